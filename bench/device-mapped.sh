#!/usr/bin/env bash
# One device call of the ninth round's unmeasured rows (bench/RESULTS.md): mapped misses with the split on and off,
# and admission under LFU with skewed routing, on one file at 12 GiB, llama.cpp's best configuration beside Strata
# when its build finishes in time. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh &&
# cp ../shared/peer/device.sh .peer/. There (carry .peer; start it in the background and poll until
# /tmp/mapped/main.log says ALL_DONE, in the same call or the next one right after):
#   setsid nohup bash bench/device-mapped.sh [qwen3-30b-a3b|qwen3-next-80b-a3b] > /dev/null 2>&1 < /dev/null &
#   bash bench/poll.sh /tmp/mapped/main.log 570
# Rows, each `strata bench -p 16 -n N -r 1 --vram-budget 12G` with the routing named: uniform with the defaults
# (the split, its device part mapped), `--cpu-share 0` (the device alone, graphs), `STRATA_DECODE_MAPPED=0` (misses
# copied in); zipf:1.0 with LRU (decode fills nothing), `--expert-cache-policy lfu` (admission), lfu with
# `STRATA_DECODE_ADMIT=0`, lfu with `STRATA_DECODE_ADMIT_ALONE=0` (the passes by the device alone admit nothing),
# lfu with `--cpu-share 0` (every pass alone) with and without that admission, lfu with `STRATA_DECODE_MAPPED=0`
# (every miss filled); llama.cpp tg and pp at -ncmoe N.
PRESET=${1:-qwen3-30b-a3b}
case $PRESET in
qwen3-next-80b-a3b) NCMOE=40; CHUNK=16384; N=32 ;;
qwen3-30b-a3b) NCMOE=26; CHUNK=4096; N=64 ;;
*) echo "device-mapped.sh: presets are qwen3-30b-a3b and qwen3-next-80b-a3b" >&2; exit 2 ;;
esac
L=/tmp/mapped; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
lscpu | grep -E "^CPU\(s\)|Thread|Core"
(bash .peer/device.sh llama > $L/llama-build.log 2>&1; touch $L/llama.done) &
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j12 --target strata > $L/build.log 2>&1
echo "strata build rc=$? at $(el) s"
S=/tmp/strata/bin/strata; LB=/tmp/llama.cpp/build/bin/llama-bench; F=/tmp/mapped.gguf
($S synth --preset $PRESET --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; touch $L/synth.done) &
cmake --build /tmp/strata -j12 --target test_cuda_engine test_cuda_ops > $L/build2.log 2>&1
/tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter='*Router*' > $L/ops.log 2>&1
echo "test_cuda_ops (router) rc=$? at $(el) s"; grep -E "FAILED|PASSED" $L/ops.log | head
/tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
    --gtest_filter='*Mapped*:*Hybrid*:*Graphs*:*RouteOverride*:*Placement*:*Schedules*' > $L/eng.log 2>&1
echo "test_cuda_engine (mapped, hybrid, graphs, override, placement, schedules) rc=$? at $(el) s"
grep -E "FAILED|PASSED" $L/eng.log | head
while [ ! -f $L/synth.done ]; do sleep 2; done; echo "synth at $(el) s"
sb() { echo "== $(env | grep '^STRATA_' | tr '\n' ' ')strata bench $*"; $S bench "$@" > $L/s.txt 2> $L/s.err
  grep -E "^\| synth|^\| (pp|tg)|rror" $L/s.txt $L/s.err | head -12; cat $L/s.txt >> $L/strata-all.txt; echo "at $(el) s"; }
U="-m $F -p 16 -n $N -r 1 --chunk $CHUNK --vram-budget 12G"
sb $U --routing uniform
sb $U --routing uniform --cpu-share 0
STRATA_DECODE_MAPPED=0 sb $U --routing uniform
sb $U --routing zipf:1.0
sb $U --routing zipf:1.0 --expert-cache-policy lfu
STRATA_DECODE_ADMIT=0 sb $U --routing zipf:1.0 --expert-cache-policy lfu
STRATA_DECODE_ADMIT_ALONE=0 sb $U --routing zipf:1.0 --expert-cache-policy lfu
sb $U --routing zipf:1.0 --expert-cache-policy lfu --cpu-share 0
STRATA_DECODE_ADMIT_ALONE=0 sb $U --routing zipf:1.0 --expert-cache-policy lfu --cpu-share 0
STRATA_DECODE_MAPPED=0 sb $U --routing zipf:1.0 --expert-cache-policy lfu
if [ -f $L/llama.done ] && [ -x $LB ] && [ "$(el)" -lt 520 ]; then
  echo "== llama-bench -ncmoe $NCMOE"; bash .peer/device.sh peak $LB -m $F -ngl 99 -ncmoe $NCMOE -lm none -fa 1 -t 16 \
    -ub 4096 -b 4096 -p 4096 -n $N -r 1 > $L/l.txt 2>&1; grep -E "^\| |peak" $L/l.txt | grep -v -- "---"
else echo "(llama.cpp not built in time or skipped at $(el) s)"; fi
cp $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
