#!/usr/bin/env bash
# The least device time that proves the expert slots' CUDA side (size classes, loans from every class, the pools of
# placement.h's slot_pools): build test_cuda_engine alone and run its slot, loan and placement tests. There:
#   setsid nohup bash bench/device-tests-slots.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/ts/main.log 300
L=/tmp/ts; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s)
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j16 --target test_cuda_engine > $L/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - T0 )) s"; grep -E " error" $L/build.log | head -5
timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter="${ENGINE:-*SlotClasses*:*PromptLoans*:*PlacementDoesNotChangeABit*}" > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "FAILED|PASSED|Failure|Expected|Which|slots:" $L/engine.log | head -20
[ -n "${OUT:-}" ] && cp $L/engine.log $OUT/
echo ALL_DONE
