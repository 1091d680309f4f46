#!/usr/bin/env bash
# bench/device-favourites.sh cut to a short call (for a session with little device time left): one build of both
# targets, the GPU tests the favourites touch (mapped misses, with their new on/off arms; prompt loans), then the
# demo model's decode hit rates with and without at two budgets, decoding alone (--cpu-share 0).
# There: setsid nohup bash bench/device-fav-short.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/favs/main.log 400
L=/tmp/favs; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
S=/tmp/strata/bin/strata
cmake -S . -B /tmp/strata -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 \
  -DCMAKE_PREFIX_PATH=/tmp/deps/usr -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf \
  -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest -DSTRATA_PYTHON=/nonexistent > $L/cfg.log 2>&1
cmake --build /tmp/strata -j16 --target test_cuda_engine strata > $L/build.log 2>&1
echo "build rc=$? at $(el) s"; grep -E "error" $L/build.log | head -5
timeout 170 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*MappedMisses*:*PromptLoans*' > $L/tests.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Expected|Which is|actual" $L/tests.log | head -20
head -c 2000 models/demo/sample.txt > $L/prompt.txt
for B in 661M 667M; do for FAV in 1 0; do
  STRATA_PROMPT_FAVOURITES=$FAV $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 \
    --ignore-eos --vram-budget $B --cpu-share 0 > $L/demo.out 2> $L/demo.err
  echo "== favourites $FAV, budget $B, cpu-share 0: $(grep -o 'expert cache [0-9]* slots ([^)]*)' $L/demo.err | head -1)"
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; done; done
echo "done at $(el) s"; echo ALL_DONE
