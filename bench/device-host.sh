#!/usr/bin/env bash
# Resident decode on the 30B file in one call (issue 16): the GPU suites (test_cuda_ops, its router, activation and
# attention tests again with the switches in SWITCHES off; test_cuda_engine), tg128 and tg64 at a 4096-token context
# with each switch off beside the default, the host's share of a token (STRATA_CUDA_PASS_TIMES=1), a CUPTI timeline
# at a long context (TRACE=0: none; TRACE_SHORT=1: one at a 1-33 token context too); DEPTH=0 leaves out the rows at a
# 4096-token context for the switches; ENGINE_OFF=1 runs test_cuda_engine again with the switches off; NCU_KERNELS=RE
# runs Nsight Compute on those kernels; with LLAMA=1 llama.cpp is built in the background and its rows on the same file
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
for sw in $SW; do export "$sw"; sb -m $F -p 512 -n 128 -r 2 --chunk 4096
  [ "${DEPTH:-1}" = 0 ] || sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096; unset "${sw%%=*}"; done
if [ "${TRACE:-1}" != 0 ]; then
  bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
  CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/long.csv $S bench -m $F -p 1 -n 16 -d 4096 -r 1 --chunk 4096 > $L/tr2.out 2>&1
  python3 -m tools.profile.timeline $L/long.csv --marker embed --passes 8 > $L/tl.txt 2>&1; head -8 $L/tl.txt
  [ -n "${OUT:-}" ] && cp $L/long.csv $OUT/ 2>/dev/null
  if [ -n "${TRACE_SHORT:-}" ]; then
    CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/short.csv $S bench -m $F -p 1 -n 32 -r 1 > $L/tr3.out 2>&1
    python3 -m tools.profile.timeline $L/short.csv --marker embed --passes 16 > $L/tl3.txt 2>&1; head -8 $L/tl3.txt
    [ -n "${OUT:-}" ] && cp $L/short.csv $OUT/ 2>/dev/null
  fi
fi
wait $TESTS_BUILD
timeout 200 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops.log | head
env $SW timeout 100 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='CudaRouter*:CudaActivations*:MmvqHost*:*Attention*:*Flash*' > $L/ops0.log 2>&1
echo "test_cuda_ops (router, activations, host mat-vec, attention) with $SW rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops0.log | head
timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran|graphs:" $L/engine.log | head
if [ -n "${ENGINE_OFF:-}" ]; then
  env $SW timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine0.log 2>&1
  echo "test_cuda_engine with $SW rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine0.log | head
fi
if [ -n "${NCU_KERNELS:-}" ]; then  # Nsight Compute on these kernels of the first decoding passes (NCU_SKIP, NCU_COUNT)
  STRATA_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --kernel-name "regex:$NCU_KERNELS" -s ${NCU_SKIP:-20} \
    -c ${NCU_COUNT:-8} --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis $S bench -m $F -p 1 -n 4 -r 1 > $L/ncu.txt 2> $L/ncu.err
  echo "ncu rc=$? at $(el) s"; tail -2 $L/ncu.err
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Reg|Waves Per SM|L1/TEX Cache Throughput" $L/ncu.txt | cut -c1-150 | head -120
  [ -n "${OUT:-}" ] && cp $L/ncu.txt $OUT/ 2>/dev/null
fi
if [ -n "${LLAMA:-}" ]; then
  lb -p 512 -n 128 -r 2; [ "${DEPTH:-1}" = 0 ] || lb -p 512 -n 64 -d 4096
  sb -m $F -p 512 -n 128 -r 2 --chunk 4096; [ "${DEPTH:-1}" = 0 ] || sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo ALL_DONE
