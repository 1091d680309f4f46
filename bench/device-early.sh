#!/usr/bin/env bash
# STRATA_CUDA_EARLY_READS's tests after the fix of its first run (the first layer's uploads read early), in about
# four minutes: the kernels' tests with it on, the q/k tests with it off, the greedy ids of `strata run
# --tokens` (a 300-token prompt, 200 steps) either way on the 30B file, one tg128 pair; the demo model's decode under --expert-cache-policy next and lfu. There (carry .peer):
#   setsid nohup bash bench/device-early.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/early/main.log 570
L=/tmp/early; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/qwen3-30b-a3b.gguf
synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
STRATA_CUDA_EARLY_READS=1 timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='*MoeTail*:*QkNorm*:*Flash*:*Attention*:*KvStore*' > $L/ops-early.log 2>&1
echo "test_cuda_ops, EARLY_READS=1: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Which|head" $L/ops-early.log | head -12
timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter='*QkNorm*' > $L/ops-default.log 2>&1
echo "test_cuda_ops *QkNorm*, early reads off: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure" $L/ops-default.log | head -6
synth_wait
for X in 0 1; do
  STRATA_CUDA_EARLY_READS=$X $S run -m $F --tokens $(seq -s, 100 399) -n 200 --temp 0 > $L/ids$X.txt 2> $L/ids$X.err
  echo "EARLY_READS=$X: rc=$? ids $(md5sum < $L/ids$X.txt | cut -c1-12) ($(wc -w < $L/ids$X.txt) words)"
done
for X in 0 1; do STRATA_CUDA_EARLY_READS=$X sb -m $F -p 1 -n 128 -r 3; done
# Issue 17: --expert-cache-policy next against lfu on the demo model's real routing at 661M (52 slots, 14% of its
# experts), the twenty-second round's rows: decode by default (alone or split by time) and alone (--cpu-share 0),
# alone with its misses admitted after each pass (STRATA_DECODE_ADMIT_ALONE=1) too.
head -c 2000 models/demo/sample.txt > $L/prompt.txt
for M in "auto 0" "0 0" "0 1"; do set -- $M; for P in lfu next; do
  echo "== demo: --expert-cache-policy $P, --cpu-share $1, STRATA_DECODE_ADMIT_ALONE=$2"
  STRATA_DECODE_ADMIT_ALONE=$2 $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 \
    --ignore-eos --vram-budget 661M --cpu-share $1 --expert-cache-policy $P > $L/demo.out 2> $L/demo.err
  grep -E "generated|hit|rror" $L/demo.err | tail -3; md5sum < $L/demo.out; done; done
echo "done at $(el) s"; echo ALL_DONE
