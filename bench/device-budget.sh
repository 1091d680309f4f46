#!/usr/bin/env bash
# One device call of one file's figures at a 12 GiB budget and all resident, llama.cpp beside Strata (tenth round,
# bench/RESULTS.md): the GPU tests of the mapped misses, loans and the bus rate first, and the host's copy rate; then
# prefill with the experts' host stratum pinned (also with `STRATA_PREFILL_SCHEDULE=predicted`) and mapped
# (`--host-mem mmap`, the stager, with its default 8 threads and with 15), prefill and decode all resident, decode
# under `--routing uniform` with the defaults (the decode mode), the device alone and split always
# (`STRATA_DECODE_CHOOSE=0`), and (the 30B) under zipf:1.0 with LRU and LFU, each with the decode mode and split
# always; the host's expert mat-vec in its AVX2 and AVX-512 forms (bench_host_experts, and decode under uniform
# routing with `STRATA_CPU_ISA=avx2`); four sequences decoding together (`--parallel 4`, llama-batched-bench -npl 4).
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There
# (carry .peer; start it in the background and poll until /tmp/budget/main.log says ALL_DONE, in the same call or
# the next one right after; a machine still warm from the call before keeps both builds):
#   setsid nohup bash bench/device-budget.sh [qwen3-30b-a3b|qwen3-next-80b-a3b] > /dev/null 2>&1 < /dev/null &
#   bash bench/poll.sh /tmp/budget/main.log 570
PRESET=${1:-qwen3-30b-a3b}
case $PRESET in
qwen3-next-80b-a3b) NCMOE=40; CHUNK=16384; N=32; PP=4096,16384; RPP=512,4096,16384; ZIPF=0; PEER_RESIDENT=0 ;;
qwen3-30b-a3b) NCMOE=26; CHUNK=4096; N=64; PP=512,4096; RPP=512,4096; ZIPF=1; PEER_RESIDENT=1 ;;
*) echo "device-budget.sh: presets are qwen3-30b-a3b and qwen3-next-80b-a3b" >&2; exit 2 ;;
esac
L=/tmp/budget; mkdir -p $L; rm -f $L/main.log $L/strata-all.txt $L/synth.done
exec > $L/main.log 2>&1
F=/tmp/budget-$PRESET.gguf
source bench/device-lib.sh
rm -f /tmp/budget-*.gguf.part
ls /tmp/budget-*.gguf 2>/dev/null | grep -v "$F" | xargs -r rm -f  # the disk holds one big file
if [ ! -f $F ]; then ($S synth --preset $PRESET --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  touch $L/synth.done) &
else touch $L/synth.done; fi
if [ ! -f $L/tests.done ]; then
  cmake --build /tmp/strata -j12 --target test_cuda_engine test_cuda_ops bench_host_experts > $L/build2.log 2>&1
  /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter='*Router*:*Upload*:*MmvqHost*' > $L/ops.log 2>&1
  echo "test_cuda_ops (router, upload, host mat-vec) rc=$? at $(el) s"; grep -E "FAILED|PASSED" $L/ops.log | head
  /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Mapped*:*Hybrid*:*Graphs*:*RouteOverride*:*Loan*:*CopyRate*:*Schedules*' \
      > $L/eng.log 2>&1
  echo "test_cuda_engine (mapped, hybrid, graphs, override, loans, rates, schedules) rc=$? at $(el) s"
  grep -E "FAILED|PASSED" $L/eng.log | head; touch $L/tests.done
  for isa in avx2 avx512; do for shape in "--ff 768 --jobs 2" "--ff 512 --jobs 4"; do
    echo "== STRATA_CPU_ISA=$isa bench_host_experts $shape"
    STRATA_CPU_ISA=$isa /tmp/strata/bin/bench_host_experts --threads 1,8,15 --calls 400 --dim 2048 $shape 2>&1 |
      grep -vE "^[0-9]+ calls"
  done; done
fi
# the host's copy rate (the stager's work is such copies), on 1 and on all threads
python3 -c "
import time, torch
a = torch.ones(1 << 30, dtype=torch.uint8); b = torch.empty_like(a)
for n in (1, 8, torch.get_num_threads()):
    torch.set_num_threads(n); b.copy_(a); t = time.time()
    for _ in range(4): b.copy_(a)
    print('host memcpy, %d threads: %.1f GB/s' % (n, 4 * a.numel() / (time.time() - t) / 1e9))
" 2>&1 | tail -3
while [ ! -f $L/synth.done ]; do sleep 2; done; echo "synth at $(el) s"
B="-m $F -r 1 --chunk $CHUNK"
U="$B -p 16 -n $N --vram-budget 12G"
sb $B -p $PP -n 1 --vram-budget 12G
STRATA_PREFILL_SCHEDULE=predicted sb $B -p $PP -n 1 --vram-budget 12G
sb $B -p $PP -n 1 --vram-budget 12G --host-mem mmap
STRATA_CUDA_STAGER_THREADS=15 sb $B -p $PP -n 1 --vram-budget 12G --host-mem mmap
sb $U --routing uniform
sb $U --routing uniform --cpu-share 0
STRATA_DECODE_CHOOSE=0 sb $U --routing uniform
STRATA_CPU_ISA=avx2 sb $U --routing uniform
sb $U --routing uniform --parallel 4
sb $B -p $RPP -n $((2 * N))
if [ $ZIPF = 1 ]; then
  sb $U --routing zipf:1.0
  STRATA_DECODE_CHOOSE=0 sb $U --routing zipf:1.0
  sb $U --routing zipf:1.0 --expert-cache-policy lfu
  STRATA_DECODE_CHOOSE=0 sb $U --routing zipf:1.0 --expert-cache-policy lfu
fi
lb -ncmoe $NCMOE -p $PP -n $N
lbb -ncmoe $NCMOE -npp 16 -ntg $N -npl 4
[ $PEER_RESIDENT = 1 ] && lb -p $RPP -n $((2 * N))  # the 80B's resident pair was measured in one call in the eighth round
cp $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
