#!/usr/bin/env bash
# Fresh machine to first output: install what is missing, build, then show and run the embedded default model
# (a tiny synthetic Qwen3-MoE file the build writes to build/models/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
model=build/models/tiny-qwen3moe.gguf
echo
echo "\$ build/bin/strata inspect $model"
build/bin/strata inspect "$model"
echo
echo "\$ build/bin/strata run -m $model -p 'Hello' -n 24 --temp 0"
build/bin/strata run -m "$model" -p "Hello" -n 24 --temp 0
