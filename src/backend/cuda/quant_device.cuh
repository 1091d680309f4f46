// Per-element dequantization on the device for every block format, in format/quant.h's operation order: products and
// sums go through __fmul_rn/__fadd_rn/__fsub_rn so the compiler cannot fuse them, which keeps every value bit-equal
// to the CPU reference. Block fields are read with byte loads: rows of 17-, 34- or 210-byte blocks start anywhere.
// Fmt<T>::elem(block, e, grids) is element e of one block. Included by .cu files only.
#pragma once

#include <cstdint>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/device_common.cuh"
#include "format/dtype.h"

namespace strata::cuda {

static __constant__ int8_t c_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};
static __constant__ int8_t c_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

namespace qd {

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

// Nibble of element j (0..31) of a 32-element block's 16 packed bytes: low nibbles 0..15, high nibbles 16..31.
__device__ __forceinline__ int nibble32(const uint8_t *qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }

// a + b, keeping a NaN a (quant_legacy.cpp's add_first_nan).
__device__ __forceinline__ float add_first_nan(float a, float b) { return isnan(a) ? a : add(a, b); }

// v * (bit j of mask ? -1 : +1), a NaN keeping its sign (quant_iq.cpp's apply_sign).
__device__ __forceinline__ float apply_sign(float v, uint32_t mask, int j) {
    return ((mask >> j) & 1) && !isnan(v) ? -v : v;
}

__device__ __forceinline__ uint32_t grid_byte(uint64_t entry, int j) { return uint32_t(entry >> (8 * j)) & 255; }

__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return e < 2 ? __uint_as_float(0x00200000u << e) : __uint_as_float((e - 1) << 23);
}

// Q4_K / Q5_K six-bit scale and min of sub-block b (0..7).
__device__ __forceinline__ void k_scale_min(const uint8_t *s, int b, int &sc, int &m) {
    if (b < 4) {
        sc = s[b] & 63;
        m = s[b + 4] & 63;
    } else {
        sc = (s[b + 4] & 15) | ((s[b - 4] >> 6) << 4);
        m = (s[b + 4] >> 4) | ((s[b] >> 6) << 4);
    }
}

__device__ __forceinline__ int q3k_scale(const uint8_t *s, int i) {
    const int lo = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
    const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

__device__ __forceinline__ int tq1_digit(uint32_t byte, int p) {
    constexpr uint32_t pow3[5] = {1, 3, 9, 27, 81};
    const uint32_t v = (byte * pow3[p]) & 255;
    return int((v * 3) >> 8);
}

}  // namespace qd

template <DType T>
struct Fmt;

#define STRATA_FMT(T_, BS, BB) \
    template <>                \
    struct Fmt<DType::T_> {    \
        static constexpr int bs = BS, bb = BB; \
        __device__ static float elem(const uint8_t *b, int e, const IqGrids &g)

// ---- plain floats (a "block" is one element) ---------------------------------------------------------------------
STRATA_FMT(F32, 1, 4) { return __uint_as_float(ld_u32(b)); }
};
STRATA_FMT(F16, 1, 2) { return ld_f16(b); }
};
STRATA_FMT(BF16, 1, 2) { return __uint_as_float(ld_u16(b) << 16); }
};

// ---- 32-element blocks ------------------------------------------------------------------------------------------
STRATA_FMT(Q4_0, 32, 18) { return qd::mul(ld_f16(b), float(qd::nibble32(b + 2, e) - 8)); }
};
STRATA_FMT(Q4_1, 32, 20) {
    return qd::add_first_nan(qd::mul(ld_f16(b), float(qd::nibble32(b + 4, e))), ld_f16(b + 2));
}
};
STRATA_FMT(Q5_0, 32, 22) {
    const int q = qd::nibble32(b + 6, e) | int(((ld_u32(b + 2) >> e) & 1) << 4);
    return qd::mul(ld_f16(b), float(q - 16));
}
};
STRATA_FMT(Q5_1, 32, 24) {
    const int q = qd::nibble32(b + 8, e) | int(((ld_u32(b + 4) >> e) & 1) << 4);
    return qd::add_first_nan(qd::mul(ld_f16(b), float(q)), ld_f16(b + 2));
}
};
STRATA_FMT(Q8_0, 32, 34) { return qd::mul(float(int8_t(b[2 + e])), ld_f16(b)); }
};
STRATA_FMT(Q8_1, 32, 36) { return qd::mul(float(int8_t(b[4 + e])), ld_f16(b)); }
};
STRATA_FMT(MXFP4, 32, 17) { return qd::mul(qd::e8m0_half(b[0]), float(c_kvalues_mxfp4[qd::nibble32(b + 1, e)])); }
};
STRATA_FMT(IQ4_NL, 32, 18) { return qd::mul(ld_f16(b), float(c_kvalues_iq4nl[qd::nibble32(b + 2, e)])); }
};

// ---- K-quants ---------------------------------------------------------------------------------------------------
STRATA_FMT(Q2_K, 256, 84) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    const int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
    const uint32_t sc = b[e / 16];
    const float dl = qd::mul(ld_f16(b + 80), float(sc & 15)), ml = qd::mul(ld_f16(b + 82), float(sc >> 4));
    return qd::sub(qd::mul(dl, float(q)), ml);
}
};
STRATA_FMT(Q3_K, 256, 110) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    int q = (b[32 + 32 * h + l] >> (2 * j)) & 3;
    if (!((b[l] >> (4 * h + j)) & 1)) q -= 4;
    const float dl = qd::mul(ld_f16(b + 108), float(qd::q3k_scale(b + 96, e / 16)));
    return qd::mul(dl, float(q));
}
};
STRATA_FMT(Q4_K, 256, 144) {
    const int p = e / 64, l = e % 32;
    const uint32_t byte = b[16 + 32 * p + l];
    const int q = (e % 64) < 32 ? int(byte & 15) : int(byte >> 4);
    int sc, m;
    qd::k_scale_min(b + 4, e / 32, sc, m);
    const float dl = qd::mul(ld_f16(b), float(sc)), dm = qd::mul(ld_f16(b + 2), float(m));
    return qd::sub(qd::mul(dl, float(q)), dm);
}
};
STRATA_FMT(Q5_K, 256, 176) {
    const int p = e / 64, l = e % 32;
    const bool high = (e % 64) >= 32;
    const uint32_t byte = b[48 + 32 * p + l];
    int q = high ? int(byte >> 4) : int(byte & 15);
    q |= int((b[16 + l] >> (2 * p + (high ? 1 : 0))) & 1) << 4;
    int sc, m;
    qd::k_scale_min(b + 4, e / 32, sc, m);
    const float dl = qd::mul(ld_f16(b), float(sc)), dm = qd::mul(ld_f16(b + 2), float(m));
    return qd::sub(qd::mul(dl, float(q)), dm);
}
};
STRATA_FMT(Q6_K, 256, 210) {
    const int h = e / 128, r = e % 128, t = r / 32, l = r % 32;
    const uint32_t byte = b[64 * h + 32 * (t & 1) + l];
    const int low = t < 2 ? int(byte & 15) : int(byte >> 4);
    const int high = (b[128 + 32 * h + l] >> (2 * t)) & 3;
    const float dl = qd::mul(ld_f16(b + 208), float(int8_t(b[192 + e / 16])));
    return qd::mul(dl, float((low | (high << 4)) - 32));
}
};
STRATA_FMT(Q8_K, 256, 292) { return qd::mul(__uint_as_float(ld_u32(b)), float(int8_t(b[4 + e]))); }
};

// ---- i-quants ---------------------------------------------------------------------------------------------------
STRATA_FMT(IQ4_XS, 256, 136) {
    const int ib = e / 32, j = e % 32;
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | int(((ld_u16(b + 2) >> (2 * ib)) & 3) << 4);
    const float dl = qd::mul(ld_f16(b), float(ls - 32));
    return qd::mul(dl, float(c_kvalues_iq4nl[qd::nibble32(b + 8 + 16 * ib, j)]));
}
};
STRATA_FMT(IQ2_XXS, 256, 66) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const uint32_t a0 = ld_u32(b + 2 + 8 * ib), a1 = ld_u32(b + 6 + 8 * ib);
    const float db = qd::mul(qd::mul(ld_f16(b), qd::add(0.5f, float(a1 >> 28))), 0.25f);
    const uint64_t gr = ld_u64(g.iq2xxs + ((a0 >> (8 * l)) & 255));
    const uint32_t signs = g.ksigns[(a1 >> (7 * l)) & 127];
    return qd::apply_sign(qd::mul(db, float(qd::grid_byte(gr, j))), signs, j);
}
};
STRATA_FMT(IQ2_XS, 256, 74) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const int s = (b[66 + ib] >> (l < 2 ? 0 : 4)) & 15;
    const float db = qd::mul(qd::mul(ld_f16(b), qd::add(0.5f, float(s))), 0.25f);
    const uint32_t w = ld_u16(b + 2 + 2 * (4 * ib + l));
    const uint64_t gr = ld_u64(g.iq2xs + (w & 511));
    const uint32_t signs = g.ksigns[w >> 9];
    return qd::apply_sign(qd::mul(db, float(qd::grid_byte(gr, j))), signs, j);
}
};
STRATA_FMT(IQ2_S, 256, 82) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const int s = (b[74 + ib] >> (l < 2 ? 0 : 4)) & 15;
    const float db = qd::mul(qd::mul(ld_f16(b), qd::add(0.5f, float(s))), 0.25f);
    const int index = b[2 + 4 * ib + l] | (((b[66 + ib] >> (2 * l)) & 3) << 8);
    const uint64_t gr = ld_u64(g.iq2s + index);
    const uint32_t signs = b[2 + 32 + 4 * ib + l];
    return qd::apply_sign(qd::mul(db, float(qd::grid_byte(gr, j))), signs, j);
}
};
STRATA_FMT(IQ3_XXS, 256, 98) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const uint32_t a = ld_u32(b + 2 + 64 + 4 * ib);
    const float db = qd::mul(qd::mul(ld_f16(b), qd::add(0.5f, float(a >> 28))), 0.5f);
    const uint32_t gr = __ldg(g.iq3xxs + b[2 + 8 * ib + 2 * l + (j >> 2)]);
    const uint32_t signs = g.ksigns[(a >> (7 * l)) & 127];
    return qd::apply_sign(qd::mul(db, float((gr >> (8 * (j & 3))) & 255)), signs, j);
}
};
STRATA_FMT(IQ3_S, 256, 110) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const int s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
    const float db = qd::mul(ld_f16(b), float(1 + 2 * s));
    const int half = j >> 2;
    const int idx = b[2 + 8 * ib + 2 * l + half] | (((b[66 + ib] >> (2 * l + half)) & 1) << 8);
    const uint32_t gr = __ldg(g.iq3s + idx);
    const uint32_t signs = b[74 + 4 * ib + l];
    return qd::apply_sign(qd::mul(db, float((gr >> (8 * (j & 3))) & 255)), signs, j);
}
};
STRATA_FMT(IQ1_S, 256, 50) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const uint32_t w = ld_u16(b + 34 + 2 * ib);
    const float dl = qd::mul(ld_f16(b), float(2 * ((w >> 12) & 7) + 1));
    const float delta = (w & 0x8000) ? -0.125f : 0.125f;
    const uint64_t gr = ld_u64(g.iq1s + (b[2 + 4 * ib + l] | (((w >> (3 * l)) & 7) << 8)));
    return qd::mul(dl, qd::add(float(int8_t(qd::grid_byte(gr, j))), delta));
}
};
STRATA_FMT(IQ1_M, 256, 56) {
    const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
    const uint32_t sc0 = ld_u16(b + 48), sc1 = ld_u16(b + 50), sc2 = ld_u16(b + 52), sc3 = ld_u16(b + 54);
    const uint32_t d_bits = (sc0 >> 12) | ((sc1 >> 8) & 0x00f0) | ((sc2 >> 4) & 0x0f00) | (sc3 & 0xf000);
    const uint32_t scw = ld_u16(b + 48 + 2 * (ib / 2));
    const int s = (scw >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
    const float dl = qd::mul(f16_to_f32(d_bits), float(2 * s + 1));
    const int nib = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15;
    const float delta = (nib & 8) ? -0.125f : 0.125f;
    const uint64_t gr = ld_u64(g.iq1s + (b[4 * ib + l] | ((nib & 7) << 8)));
    return qd::mul(dl, qd::add(float(int8_t(qd::grid_byte(gr, j))), delta));
}
};

// ---- ternary ----------------------------------------------------------------------------------------------------
STRATA_FMT(TQ1_0, 256, 54) {
    int digit;
    if (e < 160) digit = qd::tq1_digit(b[e % 32], e / 32);
    else if (e < 240) digit = qd::tq1_digit(b[32 + (e - 160) % 16], (e - 160) / 16);
    else digit = qd::tq1_digit(b[48 + (e - 240) % 4], (e - 240) / 4);
    return qd::mul(ld_f16(b + 52), float(digit - 1));
}
};
STRATA_FMT(TQ2_0, 256, 66) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    return qd::mul(ld_f16(b + 64), float(((b[32 * h + l] >> (2 * j)) & 3) - 1));
}
};

#undef STRATA_FMT

// Element k of a row of type T (k < the row length).
template <DType T>
__device__ __forceinline__ float row_elem(const uint8_t *row, int64_t k, const IqGrids &g) {
    using F = Fmt<T>;
    return F::elem(row + (k / F::bs) * F::bb, int(k % F::bs), g);
}

// X-macro over every type with a device dequantizer, for the launchers' switches.
#define STRATA_CUDA_DTYPES(X)                                                                                     \
    X(F32) X(F16) X(BF16) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(Q8_1) X(MXFP4) X(IQ4_NL) X(Q2_K) X(Q3_K)     \
    X(Q4_K) X(Q5_K) X(Q6_K) X(Q8_K) X(IQ4_XS) X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) X(IQ3_XXS) X(IQ3_S) X(IQ1_S)         \
    X(IQ1_M) X(TQ1_0) X(TQ2_0)

}  // namespace strata::cuda
