# Sourced by bench/device-budget.sh and bench/device-choose.sh on the GPU machine, after L (the log folder) is set and
# the output redirected: the build environment, the llama.cpp build started in the background (kept from the call
# before on a warm machine; none with NO_LLAMA=1; at the lowest CPU priority, as rows beside it share the host),
# Strata's build, and the helpers each row uses:
#   el                 seconds since the script started
#   sb ARGS...         strata bench ARGS (STRATA_* from the environment named), the table's rows kept in the log
#   lb ARGS...         llama-bench on $F in the best configuration's flags plus ARGS, its peak GPU memory, once built
#   lbb ARGS...        llama-batched-bench on $F likewise (parallel sequences: -npp, -ntg, -npl in ARGS)
#   synth_start P F    `strata synth --preset P --type Q4_K --dense-type Q8_0 -o F` in the background (kept where F
#                      exists: a warm machine); synth_wait: until it is written
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
lscpu | grep -E "^CPU\(s\)|Thread|Core|Model name"
S=/tmp/strata/bin/strata; LB=/tmp/llama.cpp/build/bin/llama-bench
if [ -n "${NO_LLAMA:-}" ]; then touch $L/llama.done; echo "llama.cpp: not built (NO_LLAMA)"
elif [ -x $LB ]; then touch $L/llama.done; echo "llama.cpp: the build of the call before"
else rm -f $L/llama.done; (nice -n 19 bash .peer/device.sh llama > $L/llama-build.log 2>&1; touch $L/llama.done) & fi
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j12 --target strata > $L/build.log 2>&1
echo "strata build rc=$? at $(el) s"; grep -E "error" $L/build.log | head -5
sb() { echo "== $(env | grep '^STRATA_' | tr '\n' ' ')strata bench $*"; $S bench "$@" > $L/s.txt 2> $L/s.err
  grep -E "^\| synth|^\| (pp|tg)|rror|pinned host-to|^decode (reads|mode)|^full or predicted|^host-computed|device memory" $L/s.txt $L/s.err | head -16
  cat $L/s.txt >> $L/strata-all.txt; echo "at $(el) s"; }
lb() { while [ ! -f $L/llama.done ]; do sleep 3; done
  if [ -x $LB ]; then echo "== llama-bench $* at $(el) s"
    bash .peer/device.sh peak $LB -m $F -ngl 99 -lm none -fa 1 -t 16 -ub 4096 -b 4096 -r 1 "$@" > $L/l.txt 2>&1
    grep -E "^\| |peak" $L/l.txt | grep -v -- "---"
  else echo "(llama.cpp did not build: $(tail -3 $L/llama-build.log))"; fi; }
lbb() { while [ ! -f $L/llama.done ]; do sleep 3; done
  local BB=/tmp/llama.cpp/build/bin/llama-batched-bench
  if [ -x $BB ]; then echo "== llama-batched-bench $* at $(el) s"
    bash .peer/device.sh peak $BB -m $F -ngl 99 -fa 1 -t 16 -ub 4096 -b 4096 -c 8192 "$@" > $L/lbb.txt 2>&1
    grep -E "^\| |peak|rror" $L/lbb.txt | grep -v -- "---"
  else echo "(llama-batched-bench did not build)"; fi; }
synth_start() { rm -f $L/synth.rc; if [ -f "$2" ]; then touch $L/synth.rc; else
  ($S synth --preset "$1" --type Q4_K --dense-type Q8_0 -o "$2" > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s" > $L/synth.rc) &
  fi; }
synth_wait() { while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc; }
