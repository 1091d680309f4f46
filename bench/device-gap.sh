#!/usr/bin/env bash
# Where a decoding token's wall time goes on the 30B all resident (about six minutes, one machine): first the
# engine's greedy, graph and arg-max GPU tests with greedy steps replayed ahead of the host and without
# (STRATA_DECODE_AHEAD=1/0; TESTS= skips them), then `strata bench -p 1 -n 128 -r 3` with STRATA_CUDA_PASS_TIMES=1,
# whose exit line splits a replayed pass into the host's work before the launch, the launch call, launch to done,
# and the host's time between one replay and the next (steps replayed ahead are counted apart); the GPU's own time
# per token is the CUPTI timeline's. Then the switches in AB (default STRATA_DECODE_AHEAD STRATA_CUDA_MMVQ_STAGE)
# =0/=1 alternated, PAIRS times (default 2), `-p 512 -n 128 -r 3`; with LLAMA=1 llama.cpp built meanwhile and its
# rows (`llama-bench -p 512 -n 128 -r 3`, the best configuration's flags) then Strata's again. There (carry .peer):
#   setsid nohup bash bench/device-gap.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/gap/main.log 570
L=/tmp/gap; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${LLAMA:-}" ] || NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/q30.gguf
synth_start qwen3-30b-a3b $F
[ -n "${TRACE:-1}" ] && { bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log; }
if [ -n "${TESTS:-1}" ]; then  # the engine's greedy, graph and arg-max tests, ahead of the host and not
  cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1
  echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
  ENG=${ENG:-'*Greedy*:*GraphsDoNotChangeABit*:*Argmax*:*MatchesTheCpuEngine*'}
  for X in ${TEST_AHEAD:-1 0}; do
    STRATA_DECODE_AHEAD=$X timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter="$ENG" > $L/engine$X.log 2>&1
    echo "test_cuda_engine ($ENG), STRATA_DECODE_AHEAD=$X: rc=$? at $(el) s"
    grep -E "FAILED|PASSED|Failure|Expected|Which|replayed ahead" $L/engine$X.log | head -12
  done
fi
synth_wait
gap() { echo "== $* strata bench -m $F -p 1 -n 128 -r 3"
  env STRATA_CUDA_PASS_TIMES=1 "$@" $S bench -m $F -p 1 -n 128 -r 3 > $L/g.txt 2> $L/g.err
  grep -E "^\| synth.*tg" $L/g.txt; grep -E "graphs:|ahead|op by op|rror" $L/g.err; echo "at $(el) s"; }
gap STRATA_DECODE_AHEAD=0
gap
for SW in ${AB:-STRATA_DECODE_AHEAD STRATA_CUDA_MMVQ_STAGE}; do
  for X in ${PAIRS:-0 1 0 1}; do export $SW=$X; sb -m $F ${ABARGS:--p 512 -n 128 -r 3 --chunk 4096}; unset $SW; done
done
if [ -n "${LLAMA:-}" ]; then  # llama.cpp's rows on the same file, between two of Strata's
  lb -p 512 -n 128 -r 3; sb -m $F -p 512 -n 128 -r 3 --chunk 4096
fi
if [ -n "${TRACE:-1}" ]; then  # (TRACE= skips the timeline)
  CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/strata.csv $S bench -m $F -p 1 -n 32 -r 1 > $L/trace.out 2>&1
  echo "== traced rc=$? at $(el) s"
  python3 -m tools.profile.timeline $L/strata.csv --marker embed --passes 16 | head -24
  [ -n "${OUT:-}" ] && gzip -c $L/strata.csv > $OUT/strata.csv.gz
fi
echo "done at $(el) s"; echo ALL_DONE
