#!/usr/bin/env bash
# Fuzzes the GGUF reader for SECONDS (default 60) with libFuzzer + ASan + UBSan, after running the GGUF tests
# (including the corrupt-file corpus) under the same sanitizers. Exits non-zero on any finding; a crashing input is
# left in build-fuzz/artifacts/. Builds only the few sources involved, in build-fuzz/, with clang.
# Environment: STRATA_FUZZ_JOBS (build parallelism, default 2), STRATA_FUZZ_MAX_LEN (default 16384).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
jobs=${STRATA_FUZZ_JOBS:-2}
max_len=${STRATA_FUZZ_MAX_LEN:-16384}

if ! command -v clang++ >/dev/null 2>&1; then
    echo "fuzz: clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
    exit 1
fi

CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON \
    -DSTRATA_TESTS=OFF -DSTRATA_CUDA=OFF -DSTRATA_NATIVE=OFF >/dev/null
cmake --build build-fuzz -j"$jobs" --target gguf_fuzz gguf_fuzz_seeds gguf_sanitized_tests

echo "== GGUF tests under ASan + UBSan"
build-fuzz/bin/gguf_sanitized_tests --gtest_brief=1

seeds=build-fuzz/seeds
corpus=fuzz/corpus-run  # grows across runs (git-ignored); new interesting inputs land here
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" build-fuzz/artifacts
build-fuzz/bin/gguf_fuzz_seeds "$seeds"

# fuzz/regressions holds inputs that once found a bug: they run first, every time.
echo "== libFuzzer on the GGUF reader for ${seconds} s (seeds: $(ls "$seeds" | wc -l), corpus: $(ls "$corpus" | wc -l))"
# -malloc_limit_mb: inputs are at most max_len bytes, so any large allocation is a bug (a count not bounded by
# the file size); libFuzzer reports it as a finding.
if ! build-fuzz/bin/gguf_fuzz -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=64 -dict=fuzz/gguf.dict -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 \
        "$corpus" "$seeds" fuzz/regressions; then
    echo "fuzz: FINDING: see the input saved in build-fuzz/artifacts/" >&2
    exit 1
fi
echo "== fuzzing found nothing"
