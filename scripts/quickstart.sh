#!/usr/bin/env bash
# Fresh machine to first output: install what building and running need, build strata into build/ (CUDA where a
# GPU is here, for its architecture; no tests), then show and run the embedded default model, a tiny synthetic
# Qwen3-MoE file the build writes to build/models/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
scripts/setup.sh
step "configuring build/" cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_TESTS=OFF
step "building strata ($(nproc) jobs)" cmake --build build -j"$(nproc)"
model=build/models/tiny-qwen3moe.gguf
echo
echo "\$ build/bin/strata inspect $model"
build/bin/strata inspect "$model"
echo
echo "\$ build/bin/strata run -m $model -p 'Hello' -n 24 --temp 0"
echo "(this model's weights are random, so its text is noise: control characters and U+FFFD are expected)"
build/bin/strata run -m "$model" -p "Hello" -n 24 --temp 0
