#!/usr/bin/env bash
# Resident decode on the 30B file in one call (issue 16): the GPU suites (test_cuda_ops, its router, activation and
# attention tests again with the switches in SWITCHES off; test_cuda_engine), tg128 and tg64 at a 4096-token context
# with each switch off beside the default, the host's share of a token (STRATA_CUDA_PASS_TIMES=1), a CUPTI timeline
# at a long context (TRACE=0: none); with LLAMA=1 llama.cpp is built in the background and its rows on the same file
# close the call, followed by Strata's default rows again (nothing beside them). Here first:
# ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-host.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/host/main.log 570
L=/tmp/host; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${LLAMA:-}" ] || NO_LLAMA=1
source bench/device-lib.sh
(cmake --build /tmp/strata -j8 --target test_cuda_engine test_cuda_ops > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s") &
TESTS_BUILD=$!
SW=${SWITCHES:-STRATA_CUDA_FLASH_MERGE_VEC=0 STRATA_CUDA_ATTN_FINE_SPLIT=0 STRATA_CUDA_FLASH_DECODE=0 STRATA_CUDA_Q8K_WIDE=0}
F=/tmp/kern30.gguf
[ -f $F ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
STRATA_CUDA_PASS_TIMES=1 sb -m $F -p 512 -n 128 -r 2 --chunk 4096; grep -E "graphs:" $L/s.err
sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
for sw in $SW; do export "$sw"; sb -m $F -p 512 -n 128 -r 2 --chunk 4096; sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096; unset "${sw%%=*}"; done
if [ "${TRACE:-1}" != 0 ]; then
  bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
  CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/long.csv $S bench -m $F -p 1 -n 16 -d 4096 -r 1 --chunk 4096 > $L/tr2.out 2>&1
  python3 -m tools.profile.timeline $L/long.csv --marker embed --passes 8 > $L/tl.txt 2>&1; head -8 $L/tl.txt
  [ -n "${OUT:-}" ] && cp $L/long.csv $OUT/ 2>/dev/null
fi
wait $TESTS_BUILD
timeout 200 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops.log | head
env $SW timeout 100 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='CudaRouter*:CudaActivations*:MmvqHost*:*Attention*:*Flash*' > $L/ops0.log 2>&1
echo "test_cuda_ops (router, activations, host mat-vec, attention) with $SW rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops0.log | head
timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran|graphs:" $L/engine.log | head
if [ -n "${LLAMA:-}" ]; then
  lb -p 512 -n 128 -r 2; lb -p 512 -n 64 -d 4096
  sb -m $F -p 512 -n 128 -r 2 --chunk 4096; sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo ALL_DONE
