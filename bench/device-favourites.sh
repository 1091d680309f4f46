#!/usr/bin/env bash
# The prompts' favourites (STRATA_PROMPT_FAVOURITES) on the GPU, one call:
#   1. GPU tests with them on (the default): mapped misses, graphs, prompt loans, the split's participants;
#   2. the demo model's real routing: a 2000-byte prompt of models/demo/sample.txt, 512 tokens decoded greedily
#      (--repeat-penalty 1.15), at budgets that leave 10-40% of its 384 experts in slots (the demo model's whole
#      expert cache is 19 MiB: the budgets sit a few MiB above the minimum the plan names), with and without, decoding
#      alone (--cpu-share 0: misses read in place, nothing filled) and by default (auto).
# There: setsid nohup bash bench/device-favourites.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/fav/main.log 570
L=/tmp/fav; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
(cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s" > $L/build2.rc) &
head -c 2000 models/demo/sample.txt > $L/prompt.txt
$S run -m models/demo/demo.gguf --vram-budget 1M -p x -n 1 2>&1 | grep -o "give at least [0-9.]* [KMG]i*B" | head -1
for B in 661M 665M 670M; do for SH in 0 auto; do for FAV in 1 0; do
  STRATA_PROMPT_FAVOURITES=$FAV $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 \
    --ignore-eos --vram-budget $B --cpu-share $SH > $L/demo.out 2> $L/demo.err
  echo "== favourites $FAV, budget $B, cpu-share $SH: $(grep -o 'expert cache [0-9]* slots ([^)]*)' $L/demo.err | head -1)"
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; done; done; done
echo "demo rows at $(el) s"
while [ ! -f $L/build2.rc ]; do sleep 2; done; cat $L/build2.rc; grep -E "error" $L/build2.log | head -5
timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*MappedMisses*:*Graph*:*PromptLoans*:*SplitOverTwo*:*Budget*' > $L/tests.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Expected|Which is|actual" $L/tests.log | head -20
[ -n "${OUT:-}" ] && cp $L/main.log $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
