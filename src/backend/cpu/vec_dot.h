// Dot products of one weight row with one activation row in the weight type's paired activation format
// (REFERENCE.md §2.4), as integer kernels compute them, at three instruction-set levels chosen at run time; and the
// fast activation quantizers (f32 -> Q8_0 / Q8_1 / Q8_K, the same bytes as quantize_row). No matmul loop here
// (cpu_matmul.cpp) and no weight quantization (format/quant.h).
//
// Activation rows come from the quantizers here (or quantize_row): their int8 levels lie in [-127, 127], never -128.
// The SIMD kernels rely on that (sign tricks and 16-bit pair sums); the scalar ones do not.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu_isa.h"
#include "format/dtype.h"

namespace strata {

// The best level this CPU (and its OS) runs, and the code was built with.
CpuIsa cpu_isa_supported();

// The level cpu_matmul uses: cpu_isa_supported(), or a lower one named by the environment variable
// STRATA_CPU_ISA=scalar|avx2|avx512 (read once; a level above what the CPU runs falls back to the supported one,
// with a note on stderr). Throws strata::Error for any other value.
CpuIsa cpu_isa_active();

// Sum over k < n of W[k] * X[k]: w holds n elements of the weight type, xq n elements of dot_act_type(type)
// (for F32 that is plain floats). n is a multiple of both block sizes. Quantized types multiply integer levels and
// sum them per sub-block exactly, then scale in fp32 (Q4_1/Q5_1 and K-quant minimums use the activation's s or
// bsums); only the order of fp32 operations differs between levels. Pointers need no alignment beyond the
// block structs'.
using VecDotFn = float (*)(int64_t n, const void *w, const void *xq);

// The same dot product for nx activation rows at once (1 <= nx <= the kernel's max_rows), xq_stride bytes apart:
// out[j] = dot(n, w, xq + j * xq_stride). The weight row is unpacked once for all of them, and each out[j] is bit
// for bit what VecDotFn gives for that row alone, so batching tokens never changes a result.
using VecDotRowsFn = void (*)(int64_t n, const void *w, const void *xq, size_t xq_stride, float *out, int nx);

struct VecDotKernel {
    VecDotFn dot = nullptr;           // nullptr: no dot product for the type
    VecDotRowsFn dot_rows = nullptr;  // nullptr: call dot row by row
    int max_rows = 1;
};

// f32 -> activation format for n elements (a multiple of the block size): exactly quantize_row's bytes.
using QuantizeActFn = void (*)(const float *x, void *xq, int64_t n);

// The kernel for a weight type at a level at most `isa` (a type without a kernel at that level gets the next lower
// one); nullptr when the type has no dot product at all. Asking for a level above cpu_isa_supported() is a bug.
VecDotFn vec_dot_fn(DType weight_type, CpuIsa isa);
VecDotKernel vec_dot_kernel(DType weight_type, CpuIsa isa);

// Whether the weight type has its own kernel at exactly this level (not a fallback).
bool vec_dot_has_kernel(DType weight_type, CpuIsa isa);

// The quantizer for an activation format (Q8_0, Q8_1, Q8_K) at a level at most `isa`; nullptr for other types.
QuantizeActFn quantize_act_fn(DType act_type, CpuIsa isa);

}  // namespace strata
