// Scalar dot products of the i-quants (IQ1_S ... IQ4_XS) and ternary types (TQ1_0, TQ2_0) with Q8_K activations:
// the reference for the SIMD kernels, written from the block layouts (REFERENCE.md §2.3). Every sub-block scale is
// an odd or small integer times a power of two, so whole super-blocks sum exactly in integers before one fp32
// scaling. Not fast on purpose.
#include <cstring>

#include "backend/cpu/vec_dot_impl.h"
#include "core/fp16.h"
#include "format/iq_grids.h"
#include "format/quant_blocks.h"

namespace strata::vec_dot_detail {

namespace {

inline float f16(uint16_t h) { return f16_to_f32(h); }

inline uint32_t load_u32(const void *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Magnitude j (0..7) of a grid entry, and a sign bit applied to it.
inline int grid_u8(uint64_t entry, int j) { return int((entry >> (8 * j)) & 0xff); }
inline int signed_level(int magnitude, uint8_t signs, int j) { return ((signs >> j) & 1) ? -magnitude : magnitude; }

// IQ4_XS: eight sub-blocks of 32 non-linear levels, integer scales ls - 32.
float dot_iq4_xs(int64_t n, const void *vw, const void *vx) {
    const BlockIQ4XS *w = static_cast<const BlockIQ4XS *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((w[i].scales_h >> (2 * ib)) & 3) << 4);
            const uint8_t *qs = w[i].qs + 16 * ib;
            const int8_t *xq = x[i].qs + 32 * ib;
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += kvalues_iq4nl[qs[j] & 15] * xq[j] + kvalues_iq4nl[qs[j] >> 4] * xq[j + 16];
            isum += (ls - 32) * s;
        }
        sum += x[i].d * f16(w[i].d) * float(isum);
    }
    return sum;
}

// IQ2_XXS: db = d * (0.5 + ls) / 4 = d * (2 ls + 1) / 8.
float dot_iq2_xxs(int64_t n, const void *vw, const void *vx) {
    const BlockIQ2XXS *w = static_cast<const BlockIQ2XXS *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a0 = load_u32(&w[i].qs[4 * ib]), a1 = load_u32(&w[i].qs[4 * ib + 2]);
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq::iq2xxs_grid[(a0 >> (8 * l)) & 255];
                const uint8_t signs = iq::ksigns_iq2xs[(a1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++) s += signed_level(grid_u8(g, j), signs, j) * x[i].qs[32 * ib + 8 * l + j];
            }
            isum += int(2 * (a1 >> 28) + 1) * s;
        }
        sum += x[i].d * f16(w[i].d) * 0.125f * float(isum);
    }
    return sum;
}

// IQ2_XS / IQ2_S: a 4-bit scale per 16 elements (groups 0-1: low nibble, 2-3: high), db = d * (2 s + 1) / 8.
// index(b, ib, l) and signs(b, ib, l) give the grid entry and the sign mask of group l of sub-block ib.
template <class Block, class Entry, class Signs>
float dot_iq2_scaled(int64_t n, const void *vw, const void *vx, Entry entry, Signs signs_of) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            for (int half = 0; half < 2; half++) {
                int s = 0;
                for (int l = 2 * half; l < 2 * half + 2; l++) {
                    const uint64_t g = entry(w[i], ib, l);
                    const uint8_t signs = signs_of(w[i], ib, l);
                    for (int j = 0; j < 8; j++)
                        s += signed_level(grid_u8(g, j), signs, j) * x[i].qs[32 * ib + 8 * l + j];
                }
                isum += (2 * ((w[i].scales[ib] >> (4 * half)) & 15) + 1) * s;
            }
        }
        sum += x[i].d * f16(w[i].d) * 0.125f * float(isum);
    }
    return sum;
}

float dot_iq2_xs(int64_t n, const void *w, const void *x) {
    return dot_iq2_scaled<BlockIQ2XS>(
        n, w, x, [](const BlockIQ2XS &b, int ib, int l) { return iq::iq2xs_grid[b.qs[4 * ib + l] & 511]; },
        [](const BlockIQ2XS &b, int ib, int l) { return iq::ksigns_iq2xs[b.qs[4 * ib + l] >> 9]; });
}

float dot_iq2_s(int64_t n, const void *w, const void *x) {
    return dot_iq2_scaled<BlockIQ2S>(
        n, w, x,
        [](const BlockIQ2S &b, int ib, int l) {
            return iq::iq2s_grid[b.qs[4 * ib + l] | (((b.qh[ib] >> (2 * l)) & 3) << 8)];
        },
        [](const BlockIQ2S &b, int ib, int l) { return b.qs[32 + 4 * ib + l]; });
}

// IQ3_XXS: two 4-value grid entries per group of 8; db = d * (0.5 + ls) / 2 = d * (2 ls + 1) / 4.
float dot_iq3_xxs(int64_t n, const void *vw, const void *vx) {
    const BlockIQ3XXS *w = static_cast<const BlockIQ3XXS *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a = load_u32(w[i].qs + 64 + 4 * ib);
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const uint8_t signs = iq::ksigns_iq2xs[(a >> (7 * l)) & 127];
                const uint64_t g = uint64_t(iq::iq3xxs_grid[w[i].qs[8 * ib + 2 * l]]) |
                                   (uint64_t(iq::iq3xxs_grid[w[i].qs[8 * ib + 2 * l + 1]]) << 32);
                for (int j = 0; j < 8; j++) s += signed_level(grid_u8(g, j), signs, j) * x[i].qs[32 * ib + 8 * l + j];
            }
            isum += int(2 * (a >> 28) + 1) * s;
        }
        sum += x[i].d * f16(w[i].d) * 0.25f * float(isum);
    }
    return sum;
}

// IQ3_S: 9-bit grid indices, explicit sign bytes, db = d * (1 + 2 s).
float dot_iq3_s(int64_t n, const void *vw, const void *vx) {
    const BlockIQ3S *w = static_cast<const BlockIQ3S *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const int sc = (w[i].scales[ib / 2] >> (4 * (ib % 2))) & 15;
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const int i0 = w[i].qs[8 * ib + 2 * l] | (((w[i].qh[ib] >> (2 * l)) & 1) << 8);
                const int i1 = w[i].qs[8 * ib + 2 * l + 1] | (((w[i].qh[ib] >> (2 * l + 1)) & 1) << 8);
                const uint64_t g = uint64_t(iq::iq3s_grid[i0]) | (uint64_t(iq::iq3s_grid[i1]) << 32);
                const uint8_t signs = w[i].signs[4 * ib + l];
                for (int j = 0; j < 8; j++) s += signed_level(grid_u8(g, j), signs, j) * x[i].qs[32 * ib + 8 * l + j];
            }
            isum += (1 + 2 * sc) * s;
        }
        sum += x[i].d * f16(w[i].d) * float(isum);
    }
    return sum;
}

// IQ1_S / IQ1_M: y = dl * (g + delta) with g in {-1, 0, 1} and delta = +-1/8, so 8 y / dl = 8 g +- 1 is an integer.
inline int iq1_level(uint64_t entry, int j, bool negative_delta) {
    return 8 * int(int8_t(grid_u8(entry, j))) + (negative_delta ? -1 : 1);
}

float dot_iq1_s(int64_t n, const void *vw, const void *vx) {
    const BlockIQ1S *w = static_cast<const BlockIQ1S *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t h = w[i].qh[ib];
            const bool neg = (h & 0x8000) != 0;
            int s = 0;
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq::iq1s_grid[w[i].qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)];
                for (int j = 0; j < 8; j++) s += iq1_level(g, j, neg) * x[i].qs[32 * ib + 8 * l + j];
            }
            isum += (2 * ((h >> 12) & 7) + 1) * s;
        }
        sum += x[i].d * f16(w[i].d) * 0.125f * float(isum);
    }
    return sum;
}

float dot_iq1_m(int64_t n, const void *vw, const void *vx) {
    const BlockIQ1M *w = static_cast<const BlockIQ1M *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        uint16_t sc[4];
        std::memcpy(sc, w[i].scales, 8);
        const uint16_t d_bits =
            uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++) {
                const int s3 = (sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
                const int nib = (w[i].qh[2 * ib + l / 2] >> (4 * (l % 2))) & 15;
                const uint64_t g = iq::iq1s_grid[w[i].qs[4 * ib + l] | ((nib & 7) << 8)];
                int s = 0;
                for (int j = 0; j < 8; j++) s += iq1_level(g, j, (nib & 8) != 0) * x[i].qs[32 * ib + 8 * l + j];
                isum += (2 * s3 + 1) * s;
            }
        }
        sum += x[i].d * f16(d_bits) * 0.125f * float(isum);
    }
    return sum;
}

// Ternary: y = d * (q - 1), q in {0, 1, 2}.
// TQ1_0 digit p of a byte (5 base-3 digits stored as a fraction of 243): ((byte * 3^p) mod 256) * 3 >> 8.
inline int tq1_digit(uint8_t byte, int p) {
    static constexpr uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (int(uint8_t(byte * pow3[p])) * 3) >> 8;
}

float dot_tq1_0(int64_t n, const void *vw, const void *vx) {
    const BlockTQ1_0 *w = static_cast<const BlockTQ1_0 *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        const int8_t *xq = x[i].qs;
        int isum = 0;
        for (int p = 0; p < 5; p++)
            for (int j = 0; j < 32; j++) isum += (tq1_digit(w[i].qs[j], p) - 1) * xq[32 * p + j];
        for (int p = 0; p < 5; p++)
            for (int j = 0; j < 16; j++) isum += (tq1_digit(w[i].qs[32 + j], p) - 1) * xq[160 + 16 * p + j];
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 4; j++) isum += (tq1_digit(w[i].qh[j], p) - 1) * xq[240 + 4 * p + j];
        sum += x[i].d * f16(w[i].d) * float(isum);
    }
    return sum;
}

float dot_tq2_0(int64_t n, const void *vw, const void *vx) {
    const BlockTQ2_0 *w = static_cast<const BlockTQ2_0 *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int e = 0; e < QK_K_BLOCK; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            isum += (((w[i].qs[32 * h + l] >> (2 * j)) & 3) - 1) * x[i].qs[e];
        }
        sum += x[i].d * f16(w[i].d) * float(isum);
    }
    return sum;
}

const DotEntry k_iq_dots[] = {
    {DType::IQ4_XS, dot_iq4_xs},   {DType::IQ2_XXS, dot_iq2_xxs}, {DType::IQ2_XS, dot_iq2_xs},
    {DType::IQ2_S, dot_iq2_s},     {DType::IQ3_XXS, dot_iq3_xxs}, {DType::IQ3_S, dot_iq3_s},
    {DType::IQ1_S, dot_iq1_s},     {DType::IQ1_M, dot_iq1_m},     {DType::TQ1_0, dot_tq1_0},
    {DType::TQ2_0, dot_tq2_0},
};

}  // namespace

const DotEntry *scalar_iq_dots(int *count) {
    *count = int(sizeof(k_iq_dots) / sizeof(k_iq_dots[0]));
    return k_iq_dots;
}

}  // namespace strata::vec_dot_detail
