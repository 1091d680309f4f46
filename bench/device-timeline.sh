#!/usr/bin/env bash
# Resident decode of both engines on one file, kernel by kernel as they run inside their graphs (issue 16): the
# CUPTI trace of tools/profile/kernel_trace.cpp over `strata bench -p 1 -n 32` and `llama-bench -p 0 -n 32`, each
# summarised by tools/profile/timeline.py, then the plain (untraced) tg128 of both. Here first: ../shared/peer/prepare.sh
# && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-timeline.sh [PRESET] > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/tl/main.log 570
# STRATA_* switches in the environment reach every Strata row (A/B between calls). The raw traces stay in /tmp/tl.
# WAIT_FILE=PATH: the GPU rows wait until PATH exists (another job has the GPU first; the builds go on meanwhile).
PRESET=${1:-qwen3-30b-a3b}
L=/tmp/tl; mkdir -p $L
exec > $L/main.log 2>&1
source bench/device-lib.sh
F=/tmp/tl.gguf
[ -f $F ] || { $S synth --preset $PRESET --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
if [ -n "${WAIT_FILE:-}" ]; then while [ ! -f "$WAIT_FILE" ]; do sleep 3; done; echo "$WAIT_FILE at $(el) s"; fi
trace() { local name=$1; shift
  CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/$name.csv "$@" > $L/$name.out 2>&1
  echo "== $name traced rc=$? at $(el) s"; }
trace strata $S bench -m $F -p 1 -n 32 -r 1
python3 -m tools.profile.timeline $L/strata.csv --marker embed --passes 16 | head -60
sb -m $F -p 512 -n 128 -r 2 --chunk 4096
while [ ! -f $L/llama.done ]; do sleep 3; done
if [ -x $LB ]; then
  trace llama $LB -m $F -ngl 99 -fa 1 -t 16 -p 0 -n 32 -r 1
  python3 -m tools.profile.timeline $L/llama.csv --marker get_rows --passes 16 | head -60
  lb -p 512 -n 128 -r 2
fi
[ -n "${OUT:-}" ] && for f in $L/strata.csv $L/llama.csv; do [ -f $f ] && gzip -c $f > $OUT/$(basename $f).gz; done
echo ALL_DONE
