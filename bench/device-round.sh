#!/usr/bin/env bash
# One device call's worth (under the 600 s a call may run) of a round's checks on one file: the GPU suite, then
# Strata's prefill at --vram-budget 12G with the full and the routed schedule beside llama.cpp's best configuration
# at about that memory, then Strata all resident. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh &&
# cp ../shared/peer/device.sh .peer/. There (carry .peer; the machine goes back 30 s after a call ends, so start it in
# the background and poll until /tmp/round/main.log says ALL_DONE, in the same call):
#   setsid nohup bash bench/device-round.sh [qwen3-next-80b-a3b|qwen3-30b-a3b] > /dev/null 2>&1 < /dev/null &
# A call of these steps took 534 s on 2026-12-02 with the Next-80B file (the builds side by side: Strata 100 s, llama.cpp
# 450 s; the suite 75 s, the synth beside it); this script itself has not run yet.
# Steps that would run past ~540 s are skipped and say so.
PRESET=${1:-qwen3-next-80b-a3b}
case $PRESET in
qwen3-next-80b-a3b) NCMOE=40; CHUNK=8192; P=4096,16384 ;;
qwen3-30b-a3b) NCMOE=26; CHUNK=4096; P=512,4096 ;;
*) echo "device-round.sh: presets are qwen3-next-80b-a3b and qwen3-30b-a3b" >&2; exit 2 ;;
esac
L=/tmp/round; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
before() { [ "$(el)" -lt "$1" ] || { echo "(skipped at $(el) s: $2)"; return 1; }; }
(bash .peer/device.sh llama > $L/llama-build.log 2>&1; touch $L/llama.done) &
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 &&
  cmake --build /tmp/strata -j10 --target strata test_cuda_ops test_cuda_engine > $L/build.log 2>&1
echo "strata build rc=$? at $(el) s"
S=/tmp/strata/bin/strata; LB=/tmp/llama.cpp/build/bin/llama-bench; F=/tmp/round.gguf
( $S synth --preset $PRESET --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$?" > $L/synth.rc ) &
for t in test_cuda_ops test_cuda_engine; do
  /tmp/strata/bin/$t --gtest_brief=1 > $L/$t.log 2>&1; echo "$t rc=$? at $(el) s"; grep -E "FAILED|PASSED" $L/$t.log | head -20
done
while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc
strata() { echo "== $(env | grep '^STRATA_' | tr '\n' ' ')strata bench $*"; $S bench "$@" > $L/s.txt 2> $L/s.err
  grep -E "^\| synth|^\| (pp|tg)|full prefill" $L/s.txt; grep -E "plan:" $L/s.err | head -1; cat $L/s.txt >> $L/strata-all.txt; }
llama() { echo "== llama-bench $*"; bash .peer/device.sh peak $LB "$@" > $L/l.txt 2>&1
  grep -E "^\| |peak" $L/l.txt | grep -v -- "---"; cat $L/l.txt >> $L/llama-all.txt; }
STRATA_PREFILL_SCHEDULE=full strata -m $F -p $P --chunk $CHUNK -n 1 -r 1 --vram-budget 12G
while [ ! -f $L/llama.done ]; do sleep 2; done; tail -1 $L/llama-build.log
before 480 "llama.cpp at 12 GiB" && llama -m $F -ngl 99 -ncmoe $NCMOE -lm none -fa 1 -t 16 -ub 4096 -b 4096 -p $P -n 0 -r 1
before 510 "routed schedule" && STRATA_PREFILL_SCHEDULE=routed strata -m $F -p $P --chunk $CHUNK -n 1 -r 1 --vram-budget 12G
before 540 "all resident" && strata -m $F -p 512,4096 --chunk 4096 -n 1 -r 1
echo "done at $(el) s"
echo ALL_DONE
