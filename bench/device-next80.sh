#!/usr/bin/env bash
# One device call for the eighteenth round's second step: the whole of test_cuda_engine (the split tests' new form,
# the mapped misses' admission now opt-in), then on the Next-80B-A3B file at 12 GiB the mapped tier against the
# pinned copy at pp4096 (the stager's stores past the caches, STRATA_CUDA_STAGER_NT, and its threads now the cores
# less one) and one uniform decode row with STRATA_DECODE_TIMING=1 (where a split pass's time goes). No llama.cpp.
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-next80.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/n80/main.log 570
L=/tmp/n80; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1 source bench/device-lib.sh
before() { [ "$(el)" -lt "$1" ] || { echo "(skipped at $(el) s: $2)"; return 1; }; }
F=/tmp/n80.gguf
($S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s" > $L/synth.rc) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
timeout 260 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/tests.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|tests ran" $L/tests.log | head -20
while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc
P="-m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G"
before 480 "pinned" && sb $P
before 500 "mapped" && sb $P --host-mem mmap
before 520 "mapped, memcpy" && STRATA_CUDA_STAGER_NT=0 sb $P --host-mem mmap
before 530 "decode timing" && STRATA_DECODE_TIMING=1 sb -m $F -p 16 -n 32 -r 1 --chunk 4096 --vram-budget 12G --routing uniform
grep -A12 "^| phase |" $L/s.txt
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
