#!/usr/bin/env bash
# Why a 4096-token prompt pass's dense Q8_0 matmuls and attention take what they take (issue 16: the dense k_mmq at
# 1.90 ms a layer against llama.cpp's 0.77, k_flash_mma 1.24 against 1.04): Nsight Compute's speed-of-light,
# occupancy, launch, scheduler, warp-state and memory sections for the k_mmq and k_flash_mma launches of one layer of
# the 30B file's pp4096 pass (the experts' k_mmq come with them), kernels one by one. No llama.cpp. A warm machine
# keeps the file (/tmp/q30.gguf). There (carry .peer):
#   setsid nohup bash bench/device-ncu-prefill.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/ncup/main.log 570
# The full report stays in /tmp/ncup/report.txt (copied to $OUT where OUT is set).
L=/tmp/ncup; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
# the file round 26 wrote where it is there (its dense matrices and attention are the plain file's), else the plain
F=/tmp/q30.gguf; [ -f /tmp/q30m.gguf ] && F=/tmp/q30m.gguf
synth_start qwen3-30b-a3b $F; synth_wait
# The pass's kernels in launch order: skip the first 20 layers' matmuls and attentions (about 6 a layer), then take
# one layer's worth.
STRATA_CUDA_GRAPHS=0 timeout 400 ncu --clock-control none --kernel-name "regex:k_mmq|k_flash_mma" -s ${NCU_SKIP:-120} \
  -c ${NCU_COUNT:-8} --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  $S bench -m $F -p 4096 -n 1 -r 1 --chunk 4096 > $L/report.txt 2> $L/ncu.err
echo "ncu rc=$? at $(el) s"; tail -3 $L/ncu.err
[ -n "${OUT:-}" ] && cp $L/report.txt $OUT/ 2>/dev/null
grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|No Eligible|Block Size|Grid Size|Dynamic Shared|Stall|L1/TEX Hit|L2 Hit" $L/report.txt | head -200
echo ALL_DONE
