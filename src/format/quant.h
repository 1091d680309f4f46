// Quantized block formats: scalar reference dequantization and quantization on the CPU, one row at a time.
// These are the definitions every faster path (SIMD, CUDA) is tested against. Block layouts are in
// ../shared/REFERENCE.md §2 and format/quant_blocks.h. Dequantization equals gguf-py's numpy code bit for bit.
#pragma once

#include <cstdint>

#include "format/dtype.h"

namespace strata {

// Whether a reference dequantizer / quantizer exists for the type. Both exist for F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q8_1, MXFP4, Q2_K ... Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M,
// TQ1_0, TQ2_0; neither for the integer types and F64.
bool can_dequantize(DType t);
bool can_quantize(DType t);

// The activation format a weight type's dot products read (REFERENCE.md §2.4): F32 for F32/F16/BF16 weights, else
// Q8_0, Q8_1 or Q8_K. Every backend quantizes activations to it, so all compute one function.
DType dot_act_type(DType weight_type);

// dst[0..n) = the values encoded in n elements of type t at src (any alignment).
// Throws strata::Error for a type without a dequantizer, or an n that is negative or not a multiple of the type's
// block size; nothing is read or written then.
void dequantize_row(DType t, const void *src, float *dst, int64_t n);

// Encode n floats as type t into dst (row_bytes(t, n) bytes, any alignment). Deterministic: the bytes depend only on
// the input, block by block. Throws strata::Error as dequantize_row does (and for a type without a quantizer).
// Where gguf-py has a quantizer (BF16, F16 via numpy, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0) the bytes
// are its bytes, except that NaN inputs to F16 come out quiet and MXFP4 blocks whose largest magnitude is below
// 2^-125 keep e = 0 where gguf's exponent wraps around. Q8_1 stores s = d * sum(qs) (the CPU convention); Q8_K
// stores an f32 d that is negative when the block's largest-magnitude value is positive. The K-quant and i-quant
// quantizers are our own (quant_k.cpp, quant_iq.cpp, quant_iq_grid.cpp).
void quantize_row(DType t, const float *src, void *dst, int64_t n);

}  // namespace strata
