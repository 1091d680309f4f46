#!/usr/bin/env bash
# The thirty-first round's call, one machine (about six minutes): four opt-in decode launches, written without a GPU
# in the thirtieth round, each with its switch (SWITCHES, all by default): CUDA_MMVQ_STAGE (a decoding mat-vec's
# warps copy their weight rows' first sub-blocks into shared memory before the wait for the kernel before),
# CUDA_KV_FUSE (k and v stored by the q/k norm's launch), CUDA_ATTN_Q8 (the decoding attention's last launch makes
# the o matrix's Q8_0 input), CUDA_ROUTER_NORM (the residual step before the router done by the router's launch).
#   1. GPU tests with them all on (the op tests of each against the launches it replaces, bit for bit; the engine's
#      golden and graph tests, ENG=), then the op tests with them all off (not with SHORT=1).
#   2. The 30B all resident, `-p 512 -n 128 -r 3`: each switch =0 / =1 alternated (PAIRS: three pairs), then all off
#      against all on (two pairs), then the CUPTI timeline of 32 decoded tokens with all on, kernel by kernel.
# MINI=1: the A/B rows alone, a pair each, no tests (a call with little device time left). There (carry .peer):
#   setsid nohup bash bench/device-round31.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r31/main.log 570
# If they pass and gain, the next commit makes them defaults (their env_switch defaults) and updates docs/cuda.md.
L=/tmp/r31; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=${NO_LLAMA:-1}
source bench/device-lib.sh
F=/tmp/q30.gguf
SWITCHES=${SWITCHES:-CUDA_MMVQ_STAGE CUDA_KV_FUSE CUDA_ATTN_Q8 CUDA_ROUTER_NORM}
synth_start qwen3-30b-a3b $F
ON=$(for s in $SWITCHES; do echo -n "STRATA_$s=1 "; done)
OFF=$(for s in $SWITCHES; do echo -n "STRATA_$s=0 "; done)
if [ -n "${MINI:-}" ]; then  # the A/B rows alone, a pair each, decode only (a call with little device time left)
  synth_wait
  for SW in $SWITCHES; do for X in 0 1; do export STRATA_$SW=$X; sb -m $F -p 1 -n 128 -r 2; unset STRATA_$SW; done; done
  env $ON bash -c "$S bench -m $F -p 1 -n 128 -r 2 > $L/on.txt 2>&1"; echo "== all on: $(grep -E '^\| .*tg128' $L/on.txt)"
  echo "done at $(el) s"; echo ALL_DONE; exit 0
fi
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
OPS='*Mmvq*:*CudaMatmuls*:*CudaMoe*:*CudaRouter*:*CudaNormQuant*:*Flash*:*QkNorm*:*KvStore*:*AttentionQ8*'
echo "on: $ON"
env $ON timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter="$OPS" > $L/ops.log 2>&1
echo "test_cuda_ops ($OPS) rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Expected|Which" $L/ops.log | head -8
if [ -z "${SHORT:-}" ]; then
  env $OFF timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter="$OPS" > $L/ops0.log 2>&1
  echo "test_cuda_ops, $OFF: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Expected|Which" $L/ops0.log | head -8
fi
synth_wait
for SW in $SWITCHES; do
  for X in ${PAIRS:-0 1 0 1 0 1}; do export STRATA_$SW=$X; sb -m $F -p 512 -n 128 -r 3 --chunk 4096; unset STRATA_$SW; done
done
for X in 0 1 0 1; do
  if [ $X = 1 ]; then export $ON; echo "== all on"; else echo "== all off"; fi
  sb -m $F -p 512 -n 128 -r 3 --chunk 4096
  for s in $SWITCHES; do unset STRATA_$s; done
done
env $ON CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/strata.csv $S bench -m $F -p 1 -n 32 -r 1 > $L/trace.out 2>&1
echo "== traced rc=$? at $(el) s"
python3 -m tools.profile.timeline $L/strata.csv --marker embed --passes 16 | head -30
[ -n "${OUT:-}" ] && gzip -c $L/strata.csv > $OUT/strata.csv.gz
ENG=${ENG:-*MatchesTheCpuEngine*:*Argmax*:*GraphsDoNotChangeABit*:*PlacementDoesNotChangeABit*:*CheckpointRewind*}
env $ON timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="$ENG" > $L/engine.log 2>&1
echo "test_cuda_engine ($ENG) rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine.log | head -8
if [ -n "${ENGINE_OFF:-}" ]; then
  env $OFF timeout 120 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="$ENG" > $L/engine0.log 2>&1
  echo "test_cuda_engine, $OFF: rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/engine0.log | head -8
fi
[ -n "${OUT:-}" ] && cp $L/ops.log $L/ops0.log $L/engine.log $L/engine0.log $L/strata-all.txt $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
