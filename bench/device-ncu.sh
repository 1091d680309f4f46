#!/usr/bin/env bash
# Why a few decode kernels take what they take (issue 16): Nsight Compute's speed-of-light, occupancy, launch and
# warp-state sections for the kernels named by KERNELS (a regular expression on the kernel name; default the
# short-context decode attention, its merge, the fused router and the Q8_K quantization), over the first decoding
# passes of the 30B file, no llama.cpp. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp
# ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-ncu.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/ncu/main.log 570
# The full report stays in /tmp/ncu/report.txt (copy it to $OUT).
L=/tmp/ncu; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/kern30.gguf
[ -f $F ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
K=${KERNELS:-flash_decode_part|flash_decode_merge|router_fused|quantize_act_q8_k}
# STRATA_CUDA_GRAPHS=0: the kernels one by one, as ncu replays each (the same kernels a graph holds)
STRATA_CUDA_GRAPHS=0 timeout 400 ncu --clock-control none --kernel-name "regex:$K" -c 16 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  $S bench -m $F -p 1 -n 4 -r 1 > $L/report.txt 2> $L/ncu.err
echo "ncu rc=$? at $(el) s"; tail -3 $L/ncu.err
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Block Size|Grid Size" $L/report.txt | head -120
echo ALL_DONE
