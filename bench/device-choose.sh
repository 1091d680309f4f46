#!/usr/bin/env bash
# One device call (that may run on into the next, while the machine is warm) of the decode mode's rows (tenth
# round, bench/RESULTS.md): the GPU tests of mapped misses, the split and loans first; then on the 30B-A3B and
# Next-80B at 12 GiB, `--routing uniform` decoding with the defaults (each pass alone or split by measured time),
# `--cpu-share 0` (alone), `STRATA_DECODE_CHOOSE=0` (split, misses copied in), the 30B under zipf:1.0 too, llama.cpp's
# best configuration's tg beside each file. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh &&
# cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-choose.sh > /dev/null 2>&1 < /dev/null &
#   bash bench/poll.sh /tmp/choose/main.log 570
L=/tmp/choose; mkdir -p $L; rm -f $L/main.log $L/strata-all.txt
exec > $L/main.log 2>&1
source bench/device-lib.sh
F=/tmp/choose-30b.gguf
($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; touch $L/synth.done) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1
/tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Mapped*:*Hybrid*:*Graphs*:*Loan*:*CopyRate*' \
    > $L/eng.log 2>&1
echo "test_cuda_engine (mapped, hybrid, graphs, loans, rates) rc=$? at $(el) s"; grep -E "FAILED|PASSED" $L/eng.log | head
while [ ! -f $L/synth.done ]; do sleep 2; done; echo "synth at $(el) s"
U="-m $F -r 1 --chunk 4096 -p 16 -n 64 --vram-budget 12G"
sb $U --routing uniform
sb $U --routing uniform --cpu-share 0
STRATA_DECODE_CHOOSE=0 sb $U --routing uniform
sb $U --routing zipf:1.0
STRATA_DECODE_CHOOSE=0 sb $U --routing zipf:1.0
sb ${U/-n 64/-n 256} --routing uniform
lb -ncmoe 26 -p 512 -n 64
rm -f $F; F=/tmp/choose-80b.gguf
$S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth80.log 2>&1; echo "synth 80B at $(el) s"
U="-m $F -r 1 --chunk 16384 -p 16 -n 32 --vram-budget 12G"
sb $U --routing uniform
sb $U --routing uniform --cpu-share 0
STRATA_DECODE_CHOOSE=0 sb $U --routing uniform
lb -ncmoe 40 -p 512 -n 32
sb ${U/-n 32/-n 128} --routing uniform
cp $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
