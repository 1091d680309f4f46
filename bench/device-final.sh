#!/usr/bin/env bash
# Issue 16's resident figures in one call, both engines on the same files: Strata's GPU suites (test_cuda_ops, its
# attention/activation tests again with STRATA_CUDA_FLASH_MERGE_VEC=0 STRATA_CUDA_Q8K_WIDE=0; test_cuda_engine), the
# 30B's pp512 / tg128 and tg64 at a 4096-token context, Next-80B's pp512 / pp4096 / tg64, Nsight Compute's sections
# for the split attention kernels at that context, then llama.cpp's rows (built in the background from the start)
# and Strata's default rows again with nothing beside them. Here first: ../shared/peer/prepare.sh &&
# scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-final.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/final/main.log 570
# (poll again in the next call if it has not said ALL_DONE). TESTS=0 leaves out the GPU suites and Nsight Compute (a
# call that ran them on the same build before).
L=/tmp/final; mkdir -p $L
exec > $L/main.log 2>&1
source bench/device-lib.sh
TESTS_BUILD=
[ "${TESTS:-1}" != 0 ] && { (cmake --build /tmp/strata -j6 --target test_cuda_engine test_cuda_ops > $L/build2.log 2>&1
  echo "tests build rc=$? at $(el) s") & TESTS_BUILD=$!; }
F30=/tmp/kern30.gguf F80=/tmp/kern80.gguf
(nice -n 5 $S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F80 > $L/synth80.log 2>&1; echo "synth 80B rc=$? at $(el) s") &
SYN80=$!
$S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F30 > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"
F=$F30
STRATA_CUDA_PASS_TIMES=1 sb -m $F -p 512 -n 128 -r 2 --chunk 4096; grep -E "graphs:" $L/s.err
sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
[ -n "$TESTS_BUILD" ] && wait $TESTS_BUILD
if [ "${TESTS:-1}" != 0 ]; then
timeout 200 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops.log | head
STRATA_CUDA_FLASH_MERGE_VEC=0 STRATA_CUDA_Q8K_WIDE=0 timeout 100 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='CudaActivations*:MmvqHost*:*Attention*:*Flash*' > $L/ops0.log 2>&1
echo "test_cuda_ops (activations, host mat-vec, attention) with both off rc=$? at $(el) s"; grep -E "FAILED|PASSED" $L/ops0.log | head
timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine.log | head
STRATA_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --kernel-name regex:"k_flash<|k_flash_merge_vec" -s 400 -c 4 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  $S bench -m $F -p 1 -n 4 -d 4096 --chunk 4096 -r 1 > $L/ncu.txt 2> $L/ncu.err
echo "ncu rc=$? at $(el) s"; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Block Size|Grid Size|Stall|smsp__pcsamp|Theoretical Occ|Block Limit" $L/ncu.txt | head -60
fi
wait $SYN80
F=$F80
sb -m $F -p 512,4096 -n 64 -r 1 --chunk 4096
F=$F30; lb -p 512 -n 128 -r 2; lb -p 512 -n 64 -d 4096
F=$F80; lb -p 512,4096 -n 64
echo "== Strata again, nothing beside it"
F=$F30; sb -m $F -p 512 -n 128 -r 2 --chunk 4096; sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
F=$F80; sb -m $F -p 512 -n 64 -r 1 --chunk 4096
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/ncu.txt $OUT/ 2>/dev/null
echo ALL_DONE
