#!/usr/bin/env bash
# The twenty-second round's third call: LFU with decay as the default expert-cache policy (it was LRU), one call:
#   1. The GPU tests of the mapped misses, budgets and prompt loans under the new default (a budget's partial caches
#      now run LFU where no test names a policy), while the 30B file is written (after the demo rows below).
#   2. The demo model's real routing at 14% and 45% of its experts in slots, after a 2000-byte prompt, decoding by
#      default (the decode mode chooses alone or split by time; split passes copy their misses in) and alone
#      (--cpu-share 0): hit rate and speed under lfu and lru.
#   3. The demo model's perplexity on sample.txt (issue 13) on CUDA all resident and at the smallest budget.
#   4. The 30B-A3B at 12 GiB, lfu against lru: tg64 under uniform routing (issue 17's bar; no policy can do better
#      than the cache's share there, so this is the cost of LFU's bookkeeping) and pp512 / pp4096.
# SHORT=1 (a call with little device time): no tests, no prefill rows; DEMO_ONLY=1 as well: no 30B rows. Here first as for bench/device-round22.sh. There:
#   setsid nohup bash bench/device-round22c.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r22c/main.log 570
L=/tmp/r22c; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/q30.gguf
[ -n "${DEMO_ONLY:-}" ] && touch $F.done  # no 30B rows either
[ -f $F ] || [ -n "${DEMO_ONLY:-}" ] || ($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
head -c 2000 models/demo/sample.txt > $L/prompt.txt
for B in 661M 667M; do for SH in auto 0; do for P in lfu lru; do
  echo "== demo: --expert-cache-policy $P, budget $B, cpu-share $SH"
  $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 --ignore-eos \
    --vram-budget $B --cpu-share $SH --expert-cache-policy $P > $L/demo.out 2> $L/demo.err
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; done; done; done
for B in "" "--vram-budget 659M"; do echo "== demo perplexity on sample.txt, CUDA ${B:-all resident}"
  $S perplexity -m models/demo/demo.gguf -f models/demo/sample.txt --ctx 512 $B --json 2> $L/ppl.err | tail -c 600; echo
  grep -E "rror|expert cache" $L/ppl.err | head -2; done
echo "demo rows at $(el) s"
[ -z "${SHORT:-}" ] && cmake --build /tmp/strata -j16 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
grep -E "error" $L/build2.log | head -5
[ -z "${SHORT:-}" ] && timeout 120 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*MappedMisses*:*Budget*:*PromptLoans*' > $L/tests.log 2>&1
echo "test_cuda_engine (mapped misses, budgets, prompt loans) rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Expected|Which is|actual" $L/tests.log | head -24
[ -n "${OUT:-}" ] && cp $L/tests.log $OUT/ 2>/dev/null
while [ ! -f $L/synth.rc ] && [ ! -f $F.done ]; do sleep 2; done; cat $L/synth.rc 2>/dev/null; touch $F.done
[ -z "${DEMO_ONLY:-}" ] && for P in lfu lru; do
  sb -m $F -p 16 -n 64 -r 2 --chunk 4096 --routing uniform --vram-budget 12G --expert-cache-policy $P; done
[ -z "${SHORT:-}" ] && for P in lfu lru; do sb -m $F -p 512,4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G --expert-cache-policy $P; done
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
