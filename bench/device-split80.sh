#!/usr/bin/env bash
# Where a Next-80B decoding pass goes at 12 GiB under uniform routing when the host computes part of the misses
# (issue 17's row: 1.27-1.38x of llama.cpp on the thirty-fifth round's H100 host, bar 1.5x), in two calls (the 43 GB
# file takes one to five minutes to write, beside the build): with every decode-sized pass split with the host
# (STRATA_DECODE_CHOOSE=0) its phases by layer (STRATA_DECODE_TIMING=1: host and device ms), the CUPTI trace of a
# split decode (tools/profile/kernel_trace.cpp) summarised pass by pass by tools/profile/timeline.py (the GPU's busy
# and idle time, its kernels and the copies beside them), then the default row, the split row, fixed host shares and
# the host's expert rate alone (bench_host_experts).
# There (carry .peer):
#   setsid nohup bash bench/device-split80.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/s80/main.log 570
L=/tmp/s80; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/qwen3-next-80b-a3b.gguf
synth_start qwen3-next-80b-a3b $F
bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
cmake --build /tmp/strata -j12 --target bench_host_experts > $L/build3.log 2>&1 || tail -3 $L/build3.log
synth_wait
B="-m $F -p 16 -n 32 --chunk 4096 --routing uniform --vram-budget 12G"
(export STRATA_DECODE_CHOOSE=0 STRATA_DECODE_TIMING=1; sb $B -r 1; grep -A14 "^| phase |" $L/s.txt)
STRATA_DECODE_CHOOSE=0 CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/split.csv \
  $S bench -m $F -p 16 -n 24 -r 1 --chunk 4096 --routing uniform --vram-budget 12G > $L/split.out 2>&1
echo "== traced split decode rc=$? at $(el) s"; grep -E "tg24" $L/split.out
python3 -m tools.profile.timeline $L/split.csv --marker embed --passes 8 --each | head -70
sb $B -r 2
STRATA_DECODE_CHOOSE=0 sb $B -r 2
for SH in 0.3 0.5 0.7; do STRATA_DECODE_CHOOSE=0 sb $B -r 1 --cpu-share $SH; done
# the host's rate alone on Next-80B's expert shape, four a call as a split layer gives it
/tmp/strata/bin/bench_host_experts --threads 8,15 --calls 400 --dim 2048 --ff 512 --jobs 4 2>&1 | tail -4
[ -n "${OUT:-}" ] && gzip -c $L/split.csv > $OUT/split.csv.gz
echo "done at $(el) s"; echo ALL_DONE
