#!/usr/bin/env bash
# The twenty-fourth round's call (issue 16's 30B pp512, after the twenty-third round's profile: the prompt's f32
# router 15.8% of the pass in 16 blocks, the attention's split merge 4.2%), one warm machine:
#   1. GPU tests of the opt-in 16-row generic matmul (STRATA_CUDA_MM_SMALL_TILES=1): its bits against the tile
#      list's 64-row form, the matmul and MoE op tests and the golden engines against the CPU with it (and
#      STRATA_CUDA_MMQ_SMALL_GRID=1) on.
#   2. The 30B-A3B all resident, pp512 / pp4096, alternated: the small tiles off / on; the attention split line at
#      2 / 1 waves (STRATA_CUDA_ATTN_SPLIT_WAVES; 1 keeps a 512-token prompt's 256 blocks whole); the dense
#      matrices' small grids in the plain form (STRATA_CUDA_MMQ_SMALL_GRID=1: k, v and o at 512 tokens); Q8_K's
#      thread-per-element quantization only up to 64 rows (STRATA_CUDA_Q8K_WIDE_ROWS=64; decode keeps it).
#   3. Next-80B resident pp512 with the small tiles off / on (its router: 512 experts), if NEXT=1 (a 43 GB synth).
#   4. llama.cpp beside (issue 16's pp512 and tg128 bars, the same file), then (PROFILE=1) both engines' pp512
#      kernels (bench/device-profile.sh on the same file); MMQ_DETAIL=1: Nsight Compute's sections for the experts'
#      and the dense matrices' k_mmq of a pp512 pass (the largest shares of its time).
# SHORT=1 (a few minutes of device time): each A/B once, no llama.cpp, no Next-80B, no profile.
# Flip the defaults that win (matmul_tiled.cu's small_on, cuda_mixers.cpp's waves, mmq.cu's small grid,
# mmvq.cu's q8k_wide_rows) and say so in bench/RESULTS.md. There:
#   setsid nohup bash bench/device-round24.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r24/main.log 570
L=/tmp/r24; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${SHORT:-}" ] && NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/q30.gguf
rm -f $L/synth.rc; [ -f $F ] && touch $L/synth.rc || ($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
grep -E " error" $L/build2.log | head -5
STRATA_CUDA_MM_SMALL_TILES=1 timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='CudaMatmulGeneric*:*CudaMatmul/*:*CudaMoe/*:CudaMatmuls*' > $L/ops.log 2>&1
echo "test_cuda_ops with the small tiles rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/ops.log | head -12
STRATA_CUDA_Q8K_WIDE_ROWS=2 timeout 60 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter='CudaActivations*' \
  > $L/ops2.log 2>&1; echo "test_cuda_ops, Q8_K's warp form above 2 rows rc=$?"; grep -E "FAILED|PASSED|Failure" $L/ops2.log | head -4
STRATA_CUDA_MM_SMALL_TILES=1 STRATA_CUDA_MMQ_SMALL_GRID=1 timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*MatchesTheCpuEngine*:*FusedPromptExperts*:*PromptLoans*:*Budget*' > $L/engine.log 2>&1
echo "test_cuda_engine with the small tiles rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Expected|Which" $L/engine.log | head -12
STRATA_CUDA_ATTN_SPLIT_WAVES=1 timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*MatchesTheCpuEngine*' > $L/engine2.log 2>&1
echo "test_cuda_engine with one wave's split line rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure" $L/engine2.log | head -6
[ -n "${OUT:-}" ] && cp $L/ops.log $L/engine.log $OUT/ 2>/dev/null
while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc
AB="0 1 0 1"; ABA="1 2 1"; GRID="1 0 1"; Q8="64 0 64"
[ -n "${SHORT:-}" ] && AB="0 1" && ABA="1 2" && GRID="1 0" && Q8="64 0"
for X in $AB; do STRATA_CUDA_MM_SMALL_TILES=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
for W in $ABA; do STRATA_CUDA_MM_SMALL_TILES=1 STRATA_CUDA_ATTN_SPLIT_WAVES=$W sb -m $F -p 512 -n 1 -r 3 --chunk 4096; done
for X in $GRID; do STRATA_CUDA_MM_SMALL_TILES=1 STRATA_CUDA_MMQ_SMALL_GRID=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
for X in $Q8; do STRATA_CUDA_MM_SMALL_TILES=1 STRATA_CUDA_Q8K_WIDE_ROWS=$X sb -m $F -p 512 -n 128 -r 3 --chunk 4096; done
if [ -n "${NEXT:-}" ]; then N=/tmp/n80.gguf; [ -f $N ] || $S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $N > $L/synth80.log 2>&1
  for X in 0 1; do STRATA_CUDA_MM_SMALL_TILES=$X sb -m $N -p 512,4096 -n 1 -r 2 --chunk 4096; done; fi
echo "rows at $(el) s"
if [ -z "${SHORT:-}" ]; then sb -m $F -p 512 -n 128 -r 5 --chunk 4096
  lb -p 512 -n 128 -r 5
  STRATA_CUDA_MM_SMALL_TILES=1 sb -m $F -p 512 -n 128 -r 5 --chunk 4096; fi
echo "llama.cpp rows at $(el) s"
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
if [ -n "${PROFILE:-}" ]; then echo "profile: /tmp/prof/main.log"
  STRATA_CUDA_MM_SMALL_TILES=1 F=$F bash bench/device-profile.sh qwen3-30b-a3b pp512
  cp /tmp/prof/main.log $L/profile.log; sed -n '/^| kernel/,/^| all/p' /tmp/prof/main.log; fi
if [ -n "${MMQ_DETAIL:-}" ]; then  # why the experts' tiles take 33.6% of the pass: the two k_mmq of one layer
  STRATA_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --kernel-name "regex:k_mmq" -s 20 -c 4 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis $S bench -m $F -p 512 -n 1 -r 1 > $L/mmq.txt 2> $L/mmq.err; echo "ncu rc=$?"
  [ -n "${OUT:-}" ] && cp $L/mmq.txt $OUT/ 2>/dev/null
  grep -E "^  [a-zA-Z_].*\(|Duration|Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots|Block Size|Grid Size|Stall" $L/mmq.txt | head -80; fi
echo "done at $(el) s"; echo ALL_DONE
