#!/usr/bin/env bash
# Why the decode kernels take what they take (issue 16): Nsight Compute's speed-of-light, occupancy, launch and
# warp-state sections for the kernels named by KERNELS (a regular expression on the kernel name; default every kernel
# of a 30B decode layer), over the first decoding passes of the 30B file, then a CUPTI timeline of the same decode
# inside its graphs and an untimed-trace baseline row; no llama.cpp. Here first: ../shared/peer/prepare.sh &&
# scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-ncu.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/ncu/main.log 570
# The full report stays in /tmp/ncu/report.txt (copied to $OUT where OUT is set).
L=/tmp/ncu; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/kern30.gguf
[ -f $F ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
sb -m $F -p 512 -n 128 -r 2 --chunk 4096
K=${KERNELS:-flash_decode|router_fused|quantize_act|k_mmvq|rms_norm|qk_norm_rope|kv_store|moe_pair|moe_combine}
# STRATA_CUDA_GRAPHS=0: the kernels one by one, as ncu replays each (the same kernels a graph holds); the pass of
# -p 1 comes first, then decoding: skip the embedding pass's first layer
STRATA_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --kernel-name "regex:$K" -s 20 -c ${NCU_COUNT:-34} \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  $S bench -m $F -p 1 -n 4 -r 1 > $L/report.txt 2> $L/ncu.err
echo "ncu rc=$? at $(el) s"; tail -3 $L/ncu.err
[ -n "${OUT:-}" ] && cp $L/report.txt $OUT/ 2>/dev/null
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Block Size|Grid Size" $L/report.txt | head -230
bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/strata.csv $S bench -m $F -p 1 -n 32 -r 1 > $L/tr.out 2>&1
python3 -m tools.profile.timeline $L/strata.csv --marker embed --passes 16 | head -40
[ -n "${OUT:-}" ] && cp $L/strata.csv $OUT/ 2>/dev/null
echo ALL_DONE
