// quant.h's entry points: argument checks and dispatch to the per-type block functions (quant_legacy.cpp,
// quant_k.cpp, quant_iq.cpp, quant_iq_grid.cpp, quant_ternary.cpp). No arithmetic here.
#include "format/quant.h"

#include "core/error.h"
#include "format/quant_impl.h"

namespace strata {

namespace {

using namespace quant_detail;

struct QuantFns {
    DType type;
    DequantFn dequant;
    QuantFn quant;  // nullptr: no reference quantizer
};

constexpr QuantFns k_fns[] = {
    {DType::F32, dequant_f32, quant_f32},
    {DType::F16, dequant_f16, quant_f16},
    {DType::BF16, dequant_bf16, quant_bf16},
    {DType::Q4_0, dequant_q4_0, quant_q4_0},
    {DType::Q4_1, dequant_q4_1, quant_q4_1},
    {DType::Q5_0, dequant_q5_0, quant_q5_0},
    {DType::Q5_1, dequant_q5_1, quant_q5_1},
    {DType::Q8_0, dequant_q8_0, quant_q8_0},
    {DType::Q8_1, dequant_q8_1, quant_q8_1},
    {DType::MXFP4, dequant_mxfp4, quant_mxfp4},
    {DType::Q2_K, dequant_q2_k, quant_q2_k},
    {DType::Q3_K, dequant_q3_k, quant_q3_k},
    {DType::Q4_K, dequant_q4_k, quant_q4_k},
    {DType::Q5_K, dequant_q5_k, quant_q5_k},
    {DType::Q6_K, dequant_q6_k, quant_q6_k},
    {DType::Q8_K, dequant_q8_k, quant_q8_k},
    {DType::IQ4_NL, dequant_iq4_nl, quant_iq4_nl},
    {DType::IQ4_XS, dequant_iq4_xs, quant_iq4_xs},
    {DType::IQ2_XXS, dequant_iq2_xxs, quant_iq2_xxs},
    {DType::IQ2_XS, dequant_iq2_xs, quant_iq2_xs},
    {DType::IQ2_S, dequant_iq2_s, quant_iq2_s},
    {DType::IQ3_XXS, dequant_iq3_xxs, quant_iq3_xxs},
    {DType::IQ3_S, dequant_iq3_s, quant_iq3_s},
    {DType::IQ1_S, dequant_iq1_s, quant_iq1_s},
    {DType::IQ1_M, dequant_iq1_m, quant_iq1_m},
    {DType::TQ1_0, dequant_tq1_0, quant_tq1_0},
    {DType::TQ2_0, dequant_tq2_0, quant_tq2_0},
};

const QuantFns *find(DType t) {
    for (const QuantFns &f : k_fns)
        if (f.type == t) return &f;
    return nullptr;
}

// Number of blocks in n elements of t; throws for a count that is negative or not a whole number of blocks.
int64_t block_count(DType t, int64_t n, const char *what) {
    const int64_t bs = dtype_info(t).block_size;
    if (n < 0 || n % bs != 0)
        fail("%s %s: %lld elements is not a whole number of %lld-element blocks", what, dtype_name(t), (long long)n,
             (long long)bs);
    return n / bs;
}

}  // namespace

bool can_dequantize(DType t) {
    return find(t) != nullptr;
}

bool can_quantize(DType t) {
    const QuantFns *f = find(t);
    return f != nullptr && f->quant != nullptr;
}

void dequantize_row(DType t, const void *src, float *dst, int64_t n) {
    const QuantFns *f = find(t);
    if (!f) fail("dequantize %s: no dequantizer for this type", dtype_name(t));
    const int64_t nb = block_count(t, n, "dequantize");
    if (nb > 0) f->dequant(static_cast<const uint8_t *>(src), dst, nb);
}

void quantize_row(DType t, const float *src, void *dst, int64_t n) {
    const QuantFns *f = find(t);
    if (!f || !f->quant) fail("quantize %s: no quantizer for this type", dtype_name(t));
    const int64_t nb = block_count(t, n, "quantize");
    if (nb > 0) f->quant(src, static_cast<uint8_t *>(dst), nb);
}

DType dot_act_type(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16: return DType::F32;
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q8_0:
        case DType::IQ4_NL:
        case DType::MXFP4: return DType::Q8_0;
        case DType::Q4_1:
        case DType::Q5_1: return DType::Q8_1;
        default: return DType::Q8_K;
    }
}

}  // namespace strata
