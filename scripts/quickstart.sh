#!/usr/bin/env bash
# Fresh machine to first output: install what building and running need, build strata into build/ (CUDA where a
# GPU is here, for its architecture; no tests), then run the embedded default model, models/demo/demo.gguf (a small
# Qwen3-Next MoE trained on Python sources: models/demo/MODEL_CARD.md), on the start of a Python function.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
scripts/setup.sh
step "configuring build/" cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_TESTS=OFF
step "building strata ($(nproc) jobs)" cmake --build build -j"$(nproc)"
cmd=(build/bin/strata run -m models/demo/demo.gguf -f models/demo/prompt.txt -n 96 --temp 0 --repeat-penalty 1.15)
echo
echo "\$ ${cmd[*]}"
echo "(a 27 MiB model trained for 10 minutes on Python sources; the prompt is the first 5 lines below)"
echo
"${cmd[@]}"
