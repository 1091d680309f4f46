#!/usr/bin/env bash
# Loads ahead in three decoding kernels (the thirty-fifth round ran this: the tail's and the merge's are now defaults,
# the mat-vec's stays opt-in; a row of none below now has the two defaults on): the mat-vec's (STRATA_CUDA_MMVQ_AHEAD=1),
# the MoE tail's (STRATA_CUDA_TAIL_AHEAD=1) and the split attention merge's (STRATA_CUDA_MERGE_AHEAD=1), in about six
# minutes on the 30B file, all resident: their bit-for-bit tests (each test runs both forms; the mat-vec's with
# staged rows too), the engine's greedy, graph and CPU-match tests with all three on, the greedy ids of `strata run
# --tokens` under each, then tg128 alternated over none, each alone and all three, twice, and tg64 at a 4096 context.
# There (carry .peer):
#   setsid nohup bash bench/device-ahead.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/ahead/main.log 570
L=/tmp/ahead; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/qwen3-30b-a3b.gguf
synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
ALL="STRATA_CUDA_MMVQ_AHEAD=1 STRATA_CUDA_TAIL_AHEAD=1 STRATA_CUDA_MERGE_AHEAD=1"
# the defaults, then the staged rows with the three switches on (the launches that take their form from the switch,
# such as the q/k/v parts' mat-vec, run the new forms there)
for X in 0 1; do
  if [ $X = 1 ]; then E="STRATA_CUDA_MMVQ_STAGE=1 $ALL"; else E=""; fi
  env $E timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
    --gtest_filter='*Mmvq*:*CudaMatmuls*:*CudaMoe*:*Router*:*FlashDecode*:*Attention*' > $L/ops$X.log 2>&1
  echo "test_cuda_ops [$E]: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Which|k [0-9]" $L/ops$X.log | head -8
done
env $ALL timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*Greedy*:*GraphsDoNotChangeABit*:*MatchesTheCpuEngine*:*Split*' > $L/engine.log 2>&1
echo "test_cuda_engine, all three on: rc=$? at $(el) s"
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -8
synth_wait
SETS=("" "STRATA_CUDA_MMVQ_AHEAD=1" "STRATA_CUDA_TAIL_AHEAD=1" "STRATA_CUDA_MERGE_AHEAD=1" "$ALL")
for E in "${SETS[@]}"; do
  env $E $S run -m $F --tokens $(seq -s, 100 399) -n 200 --temp 0 > $L/ids.txt 2> $L/ids.err
  echo "[$E]: rc=$? ids $(md5sum < $L/ids.txt | cut -c1-12) ($(wc -w < $L/ids.txt) words)"
done
# each setting in a subshell of its own, so that nothing it exports outlives it
for R in 1 2; do for E in "${SETS[@]}"; do (if [ -n "$E" ]; then export $E; fi; sb -m $F -p 1 -n 128 -r 3); done; done
(export $ALL; sb -m $F -p 1 -n 64 -r 2 -d 4096)
sb -m $F -p 1 -n 64 -r 2 -d 4096
echo "done at $(el) s"; echo ALL_DONE
