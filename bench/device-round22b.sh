#!/usr/bin/env bash
# The twenty-second round's second call: issue 17's rows still missing beside llama.cpp, one call (poll again):
#   1. Next-layer prefetch (STRATA_DECODE_PREFETCH=1) against off: the demo model's real routing at a budget that
#      leaves 14% of its experts in slots (decoding alone and by default), and Next-80B at 12 GiB under the
#      synthetic router (--routing model; under uniform draws no prediction can help).
#   2. Next-80B at 12 GiB, four sequences (--parallel 4) beside llama-batched-bench -npl 4 (-ncmoe 40).
#   3. The 30B at 12 GiB under uniform routing, tg64, beside llama.cpp -ncmoe 26, Strata before and after.
# The GPU tests of this code ran in the first call (bench/device-round22.sh). Here first as there. There:
#   setsid nohup bash bench/device-round22b.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r22b/main.log 570
L=/tmp/r22b; mkdir -p $L
exec > $L/main.log 2>&1
F=/tmp/n80.gguf
source bench/device-lib.sh
[ -f $F ] || ($S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
head -c 2000 models/demo/sample.txt > $L/prompt.txt
for SH in 0 auto; do for PF in 1 0; do
  echo "== demo: STRATA_DECODE_PREFETCH=$PF, budget 661M, cpu-share $SH (beside the llama.cpp build)"
  STRATA_DECODE_PREFETCH=$PF $S run -m models/demo/demo.gguf -f $L/prompt.txt -n 512 --temp 0 --repeat-penalty 1.15 \
    --ignore-eos --vram-budget 661M --cpu-share $SH > $L/demo.out 2> $L/demo.err
  grep -E "generated|rror" $L/demo.err | tail -2; md5sum < $L/demo.out; done; done
while [ ! -f $L/synth.rc ] && [ ! -f $F.done ]; do sleep 2; done; cat $L/synth.rc 2>/dev/null; touch $F.done
while [ ! -f $L/llama.done ]; do sleep 3; done; echo "llama.cpp built at $(el) s"
lbb -ncmoe 40 -npp 16 -ntg 32 -npl 4
sb -m $F -p 16 -n 32 -r 2 --chunk 4096 --routing uniform --vram-budget 12G --parallel 4
for PF in 1 0; do STRATA_DECODE_PREFETCH=$PF sb -m $F -p 16 -n 32 -r 2 --chunk 4096 --vram-budget 12G
  grep -E "next-layer prediction" $L/s.txt; done
rm -f $F $F.done
F=/tmp/q30.gguf
$S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth30.log 2>&1; echo "synth 30B rc=$? at $(el) s"
T="-m $F -p 16 -n 64 -r 2 --chunk 4096 --routing uniform --vram-budget 12G"
sb $T
lb -ncmoe 26 -p 0 -n 64 -r 2
sb $T
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
