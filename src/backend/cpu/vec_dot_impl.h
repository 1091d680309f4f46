// Internal to the CPU backend: the per-level kernel tables behind vec_dot.h's dispatch, and the IQ2/IQ3 sign bytes
// table the x86 kernels use. Declarations and plain constexpr data only, so that the files compiled for AVX2 or
// AVX-512 can include it without emitting inline code that another file would link against.
#pragma once

#include <cstdint>

#include "backend/cpu/vec_dot.h"
#include "format/iq_grids.h"

namespace strata::vec_dot_detail {

struct DotEntry {
    DType type;
    VecDotFn dot;
    VecDotRowsFn dot_rows = nullptr;
    int max_rows = 1;
};

// One level's kernels: dot products for the weight types it implements (the others fall back to a lower level),
// and its activation quantizers (nullptr: use the lower level's).
struct KernelTable {
    const DotEntry *dots;
    int n_dots;
    QuantizeActFn quantize_q8_0, quantize_q8_1, quantize_q8_k;
};

// vec_dot_scalar.cpp / vec_dot_scalar_iq.cpp: every type, the reference.
const KernelTable &scalar_kernels();
const DotEntry *scalar_iq_dots(int *count);  // the i-quant and ternary part of the scalar table

// vec_dot_avx2.cpp and vec_dot_avx512.cpp; empty tables where the build does not target x86-64.
const KernelTable &avx2_kernels();
const KernelTable &avx512_kernels();

// Sign masks of the IQ2/IQ3 formats as byte vectors: byte j of k_sign_bytes.v[i] is 0xff (negate) where bit j of
// ksigns_iq2xs[i] is set, else 0x01, ready for a byte-wise sign operation.
constexpr uint64_t sign_bytes_of(uint8_t mask) {
    uint64_t v = 0;
    for (int j = 0; j < 8; j++) v |= uint64_t(((mask >> j) & 1) ? 0xff : 0x01) << (8 * j);
    return v;
}

struct SignBytesTable {
    uint64_t v[128];
};

constexpr SignBytesTable make_sign_bytes() {
    SignBytesTable t{};
    for (int i = 0; i < 128; i++) t.v[i] = sign_bytes_of(iq::ksigns_iq2xs[i]);
    return t;
}

inline constexpr SignBytesTable k_sign_bytes = make_sign_bytes();

}  // namespace strata::vec_dot_detail
