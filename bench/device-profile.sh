#!/usr/bin/env bash
# Where a decoded token's GPU time goes, kernel by kernel, in Strata and in llama.cpp on the same file, in one device
# call (issue 16's first step). Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp
# ../shared/peer/device.sh .peer/. There (carry .peer; poll until /tmp/prof/main.log says ALL_DONE):
#   setsid nohup bash bench/device-profile.sh [qwen3-30b-a3b|qwen3-next-80b-a3b] [tg|pp512] > /dev/null 2>&1 < /dev/null &
# tg (default): a decoding pass; pp512: a 512-token prompt pass (Strata's longest pass of `bench -p 512 -n 1`;
# llama.cpp's kernels of its warm-up and timed pp512 summed, per layer and pass).
# Nsight Compute times every kernel of the first passes (--clock-control none: the clocks left alone; each kernel
# alone, so these are the kernels' own durations); tools/profile/ncu_table.py sums one decoding pass per kernel:
# /tmp/prof/strata.md and /tmp/prof/llama.md. About 8 minutes with the llama.cpp build.
PRESET=${1:-qwen3-30b-a3b}; TEST=${2:-tg}
L=/tmp/prof; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
[ -x /tmp/llama.cpp/build/bin/llama-bench ] && echo "llama.cpp: the build of a call before" > $L/llama-build.log ||
  (bash .peer/device.sh llama > $L/llama-build.log 2>&1) &
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent -DSTRATA_TESTS=OFF"
[ -f /tmp/strata/CMakeCache.txt ] || cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1  # configured by a call before: kept
cmake --build /tmp/strata -j8 --target strata > $L/build.log 2>&1
echo "strata build rc=$?"
S=/tmp/strata/bin/strata; F=${F:-/tmp/prof.gguf}  # F=...: a file of the preset already written (a warm machine)
[ -f $F ] || { $S synth --preset $PRESET --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$?"; }
LAYERS=$($S inspect $F 2>/dev/null | grep -oE "block_count[^0-9]*[0-9]+" | grep -oE "[0-9]+$" | head -1)
NCU="ncu --clock-control none --metrics gpu__time_duration.sum --csv"
if [ "$TEST" = pp512 ]; then SARGS="-p 512 -n 1"; SC=12000; PICK=--longest; LARGS="-p 512 -n 0"; LC=20000; LMARK=""
  LLAYERS=$(( 2 * ${LAYERS:-1} ))
else SARGS="-p 1 -n 2"; SC=2500; PICK=""; LARGS="-p 0 -n 4"; LC=3000; LMARK=get_rows; LLAYERS=${LAYERS:-1}; fi
if [ "$TEST" = pp512 ]; then  # where the pass's wall time goes (the device's idle spans included), before ncu
  STRATA_PREFILL_TIMING=1 $S bench -m $F -p 512 -n 1 -r 3 > $L/timing.txt 2>&1; grep -E "^\| (pp|tg)" $L/timing.txt
  sed -n "/^| phase | host ms/,\$p" $L/timing.txt | head -14; fi
timeout 400 $NCU -c $SC $S bench -m $F $SARGS -r 1 > $L/strata.csv 2> $L/strata-ncu.err; echo "strata ncu rc=$?"
python3 -m tools.profile.ncu_table $L/strata.csv --marker embed_rows $PICK --layers ${LAYERS:-1} > $L/strata.md; cat $L/strata.md
wait; tail -1 $L/llama-build.log
LB=/tmp/llama.cpp/build/bin/llama-bench
timeout 400 $NCU -c $LC $LB -m $F -ngl 99 -fa 1 -t 16 -ub 4096 -b 4096 $LARGS -r 1 > $L/llama.csv 2> $L/llama-ncu.err
echo "llama ncu rc=$?"
python3 -m tools.profile.ncu_table $L/llama.csv --marker "$LMARK" --layers $LLAYERS > $L/llama.md; cat $L/llama.md
echo ALL_DONE
