// Reference (de)quantization of the plain float types and the 32-element block formats (Q4_0 ... Q8_1, MXFP4).
// Every float operation follows the order of gguf-py's numpy code so results match it bit for bit; no SIMD here.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "format/quant_blocks.h"
#include "format/quant_impl.h"

namespace strata::quant_detail {

namespace {

// Nibble of element j (0..31) in a 16-byte array of 32-element blocks: low nibbles hold 0..15, high nibbles 16..31.
inline int nibble32(const uint8_t *qs, int j) {
    return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}

inline void pack_nibbles32(const uint8_t *q, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = uint8_t((q[j] & 15) | (q[j + 16] << 4));
}

inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// gguf's np_roundf (round half away from zero) as an int in [lo, hi]; NaN gives 0. Only non-finite input reaches
// the clamp, where gguf's own result is whatever its float-to-int cast does.
inline int round_away(float v, int lo, int hi) {
    if (std::isnan(v)) return 0;
    return int(std::fmin(std::fmax(std::round(v), float(lo)), float(hi)));
}

// trunc(v) clamped to [0, hi], as gguf computes levels (astype(uint8), then clip); NaN gives 0.
inline int trunc_clamp(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    return v >= float(hi) ? hi : int(v);
}

// a + b with numpy's NaN result when both are NaN (x86 returns the first operand's, quieted; a is a product here,
// so already quiet). Written out because a compiler may swap the operands of a commutative +.
inline float add_first_nan(float a, float b) {
    return std::isnan(a) ? a : a + b;
}

float absmax(const float *x, int n) {
    float m = 0.0f;
    for (int j = 0; j < n; j++) m = std::fmax(m, std::fabs(x[j]));
    return m;
}

void minmax(const float *x, int n, float *mn, float *mx) {
    *mn = x[0];
    *mx = x[0];
    for (int j = 1; j < n; j++) {
        *mn = std::fmin(*mn, x[j]);
        *mx = std::fmax(*mx, x[j]);
    }
}

// MXFP4 scale: 2^(e-128), i.e. half of the E8M0 value 2^(e-127), so that it pairs with the doubled FP4 levels.
// e = 0 and 1 give f32 subnormals.
inline float e8m0_half(uint8_t e) {
    return e < 2 ? bits_to_f32(0x00200000u << e) : bits_to_f32(uint32_t(e - 1) << 23);
}

}  // namespace

// ---- plain floats ------------------------------------------------------------------------------------------------

void dequant_f32(const uint8_t *src, float *dst, int64_t nb) {
    std::memcpy(dst, src, size_t(nb) * 4);
}

void dequant_f16(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) dst[i] = f16_to_f32(load_block<uint16_t>(src, i));
}

void dequant_bf16(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) dst[i] = bf16_to_f32(load_block<uint16_t>(src, i));
}

void quant_f32(const float *src, uint8_t *dst, int64_t nb) {
    std::memcpy(dst, src, size_t(nb) * 4);
}

// NaN inputs become quiet NaNs (as F16C hardware and ggml do); numpy's astype keeps signalling payloads instead.
void quant_f16(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) store_block<uint16_t>(dst, i, f32_to_f16(src[i]));
}

void quant_bf16(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) store_block<uint16_t>(dst, i, f32_to_bf16(src[i]));
}

// ---- dequantization ----------------------------------------------------------------------------------------------

void dequant_q4_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockQ4_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 32; j++) dst[j] = d * float(nibble32(b.qs, j) - 8);
    }
}

void dequant_q4_1(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockQ4_1>(src, i);
        const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
        for (int j = 0; j < 32; j++) dst[j] = add_first_nan(d * float(nibble32(b.qs, j)), m);
    }
}

void dequant_q5_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockQ5_0>(src, i);
        const float d = f16_to_f32(b.d);
        const uint32_t qh = load_u32(b.qh);
        for (int j = 0; j < 32; j++) {
            const int q = nibble32(b.qs, j) | int(((qh >> j) & 1) << 4);
            dst[j] = d * float(q - 16);
        }
    }
}

void dequant_q5_1(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockQ5_1>(src, i);
        const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
        const uint32_t qh = load_u32(b.qh);
        for (int j = 0; j < 32; j++) {
            const int q = nibble32(b.qs, j) | int(((qh >> j) & 1) << 4);
            dst[j] = add_first_nan(d * float(q), m);
        }
    }
}

void dequant_q8_0(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockQ8_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 32; j++) dst[j] = float(b.qs[j]) * d;
    }
}

// The s field is a by-product for dot products; the values are d * qs alone.
void dequant_q8_1(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockQ8_1>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 32; j++) dst[j] = float(b.qs[j]) * d;
    }
}

void dequant_mxfp4(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockMXFP4>(src, i);
        const float d = e8m0_half(b.e);
        for (int j = 0; j < 32; j++) dst[j] = d * float(kvalues_mxfp4[nibble32(b.qs, j)]);
    }
}

// ---- quantization ------------------------------------------------------------------------------------------------
// These reproduce gguf-py's quantizers (which mirror ggml's reference C): the integer levels are computed from the
// unrounded f32 scale, then the scale is stored as fp16.

void quant_q8_0(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        BlockQ8_0 b;
        const float d = absmax(src, 32) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) b.qs[j] = int8_t(round_away(src[j] * id, -128, 127));
        b.d = f32_to_f16(d);
        store_block(dst, i, b);
    }
}

// CPU flavour of Q8_1: levels as Q8_0's (round(x * (1/d)), half away from zero), s = d * sum(qs) with the unrounded
// d, both fields fp16 (ggml's CUDA quantizer stores s = sum(x) instead).
void quant_q8_1(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        BlockQ8_1 b;
        const float d = absmax(src, 32) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            b.qs[j] = int8_t(round_away(src[j] * id, -128, 127));
            sum += b.qs[j];
        }
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(d * float(sum));
        store_block(dst, i, b);
    }
}

void quant_q4_0(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        const float d = signed_absmax(32, src) / -8.0f;  // the largest magnitude maps to level -8
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = uint8_t(trunc_clamp(src[j] * id + 8.5f, 15));
        BlockQ4_0 b;
        b.d = f32_to_f16(d);
        pack_nibbles32(q, b.qs);
        store_block(dst, i, b);
    }
}

void quant_q4_1(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        float mn, mx;
        minmax(src, 32, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = uint8_t(trunc_clamp((src[j] - mn) * id + 0.5f, 15));
        BlockQ4_1 b;
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(mn);
        pack_nibbles32(q, b.qs);
        store_block(dst, i, b);
    }
}

namespace {
void pack_q5(const uint8_t *q, uint8_t *qs, uint8_t *qh_bytes) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) qh |= uint32_t(q[j] >> 4) << j;
    pack_nibbles32(q, qs);
    std::memcpy(qh_bytes, &qh, 4);
}
}  // namespace

void quant_q5_0(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        const float d = signed_absmax(32, src) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = uint8_t(trunc_clamp(src[j] * id + 16.5f, 31));
        BlockQ5_0 b;
        b.d = f32_to_f16(d);
        pack_q5(q, b.qs, b.qh);
        store_block(dst, i, b);
    }
}

void quant_q5_1(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        float mn, mx;
        minmax(src, 32, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[32];
        for (int j = 0; j < 32; j++) q[j] = uint8_t(trunc_clamp((src[j] - mn) * id + 0.5f, 31));
        BlockQ5_1 b;
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(mn);
        pack_q5(q, b.qs, b.qh);
        store_block(dst, i, b);
    }
}

// Shared exponent from the largest magnitude: e = floor(log2(amax)) - 2 + 127, so that amax / 2^(e-128) lies in
// [8, 16), around the largest doubled FP4 level (12). floor() is taken of log2 rounded to f32, as numpy's float32
// log2 gives it: for amax a few ulps below a power of two that rounds up to the power, and matching gguf's bytes
// depends on doing the same.
// Blocks with amax < 2^-125 would need e < 0; gguf's uint8 cast wraps those round to 232..255 (an all-zero block),
// we clamp to e = 0, which keeps them.
void quant_mxfp4(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        const float amax = absmax(src, 32);
        int e = 0;
        if (amax > 0.0f) e = round_clamp(std::floor(float(std::log2(double(amax)))) - 2.0f + 127.0f, 0, 255);
        const float d = e8m0_half(uint8_t(e));
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            int best = 0;
            float best_err = std::fabs(d * float(kvalues_mxfp4[0]) - src[j]);
            for (int k = 1; k < 16; k++) {
                const float err = std::fabs(d * float(kvalues_mxfp4[k]) - src[j]);
                if (err < best_err) best_err = err, best = k;
            }
            q[j] = uint8_t(best);
        }
        BlockMXFP4 b;
        b.e = uint8_t(e);
        pack_nibbles32(q, b.qs);
        store_block(dst, i, b);
    }
}

}  // namespace strata::quant_detail
