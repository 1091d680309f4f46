#!/usr/bin/env bash
# The twenty-ninth round's first call, one machine (about ten minutes: two calls, the second only polling; SHORT=1
# about six minutes, one call):
#   1. GPU tests: test_cuda_ops' matmul forms (Q8Staged in CudaMmq.FormsAreTheSameBits and
#      PartsAreTheSeparateLaunchesBits) and attention ops (heavy-first); test_cuda_engine's placement, loan,
#      slot-class (a loan across both classes) and golden cases, and the golden cases again with the Wide form
#      (STRATA_CUDA_MMQ_Q8_STAGED=0) and the attention in tile order (STRATA_CUDA_ATTN_HEAVY_FIRST=0).
#   2. The Q8_0 staged form and the heaviest attention tiles first against the build before (both switches 0 / 1),
#      four pairs on the 30B all resident, pp512 / pp4096 (the second two after 3).
#   3. Expert slots in size classes on the mixed-down 30B at 12 GiB (STRATA_SLOT_CLASSES=1 / 0), then auto's cost
#      model off (STRATA_PREFILL_COST=0); the rows print the layers the model chose and the bus rate.
# SHORT=1: the matmul tests, the engine's slot-class and golden tests with both switches off (the defaults are the
# same bits by the op tests), the first two pairs, and 3 without the classes-off row.
# There (carry .peer):
#   setsid nohup bash bench/device-round29.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r29/main.log 570
L=/tmp/r29; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
M=/tmp/q30m.gguf
[ -f $M ] || ($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 --mixed-down Q6_K -o $M > $L/synthm.log 2>&1;
  echo "mixed synth rc=$? at $(el) s" > $L/synthm.rc) &
[ -f $M ] && echo "kept" > $L/synthm.rc
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
OF='*CudaMmq*:*FlashMma*:*CudaAttention*:*FlashMerge*'; [ -n "${SHORT:-}" ] && OF='*CudaMmq*'
timeout 200 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter="$OF" > $L/ops.log 2>&1
echo "test_cuda_ops ($OF) rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/ops.log | head -12
Q8="STRATA_CUDA_MMQ_Q8_STAGED=0 STRATA_CUDA_ATTN_HEAVY_FIRST=0"
if [ -z "${SHORT:-}" ]; then
  EF='*PlacementDoesNotChangeABit*:*PromptLoans*:*SlotClasses*:*MatchesTheCpuEngine*:*TwoGpus*'
  timeout 240 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="${ENGINE:-$EF}" > $L/engine.log 2>&1
  echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -12
  EQ='*MatchesTheCpuEngine*:*FusedPromptExperts*'
else EQ='*SlotClasses*:*MatchesTheCpuEngine*'; fi
env $Q8 timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="$EQ" > $L/engine-q8.log 2>&1
echo "test_cuda_engine ($EQ), $Q8: rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine-q8.log | head -8
[ -n "${OUT:-}" ] && cp $L/ops.log $L/engine.log $L/engine-q8.log $OUT/ 2>/dev/null
while [ ! -f $L/synthm.rc ]; do sleep 2; done; cat $L/synthm.rc
ab() { for X in 0 1 0 1; do
  STRATA_CUDA_MMQ_Q8_STAGED=$X STRATA_CUDA_ATTN_HEAVY_FIRST=$X sb -m $M -p 512,4096 -n 1 -r 3 --chunk 4096; done; }
ab
CL="1 0"; [ -n "${SHORT:-}" ] && CL=1
for X in $CL; do STRATA_SLOT_CLASSES=$X sb -m $M -p 4096 -n 64 -r 2 --chunk 4096 --vram-budget 12G
  grep -h "plan:" $L/s.err $L/s.txt | head -1 | cut -c1-260; done
STRATA_PREFILL_COST=0 sb -m $M -p 4096 -n 64 -r 2 --chunk 4096 --vram-budget 12G
[ -z "${SHORT:-}" ] && ab
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
