#!/usr/bin/env bash
# The thirty-sixth round in one call (about twelve minutes: poll it from a second call on the warm machine), Next-80B
# only (its file written beside the build): two opt-in changes to a split decoding layer, the handoff of the host's rows
# (STRATA_DECODE_HANDOFF=1) and the early fills (STRATA_DECODE_EARLY_FILLS=1), and the two opt-in decoding forms of the
# thirty-fifth round (STRATA_CUDA_MMVQ_AHEAD=2, STRATA_CUDA_ROUTER_ONE=1). Their tests first: the handoff copy's, the
# mat-vec's and the router's bit-for-bit ones, then the engine's hybrid test (the handoff and the early fills on and
# off) and its greedy, graph and CPU-match tests with both opt-in forms on. Then Next-80B at 12 GiB under uniform
# routing with none, each and both of the two split changes, twice; the split's phases (STRATA_DECODE_CHOOSE=0
# STRATA_DECODE_TIMING=1) without and with both, and a split decode's CUPTI trace with both; all resident, tg64 under
# none / each opt-in form / both, twice, and the greedy ids of `strata run --tokens` under each; last the split at fixed
# host shares and the host's expert rate alone.
# There (carry .peer):
#   setsid nohup bash bench/device-round36.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r36/main.log 570
L=/tmp/r36; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
G=/tmp/qwen3-next-80b-a3b.gguf
rm -f /tmp/qwen3-30b-a3b.gguf  # a warm machine's: the disk holds one of the two beside the build
synth_start qwen3-next-80b-a3b $G
bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine bench_host_experts > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
BOTH="STRATA_CUDA_MMVQ_AHEAD=2 STRATA_CUDA_ROUTER_ONE=1"
env $BOTH timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='*CudaUpload*:*Mmvq*:*CudaMatmuls*:*CudaMoe*:*CudaRouter*' > $L/ops.log 2>&1
echo "test_cuda_ops, both on: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Which|what|round" $L/ops.log | head -8
timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Hybrid*' > $L/hybrid.log 2>&1
echo "test_cuda_engine hybrid: rc=$? at $(el) s"
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which|slots, share" $L/hybrid.log | head -8
env $BOTH timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*Greedy*:*GraphsDoNotChangeABit*:*MatchesTheCpuEngine*:*Argmax*' > $L/engine.log 2>&1
echo "test_cuda_engine, both on: rc=$? at $(el) s"
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -8
synth_wait
B="-m $G -p 16 -n 32 -r 2 --chunk 4096 --routing uniform --vram-budget 12G"
SPLIT=("" "STRATA_DECODE_HANDOFF=1" "STRATA_DECODE_EARLY_FILLS=1" "STRATA_DECODE_HANDOFF=1 STRATA_DECODE_EARLY_FILLS=1")
for R in 1 2; do for E in "${SPLIT[@]}"; do (if [ -n "$E" ]; then export $E; fi; sb $B); done; done
for E in "" "STRATA_DECODE_HANDOFF=1 STRATA_DECODE_EARLY_FILLS=1"; do
  (if [ -n "$E" ]; then export $E; fi; export STRATA_DECODE_CHOOSE=0 STRATA_DECODE_TIMING=1; sb $B -r 1
   grep -A14 "^| phase |" $L/s.txt)
done
# a split decode's CUPTI trace (tools/profile/kernel_trace.cpp), pass by pass: the GPU's busy and idle time
STRATA_DECODE_HANDOFF=1 STRATA_DECODE_EARLY_FILLS=1 STRATA_DECODE_CHOOSE=0 CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/split.csv \
  $S bench -m $G -p 16 -n 24 -r 1 --chunk 4096 --routing uniform --vram-budget 12G > $L/split.out 2>&1
echo "== traced split decode rc=$? at $(el) s"; grep -E "tg24" $L/split.out
python3 -m tools.profile.timeline $L/split.csv --marker embed --passes 8 --each | head -60
[ -n "${OUT:-}" ] && gzip -c $L/split.csv > $OUT/split.csv.gz
SETS=("" "STRATA_CUDA_MMVQ_AHEAD=2" "STRATA_CUDA_ROUTER_ONE=1" "$BOTH")
# each setting in a subshell of its own, so that nothing it exports outlives it
for R in 1 2; do for E in "${SETS[@]}"; do (if [ -n "$E" ]; then export $E; fi; sb -m $G -p 1 -n 64 -r 2); done; done
for E in "${SETS[@]}"; do
  env $E $S run -m $G --tokens $(seq -s, 100 399) -n 100 --temp 0 > $L/ids.txt 2> $L/ids.err
  echo "[$E]: rc=$? ids $(md5sum < $L/ids.txt | cut -c1-12) ($(wc -w < $L/ids.txt) words) at $(el) s"
done
for SH in 0.3 0.5 0.7; do STRATA_DECODE_CHOOSE=0 sb $B -r 1 --cpu-share $SH; done
/tmp/strata/bin/bench_host_experts --threads 8,15 --calls 400 --dim 2048 --ff 512 --jobs 4 2>&1 | tail -4
echo "done at $(el) s"; echo ALL_DONE
