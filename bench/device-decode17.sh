#!/usr/bin/env bash
# One device call: issue 17's 30B-A3B row side by side on whatever host the call lands on (the hosts' CPUs differ by
# 2x in the host's expert rate, which moves both engines' decoding under a budget). llama.cpp is built first with
# every core (only llama-bench), Strata beside it; the GPU test of mapped misses runs while they compile; the bench
# rows run only after both builds, with nothing beside them: Strata at 12 GiB under uniform routing, llama.cpp's best
# configuration at about the same memory (-ncmoe 26), Strata again. Here first: ../shared/peer/prepare.sh &&
# scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-decode17.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/d17/main.log 580
L=/tmp/d17; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
(cd /tmp && rm -rf llama.cpp && tar xzf $R/.peer/llama.tgz && cd llama.cpp &&
  cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release > $L/llama-cfg.log 2>&1 &&
  cmake --build build --target llama-bench -j16 > $L/llama-build.log 2>&1; echo "llama build rc $?" > $L/llama.rc) &
NO_LLAMA=1 source bench/device-lib.sh
F=/tmp/d17.gguf
$S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"
cmake --build /tmp/strata -j8 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
timeout 120 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*MappedMissesDoNotChangeABit*' > $L/tests.log 2>&1
echo "test_cuda_engine (mapped misses) rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|tests ran" $L/tests.log | head -10
while [ ! -f $L/llama.rc ]; do sleep 2; done; cat $L/llama.rc; echo "at $(el) s"
U="-m $F -p 16 -n 64 -r 1 --chunk 4096 --vram-budget 12G --routing uniform"
sb $U
LB=/tmp/llama.cpp/build/bin/llama-bench
[ -x $LB ] && { echo "== llama-bench -ncmoe 26 -p 0 -n 64 at $(el) s"
  bash .peer/device.sh peak $LB -m $F -ngl 99 -ncmoe 26 -lm none -fa 1 -t 16 -ub 4096 -b 4096 -p 0 -n 64 -r 2 > $L/l.txt 2>&1
  grep -E "^\| |peak" $L/l.txt | grep -v -- "---"; }
sb $U
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
