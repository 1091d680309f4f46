// Quantized block formats: scalar reference dequantization and quantization on the CPU, one row at a time.
// These are the definitions every faster path (SIMD, CUDA) is tested against. Block layouts are in
// ../shared/REFERENCE.md §2; n is always a multiple of the type's block size.
#pragma once

#include <cstdint>

#include "format/dtype.h"

namespace strata {

// Whether a reference (de)quantizer exists for the type.
bool can_dequantize(DType t);
bool can_quantize(DType t);

// dst[0..n) = the values encoded in n elements of type t at src.
void dequantize_row(DType t, const void *src, float *dst, int64_t n);

// Encode n floats as type t into dst (row_bytes(t, n) bytes). Throws strata::Error for a type with no quantizer.
void quantize_row(DType t, const float *src, void *dst, int64_t n);

}  // namespace strata
