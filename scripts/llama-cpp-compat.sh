#!/usr/bin/env bash
# Checks that llama.cpp reads the files Strata writes the way Strata does: every golden fixture and every tiny
# synthetic preset, greedy continuation of one prompt through llama.cpp's llama-simple and through `strata run`
# (CPU), which must print the same text. Random weights make tokens that are parts of UTF-8 characters; llama-simple
# prints their raw bytes and Strata a replacement character, so both are compared without invalid bytes and
# replacement characters. llama.cpp is not part of this project: build it yourself and pass the folder holding
# llama-simple.
#   scripts/llama-cpp-compat.sh LLAMA_BIN_DIR [STRATA_BUILD_DIR (default build)]
set -uo pipefail
cd "$(dirname "$0")/.."
llama=${1:?usage: scripts/llama-cpp-compat.sh LLAMA_BIN_DIR [STRATA_BUILD_DIR]}
build=${2:-build}
strata=$build/bin/strata
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prompt="The quick brown fox"
files=()
for p in tiny-qwen3moe tiny-qwen3next tiny-qwen35moe; do
    "$strata" synth --preset "$p" -o "$work/synth-$p.gguf" --quiet && files+=("$work/synth-$p.gguf")
done
[ -d "$build/golden" ] && files+=("$build"/golden/*.gguf)
# valid characters only, no replacement characters, no trailing newline
clean() { python3 -c 'import sys; t = sys.stdin.buffer.read().decode("utf-8", "ignore"); print(t.replace("\ufffd", "").rstrip("\n"))'; }
same=0 total=0
for f in "${files[@]}"; do
    a=$("$llama/llama-simple" -m "$f" -n 12 "$prompt" 2>/dev/null | clean)
    b=$("$strata" run -m "$f" -p "$prompt" -n 12 --temp 0 --device cpu 2>/dev/null | clean)
    total=$((total + 1))
    if [ -n "$a" ] && [ "$a" == "$b" ]; then
        same=$((same + 1)); echo "same     $(basename "$f")"
    else
        echo "DIFFERS  $(basename "$f")"; echo "  llama.cpp: $a"; echo "  strata:    $b"
    fi
done
echo "$same of $total files: llama.cpp and Strata continue the prompt identically"
[ "$same" -eq "$total" ]
