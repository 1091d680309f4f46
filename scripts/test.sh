#!/usr/bin/env bash
# The whole test suite, in build trees of its own (build-test/, build-cuda/, build-fuzz/: build/ is left as it is):
# CPU build and tests (C++ and the Python cross-checks), the CUDA build compiled for our users' cards and Hopper
# (sm_86, 89, 90, 120: every kernel must build for each; its GPU tests run only where a GPU is present), and a
# bounded libFuzzer run of the GGUF reader.
# Environment: STRATA_FUZZ_SECONDS (default 60), STRATA_TEST_CUDA_ARCH (default "86;89;90;120"), STRATA_SKIP_CUDA=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
scripts/setup.sh --tests
jobs=$(nproc)

echo "== CPU build and tests"
if [ -r /proc/cpuinfo ]; then  # which CPU kernel levels this machine runs (the tests check each one it has)
    echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); has:" \
        $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|avx512bw|avx512vl|avx512_vnni' | sort)
fi
step "configuring build-test/" cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF -DSTRATA_TESTS=ON
grep -h "Integer dot-product probe" "$step_log_dir"/configuring-build-test.log || true
step "building build-test/ ($jobs jobs)" cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs" -LE gpu

nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ "${STRATA_SKIP_CUDA:-0}" != 1 ] && [ -n "$nvcc" ]; then
    archs="${STRATA_TEST_CUDA_ARCH:-86;89;90;120}"
    echo "== CUDA build (architectures $archs)"
    step "configuring build-cuda/" cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON \
        -DSTRATA_TESTS=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DSTRATA_CUDA_ARCHS="$archs"
    step "building build-cuda/ ($jobs jobs)" cmake --build build-cuda -j"$jobs"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        ctest --test-dir build-cuda --output-on-failure -L gpu
    else
        echo "(no GPU here: CUDA code compiled, GPU tests not run)"
    fi
fi

echo "== Fuzzing the GGUF reader (${STRATA_FUZZ_SECONDS:-60} s)"
scripts/fuzz.sh "${STRATA_FUZZ_SECONDS:-60}"
echo "== all tests passed"
