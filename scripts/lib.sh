# Sourced by the scripts: `step TEXT CMD...` runs CMD with its output in build-logs/, printing one line for the step
# and a sign of life while it runs (on a terminal the build's last [ NN%] mark, elsewhere a dot every 10 s); when CMD
# fails, the last lines of its log are shown and the script stops with CMD's exit code.
step_log_dir=${STRATA_LOG_DIR:-build-logs}

step() {
    local what=$1
    shift
    mkdir -p "$step_log_dir"
    local log
    local name
    name=$(printf '%s' "$what" | tr -c 'A-Za-z0-9' '-' | tr -s '-' | sed 's/^-//; s/-$//' | cut -c1-48)
    log="$step_log_dir/$name.log"
    local t0=$SECONDS rc=0
    printf '%s ' "$what"
    "$@" >"$log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        local el=$((SECONDS - t0))
        if [ -t 1 ]; then
            local pct
            pct=$(grep -o '\[ *[0-9]*%\]' "$log" 2>/dev/null | tail -n 1 || true)
            printf '\r%s %s %ds ' "$what" "$pct" "$el"
        elif [ $((el % 10)) -eq 0 ]; then
            printf '.'
        fi
    done
    wait "$pid" || rc=$?
    [ -t 1 ] && printf '\r%s' "$what"
    if [ "$rc" -ne 0 ]; then
        printf ' failed (exit %d after %ds); the end of %s:\n' "$rc" $((SECONDS - t0)) "$log"
        tail -n 40 "$log"
        exit "$rc"
    fi
    printf ' done (%ds)          \n' $((SECONDS - t0))
}
