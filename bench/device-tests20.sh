#!/usr/bin/env bash
# The GPU tests of code that has not run on a GPU yet, alone (a session with little device time): the CUDA engine
# suite's split, mapped-miss, graph and prompt-loan tests, built for sm_90 only, nothing else built or benched.
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-tests20.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/t20/main.log 480
L=/tmp/t20; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s)
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j16 --target test_cuda_engine > $L/build.log 2>&1
echo "test_cuda_engine build rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "error" $L/build.log | head -5
timeout 240 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter="${TESTS:-*SplitOverTwo*:*PromptLoans*:*Graph*:*MappedMisses*:*SplitPasses*}" > $L/tests.log 2>&1
echo "test_cuda_engine rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "FAILED|PASSED|Failure|tests ran|skipped|Skipped|Expected|Which is|actual" $L/tests.log | head -40
[ -n "${OUT:-}" ] && cp $L/tests.log $L/build.log $OUT/ 2>/dev/null
echo ALL_DONE
