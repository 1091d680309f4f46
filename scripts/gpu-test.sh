#!/usr/bin/env bash
# On a machine with a GPU: build with CUDA for the local GPU's architecture and run the GPU tests, then the CPU
# suites against the same build. Usage: scripts/gpu-test.sh [ARCH] (default 90). Logs to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
jobs=$(nproc)
log=${OUT:-build-gpu}/gpu-test.log
mkdir -p "$(dirname "$log")"
{
    nvidia-smi -L || true
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_CUDA_ARCHS="$arch" \
        -DSTRATA_PYTHON=/nonexistent >/dev/null
    cmake --build build-gpu -j"$jobs"
    ctest --test-dir build-gpu --output-on-failure -L gpu
    # The golden models through the CUDA engine, where the Python tooling is at hand (numpy, gguf; tools/golden).
    if [ -d tools/golden ] && python3 -c "import gguf, numpy" 2>/dev/null; then
        python3 -m tools.golden.generate --out build-gpu/golden --strata build-gpu/bin/strata
        python3 tests/cuda/golden_cuda.py --bin build-gpu/bin --golden build-gpu/golden --out build-gpu/golden-cuda
    else
        echo "gpu-test: golden models skipped (needs tools/golden and python3 with numpy and gguf)"
    fi
    ctest --test-dir build-gpu --output-on-failure -j"$jobs" -LE "gpu|python"
} 2>&1 | tee "$log"
