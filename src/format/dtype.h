// ggml tensor types as stored in GGUF files: ids, block sizes and bytes per block. Layout facts only; the
// (de)quantization code lives in quant.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : int32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
    I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct DTypeInfo {
    DType type;
    const char *name;     // as ggml/gguf-py spell it: "Q4_K", "IQ2_XXS", "BF16"
    int32_t block_size;   // elements per block
    int32_t block_bytes;  // bytes per block
};

constexpr int32_t QK_K = 256;

// Layout of a type id read from a file; nothing for ids that are unknown or were removed from ggml.
const DTypeInfo *dtype_info(int32_t id);
const DTypeInfo &dtype_info(DType t);
const char *dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

// Every known type, in id order.
const DTypeInfo *dtype_all(size_t *count);

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t row_bytes(DType t, int64_t n) {
    const DTypeInfo &i = dtype_info(t);
    return size_t(n / i.block_size) * size_t(i.block_bytes);
}

}  // namespace strata
