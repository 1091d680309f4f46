#!/usr/bin/env bash
# The twenty-first round's device work, one script over two calls (poll again in the second):
#   0. The prompts' favourites on the demo model (issue 17's cache policy): decode hit rates with and without.
#   1. The prompt-loan GPU test with its budget sweep at a fixed 1024-token chunk (new in the twentieth round, not run).
#   2. Issue 15: Next-80B-A3B at 12 GiB, pp4096 with the prompt's shared expert first and after
#      (STRATA_PREFILL_SHARED_FIRST=0), and once with STRATA_PREFILL_TIMING=1 (the upload and copy_wait phases).
#   3. Issue 17: Next-80B at 12 GiB under uniform routing, tg32, beside llama.cpp's best configuration at about that
#      memory (-ncmoe 40, 12.7 GiB in ../shared/peer), Strata before and after it.
#   4. Issue 16: the 30B all in VRAM, pp512 with five repetitions on both engines (llama.cpp's pp512 spread was
#      ±1916 of 7931 at -r 2), Strata before and after it; the Next-80B file is deleted first (the disk holds one).
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-round21.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r21/main.log 570
L=/tmp/r21; mkdir -p $L
exec > $L/main.log 2>&1
source bench/device-lib.sh
F=/tmp/n80.gguf
[ -f $F ] || ($S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
# The prompts' favourites (STRATA_PROMPT_FAVOURITES) on the demo model's real routing: decode hit rate and speed
# after a 2000-byte prompt, at budgets that leave a small share of its 384 experts in slots, decoding alone
# (--cpu-share 0: misses read in place, nothing filled) and by default.
head -c 2000 models/demo/sample.txt > $L/prompt.txt
$S run -m models/demo/demo.gguf --vram-budget 1M -p x -n 1 2>&1 | grep -o "give at least [0-9.]* [KMG]i*B" | head -1
for B in 692M 696M 702M; do for SH in 0 auto; do for FAV in 1 0; do
  echo "== STRATA_PROMPT_FAVOURITES=$FAV budget $B cpu-share $SH"
  STRATA_PROMPT_FAVOURITES=$FAV $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 \
    --ignore-eos --vram-budget $B --cpu-share $SH > $L/demo.out 2> $L/demo.err
  grep -E "slots|hits|rror" $L/demo.err | tail -3; done; done; done
echo "demo rows at $(el) s"
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
grep -E "error" $L/build2.log | head -5
timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*PromptLoans*' > $L/tests.log 2>&1
echo "test_cuda_engine (prompt loans) rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Skipped|skipped|Expected|Which is|actual" $L/tests.log | head -20
[ -n "${OUT:-}" ] && cp $L/tests.log $OUT/ 2>/dev/null
while [ ! -f $L/synth.rc ] && [ ! -f $F.done ]; do sleep 2; done; cat $L/synth.rc 2>/dev/null; touch $F.done
P="-m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G"
sb $P
STRATA_PREFILL_SHARED_FIRST=0 sb $P
sb $P
STRATA_PREFILL_TIMING=1 sb $P; grep -E "^\| (phase|mixer|route|readback|group|upload|copy_wait|experts|host|combine|shared) |could not" $L/s.txt | tail -11
U="-m $F -p 16 -n 32 -r 2 --chunk 4096 --routing uniform --vram-budget 12G"
sb $U
lb -ncmoe 40 -p 0 -n 32 -r 2
sb $U
rm -f $F $F.done
F=/tmp/q30.gguf
$S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth30.log 2>&1; echo "synth 30B rc=$? at $(el) s"
R="-m $F -p 512 -n 128 -r 5 --chunk 4096"
sb $R
lb -p 512 -n 128 -r 5
sb $R
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
