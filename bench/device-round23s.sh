#!/usr/bin/env bash
# bench/device-round23.sh cut to a call of a few minutes (what a session's last device time allows): the strata
# binary and test_cuda_engine built together; the GPU tests of the prompt experts' fusions, the quantized expert
# input, prompt loans and mapped misses (partial caches under the LFU default); the demo model's decode at 14% of its
# experts in slots, lfu / lru, split and alone; then the 30B rows of device-round23.sh, once each, as time allows. There:
#   setsid nohup bash bench/device-round23s.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r23/main.log 500
L=/tmp/r23; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
source .peer/device.sh env; source scripts/device-env.sh
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
cmake -S . -B /tmp/strata $CM > $L/cfg.log 2>&1 && cmake --build /tmp/strata -j16 --target strata test_cuda_engine \
  > $L/build.log 2>&1
echo "build rc=$? at $(el) s"; grep -E "error" $L/build.log | head -5
S=/tmp/strata/bin/strata
timeout 120 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*FusedPromptExperts*:*QuantizedExpertInput*:*PromptLoans*:*MappedMisses*' > $L/tests.log 2>&1
echo "test_cuda_engine (fused prompt experts, quantized input, prompt loans, mapped misses) rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Expected|Which is|actual" $L/tests.log | head -24
[ -n "${OUT:-}" ] && cp $L/tests.log $OUT/ 2>/dev/null
head -c 2000 models/demo/sample.txt > $L/prompt.txt
for SH in 0 auto; do for P in lfu lru; do echo "== demo: --expert-cache-policy $P, budget 661M, cpu-share $SH"
  $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 --ignore-eos \
    --vram-budget 661M --cpu-share $SH --expert-cache-policy $P > $L/demo.out 2> $L/demo.err
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; done; done
echo "demo rows at $(el) s"
F=/tmp/q30.gguf
[ -f $F ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
T00=$T0; source bench/device-lib.sh; T0=$T00  # sb (the build above is current)
for X in 1 0; do P=lfu; [ $X = 0 ] && P=lru
  sb -m $F -p 16 -n 64 -r 2 --chunk 4096 --routing uniform --vram-budget 12G --expert-cache-policy $P; done
for X in 1 0; do STRATA_CUDA_EXPERT_FUSE=$X sb -m $F -p 512 -n 1 -r 3 --chunk 4096; done
echo "done at $(el) s"; echo ALL_DONE
