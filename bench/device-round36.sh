#!/usr/bin/env bash
# The thirty-sixth round in one call (about twelve minutes: poll it from a second call on the warm machine): the two
# opt-in decoding forms of the thirty-fifth round (STRATA_CUDA_MMVQ_AHEAD=2, STRATA_CUDA_ROUTER_ONE=1) and the
# handoff of the host's rows (STRATA_DECODE_HANDOFF, on). Their tests: the mat-vec's, the router's and the handoff
# copy's bit-for-bit ones, then the engine's hybrid, greedy, graph and CPU-match tests with both opt-ins on (the hybrid
# test runs the handoff on and off); the greedy ids of `strata run --tokens` under each opt-in; tg128 of the 30B all
# resident alternated over none / each / both twice; the 30B file removed (the disk holds one of the two beside the
# build), Next-80B written, its tg64 all resident none / both twice, then its 12 GiB decode under uniform routing
# with the handoff on and off, twice. Next-80B's file stays for bench/device-split80.sh on the warm machine.
# There (carry .peer):
#   setsid nohup bash bench/device-round36.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r36/main.log 570
L=/tmp/r36; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/qwen3-30b-a3b.gguf
G=/tmp/qwen3-next-80b-a3b.gguf
[ -f $G ] || synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine bench_host_experts > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
BOTH="STRATA_CUDA_MMVQ_AHEAD=2 STRATA_CUDA_ROUTER_ONE=1"
env $BOTH timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
  --gtest_filter='*Mmvq*:*CudaMatmuls*:*CudaMoe*:*CudaRouter*:*CudaUpload*' > $L/ops.log 2>&1
echo "test_cuda_ops, both on: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Which|what|round" $L/ops.log | head -8
env $BOTH timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*Hybrid*:*Greedy*:*GraphsDoNotChangeABit*:*MatchesTheCpuEngine*:*Split*:*Argmax*' > $L/engine.log 2>&1
echo "test_cuda_engine, both on: rc=$? at $(el) s"
grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which|slots, share" $L/engine.log | head -8
SETS=("" "STRATA_CUDA_MMVQ_AHEAD=2" "STRATA_CUDA_ROUTER_ONE=1" "$BOTH")
if [ ! -f $G ]; then
  synth_wait
  for E in "${SETS[@]}"; do
    env $E $S run -m $F --tokens $(seq -s, 100 399) -n 200 --temp 0 > $L/ids.txt 2> $L/ids.err
    echo "[$E]: rc=$? ids $(md5sum < $L/ids.txt | cut -c1-12) ($(wc -w < $L/ids.txt) words)"
  done
  # each setting in a subshell of its own, so that nothing it exports outlives it
  for R in 1 2; do for E in "${SETS[@]}"; do (if [ -n "$E" ]; then export $E; fi; sb -m $F -p 1 -n 128 -r 3); done; done
  rm -f $F
  synth_start qwen3-next-80b-a3b $G
fi
synth_wait
for R in 1 2; do for E in "" "$BOTH"; do (if [ -n "$E" ]; then export $E; fi; sb -m $G -p 1 -n 64 -r 2); done; done
B="-m $G -p 16 -n 32 -r 2 --chunk 4096 --routing uniform --vram-budget 12G"
for R in 1 2; do for H in 1 0; do STRATA_DECODE_HANDOFF=$H sb $B; done; done
echo "done at $(el) s"; echo ALL_DONE
