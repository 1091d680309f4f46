#!/usr/bin/env bash
# The twenty-second round's device work, one script over two or three calls (poll again in each next call):
#   1. The whole GPU test binary on this round's code (the prompts' favourites are on by default wherever the cache
#      is partial, so every partial-cache test with a prompt runs them), built while the Next-80B file is written.
#   2. The demo model's real routing (issue 17's cache policy): decode hit rates after a 2000-byte prompt with the
#      prompts' favourites on and off, at budgets that leave a small share of its 384 experts in slots, decoding
#      alone (--cpu-share 0: misses read in place) and by default; then --expert-profile: a run that writes the
#      profile, and a short prompt decoded with it and without it.
#   3. Issue 17: Next-80B-A3B Q4_K at 12 GiB under uniform routing, tg32, beside llama.cpp's best configuration at
#      about that memory (-ncmoe 40), Strata before and after it; issue 15: pp4096 at 12 GiB beside llama.cpp's.
#   4. Issue 16: the 30B all in VRAM, pp512 / tg128 with five repetitions on both engines, Strata before and after.
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-round22.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r22/main.log 570
L=/tmp/r22; mkdir -p $L
exec > $L/main.log 2>&1
F=/tmp/n80.gguf
source bench/device-lib.sh
[ -f $F ] || ($S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
grep -E "error" $L/build2.log | head -5
timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/tests.log 2>&1
echo "test_cuda_engine (all) rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Expected|Which is|actual" $L/tests.log | head -24
[ -n "${OUT:-}" ] && cp $L/tests.log $OUT/ 2>/dev/null
head -c 2000 models/demo/sample.txt > $L/prompt.txt
$S run -m models/demo/demo.gguf --vram-budget 1M -p x -n 1 2>&1 | grep -o "give at least [0-9.]* [KMG]i*B" | head -1
demo() { $S run -m models/demo/demo.gguf -n 512 --temp 0 --repeat-penalty 1.15 --ignore-eos "$@" > $L/demo.out 2> $L/demo.err
  echo "   $(grep -o 'expert cache [0-9]* slots ([^)]*)' $L/demo.err | head -1)"
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; }
for B in 661M 667M; do for SH in 0 auto; do for FAV in 1 0; do
  echo "== favourites $FAV, budget $B, cpu-share $SH"
  STRATA_PROMPT_FAVOURITES=$FAV demo -f $L/prompt.txt --vram-budget $B --cpu-share $SH; done; done; done
echo "== profile written by a 2000-byte prompt's run"; rm -f $L/p.gguf $L/none.gguf
demo -f $L/prompt.txt --vram-budget 661M --cpu-share 0 --expert-profile $L/p.gguf; ls -l $L/p.gguf
tail -c 3000 models/demo/sample.txt | head -c 120 > $L/short.txt
echo "== a 120-byte prompt with the profile"; demo -f $L/short.txt --vram-budget 661M --cpu-share 0 --expert-profile $L/p.gguf
echo "== the same without one"; demo -f $L/short.txt --vram-budget 661M --cpu-share 0 --expert-profile $L/none.gguf
echo "demo rows at $(el) s"
while [ ! -f $L/synth.rc ] && [ ! -f $F.done ]; do sleep 2; done; cat $L/synth.rc 2>/dev/null; touch $F.done
U="-m $F -p 16 -n 32 -r 2 --chunk 4096 --routing uniform --vram-budget 12G"
sb $U
lb -ncmoe 40 -p 0 -n 32 -r 2
sb $U
sb -m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G
lb -ncmoe 40 -p 4096 -n 0 -r 1
rm -f $F $F.done
F=/tmp/q30.gguf
$S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth30.log 2>&1; echo "synth 30B rc=$? at $(el) s"
R="-m $F -p 512 -n 128 -r 5 --chunk 4096"
sb $R
lb -p 512 -n 128 -r 5
sb $R
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
