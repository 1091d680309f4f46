#!/usr/bin/env bash
# STRATA_CUDA_MMVQ_AHEAD=2 (a decoding mat-vec's loads ahead only where they cost no wave of blocks; opt-in until
# this has run) in about seven minutes: the mat-vec's bit-for-bit tests and the engine's greedy, graph and CPU-match
# tests with it, the greedy ids of `strata run --tokens` with it and without, tg128 of the 30B all resident
# alternated 0 / 2 / 1 twice, then the 30B file removed (the disk holds one of the two beside the build), Next-80B
# written and its tg64 alternated 0 / 2 twice. Next-80B's file stays for bench/device-split80.sh on the warm machine.
# There (carry .peer):
#   setsid nohup bash bench/device-mmvq-ahead2.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/a2/main.log 570
L=/tmp/a2; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/qwen3-30b-a3b.gguf
G=/tmp/qwen3-next-80b-a3b.gguf
[ -f $G ] || synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
STRATA_CUDA_MMVQ_AHEAD=2 timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='*Mmvq*:*CudaMatmuls*:*CudaMoe*' > $L/ops.log 2>&1
echo "test_cuda_ops, MMVQ_AHEAD=2: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure" $L/ops.log | head -8
STRATA_CUDA_MMVQ_AHEAD=2 timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*Greedy*:*GraphsDoNotChangeABit*:*MatchesTheCpuEngine*:*Split*' > $L/engine.log 2>&1
echo "test_cuda_engine, MMVQ_AHEAD=2: rc=$? at $(el) s"
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -8
if [ ! -f $G ]; then
  synth_wait
  for X in 0 2; do
    STRATA_CUDA_MMVQ_AHEAD=$X $S run -m $F --tokens $(seq -s, 100 399) -n 200 --temp 0 > $L/ids$X.txt 2> $L/ids$X.err
    echo "MMVQ_AHEAD=$X: rc=$? ids $(md5sum < $L/ids$X.txt | cut -c1-12) ($(wc -w < $L/ids$X.txt) words)"
  done
  for R in 1 2; do for X in 0 2 1; do STRATA_CUDA_MMVQ_AHEAD=$X sb -m $F -p 1 -n 128 -r 3; done; done
  rm -f $F
  synth_start qwen3-next-80b-a3b $G
fi
synth_wait
for R in 1 2; do for X in 0 2; do STRATA_CUDA_MMVQ_AHEAD=$X sb -m $G -p 1 -n 64 -r 2; done; done
echo "done at $(el) s"; echo ALL_DONE
