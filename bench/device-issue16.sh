#!/usr/bin/env bash
# Issue 16's rows in one call, one machine (about seven minutes for the 30B; PRESET=qwen3-next-80b-a3b for the 80B,
# whose 43 GB file takes about five minutes to write): `strata synth --preset PRESET --type Q4_K --dense-type Q8_0`,
# all resident, Strata's `-p 512,4096 -n 128 -r 3 --chunk 4096` before and after llama.cpp's best configuration
# (`llama-bench -ngl 99 -lm none -fa 1 -t 16 -ub 4096 -b 4096 -r 3 -p 512,4096 -n 128`, built in the background at
# the lowest priority). While llama.cpp builds: test_cuda_engine's greedy and graph tests (greedy steps ahead of the
# host, the default; TESTS= skips them). Then (BUDGET= skips them) issue 17's row and issue 16's no-regression row at
# 12 GiB under uniform routing, Strata `-p 16 -n 64 -r 2 --routing uniform --vram-budget 12G` (`-n 32` on the 80B)
# before and after llama.cpp's best configuration at about that memory (`-ncmoe 26`; 40 on the 80B; TIMING=1 adds
# STRATA_DECODE_TIMING's phases). EARLY= skips the reads before the wait (STRATA_CUDA_EARLY_READS, on by default):
# their GPU tests beside the greedy ones, the greedy ids of `strata run --tokens` either way, and a tg128 A/B before
# the 12 GiB rows; AHEAD=1 adds a tg128 A/B of STRATA_CUDA_TAIL_AHEAD and STRATA_CUDA_MERGE_AHEAD together (both on by
# default since the thirty-fifth round).
# There (carry .peer):
#   setsid nohup bash bench/device-issue16.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/i16/main.log 570
L=/tmp/i16; mkdir -p $L
exec > $L/main.log 2>&1
source bench/device-lib.sh
PRESET=${PRESET:-qwen3-30b-a3b}
F=/tmp/$PRESET.gguf
synth_start $PRESET $F
if [ -n "${TESTS:-1}" ]; then
  cmake --build /tmp/strata -j12 --target test_cuda_engine test_cuda_ops > $L/build2.log 2>&1
  echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
  # greedy steps ahead of the host (STRATA_DECODE_AHEAD, on) with the reads before the wait (EARLY= : without them)
  E=${EARLY-1}; E=${E:+1}; E=${E:-0}
  STRATA_CUDA_EARLY_READS=$E timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
    --gtest_filter='*Greedy*:*GraphsDoNotChangeABit*:*Argmax*' > $L/engine.log 2>&1
  echo "test_cuda_engine, STRATA_CUDA_EARLY_READS=$E: rc=$? at $(el) s"
  grep -E "FAILED|PASSED|Failure|Expected|Which" $L/engine.log | head -8
  if [ $E = 1 ]; then
    STRATA_CUDA_EARLY_READS=1 timeout 120 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 \
      --gtest_filter='*MoeTail*:*QkNorm*:*Flash*:*Attention*:*KvStore*:*Mmvq*:*CudaMoe*:*Router*' > $L/ops-early.log 2>&1
    echo "test_cuda_ops, EARLY_READS=1: rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure" $L/ops-early.log | head -8
  fi
fi
synth_wait
if [ -n "${EARLY-1}" ]; then  # the same greedy ids either way: a 300-token prompt, 200 steps (contexts past 64)
  for X in 0 1; do
    STRATA_CUDA_EARLY_READS=$X $S run -m $F --tokens $(seq -s, 100 399) -n 200 --temp 0 > $L/ids$X.txt 2> $L/ids$X.err
    echo "EARLY_READS=$X: rc=$? ids $(md5sum < $L/ids$X.txt | cut -c1-12) ($(wc -w < $L/ids$X.txt) words)"
  done
fi
sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096
lb -p 512,4096 -n 128 -r 3
sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096
if [ -n "${EARLY-1}" ]; then  # reads before the wait, A/B alternated, resident decode
  for X in 0 1 0 1; do STRATA_CUDA_EARLY_READS=$X sb -m $F -p 1 -n 128 -r 3; done
fi
if [ -n "${AHEAD:-}" ]; then  # AHEAD=1: the MoE tail's and the merge's loads ahead, both on against both off
  for X in 0 1 0 1; do STRATA_CUDA_TAIL_AHEAD=$X STRATA_CUDA_MERGE_AHEAD=$X sb -m $F -p 1 -n 128 -r 3; done
fi
if [ -n "${BUDGET-1}" ]; then
  if [ $PRESET = qwen3-30b-a3b ]; then NCMOE=26 N=64; else NCMOE=40 N=32; fi
  sb -m $F -p 16 -n $N -r 2 --chunk 4096 --routing uniform --vram-budget 12G
  lb -ncmoe $NCMOE -p 0 -n $N -r 2
  sb -m $F -p 16 -n $N -r 2 --chunk 4096 --routing uniform --vram-budget 12G
  if [ -n "${TIMING:-}" ]; then  # where a decoding pass's time goes at 12 GiB (phases summed over the layers)
    STRATA_DECODE_TIMING=1 sb -m $F -p 16 -n $N -r 1 --chunk 4096 --routing uniform --vram-budget 12G
    grep -A14 "^| phase |" $L/s.txt
  fi
fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/engine*.log $L/ops*.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
