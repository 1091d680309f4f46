#!/usr/bin/env bash
# Strata's whole GPU suites with the defaults of this build, nothing else (about six minutes: the build, then
# test_cuda_engine, then test_cuda_ops). There (carry .peer):
#   setsid nohup bash bench/device-suites.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/suites/main.log 570
L=/tmp/suites; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
cmake --build /tmp/strata -j14 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
timeout 330 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|tests ran|Failure|Which" $L/engine.log | head -12
timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|tests ran|Failure|Which" $L/ops.log | head -12
echo "done at $(el) s"; echo ALL_DONE
