#!/usr/bin/env bash
# One device call's worth of decode-under-a-budget checks on one file (the A/B rows the eighth round of
# bench/RESULTS.md left unmeasured), with llama.cpp's best configuration at about the same memory beside Strata when
# its build finishes in time. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh &&
# cp ../shared/peer/device.sh .peer/. There (carry .peer; start it in the background and poll until
# /tmp/decode/main.log says ALL_DONE, in the same call or the next one right after):
#   setsid nohup bash bench/device-decode.sh [qwen3-next-80b-a3b|qwen3-30b-a3b] > /dev/null 2>&1 < /dev/null &
#   bash bench/poll.sh /tmp/decode/main.log 570
# Rows, each `strata bench -p 16 -n N -r 1 --vram-budget 12G --routing uniform` unless said: the split's fitted model
# (default), its rule before (STRATA_DECODE_SPLIT_FIT=0), no split (--cpu-share 0), the decode overlap off; the same
# with STRATA_DECODE_TIMING=1 -p 1; then prefill with the grouping on one thread (STRATA_GROUP_THREADS=1) and on the
# default; llama.cpp tg and pp at -ncmoe N. Not run yet as a whole: its parts ran in the eighth round's calls.
PRESET=${1:-qwen3-next-80b-a3b}
case $PRESET in
qwen3-next-80b-a3b) NCMOE=40; CHUNK=16384; P=4096,16384; N=32 ;;
qwen3-30b-a3b) NCMOE=26; CHUNK=4096; P=512,4096; N=64 ;;
*) echo "device-decode.sh: presets are qwen3-next-80b-a3b and qwen3-30b-a3b" >&2; exit 2 ;;
esac
L=/tmp/decode; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
before() { [ "$(el)" -lt "$1" ] || { echo "(skipped at $(el) s: $2)"; return 1; }; }
lscpu | grep -E "^CPU\(s\)|Thread|Core"
(bash .peer/device.sh llama > $L/llama-build.log 2>&1; touch $L/llama.done) &
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j12 --target strata > $L/build.log 2>&1
echo "strata build rc=$? at $(el) s"
S=/tmp/strata/bin/strata; LB=/tmp/llama.cpp/build/bin/llama-bench; F=/tmp/decode.gguf
($S synth --preset $PRESET --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; touch $L/synth.done) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1
/tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Hybrid*:*RouteOverride*:*Upload*:*Loan*' > $L/eng.log 2>&1
echo "test_cuda_engine (hybrid, override, uploads, loans) rc=$? at $(el) s"; grep -E "FAILED|PASSED" $L/eng.log | head
while [ ! -f $L/synth.done ]; do sleep 2; done; echo "synth at $(el) s"
sb() { echo "== $(env | grep '^STRATA_' | tr '\n' ' ')strata bench $*"; $S bench "$@" > $L/s.txt 2> $L/s.err
  grep -E "^\| synth|^\| (pp|tg)|outgrew|^\| (mixer|route|readback|group|experts|host|combine|shared) \|" $L/s.txt
  cat $L/s.txt >> $L/strata-all.txt; echo "at $(el) s"; }
U="-m $F -p 16 -n $N -r 1 --chunk $CHUNK --vram-budget 12G --routing uniform"
sb $U
STRATA_DECODE_SPLIT_FIT=0 sb $U
sb $U --cpu-share 0
STRATA_DECODE_OVERLAP=0 sb $U
before 400 "decode timing" && STRATA_DECODE_TIMING=1 sb -m $F -p 1 -n $N -r 1 --chunk $CHUNK --vram-budget 12G --routing uniform
before 440 "prefill, grouping on one thread" && STRATA_GROUP_THREADS=1 sb -m $F -p $P --chunk $CHUNK -n 1 -r 1 --vram-budget 12G
before 480 "prefill" && sb -m $F -p $P --chunk $CHUNK -n 1 -r 1 --vram-budget 12G
if [ -f $L/llama.done ] && [ -x $LB ] && before 520 "llama.cpp"; then
  echo "== llama-bench -ncmoe $NCMOE"; bash .peer/device.sh peak $LB -m $F -ngl 99 -ncmoe $NCMOE -lm none -fa 1 -t 16 \
    -ub 4096 -b 4096 -p $P -n $N -r 1 > $L/l.txt 2>&1; grep -E "^\| |peak" $L/l.txt | grep -v -- "---"
else echo "(llama.cpp not built in time or skipped at $(el) s)"; fi
cp $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
