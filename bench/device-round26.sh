#!/usr/bin/env bash
# The twenty-sixth round's call, one machine: the three matmul forms of round 25 (the f32 router kernel, a prompt's
# q/k/v in one launch, the staged Q4_K expert tiles) are now the defaults.
#   1. GPU tests: the whole test_cuda_ops, and test_cuda_engine's golden, placement, schedule, fusion, loan, slot-class
#      (new: CudaEngineSlotClasses, a file of two expert sizes), graph, budget and split tests (ENGINE=... overrides)
#      under the new defaults, and its golden cases with the three switched off (STRATA_CUDA_MM_F32=0
#      STRATA_CUDA_MMQ_PARTS=0 STRATA_CUDA_MMQ_STAGED=0). The slots' pools and loans changed with the size classes
#      (placement.h: slot_pools, a loan as a list of slots) and have not run on a GPU before this.
#   2. Issue 17's 30B row at 12 GiB under uniform routing (57.0 tok/s in round 25 against 70-83 in earlier rounds):
#      STRATA_HOST_STAGE=1 / 0 alternated, then --cpu-share 0 (the device alone).
#   3. Where a resident decoding pass's GPU time goes, by op (STRATA_CUDA_PROFILE=1), for issue 16's HBM bar.
#   4. Expert slots in size classes on a 30B file whose down matrices are Q6_K in the Q4_K_M recipe's layers
#      (`strata synth --mixed-down Q6_K`), at 12 GiB: STRATA_SLOT_CLASSES=1 / 0 (more slots in the same memory).
#      Then the same with auto's cost model off (STRATA_PREFILL_COST=0: the recall's line; the rows above print the
#      layers the model chose full or predicted, and the check line the bus rate measured at start).
#   4b. A prompt's tensor-core attention with its heaviest tiles first (STRATA_CUDA_ATTN_HEAVY_FIRST=0 / 1, the same
#      bits: CudaFlashMma.HeavyFirstIsTheTileOrdersBits in the ops suite), 30B pp512 / pp4096 all resident.
#   5. Issue 16's bars on the 30B all resident: pp512 / pp4096 / tg128 beside llama.cpp (built in the background).
# SHORT=1 (about five minutes): the engine's placement, loan and slot-class tests, the ops suite's attention tests,
# one A/B pair of 4 and its cost-model row; no golden cases, no 2, no decode profile, no 4b, no llama.cpp.
# There:
#   setsid nohup bash bench/device-round26.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r26/main.log 570
L=/tmp/r26; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${SHORT:-}" ] && NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/q30.gguf M=/tmp/q30m.gguf
if [ -z "${SHORT:-}" ]; then synth_start qwen3-30b-a3b $F; else touch $L/synth.rc; fi
[ -f $M ] || ($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 --mixed-down Q6_K -o $M > $L/synthm.log 2>&1;
  echo "mixed synth rc=$? at $(el) s" > $L/synthm.rc) &
T2="test_cuda_ops test_cuda_engine"
cmake --build /tmp/strata -j12 --target $T2 > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"
grep -E " error" $L/build2.log | head -5
OF='*'; [ -n "${SHORT:-}" ] && OF='*FlashMma*:*CudaAttention*:*FlashMerge*'
timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter="$OF" > $L/ops.log 2>&1
echo "test_cuda_ops ($OF) rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/ops.log | head -12
EF='*MatchesTheCpuEngine*:*PlacementDoesNotChangeABit*:*SchedulesDoNotChangeABit*:*FusedPromptExperts*:*PromptLoans*:*SlotClasses*:*Graph*:*Budget*:*SplitPasses*'
[ -n "${SHORT:-}" ] && EF='*PlacementDoesNotChangeABit*:*PromptLoans*:*SlotClasses*:*MatchesTheCpuEngine*:*TwoGpus*'
timeout 240 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="${ENGINE:-$EF}" > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -12
[ -z "${SHORT:-}" ] && STRATA_CUDA_MM_F32=0 STRATA_CUDA_MMQ_PARTS=0 STRATA_CUDA_MMQ_STAGED=0 timeout 100 /tmp/strata/bin/test_cuda_engine \
  --gtest_brief=1 --gtest_filter='*MatchesTheCpuEngine*:*FusedPromptExperts*' > $L/engine-off.log 2>&1
echo "test_cuda_engine, the three off: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure" $L/engine-off.log | head -6
[ -n "${OUT:-}" ] && cp $L/ops.log $L/engine.log $L/engine-off.log $OUT/ 2>/dev/null
synth_wait
U="-m $F -p 16 -n 64 -r 2 --chunk 4096 --routing uniform --vram-budget 12G"
AB="1 0 1 0"; [ -n "${SHORT:-}" ] && AB="1 0"
[ -z "${SHORT:-}" ] && for X in $AB; do STRATA_HOST_STAGE=$X sb $U; done
[ -z "${SHORT:-}" ] && sb $U --cpu-share 0
[ -z "${SHORT:-}" ] && STRATA_CUDA_PROFILE=1 $S bench -m $F -p 1 -n 128 -r 1 > $L/tgprof.txt 2>&1; echo "decode profile:"
[ -z "${SHORT:-}" ] && { grep -E "^\| (pp|tg)" $L/tgprof.txt; sed -n '/CUDA op profile/,$p' $L/tgprof.txt | head -60; }
while [ ! -f $L/synthm.rc ]; do sleep 2; done; cat $L/synthm.rc
for X in $AB; do STRATA_SLOT_CLASSES=$X sb -m $M -p 4096 -n 64 -r 2 --chunk 4096 --vram-budget 12G
  grep -h "plan:" $L/s.err $L/s.txt | head -1 | cut -c1-260; done
STRATA_PREFILL_COST=0 sb -m $M -p 4096 -n 64 -r 2 --chunk 4096 --vram-budget 12G
[ -z "${SHORT:-}" ] && for X in 0 1 0 1; do STRATA_CUDA_ATTN_HEAVY_FIRST=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
if [ -z "${SHORT:-}" ]; then sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096
lb -p 512,4096 -n 128 -r 3
sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096; fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tgprof.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
