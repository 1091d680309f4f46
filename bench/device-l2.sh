#!/usr/bin/env bash
# The L2 prefetch of a decoding pass's dense weights (STRATA_CUDA_L2_PREFETCH=1|2|3, opt-in) and the reads before the
# programmatic wait (STRATA_CUDA_EARLY_READS) with the q/k rotation's spelled-out roundings, in about five minutes on
# the 30B file, all resident: the q/k tests both ways, the early reads' op tests, the engine's graph and greedy tests
# with the prefetch on (mode 3), the greedy ids of `strata run --tokens` under every mode and either early form, then
# tg128 alternated over the modes (early reads on), without the experts' down matrices, and the kernel's block count. There (carry .peer):
#   setsid nohup bash bench/device-l2.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/l2/main.log 570
L=/tmp/l2; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/qwen3-30b-a3b.gguf
synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
for X in 0 1; do
  STRATA_CUDA_EARLY_READS=$X timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
    --gtest_filter='*MoeTail*:*QkNorm*:*Flash*:*Attention*:*KvStore*:*Elementwise*:*Rope*' > $L/ops$X.log 2>&1
  echo "test_cuda_ops, EARLY_READS=$X: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Which|head" $L/ops$X.log | head -8
done
STRATA_CUDA_L2_PREFETCH=3 STRATA_CUDA_EARLY_READS=1 timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*Greedy*:*GraphsDoNotChangeABit*:*MatchesTheCpuEngine*:*Split*' > $L/engine.log 2>&1
echo "test_cuda_engine, L2_PREFETCH=3 EARLY_READS=1: rc=$? at $(el) s"
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -8
synth_wait
for M in "0 0" "0 1" "1 1" "2 1" "3 1"; do set -- $M
  STRATA_CUDA_L2_PREFETCH=$1 STRATA_CUDA_EARLY_READS=$2 $S run -m $F --tokens $(seq -s, 100 399) -n 200 --temp 0 \
    > $L/ids.txt 2> $L/ids.err
  echo "L2_PREFETCH=$1 EARLY_READS=$2: rc=$? ids $(md5sum < $L/ids.txt | cut -c1-12) ($(wc -w < $L/ids.txt) words)"
done
export STRATA_CUDA_EARLY_READS=1
for R in 1 2; do for X in 0 1 2 3; do STRATA_CUDA_L2_PREFETCH=$X sb -m $F -p 1 -n 128 -r 3; done; done
for X in 1 2; do STRATA_CUDA_L2_EXPERTS=0 STRATA_CUDA_L2_PREFETCH=$X sb -m $F -p 1 -n 128 -r 3; done
for B in 4 64; do for X in 1 2; do STRATA_CUDA_L2_BLOCKS=$B STRATA_CUDA_L2_PREFETCH=$X sb -m $F -p 1 -n 128 -r 3; done; done
for X in 0 1; do STRATA_CUDA_EARLY_READS=$X sb -m $F -p 1 -n 128 -r 3; done
echo "done at $(el) s"; echo ALL_DONE
