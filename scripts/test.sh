#!/usr/bin/env bash
# The whole test suite: CPU build and tests (C++ and the Python cross-checks), the CUDA build compiled for one
# architecture (its GPU tests run only where a GPU is present), and a bounded libFuzzer run of the GGUF reader.
# Environment: STRATA_FUZZ_SECONDS (default 60), STRATA_TEST_CUDA_ARCH (default 90), STRATA_SKIP_CUDA=1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)

echo "== CPU build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -LE gpu

nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ "${STRATA_SKIP_CUDA:-0}" != 1 ] && [ -n "$nvcc" ]; then
    echo "== CUDA build (sm_${STRATA_TEST_CUDA_ARCH:-90})"
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" \
        -DSTRATA_CUDA_ARCHS="${STRATA_TEST_CUDA_ARCH:-90}" >/dev/null
    cmake --build build-cuda -j"$jobs"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        ctest --test-dir build-cuda --output-on-failure -L gpu
    else
        echo "(no GPU here: CUDA code compiled, GPU tests not run)"
    fi
fi

echo "== Fuzzing the GGUF reader (${STRATA_FUZZ_SECONDS:-60} s)"
scripts/fuzz.sh "${STRATA_FUZZ_SECONDS:-60}"
echo "== all tests passed"
