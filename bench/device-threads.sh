#!/usr/bin/env bash
# One device call, no llama.cpp (eleventh round, bench/RESULTS.md): Next-80B at 12 GiB, prefill with the auto schedule
# (which now takes the predicted schedule below the full one's line), then decode under `--routing uniform` with the
# host's pool at its default size (the cores less one) and at 8 and 11 threads (`--cpu-threads`; bench_host_experts
# found 8 faster than 15 on the H200 machine's 16 cores), one and four sequences; then, time allowing, the 30B's
# prefill at 12 GiB (auto against routed), where auto now takes the predicted schedule.
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry
# .peer): setsid nohup bash bench/device-threads.sh > /dev/null 2>&1 < /dev/null & sleep 5
#        bash bench/poll.sh /tmp/threads/main.log 570
L=/tmp/threads; mkdir -p $L; rm -f $L/main.log $L/strata-all.txt
exec > $L/main.log 2>&1
NO_LLAMA=1
F=/tmp/budget-qwen3-next-80b-a3b.gguf
source bench/device-lib.sh
if [ ! -f $F ]; then $S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; fi
echo "synth at $(el) s"
B="-m $F -r 1 --chunk 16384"
U="$B -p 16 -n 32 --vram-budget 12G --routing uniform"
sb $B -p 4096,16384 -n 1 --vram-budget 12G
sb $U
sb $U --cpu-threads 8
sb $U --cpu-threads 11
sb $U --parallel 4 --cpu-threads 8
if [ $(el) -lt 330 ]; then
  rm -f $F; F=/tmp/budget-qwen3-30b-a3b.gguf
  $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth at $(el) s"
  sb -m $F -r 1 --chunk 4096 -p 512,4096 -n 1 --vram-budget 12G
  [ $(el) -lt 400 ] && STRATA_PREFILL_SCHEDULE=routed sb -m $F -r 1 --chunk 4096 -p 512,4096 -n 1 --vram-budget 12G
fi
cp $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
