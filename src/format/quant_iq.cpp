// Reference dequantization of every i-quant (IQ1_S ... IQ4_XS), bit for bit in gguf-py's operation order, and the
// quantizers of the non-linear 4-bit formats IQ4_NL / IQ4_XS. Not the grid formats' quantizers (quant_iq_grid.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/fp16.h"
#include "format/iq_grids.h"
#include "format/quant_blocks.h"
#include "format/quant_impl.h"

namespace strata::quant_detail {

namespace {

inline uint8_t grid_byte(uint64_t entry, int j) {
    return uint8_t(entry >> (8 * j));
}

// v * (bit j of mask ? -1 : +1) as IEEE multiplication gives it (numpy multiplies by a +-1 array): the same as
// negation except that a NaN keeps its sign. Written out because compilers turn a multiply by +-1 into a negation.
inline float apply_sign(float v, uint8_t mask, int j) {
    return ((mask >> j) & 1) && !std::isnan(v) ? -v : v;
}

inline uint32_t load_u32(const void *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

}  // namespace

void dequant_iq4_nl(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += 32) {
        const auto b = load_block<BlockIQ4NL>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * float(kvalues_iq4nl[b.qs[j] & 15]);
            dst[j + 16] = d * float(kvalues_iq4nl[b.qs[j] >> 4]);
        }
    }
}

void dequant_iq4_xs(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ4XS>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++, dst += 32) {
            const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b.scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * float(ls - 32);
            const uint8_t *qs = b.qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                dst[j] = dl * float(kvalues_iq4nl[qs[j] & 15]);
                dst[j + 16] = dl * float(kvalues_iq4nl[qs[j] >> 4]);
            }
        }
    }
}

void dequant_iq2_xxs(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ2XXS>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a0 = load_u32(&b.qs[4 * ib]), a1 = load_u32(&b.qs[4 * ib + 2]);
            const float db = d * (0.5f + float(a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, dst += 8) {
                const uint64_t g = iq::iq2xxs_grid[(a0 >> (8 * l)) & 255];
                const uint8_t signs = iq::ksigns_iq2xs[(a1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++) dst[j] = apply_sign(db * float(grid_byte(g, j)), signs, j);
            }
        }
    }
}

void dequant_iq2_xs(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ2XS>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++, dst += 8) {
                const int s = (b.scales[ib] >> (l < 2 ? 0 : 4)) & 15;
                const float db = d * (0.5f + float(s)) * 0.25f;
                const uint16_t w = b.qs[4 * ib + l];
                const uint64_t g = iq::iq2xs_grid[w & 511];
                const uint8_t signs = iq::ksigns_iq2xs[w >> 9];
                for (int j = 0; j < 8; j++) dst[j] = apply_sign(db * float(grid_byte(g, j)), signs, j);
            }
        }
    }
}

void dequant_iq2_s(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ2S>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++, dst += 8) {
                const int s = (b.scales[ib] >> (l < 2 ? 0 : 4)) & 15;
                const float db = d * (0.5f + float(s)) * 0.25f;
                const int index = b.qs[4 * ib + l] | (((b.qh[ib] >> (2 * l)) & 3) << 8);
                const uint64_t g = iq::iq2s_grid[index];
                const uint8_t signs = b.qs[32 + 4 * ib + l];
                for (int j = 0; j < 8; j++) dst[j] = apply_sign(db * float(grid_byte(g, j)), signs, j);
            }
        }
    }
}

void dequant_iq3_xxs(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ3XXS>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a = load_u32(b.qs + 64 + 4 * ib);
            const float db = d * (0.5f + float(a >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, dst += 8) {
                const uint32_t g0 = iq::iq3xxs_grid[b.qs[8 * ib + 2 * l]];
                const uint32_t g1 = iq::iq3xxs_grid[b.qs[8 * ib + 2 * l + 1]];
                const uint8_t signs = iq::ksigns_iq2xs[(a >> (7 * l)) & 127];
                for (int j = 0; j < 4; j++) {
                    dst[j] = apply_sign(db * float(grid_byte(g0, j)), signs, j);
                    dst[j + 4] = apply_sign(db * float(grid_byte(g1, j)), signs, j + 4);
                }
            }
        }
    }
}

void dequant_iq3_s(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ3S>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++) {
            const int s = (b.scales[ib / 2] >> (4 * (ib % 2))) & 15;
            const float db = d * float(1 + 2 * s);
            for (int l = 0; l < 4; l++, dst += 8) {
                const int i0 = b.qs[8 * ib + 2 * l] | (((b.qh[ib] >> (2 * l)) & 1) << 8);
                const int i1 = b.qs[8 * ib + 2 * l + 1] | (((b.qh[ib] >> (2 * l + 1)) & 1) << 8);
                const uint32_t g0 = iq::iq3s_grid[i0], g1 = iq::iq3s_grid[i1];
                const uint8_t signs = b.signs[4 * ib + l];
                for (int j = 0; j < 4; j++) {
                    dst[j] = apply_sign(db * float(grid_byte(g0, j)), signs, j);
                    dst[j + 4] = apply_sign(db * float(grid_byte(g1, j)), signs, j + 4);
                }
            }
        }
    }
}

void dequant_iq1_s(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ1S>(src, i);
        const float d = f16_to_f32(b.d);
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t w = b.qh[ib];
            const float dl = d * float(2 * ((w >> 12) & 7) + 1);
            const float delta = (w & 0x8000) ? -IQ1_DELTA : IQ1_DELTA;
            for (int l = 0; l < 4; l++, dst += 8) {
                const uint64_t g = iq::iq1s_grid[b.qs[4 * ib + l] | (((w >> (3 * l)) & 7) << 8)];
                for (int j = 0; j < 8; j++) dst[j] = dl * (float(int8_t(grid_byte(g, j))) + delta);
            }
        }
    }
}

void dequant_iq1_m(const uint8_t *src, float *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const auto b = load_block<BlockIQ1M>(src, i);
        uint16_t sc[4];
        std::memcpy(sc, b.scales, 8);
        const uint16_t d_bits =
            uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = f16_to_f32(d_bits);
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++, dst += 8) {
                const int s = (sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
                const float dl = d * float(2 * s + 1);
                const int nib = (b.qh[2 * ib + l / 2] >> (4 * (l % 2))) & 15;
                const float delta = (nib & 8) ? -IQ1_DELTA : IQ1_DELTA;
                const uint64_t g = iq::iq1s_grid[b.qs[4 * ib + l] | ((nib & 7) << 8)];
                for (int j = 0; j < 8; j++) dst[j] = dl * (float(int8_t(grid_byte(g, j))) + delta);
            }
        }
    }
}

// ---- IQ4 quantization --------------------------------------------------------------------------------------------

namespace {

// Levels for a block of 32 with the final scale dl (as the reader computes it), and their squared error.
float iq4_assign(const float *x, float dl, uint8_t *idx) {
    const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
    float err = 0.0f;
    for (int j = 0; j < 32; j++) {
        idx[j] = uint8_t(nearest_level16(kvalues_iq4nl, x[j] * idl));
        const float diff = dl * float(kvalues_iq4nl[idx[j]]) - x[j];
        err += diff * diff;
    }
    return err;
}

void pack_iq4_nibbles(const uint8_t *idx, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = uint8_t(idx[j] | (idx[j + 16] << 4));
}

}  // namespace

void quant_iq4_nl(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += 32) {
        uint8_t idx[32];
        const float d = f16_round(fit_iq4(32, kvalues_iq4nl, src, nullptr, idx));
        iq4_assign(src, d, idx);
        BlockIQ4NL b;
        b.d = f32_to_f16(d);
        pack_iq4_nibbles(idx, b.qs);
        store_block(dst, i, b);
    }
}

// Eight sub-blocks of 32 with 6-bit signed scales (ls - 32) under one fp16 d: float fit per sub-block, the largest
// magnitude on -32, each integer scale picked from its rounding's neighbours by error, then a least-squares refit of
// d kept if it helps.
void quant_iq4_xs(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        float scales[8];
        uint8_t idx[QK_K_BLOCK];
        for (int ib = 0; ib < 8; ib++) scales[ib] = fit_iq4(32, kvalues_iq4nl, src + 32 * ib, nullptr, idx + 32 * ib);

        auto assign = [&](float d, int *ls, uint8_t *out_idx) {
            float total = 0.0f;
            for (int ib = 0; ib < 8; ib++) {
                const int l0 = d != 0.0f ? round_clamp(scales[ib] / d, -32, 31) : 0;
                float best = std::numeric_limits<float>::infinity();
                for (int l = std::max(l0 - 1, -32); l <= std::min(l0 + 1, 31); l++) {
                    uint8_t trial[32];
                    const float err = iq4_assign(src + 32 * ib, d * float(l), trial);
                    if (err < best) {
                        best = err, ls[ib] = l;
                        std::memcpy(out_idx + 32 * ib, trial, 32);
                    }
                }
                total += best;
            }
            return total;
        };

        float d = f16_round(signed_absmax(8, scales) / -32.0f);
        int ls[8] = {};
        float err = assign(d, ls, idx);
        for (int iter = 0; iter < 2; iter++) {
            float saa = 0.0f, sax = 0.0f;
            for (int e = 0; e < QK_K_BLOCK; e++) {
                const float a = float(ls[e / 32] * kvalues_iq4nl[idx[e]]);
                saa += a * a, sax += a * src[e];
            }
            if (!(saa > 0.0f)) break;
            const float d2 = f16_round(sax / saa);
            if (d2 == d) break;
            int ls2[8] = {};
            uint8_t idx2[QK_K_BLOCK];
            const float err2 = assign(d2, ls2, idx2);
            if (!(err2 < err)) break;
            d = d2, err = err2;
            std::memcpy(ls, ls2, sizeof ls);
            std::memcpy(idx, idx2, sizeof idx);
        }

        BlockIQ4XS b = {};
        b.d = f32_to_f16(d);
        for (int ib = 0; ib < 8; ib++) {
            const int v = ls[ib] + 32;
            b.scales_l[ib / 2] |= uint8_t((v & 15) << (4 * (ib % 2)));
            b.scales_h |= uint16_t((v >> 4) << (2 * ib));
            pack_iq4_nibbles(idx + 32 * ib, b.qs + 16 * ib);
        }
        store_block(dst, i, b);
    }
}

}  // namespace strata::quant_detail
