#!/usr/bin/env bash
# One device call for the eighteenth round's third step: the GPU tests of mapped misses (now with the passes' timing
# on in one case) and the split, then where a decoding pass under a budget spends its time (STRATA_DECODE_TIMING=1,
# fixed to take no timestamp inside a recorded pass): the 30B-A3B at 12 GiB under uniform routing, the decode mode's
# choice and the GPU alone (--cpu-share 0) and a fixed share near the rates' ratio (--cpu-share 0.4); the mapped tier
# with the stager's stores past the caches and not, both at the default threads; then Next-80B's uniform decode with
# the timing. No llama.cpp. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp
# ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-timing.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/tm/main.log 570
L=/tmp/tm; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1 source bench/device-lib.sh
before() { [ "$(el)" -lt "$1" ] || { echo "(skipped at $(el) s: $2)"; return 1; }; }
F=/tmp/tm30.gguf
($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s" > $L/synth.rc) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Mapped*:*Split*' > $L/tests.log 2>&1
echo "test_cuda_engine (mapped, split) rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|tests ran" $L/tests.log | head -20
while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc
phases() { grep -A12 "^| phase |" $L/s.txt; }
U="-m $F -p 16 -n 64 -r 1 --chunk 4096 --vram-budget 12G --routing uniform"
before 400 "30B timing" && { STRATA_DECODE_TIMING=1 sb $U; phases; STRATA_DECODE_TIMING=1 sb $U --cpu-share 0; phases; }
before 420 "fixed share" && sb $U --cpu-share 0.4
P="-m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G --host-mem mmap"
before 430 "mapped tier" && { sb $P; STRATA_CUDA_STAGER_NT=1 sb $P; }
rm -f $F
G=/tmp/tm80.gguf
before 420 "Next-80B" && { $S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $G > $L/synth2.log 2>&1
  echo "synth rc=$? at $(el) s"
  before 530 "Next-80B timing" && { STRATA_DECODE_TIMING=1 sb -m $G -p 16 -n 32 -r 1 --chunk 4096 --vram-budget 12G --routing uniform; phases; }; }
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
