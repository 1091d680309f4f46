#!/usr/bin/env bash
# Issue 16's rows in one call, one machine (about seven minutes for the 30B; PRESET=qwen3-next-80b-a3b for the 80B,
# whose 43 GB file takes about five minutes to write): `strata synth --preset PRESET --type Q4_K --dense-type Q8_0`,
# all resident, Strata's `-p 512,4096 -n 128 -r 3 --chunk 4096` before and after llama.cpp's best configuration
# (`llama-bench -ngl 99 -lm none -fa 1 -t 16 -ub 4096 -b 4096 -r 3 -p 512,4096 -n 128`, built in the background at
# the lowest priority). While llama.cpp builds: test_cuda_engine's greedy and graph tests with greedy steps ahead of
# the host off and on (STRATA_DECODE_AHEAD=0/1; TESTS= skips them). Then (BUDGET= skips them) issue 17's row and
# issue 16's no-regression row at 12 GiB under uniform routing, Strata `-p 16 -n 64 -r 2 --routing uniform
# --vram-budget 12G` (`-n 32` on the 80B) before and after llama.cpp's best configuration at about that memory
# (`-ncmoe 26`; 40 on the 80B). There (carry .peer):
#   setsid nohup bash bench/device-issue16.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/i16/main.log 570
L=/tmp/i16; mkdir -p $L
exec > $L/main.log 2>&1
source bench/device-lib.sh
PRESET=${PRESET:-qwen3-30b-a3b}
F=/tmp/$PRESET.gguf
synth_start $PRESET $F
if [ -n "${TESTS:-1}" ]; then
  cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1
  echo "tests build rc=$? at $(el) s"; grep -E " error" $L/build2.log | head -5
  for X in 0 1; do
    STRATA_DECODE_AHEAD=$X timeout 150 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
      --gtest_filter='*Greedy*:*GraphsDoNotChangeABit*:*Argmax*' > $L/engine$X.log 2>&1
    echo "test_cuda_engine, STRATA_DECODE_AHEAD=$X: rc=$? at $(el) s"
    grep -E "FAILED|PASSED|Failure|Expected|Which" $L/engine$X.log | head -8
  done
fi
synth_wait
sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096
lb -p 512,4096 -n 128 -r 3
sb -m $F -p 512,4096 -n 128 -r 3 --chunk 4096
if [ -n "${BUDGET-1}" ]; then
  if [ $PRESET = qwen3-30b-a3b ]; then NCMOE=26 N=64; else NCMOE=40 N=32; fi
  sb -m $F -p 16 -n $N -r 2 --chunk 4096 --routing uniform --vram-budget 12G
  lb -ncmoe $NCMOE -p 0 -n $N -r 2
  sb -m $F -p 16 -n $N -r 2 --chunk 4096 --routing uniform --vram-budget 12G
  # where a decoding pass's time goes at 12 GiB (phases summed over the layers)
  STRATA_DECODE_TIMING=1 sb -m $F -p 16 -n $N -r 1 --chunk 4096 --routing uniform --vram-budget 12G
  grep -A14 "^| phase |" $L/s.txt
fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/engine*.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
