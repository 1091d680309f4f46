#!/usr/bin/env bash
# Fresh machine to first output: install what is missing, build, and run strata on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
echo
build/bin/strata inspect build/models/tiny-qwen3moe.gguf
