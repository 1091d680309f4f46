// Reference (de)quantization of the ternary formats TQ1_0 (base-3 packed) and TQ2_0 (2 bits per value), both
// y = d * (q - 1) with q in {0, 1, 2}. Bit for bit with gguf-py in both directions; no search, d = max |x|.
#include <cmath>

#include "core/fp16.h"
#include "format/quant_blocks.h"
#include "format/quant_impl.h"

namespace strata::quant_detail {

namespace {

// TQ1_0 stores 5 base-3 digits v = sum q_p 3^(4-p) per byte as ceil(v * 256 / 243), a fixed-point fraction of 243,
// so digit p comes back as ((byte * 3^p) mod 256) * 3 >> 8. Byte j of qs[0..31] holds elements j + 32p (p = 0..4),
// byte j of qs[32..47] elements 160 + j + 16p, byte j of qh elements 240 + j + 4p (p = 0..3, fifth digit zero).
constexpr uint8_t k_pow3[5] = {1, 3, 9, 27, 81};

inline int tq1_digit(uint8_t byte, int p) {
    const uint8_t v = uint8_t(byte * k_pow3[p]);  // mod 256, as the format defines it
    return (int(v) * 3) >> 8;
}

inline uint8_t tq1_pack(const uint8_t *q, int stride, int n_digits) {
    int v = 0;
    for (int p = 0; p < n_digits; p++) v += q[p * stride] * k_pow3[4 - p];
    return uint8_t((v * 256 + 242) / 243);
}

// gguf's np_roundf(x * id) + 1 for the ternary formats, as an int in [0, 2] (NaN gives 1).
inline uint8_t ternary_level(float v) {
    if (std::isnan(v)) return 1;
    return uint8_t(std::fmin(std::fmax(std::round(v), -1.0f), 1.0f) + 1.0f);
}

}  // namespace

void dequant_tq1_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockTQ1_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (int p = 0; p < 5; p++)
            for (int j = 0; j < 32; j++) dst[32 * p + j] = d * float(tq1_digit(b.qs[j], p) - 1);
        for (int p = 0; p < 5; p++)
            for (int j = 0; j < 16; j++) dst[160 + 16 * p + j] = d * float(tq1_digit(b.qs[32 + j], p) - 1);
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 4; j++) dst[240 + 4 * p + j] = d * float(tq1_digit(b.qh[j], p) - 1);
    }
}

void dequant_tq2_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockTQ2_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            dst[e] = d * float(((b.qs[32 * h + l] >> (2 * j)) & 3) - 1);
        }
    }
}

void quant_tq1_0(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        float d = 0.0f;
        for (int e = 0; e < QK_K_BLOCK; e++) d = std::fmax(d, std::fabs(src[e]));
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK_K_BLOCK];
        for (int e = 0; e < QK_K_BLOCK; e++) q[e] = ternary_level(src[e] * id);
        BlockTQ1_0 b;
        for (int j = 0; j < 32; j++) b.qs[j] = tq1_pack(q + j, 32, 5);
        for (int j = 0; j < 16; j++) b.qs[32 + j] = tq1_pack(q + 160 + j, 16, 5);
        for (int j = 0; j < 4; j++) b.qh[j] = tq1_pack(q + 240 + j, 4, 4);
        b.d = f32_to_f16(d);
        store_block(dst, i, b);
    }
}

void quant_tq2_0(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        float d = 0.0f;
        for (int e = 0; e < QK_K_BLOCK; e++) d = std::fmax(d, std::fabs(src[e]));
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        BlockTQ2_0 b = {};
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            b.qs[32 * h + l] |= uint8_t(ternary_level(src[e] * id) << (2 * j));
        }
        b.d = f32_to_f16(d);
        store_block(dst, i, b);
    }
}

}  // namespace strata::quant_detail
