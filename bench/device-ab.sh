#!/usr/bin/env bash
# A/B of two builds on the GPU machine, in one call: the working tree ("new") against an older commit ("old").
# Here, first:  ../shared/peer/prepare.sh && scripts/device-debs.sh && cp ../shared/peer/device.sh .peer/
#               mkdir -p .devrun && git archive OLD_COMMIT | gzip > .devrun/old.tgz
# (.devrun/ in .git/info/exclude, carried like .peer)
# There (carry .peer and .devrun; the machine goes back 30 s after a call ends, so start it in the background and
# poll):  setsid nohup bash bench/device-ab.sh > /dev/null 2>&1 < /dev/null &   then read /tmp/ab/main.log.
# Builds both (CUDA sm_90), runs the GPU tests of the new one, writes the synthetic files, and runs each bench command
# with both binaries one after the other, flipping the order from command to command. Logs in /tmp/ab.
# ROWS=decode: the resident 30B's tg128 instead (each switch of SWITCHES off in the new build beside them, then tg64
# at a 4096-token context), the GPU suites of the new build (test_cuda_ops again with SWITCHES off) after the rows;
# NCU_KERNELS=RE adds Nsight Compute on those kernels of both builds (warp stall reasons, instructions executed).
R=$(pwd); L=/tmp/ab; mkdir -p $L
exec > $L/main.log 2>&1
source .peer/device.sh env; source scripts/device-env.sh
CM="-DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=/tmp/deps/usr
    -DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf -DGTest_DIR=/tmp/deps/usr/lib/x86_64-linux-gnu/cmake/GTest
    -DSTRATA_PYTHON=/nonexistent"
mkdir -p /tmp/oldsrc && tar xzf .devrun/old.tgz -C /tmp/oldsrc
cmake -S . -B /tmp/new $CM -DSTRATA_TESTS=ON > $L/cfg-new.log 2>&1
cmake -S /tmp/oldsrc -B /tmp/old $CM -DSTRATA_TESTS=OFF > $L/cfg-old.log 2>&1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
if [ "${ROWS:-}" = decode ]; then
  (cmake --build /tmp/new -j8 --target strata > $L/build-new.log 2>&1; echo "new build rc=$? at $(el) s") &
  (cmake --build /tmp/old -j8 --target strata > $L/build-old.log 2>&1; echo "old build rc=$? at $(el) s") &
  wait
  (cmake --build /tmp/new -j14 --target test_cuda_ops test_cuda_engine > $L/build-tests.log 2>&1; echo "tests build rc=$? at $(el) s") &
  TB=$!
else
  (cmake --build /tmp/new -j12 > $L/build-new.log 2>&1; echo "new build rc=$?") &
  (cmake --build /tmp/old -j4 --target strata > $L/build-old.log 2>&1; echo "old build rc=$?") &
  wait
  (cd /tmp/new && ctest -L gpu --output-on-failure) > $L/gputest.log 2>&1
  echo "gpu tests rc=$?"; tail -3 $L/gputest.log
fi
N=/tmp/new/bin/strata; O=/tmp/old/bin/strata
flip=0
ab() {  # name, then bench arguments
    local name=$1 order="old new"; shift
    [ $((flip++ % 2)) = 1 ] && order="new old"
    for arm in $order; do
        local b=$O; [ $arm = new ] && b=$N
        echo "== $name $arm ${AB_ENV:-}"
        env ${AB_ENV:-} $b bench "$@" > $L/$name-$arm.txt 2> $L/$name-$arm.err
        grep -E '^\| synth' $L/$name-$arm.txt; grep -E 'rror' $L/$name-$arm.err | head -3
    done
}
if [ "${ROWS:-}" = decode ]; then
  F=/tmp/kern30.gguf
  $N synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o $F > $L/synth.log 2>&1; echo "synth rc=$? at $(el) s"
  for i in 1 2; do ab tg128-$i -m $F -p 512 -n 128 -r 2 --chunk 4096; done
  for sw in ${SWITCHES:-}; do echo "== new $sw"; env $sw $N bench -m $F -p 512 -n 128 -r 2 --chunk 4096 > $L/sw.txt 2>&1
    grep -E '^\| synth' $L/sw.txt; done
  ab tg64-d4096 -m $F -p 512 -n 64 -r 1 --chunk 4096 -d 4096
  if [ -n "${NCU_KERNELS:-}" ]; then  # Nsight Compute, both builds: where the kernels' warps stall (no instruction?)
    for arm in old new; do b=$O; [ $arm = new ] && b=$N
      STRATA_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --kernel-name "regex:$NCU_KERNELS" -s ${NCU_SKIP:-40} \
        -c ${NCU_COUNT:-6} --section SpeedOfLight --section WarpStateStats --section InstructionStats \
        --section LaunchStats --page raw $b bench -m $F -p 1 -n 4 -r 1 > $L/ncu-$arm.txt 2> $L/ncu-$arm.err
      echo "== ncu $arm rc=$? at $(el) s"
      grep -E "^  [a-zA-Z_].*\(|gpu__time_duration.sum|smsp__inst_executed.sum |issue_stalled_(no_instruction|long_scoreboard|wait|barrier|membar|branch_resolving|short_scoreboard)[^_]" \
        $L/ncu-$arm.txt | cut -c1-140 | head -80
    done
  fi
  echo "rows done at $(el) s"; wait $TB
  timeout 200 /tmp/new/bin/test_cuda_ops --gtest_brief=1 > $L/ops.log 2>&1
  echo "test_cuda_ops rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops.log | head
  env ${SWITCHES:-} timeout 150 /tmp/new/bin/test_cuda_ops --gtest_brief=1 > $L/ops0.log 2>&1
  echo "test_cuda_ops with ${SWITCHES:-} rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/ops0.log | head
  timeout 300 /tmp/new/bin/test_cuda_engine --gtest_brief=1 > $L/engine.log 2>&1
  echo "test_cuda_engine rc=$? at $(el) s"; grep -E "FAILED|PASSED|tests ran" $L/engine.log | head
  [ -n "${OUT:-}" ] && cp $L/*.txt $OUT/ 2>/dev/null
  echo ALL_DONE; exit 0
fi
$N synth --preset qwen3-30b-a3b --type Q4_K --dense-type Q8_0 -o /tmp/q30.gguf
ab q30-r512 -m /tmp/q30.gguf -p 512 -n 128 -r 3
ab q30-r4096 -m /tmp/q30.gguf -p 4096 --chunk 4096 -n 16 -r 2
ab q30-b512 -m /tmp/q30.gguf -p 512 -n 64 -r 2 --vram-budget 12G
ab q30-b4096 -m /tmp/q30.gguf -p 4096 --chunk 4096 -n 16 -r 2 --vram-budget 12G
rm -f /tmp/q30.gguf  # the disk holds one of the two files at a time
$N synth --preset qwen3-next-80b-a3b --type Q4_K --dense-type Q8_0 -o /tmp/n80.gguf
ab n80-r512 -m /tmp/n80.gguf -p 512 -n 64 -r 2
ab n80-r4096 -m /tmp/n80.gguf -p 4096 --chunk 4096 -n 16 -r 2
ab n80-b512 -m /tmp/n80.gguf -p 512 -n 32 -r 2 --vram-budget 12G
echo ALL_DONE
