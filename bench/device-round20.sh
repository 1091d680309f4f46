#!/usr/bin/env bash
# The twentieth round's device work, one script over one or two calls (poll again if the first call's time ends):
#   1. The GPU tests of the split (each part replaying graphs), mapped misses, graphs and prompt loans: all ran in the
#      twentieth round's calls (bench/device-tests20.sh) but the loan test's budget sweep at a 1024-token chunk, new
#      after them.
#   2. Issue 15: Next-80B-A3B at 12 GiB, pp4096 with the prompt's shared expert first and after
#      (STRATA_PREFILL_SHARED_FIRST=0), and once with STRATA_PREFILL_TIMING=1 (the new upload and copy_wait phases).
#   3. With SPLIT_ROWS=1, issue 18's emulated split on one GPU: --gpus 0,0 --vram-budget 10G,10G, a part's passes as
#      graphs and op by op (STRATA_SPLIT_GRAPHS=0), against one participant at 20G.
#   4. With LLAMA=1 (its build takes ~10 minutes of device time, in the background from the start), issue 17's Next-80B
#      row side by side: Strata at 12 GiB under uniform routing, llama.cpp's best configuration at about that memory
#      (-ncmoe 40, 12.7 GiB in ../shared/peer), Strata again.
# Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There:
#   setsid nohup bash bench/device-round20.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r20/main.log 570
L=/tmp/r20; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${LLAMA:-}" ] || NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/n80.gguf
[ -f $F ] || ($S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1
  echo "synth rc=$? at $(el) s" > $L/synth.rc) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
grep -E "error" $L/build2.log | head -5
timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter='*SplitOverTwo*:*SplitPasses*:*MappedMisses*:*Graph*:*PromptLoans*' > $L/tests.log 2>&1
echo "test_cuda_engine (split, mapped, graphs, loans) rc=$? at $(el) s"
grep -E "FAILED|PASSED|Failure|tests ran|Skipped|skipped" $L/tests.log | head -20
[ -n "${OUT:-}" ] && cp $L/tests.log $OUT/ 2>/dev/null
while [ ! -f $L/synth.rc ] && [ ! -f $F.done ]; do sleep 2; done; cat $L/synth.rc 2>/dev/null; touch $F.done
P="-m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G"
sb $P
STRATA_PREFILL_SHARED_FIRST=0 sb $P
STRATA_PREFILL_TIMING=1 sb $P; grep -E "^\| (phase|mixer|route|readback|group|upload|copy_wait|experts|host|combine|shared) |could not" $L/s.txt | tail -11
if [ -n "${SPLIT_ROWS:-}" ]; then  # when the session's device time allows
  U="-m $F -p 16 -n 32 -r 1 --chunk 4096 --routing uniform"
  sb $U --vram-budget 20G
  sb $U --gpus 0,0 --vram-budget 10G,10G
  STRATA_SPLIT_GRAPHS=0 sb $U --gpus 0,0 --vram-budget 10G,10G
fi
if [ -n "${LLAMA:-}" ]; then
  U="-m $F -p 16 -n 32 -r 1 --chunk 4096 --routing uniform"
  sb $U --vram-budget 12G
  lb -ncmoe 40 -p 0 -n 32
  sb $U --vram-budget 12G
fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $L/tests.log $OUT/ 2>/dev/null
echo "done at $(el) s"; echo ALL_DONE
