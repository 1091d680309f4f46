#!/usr/bin/env bash
# A split model on the one-GPU machine (issue 18's emulated participants): the GPU suites' split test first, then two
# participants on the one H200, each with its own budget, against one participant holding the same total, and the
# prompt's chunks pipelined through the parts or not (STRATA_SPLIT_PIPELINE), four sequences' decoding cut into
# micro-passes or not (STRATA_SPLIT_MICROBATCH), in one call (ENGINE_SUITE=1: the rest of
# test_cuda_engine after; TESTS_ONLY=1: the split test alone). Here first: scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry
# .peer): setsid nohup bash bench/device-split.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/split/main.log 570
L=/tmp/split; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1 source bench/device-lib.sh
(cmake --build /tmp/strata -j10 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s") &
TB=$!
F=/tmp/kern30.gguf
[ "${TESTS_ONLY:-0}" = 1 ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s"; }
wait $TB
timeout 240 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Split*' > $L/split.log 2>&1
echo "split tests rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|split " $L/split.log | head -20
[ "${TESTS_ONLY:-0}" = 1 ] && { [ -n "${OUT:-}" ] && cp $L/main.log $L/split.log $OUT/; echo ALL_DONE; exit 0; }
for args in "--vram-budget 12G" "--gpus 0,0 --vram-budget 6G,6G"; do
  sb -m $F -p 512,4096 -n 32 -r 1 --chunk 4096 --routing uniform $args; grep -E "^part|CUDA0:" $L/s.err | head -4
done
[ "${RESIDENT:-0}" = 1 ] && { sb -m $F -p 512 -n 64 -r 1 --chunk 4096; sb -m $F -p 512 -n 64 -r 1 --chunk 4096 --gpus 0,0 --split 24,24; }
grep -E "^part|^split" $L/s.err | head -4
for pipe in 1 0; do STRATA_SPLIT_PIPELINE=$pipe sb -m $F -p 4096 -n 1 -r 1 --chunk 1024 --gpus 0,0 --split 24,24; done
# four sequences decoding: micro-passes through the pipeline (one a part) against the parts in turn, under the budget
for micro in 1 0; do STRATA_SPLIT_PIPELINE=1 STRATA_SPLIT_MICROBATCH=$micro sb -m $F -p 16 -n 32 -r 1 --parallel 4 \
  --routing uniform --gpus 0,0 --vram-budget 6G,6G; done
if [ "${ENGINE_SUITE:-0}" = 1 ]; then
  timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="-*Split*" > $L/engine.log 2>&1
  echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine.log | head
fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/split.log $OUT/ 2>/dev/null
echo ALL_DONE
