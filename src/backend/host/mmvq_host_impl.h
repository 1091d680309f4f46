// The host mat-vec's unpacking of one 32-element sub-block (mmvq_host.cpp, and the vectorized rows of
// mmvq_host_avx2.cpp): shared inline code, so both compute each scale with the same float operations. Both files
// are compiled without FMA contraction.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "format/dtype.h"
#include "format/iq_grids.h"
#include "format/quant_blocks.h"

namespace strata::mmvq_detail {

// One 32-element sub-block as cuda/qv_device.cuh's QV<T>::load unpacks it: the integer weight of each element (in
// the activations' order), a scale (and for IQ1_M a bias) per 8-element group, and an offset times the activation
// sum.
struct Sub {
    int q[32];
    float scale[4];
    float bias[4] = {0, 0, 0, 0};
    float off = 0.0f;
};

inline uint16_t u16(const uint8_t *p) {
    return uint16_t(p[0] | (p[1] << 8));
}
inline uint32_t u32(const uint8_t *p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline float f16(const uint8_t *p) {
    return f16_to_f32(u16(p));
}
inline float bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline void uniform(Sub &w, float s) {
    for (float &x : w.scale) x = s;
    w.off = 0.0f;
}
inline int8_t grid_byte(uint64_t g, int i) {
    return int8_t(uint8_t(g >> (8 * i)));
}

// Q4_K / Q5_K six-bit scale and min of sub-block j (quant_device.cuh k_scale_min).
inline void k_scale_min(const uint8_t *s, int j, int &sc, int &m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The float side of sub-block sb: scale (and bias) per 8-element group and the offset, as QV<T>::load computes them.
inline void unpack_scales(DType t, const uint8_t *row, int sb, Sub &w) {
    switch (t) {
        case DType::Q8_0:
            return uniform(w, f16(row + size_t(sb) * 34));
        case DType::Q4_0:
            return uniform(w, f16(row + size_t(sb) * 18));
        case DType::MXFP4: {
            const uint32_t x = row[size_t(sb) * 17];
            return uniform(w, x < 2 ? bits(0x00200000u << x) : bits((x - 1) << 23));
        }
        case DType::IQ4_XS: {
            const uint8_t *b = row + size_t(sb / 8) * 136;
            const int ib = sb % 8;
            const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | int(((u16(b + 2) >> (2 * ib)) & 3) << 4);
            return uniform(w, f16(b) * float(ls - 32));
        }
        case DType::Q4_K:
        case DType::Q5_K: {
            const uint8_t *b = row + size_t(sb / 8) * (t == DType::Q4_K ? 144 : 176);
            int sc, m;
            k_scale_min(b + 4, sb % 8, sc, m);
            uniform(w, f16(b) * float(sc));
            w.off = -(f16(b + 2) * float(m));
            return;
        }
        case DType::Q6_K: {
            const uint8_t *b = row + size_t(sb / 8) * 210;
            const int j = sb % 8;
            const float d = f16(b + 208);
            const float s0 = d * float(int8_t(b[192 + 2 * j])), s1 = d * float(int8_t(b[193 + 2 * j]));
            w.scale[0] = w.scale[1] = s0;
            w.scale[2] = w.scale[3] = s1;
            w.off = 0.0f;
            return;
        }
        case DType::IQ2_XXS: {
            const uint8_t *b = row + size_t(sb / 8) * 66;
            const uint32_t a1 = u32(b + 6 + 8 * (sb % 8));
            return uniform(w, (f16(b) * (0.5f + float(a1 >> 28))) * 0.25f);
        }
        case DType::IQ1_M: {
            const uint8_t *b = row + size_t(sb / 8) * 56;
            const int ib = sb % 8;
            const uint32_t sc0 = u16(b + 48), sc1 = u16(b + 50), sc2 = u16(b + 52), sc3 = u16(b + 54);
            const float d =
                f16_to_f32(uint16_t((sc0 >> 12) | ((sc1 >> 8) & 0x00f0) | ((sc2 >> 4) & 0x0f00) | (sc3 & 0xf000)));
            const uint32_t scw = u16(b + 48 + 2 * (ib / 2));
            for (int l = 0; l < 4; l++) {
                const int s = int(scw >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
                const float dl = d * float(2 * s + 1);
                const int nib = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15;
                w.scale[l] = dl;
                w.bias[l] = dl * ((nib & 8) ? -0.125f : 0.125f);
            }
            w.off = 0.0f;
            return;
        }
        default:
            fail("internal: no host mat-vec in the GPU's order for %s", dtype_name(t));
    }
}

// The integer side of sub-block sb: its 32 weights in the activations' order.
inline void unpack_q(DType t, const uint8_t *row, int sb, int *q) {
    switch (t) {
        case DType::Q8_0: {
            const uint8_t *b = row + size_t(sb) * 34;
            for (int e = 0; e < 32; e++) q[e] = int8_t(b[2 + e]);
            return;
        }
        case DType::Q4_0: {
            const uint8_t *b = row + size_t(sb) * 18;
            for (int e = 0; e < 16; e++) q[e] = (b[2 + e] & 15) - 8, q[e + 16] = (b[2 + e] >> 4) - 8;
            return;
        }
        case DType::MXFP4: {
            const uint8_t *b = row + size_t(sb) * 17;
            for (int e = 0; e < 16; e++) q[e] = kvalues_mxfp4[b[1 + e] & 15], q[e + 16] = kvalues_mxfp4[b[1 + e] >> 4];
            return;
        }
        case DType::IQ4_XS: {
            const uint8_t *b = row + size_t(sb / 8) * 136 + 8 + 16 * (sb % 8);
            for (int e = 0; e < 16; e++) q[e] = kvalues_iq4nl[b[e] & 15], q[e + 16] = kvalues_iq4nl[b[e] >> 4];
            return;
        }
        case DType::Q4_K: {
            const int j = sb % 8;
            const uint8_t *qs = row + size_t(sb / 8) * 144 + 16 + 32 * (j / 2);
            for (int e = 0; e < 32; e++) q[e] = (qs[e] >> (4 * (j & 1))) & 15;
            return;
        }
        case DType::Q5_K: {
            const uint8_t *b = row + size_t(sb / 8) * 176;
            const int j = sb % 8, p = j / 2;
            const uint8_t *qs = b + 48 + 32 * p, *qh = b + 16;
            for (int e = 0; e < 32; e++)
                q[e] = ((qs[e] >> (4 * (j & 1))) & 15) | (((qh[e] >> (2 * p + (j & 1))) & 1) << 4);
            return;
        }
        case DType::Q6_K: {
            const uint8_t *b = row + size_t(sb / 8) * 210;
            const int j = sb % 8, h = j / 4, tt = j % 4;
            const uint8_t *ql = b + 64 * h + 32 * (tt & 1), *qh = b + 128 + 32 * h;
            const int shift = tt < 2 ? 0 : 4;
            for (int e = 0; e < 32; e++) q[e] = (((ql[e] >> shift) & 15) | (((qh[e] >> (2 * tt)) & 3) << 4)) - 32;
            return;
        }
        case DType::IQ2_XXS: {
            const uint8_t *b = row + size_t(sb / 8) * 66;
            const int ib = sb % 8;
            const uint32_t a0 = u32(b + 2 + 8 * ib), a1 = u32(b + 6 + 8 * ib);
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq::iq2xxs_grid[(a0 >> (8 * l)) & 255];
                const uint8_t signs = iq::ksigns_iq2xs[(a1 >> (7 * l)) & 127];
                for (int i = 0; i < 8; i++) {
                    const int v = grid_byte(g, i);
                    q[8 * l + i] = (signs >> i) & 1 ? -v : v;
                }
            }
            return;
        }
        case DType::IQ1_M: {
            const uint8_t *b = row + size_t(sb / 8) * 56;
            const int ib = sb % 8;
            for (int l = 0; l < 4; l++) {
                const int nib = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15;
                const uint64_t g = iq::iq1s_grid[b[4 * ib + l] | ((nib & 7) << 8)];
                for (int i = 0; i < 8; i++) q[8 * l + i] = grid_byte(g, i);
            }
            return;
        }
        default:
            fail("internal: no host mat-vec in the GPU's order for %s", dtype_name(t));
    }
}

inline void unpack(DType t, const uint8_t *row, int sb, Sub &w) {
    unpack_scales(t, row, sb, w);
    unpack_q(t, row, sb, w.q);
}

inline bool has_bias(DType t) {
    return t == DType::IQ1_M;
}

}  // namespace strata::mmvq_detail
