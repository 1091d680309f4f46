#!/usr/bin/env bash
# The twenty-third round, one warm machine: the twenty-second round's LFU default measured, the prompt experts'
# fusions checked and measured, then (PROFILE=1) issue 16's pp512 profile of both engines.
#   1. The demo model's real routing at 14% (661M) and 45% (667M) of its experts in slots after a 2000-byte prompt,
#      decoding by default (auto) and alone (--cpu-share 0): hit rate and speed, --expert-cache-policy lfu / lru;
#      its perplexity on sample.txt all resident and at the smallest budget (659M).
#   2. GPU tests: the mapped misses, budgets and prompt loans (partial caches now run LFU where no test names a
#      policy), the prompt experts' fusions against the separate launches, the quantized expert input.
#   3. The 30B-A3B (written in the background) at 12 GiB under uniform routing, lfu / lru alternated (issue 17's
#      bar; the cost of LFU's bookkeeping where no policy can help).
#   4. The 30B all resident, pp512 with STRATA_CUDA_EXPERT_FUSE=1 / 0 alternated (issue 16's unmet bar), and with
#      the experts' MMQ tiles pipelined (STRATA_CUDA_MMQ_PIPE=1).
#   5. PROFILE=1: bench/device-profile.sh qwen3-30b-a3b pp512 on the same file (its own log: /tmp/prof/main.log).
# SHORT=1 (little device time): each A/B once, no pipelined-tiles row, and without PROFILE no llama.cpp build.
# llama.cpp builds in the background at the lowest priority (for 5) from the start unless NO_LLAMA=1. There:
#   setsid nohup bash bench/device-round23.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r23/main.log 570
L=/tmp/r23; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${SHORT:-}" ] && [ -z "${PROFILE:-}" ] && NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/q30.gguf
rm -f $L/synth.rc; [ -f $F ] && touch $L/synth.rc || ($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
head -c 2000 models/demo/sample.txt > $L/prompt.txt
demo() {  # demo BUDGET SHARE POLICY
  echo "== demo: --expert-cache-policy $3, budget $1, cpu-share $2"
  $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 --ignore-eos \
    --vram-budget $1 --cpu-share $2 --expert-cache-policy $3 > $L/demo.out 2> $L/demo.err
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; }
DP="lfu lru lfu lru"; [ -n "${SHORT:-}" ] && DP="lfu lru"
for SH in 0 auto; do for P in $DP; do demo 661M $SH $P; done; done
for P in lfu lru; do demo 667M auto $P; done
for B in "" "--vram-budget 659M"; do echo "== demo perplexity on sample.txt, CUDA ${B:-all resident}"
  $S perplexity -m models/demo/demo.gguf -f models/demo/sample.txt --ctx 512 $B --json 2> $L/ppl.err | tail -c 400; echo
  grep -E "rror" $L/ppl.err | head -2; done
echo "demo rows at $(el) s"
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
grep -E "error" $L/build2.log | head -5
timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*MappedMisses*:*Budget*:*PromptLoans*:*FusedPromptExperts*:*QuantizedExpertInput*' > $L/tests.log 2>&1
echo "test_cuda_engine (mapped misses, budgets, prompt loans, fused prompt experts, quantized input) rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Expected|Which is|actual" $L/tests.log | head -24
[ -n "${OUT:-}" ] && cp $L/tests.log $OUT/ 2>/dev/null
while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc
AB="1 0 1 0"; [ -n "${SHORT:-}" ] && AB="1 0"
for X in $AB; do P=lfu; [ $X = 0 ] && P=lru
  sb -m $F -p 16 -n 64 -r 2 --chunk 4096 --routing uniform --vram-budget 12G --expert-cache-policy $P; done
for X in $AB; do STRATA_CUDA_EXPERT_FUSE=$X sb -m $F -p 512 -n 1 -r 3 --chunk 4096; done
[ -z "${SHORT:-}" ] && STRATA_CUDA_MMQ_PIPE=1 sb -m $F -p 512 -n 1 -r 3 --chunk 4096  # the experts' tiles pipelined (opt-in)
echo "rows done at $(el) s"
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
if [ -n "${PROFILE:-}" ]; then while [ ! -f $L/llama.done ]; do sleep 3; done
  echo "profile: /tmp/prof/main.log"; F=$F bash bench/device-profile.sh qwen3-30b-a3b pp512
  cp /tmp/prof/main.log $L/profile.log; tail -80 /tmp/prof/main.log; fi
echo "done at $(el) s"; echo ALL_DONE
