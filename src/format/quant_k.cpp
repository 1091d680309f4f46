// Reference (de)quantization of the K-quants (Q2_K ... Q6_K) and the Q8_K activation format. Dequantization follows
// gguf-py's operation order bit for bit; the quantizers are our own least-squares searches (no importance matrix).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/fp16.h"
#include "format/quant_blocks.h"
#include "format/quant_impl.h"

namespace strata::quant_detail {

// ---- dequantization ----------------------------------------------------------------------------------------------

void dequant_q2_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockQ2K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            const int q = (b.qs[32 * h + l] >> (2 * j)) & 3;
            const uint8_t sc = b.scales[e / 16];
            const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
            dst[e] = dl * float(q) - ml;
        }
    }
}

namespace {
// Q3_K's 16 six-bit scales, stored +32: low nibbles in bytes 0-7, high bit pairs in bytes 8-11.
int q3k_scale(const uint8_t *scales, int i) {
    const int lo = i < 8 ? (scales[i] & 15) : (scales[i - 8] >> 4);
    const int hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Q4_K / Q5_K: 8 six-bit scales and mins packed in 12 bytes.
void qk_scale_min(const uint8_t *scales, int b, int *sc, int *m) {
    if (b < 4) {
        *sc = scales[b] & 63;
        *m = scales[b + 4] & 63;
    } else {
        *sc = (scales[b + 4] & 15) | ((scales[b - 4] >> 6) << 4);
        *m = (scales[b + 4] >> 4) | ((scales[b] >> 6) << 4);
    }
}

void qk_pack_scale_min(const int *sc, const int *m, uint8_t *scales) {
    for (int j = 0; j < 4; j++) {
        scales[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        scales[j + 8] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}
}  // namespace

void dequant_q3_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockQ3K>(src, i);
        const float d = f16_to_f32(b.d);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = (b.qs[32 * h + l] >> (2 * j)) & 3;
            if (!((b.hmask[l] >> (4 * h + j)) & 1)) q -= 4;
            const float dl = d * float(q3k_scale(b.scales, e / 16));
            dst[e] = dl * float(q);
        }
    }
}

void dequant_q4_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockQ4K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int p = e / 64, l = e % 32, sub = e / 32;
            const int q = (e % 64) < 32 ? (b.qs[32 * p + l] & 15) : (b.qs[32 * p + l] >> 4);
            int sc, m;
            qk_scale_min(b.scales, sub, &sc, &m);
            const float dl = d * float(sc), dm = dmin * float(m);
            dst[e] = dl * float(q) - dm;
        }
    }
}

void dequant_q5_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockQ5K>(src, i);
        const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int p = e / 64, l = e % 32, sub = e / 32;
            const bool high = (e % 64) >= 32;
            int q = high ? (b.qs[32 * p + l] >> 4) : (b.qs[32 * p + l] & 15);
            q |= ((b.qh[l] >> (2 * p + (high ? 1 : 0))) & 1) << 4;
            int sc, m;
            qk_scale_min(b.scales, sub, &sc, &m);
            const float dl = d * float(sc), dm = dmin * float(m);
            dst[e] = dl * float(q) - dm;
        }
    }
}

void dequant_q6_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockQ6K>(src, i);
        const float d = f16_to_f32(b.d);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, r = e % 128, t = r / 32, l = r % 32;
            const uint8_t byte = b.ql[64 * h + 32 * (t & 1) + l];
            const int low = t < 2 ? (byte & 15) : (byte >> 4);
            const int high = (b.qh[32 * h + l] >> (2 * t)) & 3;
            const float dl = d * float(b.scales[e / 16]);
            dst[e] = dl * float((low | (high << 4)) - 32);
        }
    }
}

void dequant_q8_k(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += QK_K_BLOCK) {
        const auto b = load_block<BlockQ8K>(src, i);
        for (int e = 0; e < QK_K_BLOCK; e++) dst[e] = b.d * float(b.qs[e]);
    }
}

// ---- quantization ------------------------------------------------------------------------------------------------
// Two stages per super-block: fit a float scale (and min) per sub-block, then quantize those with the fp16
// super-block scale(s), choosing each integer sub-scale from its rounding's neighbours by the error it gives, and
// finally refit the super-block scales by least squares over the whole block and keep that if it is better.
// Errors are measured with the dequantization formula itself, so what is minimised is what a reader will see.

namespace {

// Asymmetric K-quants (Q2_K, Q4_K, Q5_K): y = (d*sc)*q - (dmin*m), q in [0, nmax], sc and m in [0, scale_max].
struct AsymLayout {
    int n_sub, sub_len, nmax, scale_max;
};

struct AsymPlan {
    float d = 0.0f, dmin = 0.0f;  // fp16-representable
    int sc[16] = {}, m[16] = {};
    uint8_t q[QK_K_BLOCK] = {};
    float err = 0.0f;
};

// Integer sub-scales and levels for the super-block scales already in p (targets: the per-sub-block float fits).
void asym_assign(const AsymLayout &lay, const float *x, const float *scales, const float *mins, AsymPlan &p) {
    p.err = 0.0f;
    for (int j = 0; j < lay.n_sub; j++) {
        const float *xs = x + j * lay.sub_len;
        const int sc0 = p.d > 0.0f ? round_clamp(scales[j] / p.d, 0, lay.scale_max) : 0;
        const int m0 = p.dmin > 0.0f ? round_clamp(mins[j] / p.dmin, 0, lay.scale_max) : 0;
        float best = std::numeric_limits<float>::infinity();
        for (int sc = std::max(sc0 - 1, 0); sc <= std::min(sc0 + 1, lay.scale_max); sc++) {
            for (int m = std::max(m0 - 1, 0); m <= std::min(m0 + 1, lay.scale_max); m++) {
                const float dl = p.d * float(sc), dm = p.dmin * float(m);
                const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
                float err = 0.0f;
                uint8_t q[32];
                for (int i = 0; i < lay.sub_len; i++) {
                    q[i] = uint8_t(round_clamp((xs[i] + dm) * idl, 0, lay.nmax));
                    const float diff = dl * float(q[i]) - dm - xs[i];
                    err += diff * diff;
                }
                if (err < best) {
                    best = err, p.sc[j] = sc, p.m[j] = m;
                    for (int i = 0; i < lay.sub_len; i++) p.q[j * lay.sub_len + i] = q[i];
                }
            }
        }
        p.err += best;
    }
}

AsymPlan asym_quantize(const AsymLayout &lay, const float *x) {
    float scales[16], mins[16];
    AsymPlan p;
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < lay.n_sub; j++) {
        scales[j] =
            fit_asymmetric(lay.sub_len, lay.nmax, x + j * lay.sub_len, nullptr, p.q + j * lay.sub_len, &mins[j]);
        max_scale = std::fmax(max_scale, scales[j]);
        max_min = std::fmax(max_min, mins[j]);
    }
    p.d = f16_round(max_scale / float(lay.scale_max));
    p.dmin = f16_round(max_min / float(lay.scale_max));
    asym_assign(lay, x, scales, mins, p);

    // Refit (d, dmin) for the chosen integers: x ~ d*A - dmin*B with A = sc*q, B = m.
    for (int iter = 0; iter < 2; iter++) {
        float saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;
        for (int e = 0; e < lay.n_sub * lay.sub_len; e++) {
            const int j = e / lay.sub_len;
            const float a = float(p.sc[j] * p.q[e]), b = float(p.m[j]);
            saa += a * a, sab += a * b, sbb += b * b, sax += a * x[e], sbx += b * x[e];
        }
        const float det = saa * sbb - sab * sab;
        float d, dmin;
        if (det > 0.0f) {
            d = (sax * sbb - sab * sbx) / det;
            dmin = (sab * sax - saa * sbx) / det;
        } else {
            d = saa > 0.0f ? sax / saa : 0.0f;
            dmin = sbb > 0.0f ? -sbx / sbb : 0.0f;
        }
        if (!(d >= 0.0f)) d = 0.0f;
        if (!(dmin >= 0.0f)) dmin = 0.0f;
        AsymPlan t = p;
        t.d = f16_round(d);
        t.dmin = f16_round(dmin);
        if (t.d == p.d && t.dmin == p.dmin) break;
        asym_assign(lay, x, scales, mins, t);
        if (!(t.err < p.err)) break;
        p = t;
    }
    return p;
}

// Symmetric K-quants (Q3_K, Q6_K): y = (d*s)*q, q in [-nmax, nmax-1], s in [-scale_lo, scale_lo-1].
struct SymLayout {
    int n_sub, sub_len, nmax, scale_lo;
};

struct SymPlan {
    float d = 0.0f;
    int s[16] = {};
    int8_t q[QK_K_BLOCK] = {};
    float err = 0.0f;
};

void sym_assign(const SymLayout &lay, const float *x, const float *scales, SymPlan &p) {
    p.err = 0.0f;
    for (int j = 0; j < lay.n_sub; j++) {
        const float *xs = x + j * lay.sub_len;
        const int s0 = p.d != 0.0f ? round_clamp(scales[j] / p.d, -lay.scale_lo, lay.scale_lo - 1) : 0;
        float best = std::numeric_limits<float>::infinity();
        for (int s = std::max(s0 - 1, -lay.scale_lo); s <= std::min(s0 + 1, lay.scale_lo - 1); s++) {
            const float dl = p.d * float(s);
            const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            float err = 0.0f;
            int8_t q[32];
            for (int i = 0; i < lay.sub_len; i++) {
                q[i] = int8_t(round_clamp(xs[i] * idl, -lay.nmax, lay.nmax - 1));
                const float diff = dl * float(q[i]) - xs[i];
                err += diff * diff;
            }
            if (err < best) {
                best = err, p.s[j] = s;
                for (int i = 0; i < lay.sub_len; i++) p.q[j * lay.sub_len + i] = q[i];
            }
        }
        p.err += best;
    }
}

SymPlan sym_quantize(const SymLayout &lay, const float *x) {
    float scales[16];
    SymPlan p;
    for (int j = 0; j < lay.n_sub; j++)
        scales[j] = fit_symmetric(lay.sub_len, lay.nmax, x + j * lay.sub_len, nullptr, p.q + j * lay.sub_len);
    // The sub-scale of largest magnitude goes to -scale_lo, the end of the range without a positive twin.
    p.d = f16_round(signed_absmax(lay.n_sub, scales) / -float(lay.scale_lo));
    sym_assign(lay, x, scales, p);

    for (int iter = 0; iter < 2; iter++) {
        float saa = 0, sax = 0;
        for (int e = 0; e < lay.n_sub * lay.sub_len; e++) {
            const float a = float(p.s[e / lay.sub_len] * p.q[e]);
            saa += a * a, sax += a * x[e];
        }
        if (!(saa > 0.0f)) break;
        SymPlan t = p;
        t.d = f16_round(sax / saa);
        if (t.d == p.d) break;
        sym_assign(lay, x, scales, t);
        if (!(t.err < p.err)) break;
        p = t;
    }
    return p;
}

}  // namespace

void quant_q2_k(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const AsymPlan p = asym_quantize({16, 16, 3, 15}, src);
        BlockQ2K b = {};
        for (int j = 0; j < 16; j++) b.scales[j] = uint8_t(p.sc[j] | (p.m[j] << 4));
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            b.qs[32 * h + l] |= uint8_t(p.q[e] << (2 * j));
        }
        b.d = f32_to_f16(p.d);
        b.dmin = f32_to_f16(p.dmin);
        store_block(dst, i, b);
    }
}

void quant_q3_k(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SymPlan p = sym_quantize({16, 16, 4, 32}, src);
        BlockQ3K b = {};
        for (int j = 0; j < 16; j++) {
            const int v = p.s[j] + 32;
            if (j < 8)
                b.scales[j] |= uint8_t(v & 15);
            else
                b.scales[j - 8] |= uint8_t((v & 15) << 4);
            b.scales[8 + j % 4] |= uint8_t((v >> 4) << (2 * (j / 4)));
        }
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            const int q = p.q[e] + 4;  // 0..7: low two bits in qs, bit 2 in hmask (clear means "minus 4")
            b.qs[32 * h + l] |= uint8_t((q & 3) << (2 * j));
            b.hmask[l] |= uint8_t((q >> 2) << (4 * h + j));
        }
        b.d = f32_to_f16(p.d);
        store_block(dst, i, b);
    }
}

namespace {
template <class Block>
void pack_q4k_q5k(const AsymPlan &p, Block &b) {
    qk_pack_scale_min(p.sc, p.m, b.scales);
    for (int e = 0; e < QK_K_BLOCK; e++) {
        const int pp = e / 64, l = e % 32;
        const bool high = (e % 64) >= 32;
        b.qs[32 * pp + l] |= uint8_t((p.q[e] & 15) << (high ? 4 : 0));
        if constexpr (std::is_same_v<Block, BlockQ5K>) b.qh[l] |= uint8_t((p.q[e] >> 4) << (2 * pp + (high ? 1 : 0)));
    }
    b.d = f32_to_f16(p.d);
    b.dmin = f32_to_f16(p.dmin);
}
}  // namespace

void quant_q4_k(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        BlockQ4K b = {};
        pack_q4k_q5k(asym_quantize({8, 32, 15, 63}, src), b);
        store_block(dst, i, b);
    }
}

void quant_q5_k(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        BlockQ5K b = {};
        pack_q4k_q5k(asym_quantize({8, 32, 31, 63}, src), b);
        store_block(dst, i, b);
    }
}

void quant_q6_k(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SymPlan p = sym_quantize({16, 16, 32, 128}, src);
        BlockQ6K b = {};
        for (int j = 0; j < 16; j++) b.scales[j] = int8_t(p.s[j]);
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, r = e % 128, t = r / 32, l = r % 32;
            const int q = p.q[e] + 32;  // 0..63
            b.ql[64 * h + 32 * (t & 1) + l] |= uint8_t((q & 15) << (t < 2 ? 0 : 4));
            b.qh[32 * h + l] |= uint8_t((q >> 4) << (2 * t));
        }
        b.d = f32_to_f16(p.d);
        store_block(dst, i, b);
    }
}

// Activation format: iscale = -127/max with max the signed largest-magnitude value, so max lands on -127; d = 1/iscale
// is kept in f32 (negative when max is positive). Levels round to nearest, ties to even.
void quant_q8_k(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        BlockQ8K b = {};
        const float max = signed_absmax(QK_K_BLOCK, src);
        if (max != 0.0f) {
            const float iscale = -127.0f / max;
            for (int e = 0; e < QK_K_BLOCK; e++) b.qs[e] = int8_t(round_clamp(iscale * src[e], -128, 127));
            b.d = 1.0f / iscale;
        }
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int e = 0; e < 16; e++) sum += b.qs[16 * j + e];
            b.bsums[j] = int16_t(sum);
        }
        store_block(dst, i, b);
    }
}

}  // namespace strata::quant_detail
