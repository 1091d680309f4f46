#!/usr/bin/env bash
# The twenty-fifth round's call, one warm machine (issue 16's 30B pp512 after round 24's profile: the prompt's f32
# router 157 us a layer of 1352 on an H100, the generic tiled kernel's 64 blocks waiting on their loads):
#   1. GPU tests: the whole test_cuda_ops (the pipelined f32 kernel's bits against the tiled kernel's, the cp.async
#      helpers now shared by flash attention and MMQ) and the engine's golden, fusion, loan, budget and graph tests
#      under the new defaults (a prompt's attention split line at one wave, Q8_K's thread-per-element form up to 64
#      rows) with the opt-in f32 kernel and q/k/v parts on (STRATA_CUDA_MM_F32=1 STRATA_CUDA_MMQ_PARTS=1, and the
#      engine's with STRATA_CUDA_MMQ_STAGED=1; the ops suite's CudaMmq tests run the parts and the staged form
#      either way). Make each the default if its tests pass and
#      it wins.
#   2. The 30B-A3B all resident, pp512 / pp4096, alternated: STRATA_CUDA_MM_F32=0 / 1, then with it on,
#      STRATA_CUDA_MMQ_PARTS=0 / 1 (a prompt's q, k and v in one Wide tensor-core launch; opt-in, the same bits),
#      STRATA_CUDA_MMQ_STAGED=0 / 1 (the experts' Q4_K tiles copied by cp.async two steps ahead; the same bits).
#   3. The 30B at --vram-budget 12G: pp512 / pp4096 (issue 15's bar) and uniform-routing decode (issue 17's).
#   4. llama.cpp beside: all resident pp512 + tg128 (issue 16), 12G-class -ncmoe 26 pp512 / pp4096 / tg64.
#   The host's mat-vec for CPU-computed misses reading a staged copy of its rows or in place (STRATA_HOST_STAGE=1
#   / 0, bench_host_experts on the 16-core host; 1.15-1.4x on two threads of the development machine).
#   5. PROFILE=1: both engines' pp512 kernels (bench/device-profile.sh on the same file); TGPROF=1: a decoding
#      pass's (issue 16's HBM bar).
# SHORT=1 (about three minutes on a fresh machine): the tests and one A/B pair of each, no llama.cpp, no 12G rows.
# There:
#   setsid nohup bash bench/device-round25.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/r25/main.log 570
L=/tmp/r25; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${SHORT:-}" ] && NO_LLAMA=1
source bench/device-lib.sh
F=/tmp/q30.gguf
synth_start qwen3-30b-a3b $F
cmake --build /tmp/strata -j12 --target test_cuda_ops test_cuda_engine bench_host_experts > $L/build2.log 2>&1
echo "tests build rc=$? at $(el) s"
grep -E " error" $L/build2.log | head -5
OPS='*'; [ -n "${SHORT:-}" ] && OPS='CudaMatmulGeneric*:*CudaMatmul*:CudaMmq*:*CudaAttention*:CudaFlash*:CudaActivations*'
STRATA_CUDA_MM_F32=1 STRATA_CUDA_MMQ_PARTS=1 timeout 150 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 --gtest_filter="$OPS" > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|SKIPPED|Failure|Expected|Which" $L/ops.log | head -12
STRATA_CUDA_MM_F32=1 STRATA_CUDA_MMQ_PARTS=1 STRATA_CUDA_MMQ_STAGED=1 timeout 240 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 \
  --gtest_filter="${ENGINE:-*MatchesTheCpuEngine*:*FusedPromptExperts*:*PromptLoans*:*Budget*:*Graph*:*SplitPasses*}" \
  > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|Failure|Expected|Which" $L/engine.log | head -12
[ -n "${OUT:-}" ] && cp $L/ops.log $L/engine.log $OUT/ 2>/dev/null
for X in 0 1 0 1; do echo "== STRATA_HOST_STAGE=$X bench_host_experts --threads 8,16 --calls 1000"
  STRATA_HOST_STAGE=$X /tmp/strata/bin/bench_host_experts --threads 8,16 --calls 1000 2>&1 | tail -3; done
synth_wait
AB="0 1 0 1"; [ -n "${SHORT:-}" ] && AB="0 1"
for X in $AB; do STRATA_CUDA_MM_F32=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
for X in $AB; do STRATA_CUDA_MM_F32=1 STRATA_CUDA_MMQ_PARTS=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
for X in $AB; do STRATA_CUDA_MM_F32=1 STRATA_CUDA_MMQ_STAGED=$X sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; done
on() { (export STRATA_CUDA_MM_F32=1 STRATA_CUDA_MMQ_PARTS=1 STRATA_CUDA_MMQ_STAGED=1; "$@"); }  # the three together
for X in $AB; do if [ $X = 1 ]; then on sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096
  else sb -m $F -p 512,4096 -n 1 -r 3 --chunk 4096; fi; done
if [ -z "${SHORT:-}" ]; then
sb -m $F -p 512,4096 -n 64 -r 2 --chunk 4096 --vram-budget 12G
on sb -m $F -p 512,4096 -n 64 -r 2 --chunk 4096 --vram-budget 12G
sb -m $F -p 16 -n 64 -r 2 --chunk 4096 --routing uniform --vram-budget 12G
echo "rows at $(el) s"
sb -m $F -p 512 -n 128 -r 5 --chunk 4096
lb -p 512 -n 128 -r 5
lb -p 512,4096 -n 64 -r 2 -ncmoe 26
on sb -m $F -p 512 -n 128 -r 5 --chunk 4096
echo "llama.cpp rows at $(el) s"; fi
[ -n "${OUT:-}" ] && cp $L/main.log $L/strata-all.txt $OUT/ 2>/dev/null
if [ -n "${PROFILE:-}" ]; then echo "profile: /tmp/prof/main.log"
  on env F=$F bash bench/device-profile.sh qwen3-30b-a3b pp512
  cp /tmp/prof/main.log $L/profile.log; sed -n '/^| kernel/,/^| all/p' /tmp/prof/main.log; fi
if [ -n "${TGPROF:-}" ]; then echo "decode profile: /tmp/prof/main.log"  # issue 16's HBM bar: a decoding pass's kernels
  F=$F bash bench/device-profile.sh qwen3-30b-a3b tg
  cp /tmp/prof/main.log $L/profile-tg.log; sed -n '/^| kernel/,/^| all/p' /tmp/prof/main.log; fi
echo "done at $(el) s"; echo ALL_DONE
