#!/usr/bin/env bash
# Resident speed A/B for issue 16 in one call: the 30B file's pp512 / tg128 with the default build and with each
# decode switch off, a CUPTI timeline of its decode, the GPU suites (test_cuda_ops, test_cuda_engine; with
# ENGINE_OFF=1 the engine's again with STRATA_CUDA_PDL=0), then Next-80B's resident rows; with LLAMA=1 llama.cpp is
# built in the background (about 460 s) and its rows on both files close the call (LLAMA80=0: the 30B only; TRACE=0:
# no timeline). Here first: ../shared/peer/prepare.sh &&
# scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/. There (carry .peer):
#   setsid nohup bash bench/device-kernels.sh > /dev/null 2>&1 < /dev/null & sleep 5; bash bench/poll.sh /tmp/kern/main.log 570
# SWITCHES (default "STRATA_CUDA_PDL=0 STRATA_CUDA_MMVQ_AHEAD=0") names the rows beside the default one.
L=/tmp/kern; mkdir -p $L
exec > $L/main.log 2>&1
[ -n "${LLAMA:-}" ] || NO_LLAMA=1
source bench/device-lib.sh
(cmake --build /tmp/strata -j6 --target test_cuda_engine test_cuda_ops > $L/build2.log 2>&1; echo "tests build rc=$? at $(el) s") &
TESTS_BUILD=$!  # waited for by itself: a plain wait would also wait for llama.cpp's build
F=/tmp/kern30.gguf
[ -f $F ] || { $S synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"; }
rows() { sb -m $F "$@"
  for sw in ${SWITCHES:-STRATA_CUDA_PDL=0 STRATA_CUDA_MMVQ_AHEAD=0}; do export "$sw"; sb -m $F "$@"; unset "${sw%%=*}"; done; }
rows -p 512 -n 128 -r 2 --chunk 4096
sb -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 8192  # decode and prefill over a long context
if [ "${TRACE:-1}" != 0 ]; then
  bash tools/profile/build_kernel_trace.sh /tmp/kernel_trace.so > $L/kt.log 2>&1 || cat $L/kt.log
  CUDA_INJECTION64_PATH=/tmp/kernel_trace.so STRATA_KERNEL_TRACE=$L/strata.csv $S bench -m $F -p 1 -n 32 -r 1 > $L/tr.out 2>&1
  python3 -m tools.profile.timeline $L/strata.csv --marker embed --passes 16 | head -24
fi
wait $TESTS_BUILD
timeout 200 /tmp/strata/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops.log | head
timeout 300 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine.log | head
if [ -n "${ENGINE_OFF:-}" ]; then
  STRATA_CUDA_PDL=0 timeout 200 /tmp/strata/bin/test_cuda_engine --gtest_brief=1 > $L/engine0.log 2>&1
  echo "test_cuda_engine STRATA_CUDA_PDL=0 rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine0.log | head
fi
F=/tmp/kern80.gguf
[ -f $F ] || { $S synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth80.log 2>&1; echo "synth 80B rc=$? at $(el) s"; }
rows -p 512,4096 -n 64 -r 1 --chunk 4096
if [ -n "${LLAMA:-}" ]; then
  F=/tmp/kern30.gguf; lb -p 512 -n 128 -r 2; lb -p 512 -n 64 -d 8192
  [ "${LLAMA80:-1}" = 0 ] || { F=/tmp/kern80.gguf; lb -p 512,4096 -n 64; }
fi
echo ALL_DONE
