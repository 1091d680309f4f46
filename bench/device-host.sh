#!/usr/bin/env bash
# Resident decode on the 30B file in one call, no llama.cpp (issue 16): the GPU suites (test_cuda_ops, and its router
# and 8-bit activation tests again with STRATA_CUDA_ROUTER_RANK=0 and STRATA_CUDA_Q8K_WIDE=0; test_cuda_engine), tg
# rows with each new switch off beside the default, the host's share of a token (STRATA_CUDA_PASS_TIMES=1), and a
# CUPTI timeline of decoding at a short and a long context (where the gaps and the attention kernels go). Here first:
# ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-host.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/host/main.log 570
# SWITCHES names the rows beside the default one (default: the router's and the Q8_K quantization's new forms off).
L=/tmp/host; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
(cmake --build /tmp/strata -j8 --target test_cuda_engine test_cuda_ops > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s") &
TESTS_BUILD=$!
F=/tmp/kern30.gguf
[ -f $F ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
STRATA_CUDA_PASS_TIMES=1 sb -m $F -p 512 -n 128 -r 2 --chunk 4096; grep -E "graphs:|op by op" $L/s.err
for sw in ${SWITCHES:-STRATA_CUDA_ROUTER_RANK=0 STRATA_CUDA_Q8K_WIDE=0}; do export "$sw"; sb -m $F -p 512 -n 128 -r 2 --chunk 4096; unset "${sw%%=*}"; done
sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/short.csv $S bench -m $F -p 1 -n 96 -r 1 > $L/tr.out 2>&1
python3 -m tools.profile.timeline $L/short.csv --marker embed --passes 16 | head -8
CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/long.csv $S bench -m $F -p 1 -n 16 -d 4096 -r 1 --chunk 4096 > $L/tr2.out 2>&1
python3 -m tools.profile.timeline $L/long.csv --marker embed --passes 8 | head -8
[ -n "${OUT:-}" ] && cp $L/short.csv $L/long.csv $OUT/ 2>/dev/null
wait $TESTS_BUILD
timeout 200 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops.log | head
STRATA_CUDA_ROUTER_RANK=0 STRATA_CUDA_Q8K_WIDE=0 timeout 100 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='CudaRouter*:CudaActivations*:MmvqHost*' > $L/ops0.log 2>&1
echo "test_cuda_ops (router, activations, host mat-vec) with both off rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops0.log | head
timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine.log | head
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo ALL_DONE
