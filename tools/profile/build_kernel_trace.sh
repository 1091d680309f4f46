#!/usr/bin/env bash
# Builds the CUPTI kernel-trace injection library (tools/profile/kernel_trace.cpp) into OUT (default
# build-tools/kernel_trace.so). CUDA_HOME defaults to /usr/local/cuda; CUPTI's headers and libcupti come with it.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-tools/kernel_trace.so}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$(dirname "$out")"
lib=$(dirname "$(ls "$cuda"/targets/*/lib/libcupti.so "$cuda"/extras/CUPTI/lib64/libcupti.so 2>/dev/null | head -1)")
g++ -std=c++17 -O2 -shared -fPIC -Wall -I"$cuda/include" -I"$cuda/extras/CUPTI/include" tools/profile/kernel_trace.cpp \
    -o "$out" -L"$lib" -lcupti -Wl,-rpath,"$lib"
echo "built $out (libcupti from $lib)"
