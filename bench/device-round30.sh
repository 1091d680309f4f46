#!/usr/bin/env bash
# The thirtieth round's call, one machine (about seven minutes; NO_LLAMA=1 about four):
#   1. GPU tests: test_cuda_ops' matmul forms (new: Q4Direct, the experts' Q4_K tensor-core matmul reading its copied
#      quants as they lie, in CudaMmq.FormsAreTheSameBits), the engine's loan, slot-class, golden and split cases
#      (the split's residual stream now in page-locked memory) with STRATA_CUDA_MMQ_Q4_DIRECT=1.
#   2. Q4Direct against the staged form (STRATA_CUDA_MMQ_Q4_DIRECT=0 / 1, alternated, four pairs) on the 30B all
#      resident, pp512 / pp4096, and at 12 GiB pp4096 (two pairs).
#   3. Issue 16's bars with this build's defaults beside llama.cpp (built in the background): the 30B all resident,
#      pp512 / pp4096 / tg128, Strata before and after llama.cpp.
# There (carry .peer):
#   setsid nohup bash bench/device-round30.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r30/main.log 570
L=/tmp/r30; mkdir -p $L
exec > $L/main.log 2>&1
source bench/device-lib.sh
F=/tmp/q30.gguf
synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter='*CudaMmq*' > $L/ops.log 2>&1
echo "test_cuda_ops CudaMmq rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Expected|Which" $L/ops.log | head -8
STRATA_CUDA_MMQ_Q4_DIRECT=1 timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*PromptLoans*:*SlotClasses*:*MatchesTheCpuEngine*:*FusedPromptExperts*:*Split*' > $L/engine.log 2>&1
echo "test_cuda_engine, Q4 direct: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Expected|Which" $L/engine.log | head -8
[ -n "${OUT:-}" ] && cp $L/ops.log $L/engine.log $OUT/ 2>/dev/null
synth_wait
for X in 0 1 0 1 0 1 0 1; do STRATA_CUDA_MMQ_Q4_DIRECT=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
for X in 0 1 0 1; do STRATA_CUDA_MMQ_Q4_DIRECT=$X sb -m $F -p 4096 -n 1 -r 2 --chunk 4096 --vram-budget 12G; done
if [ -z "${NO_LLAMA:-}" ]; then sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096
  lb -p 512,4096 -n 128 -r 3
  sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096; fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
