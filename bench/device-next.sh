#!/usr/bin/env bash
# One device call for the seventeenth round's changes, none of which has run on a GPU (bench/RESULTS.md): the GPU
# tests they touch first (the split and its micro-passes, mapped misses with admission after passes by the device
# alone), then on the 30B-A3B file at 12 GiB: uniform decoding with the host's threads pinned and not
# (STRATA_HOST_PIN), zipf:1.0 decoding under LRU, LFU, and LFU without the alone passes' admission
# (STRATA_DECODE_ADMIT_ALONE=0), the mapped tier against the pinned copy (the stager's spans), and two participants
# on the one GPU decoding four sequences with micro-passes and without. No llama.cpp (NO_LLAMA): these rows are A/B
# within Strata. The mapped tier's rows: the stager's stores past the caches (STRATA_CUDA_STAGER_NT) on and off. Here first: ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh
# .peer/. There (carry .peer):
#   setsid nohup bash bench/device-next.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/next/main.log 570
# Steps that would run past ~560 s are skipped and say so.
L=/tmp/next; mkdir -p $L
exec > $L/main.log 2>&1
NO_LLAMA=1 source bench/device-lib.sh
before() { [ "$(el)" -lt "$1" ] || { echo "(skipped at $(el) s: $2)"; return 1; }; }
F=/tmp/next30.gguf
($S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$?" > $L/synth.rc) &
(bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log) &
cmake --build /tmp/strata -j12 --target test_cuda_engine > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s"
timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 --gtest_filter='*Split*:*Mapped*' > $L/tests.log 2>&1
echo "test_cuda_engine (split, mapped) rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure" $L/tests.log | head -20
while [ ! -f $L/synth.rc ]; do sleep 2; done; cat $L/synth.rc
# Resident decode kernel by kernel (issue 16's next step): the CUPTI trace of 32 tokens, a layer's kernels.
CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/strata.csv $S bench -m $F -p 1 -n 32 -r 1 > $L/trace.out 2>&1
echo "== traced rc=$? at $(el) s"; python3 -m tools.profile.timeline $L/strata.csv --marker embed --passes 16 | head -45
U="-m $F -p 16 -n 64 -r 1 --chunk 4096 --vram-budget 12G"
before 520 "pinned threads" && { sb $U --routing uniform; STRATA_HOST_PIN=0 sb $U --routing uniform; }
before 530 "zipf rows" && { sb $U --routing zipf:1.0
  sb $U --routing zipf:1.0 --expert-cache-policy lfu
  STRATA_DECODE_ADMIT_ALONE=0 sb $U --routing zipf:1.0 --expert-cache-policy lfu; }
before 540 "mapped tier" && { sb -m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G
  sb -m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G --host-mem mmap
  STRATA_CUDA_STAGER_NT=0 sb -m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G --host-mem mmap
  STRATA_CUDA_STAGER_THREADS=15 sb -m $F -p 4096 -n 1 -r 1 --chunk 4096 --vram-budget 12G --host-mem mmap; }
before 555 "micro-passes" && for micro in 1 0; do
  STRATA_SPLIT_PIPELINE=1 STRATA_SPLIT_MICROBATCH=$micro sb -m $F -p 16 -n 32 -r 1 --parallel 4 --routing uniform \
    --gpus 0,0 --vram-budget 6G,6G; done
[ -n "${OUT:-}" ] && { gzip -kf $L/strata.csv; cp $L/main.log $L/strata-all.txt $L/tests.log $L/strata.csv.gz $OUT/ 2>/dev/null; }
echo "done at $(el) s"; echo ALL_DONE
