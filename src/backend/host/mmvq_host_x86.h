// The x86 pieces the vectorized host mat-vecs share (mmvq_host_avx2.cpp, mmvq_host_avx512.cpp): each sub-block's 32
// integer weights as bytes (Weights<T>::load) and the float side of a sub-block for eight rows, one per 256-bit
// lane (Scales<T>), each value computed with the scalar unpack_scales's float operations. Included only by those
// two files; its anonymous namespace gives each its own copy, compiled with that file's instruction-set flags and no
// FMA contraction.
#pragma once

#include <immintrin.h>

#include "backend/host/mmvq_host_impl.h"

#define STRATA_INLINE inline __attribute__((always_inline))

namespace strata::mmvq_detail {
namespace {

STRATA_INLINE __m256i low_nibbles(__m256i v) {
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

// 16 packed bytes to 32 values: low nibbles first (elements 0..15), then the high ones, each through a 16-entry
// table of int8 values.
STRATA_INLINE __m256i nibble_table(const uint8_t *p, const int8_t *table) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i *>(table));
    const __m128i m = _mm_set1_epi8(15);
    const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(v, m));
    const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(v, 4), m));
    return _mm256_set_m128i(hi, lo);
}

// The 32 integer weights of sub-block sb of a row, as bytes in the activations' order: signed (int8) or, where
// `unsigned_weights`, 0..31.
template <DType T>
struct Weights {
    static constexpr bool unsigned_weights = false;
    STRATA_INLINE static __m256i load(const uint8_t *row,
                                      int sb) {  // the types without a vector unpacking: through unpack_q
        int q[32];
        unpack_q(T, row, sb, q);
        alignas(32) int8_t b[32];
        for (int e = 0; e < 32; e++) b[e] = int8_t(q[e]);
        return _mm256_load_si256(reinterpret_cast<const __m256i *>(b));
    }
};

template <>
struct Weights<DType::Q8_0> {
    static constexpr bool unsigned_weights = false;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + size_t(sb) * 34 + 2));
    }
};

template <>
struct Weights<DType::Q4_0> {
    static constexpr bool unsigned_weights = false;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(row + size_t(sb) * 18 + 2));
        const __m128i m = _mm_set1_epi8(15);
        const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
        return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    }
};

template <>
struct Weights<DType::MXFP4> {
    static constexpr bool unsigned_weights = false;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        return nibble_table(row + size_t(sb) * 17 + 1, kvalues_mxfp4);
    }
};

template <>
struct Weights<DType::IQ4_XS> {
    static constexpr bool unsigned_weights = false;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        return nibble_table(row + size_t(sb / 8) * 136 + 8 + 16 * (sb % 8), kvalues_iq4nl);
    }
};

template <>
struct Weights<DType::Q4_K> {
    static constexpr bool unsigned_weights = true;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        const int j = sb % 8;
        __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + size_t(sb / 8) * 144 + 16 + 32 * (j / 2)));
        if (j & 1) v = _mm256_srli_epi16(v, 4);
        return low_nibbles(v);
    }
};

template <>
struct Weights<DType::Q5_K> {
    static constexpr bool unsigned_weights = true;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        const uint8_t *b = row + size_t(sb / 8) * 176;
        const int j = sb % 8, p = j / 2;
        __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 48 + 32 * p));
        if (j & 1) lo = _mm256_srli_epi16(lo, 4);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 16));
        const __m256i hb =
            _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p + (j & 1))), _mm256_set1_epi8(1));
        return _mm256_or_si256(low_nibbles(lo), _mm256_slli_epi16(hb, 4));
    }
};

template <>
struct Weights<DType::Q6_K> {
    static constexpr bool unsigned_weights = false;
    STRATA_INLINE static __m256i load(const uint8_t *row, int sb) {
        const uint8_t *b = row + size_t(sb / 8) * 210;
        const int j = sb % 8, h = j / 4, tt = j % 4;
        __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 64 * h + 32 * (tt & 1)));
        if (tt >= 2) ql = _mm256_srli_epi16(ql, 4);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 128 + 32 * h));
        const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * tt)), _mm256_set1_epi8(3));
        const __m256i q = _mm256_or_si256(low_nibbles(ql), _mm256_slli_epi16(hb, 4));
        return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
    }
};

// The float side of sub-block sb for the eight lanes (lane i: row lane_row[i]): the scale of each 8-element group,
// the IQ1_M biases, the offset. Each value is the scalar unpack_scales's, computed with the same float operations;
// what a 256-element super-block shares is read once per super-block. The general form goes through unpack_scales.
struct LaneScales {
    __m256 scale[4], bias[4], off;
};

template <DType T>
struct Scales {
    static constexpr bool uniform = false;  // scale[0..3] differ
    STRATA_INLINE void super_block(const uint8_t *const *, int) {}
    STRATA_INLINE void get(const uint8_t *const *lane_row, int sb, LaneScales &o) {
        alignas(32) float sc[4][8], bi[4][8], off[8];
        for (int i = 0; i < 8; i++) {
            Sub u;
            unpack_scales(T, lane_row[i], sb, u);
            for (int j = 0; j < 4; j++) sc[j][i] = u.scale[j], bi[j][i] = u.bias[j];
            off[i] = u.off;
        }
        for (int j = 0; j < 4; j++) o.scale[j] = _mm256_load_ps(sc[j]), o.bias[j] = _mm256_load_ps(bi[j]);
        o.off = _mm256_load_ps(off);
    }
};

// Eight f16 values at p[i] + offset, as floats (the F16C conversion is exact, as f16_to_f32 is).
// Built in registers: small stores read back as one vector would stall store-to-load forwarding.
STRATA_INLINE __m256 f16x8(const uint8_t *const *p, size_t offset) {
    uint64_t lo = 0, hi = 0;
    for (int i = 0; i < 4; i++) lo |= uint64_t(u16(p[i] + offset)) << (16 * i);
    for (int i = 0; i < 4; i++) hi |= uint64_t(u16(p[4 + i] + offset)) << (16 * i);
    return _mm256_cvtph_ps(_mm_set_epi64x(int64_t(hi), int64_t(lo)));
}

// Eight ints as floats, built in registers (as f16x8).
STRATA_INLINE __m256 ints8(const int32_t v[8]) {
    return _mm256_cvtepi32_ps(_mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]));
}

// Q8_0 and Q4_0: one f16 scale per 32-element block.
template <int block_bytes>
struct BlockScales {
    static constexpr bool uniform = true;
    STRATA_INLINE void super_block(const uint8_t *const *, int) {}
    STRATA_INLINE void get(const uint8_t *const *lane_row, int sb, LaneScales &o) {
        o.scale[0] = f16x8(lane_row, size_t(sb) * block_bytes);
        o.off = _mm256_setzero_ps();
    }
};
template <>
struct Scales<DType::Q8_0> : BlockScales<34> {};
template <>
struct Scales<DType::Q4_0> : BlockScales<18> {};

// v[i] holds row i's eight values; afterwards v[j] holds value j of the eight rows.
STRATA_INLINE void transpose8(__m256 v[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    v[0] = _mm256_permute2f128_ps(u0, u4, 0x20), v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    v[1] = _mm256_permute2f128_ps(u1, u5, 0x20), v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    v[2] = _mm256_permute2f128_ps(u2, u6, 0x20), v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    v[3] = _mm256_permute2f128_ps(u3, u7, 0x20), v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Q4_K and Q5_K: per super-block an f16 d and dmin and eight 6-bit scales and mins (k_scale_min's bits, four
// bytes at a time); scale = d * sc and off = -(dmin * m), computed for a row's eight sub-blocks at once and
// transposed to one vector per sub-block.
template <size_t bytes>
struct KScales {
    static constexpr bool uniform = true;
    __m256 scale[8], off[8];
    STRATA_INLINE void super_block(const uint8_t *const *lane_row, int sb) {
        const size_t at = size_t(sb / 8) * bytes;
        for (int i = 0; i < 8; i++) {
            const uint8_t *b = lane_row[i] + at;
            const uint32_t a = u32(b + 4), c = u32(b + 8), e = u32(b + 12);
            const uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = c & 0x3f3f3f3fu;
            const uint32_t sc_hi = (e & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
            const uint32_t m_hi = ((e >> 4) & 0x0f0f0f0fu) | (((c >> 6) & 0x03030303u) << 4);
            const __m128i scb = _mm_set_epi32(0, 0, int(sc_hi), int(sc_lo)),
                          mb = _mm_set_epi32(0, 0, int(m_hi), int(m_lo));
            const __m256 d = _mm256_set1_ps(f16(b)), dmin = _mm256_set1_ps(f16(b + 2));
            scale[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scb)));
            off[i] =
                _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mb))), _mm256_set1_ps(-0.0f));
        }
        transpose8(scale);
        transpose8(off);
    }
    STRATA_INLINE void get(const uint8_t *const *, int sb, LaneScales &o) {
        o.scale[0] = scale[sb % 8];
        o.off = off[sb % 8];
    }
};
template <>
struct Scales<DType::Q4_K> : KScales<144> {};
template <>
struct Scales<DType::Q5_K> : KScales<176> {};

template <>
struct Scales<DType::Q6_K> {
    static constexpr bool uniform = false;
    __m256 d = _mm256_setzero_ps();
    STRATA_INLINE void super_block(const uint8_t *const *lane_row, int sb) {
        d = f16x8(lane_row, size_t(sb / 8) * 210 + 208);
    }
    STRATA_INLINE void get(const uint8_t *const *lane_row, int sb, LaneScales &o) {
        const size_t at = size_t(sb / 8) * 210 + 192 + 2 * (sb % 8);
        int32_t s0[8], s1[8];
        for (int i = 0; i < 8; i++) s0[i] = int8_t(lane_row[i][at]), s1[i] = int8_t(lane_row[i][at + 1]);
        o.scale[0] = o.scale[1] = _mm256_mul_ps(d, ints8(s0));
        o.scale[2] = o.scale[3] = _mm256_mul_ps(d, ints8(s1));
        o.off = _mm256_setzero_ps();
    }
};

template <>
struct Scales<DType::IQ4_XS> {
    static constexpr bool uniform = true;
    __m256 d = _mm256_setzero_ps();
    STRATA_INLINE void super_block(const uint8_t *const *lane_row, int sb) {
        d = f16x8(lane_row, size_t(sb / 8) * 136);
    }
    STRATA_INLINE void get(const uint8_t *const *lane_row, int sb, LaneScales &o) {
        const size_t at = size_t(sb / 8) * 136;
        const int ib = sb % 8;
        int32_t ls[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t *b = lane_row[i] + at;
            ls[i] = (((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | int(((u16(b + 2) >> (2 * ib)) & 3) << 4)) - 32;
        }
        o.scale[0] = _mm256_mul_ps(d, ints8(ls));
        o.off = _mm256_setzero_ps();
    }
};

template <>
struct Scales<DType::IQ2_XXS> {
    static constexpr bool uniform = true;
    __m256 d = _mm256_setzero_ps();
    STRATA_INLINE void super_block(const uint8_t *const *lane_row, int sb) { d = f16x8(lane_row, size_t(sb / 8) * 66); }
    STRATA_INLINE void get(const uint8_t *const *lane_row, int sb, LaneScales &o) {
        const size_t at = size_t(sb / 8) * 66 + 6 + 8 * (sb % 8);
        int32_t h[8];
        for (int i = 0; i < 8; i++) h[i] = int32_t(u32(lane_row[i] + at) >> 28);
        const __m256 f = _mm256_add_ps(_mm256_set1_ps(0.5f), ints8(h));
        o.scale[0] = _mm256_mul_ps(_mm256_mul_ps(d, f), _mm256_set1_ps(0.25f));
        o.off = _mm256_setzero_ps();
    }
};

// Rows<T>::run(args...) for the types with a vector form, true; false for the others.
template <template <DType> class Rows, typename... Args>
bool by_type(DType t, Args... args) {
    switch (t) {
        case DType::Q8_0:
            Rows<DType::Q8_0>::run(args...);
            return true;
        case DType::Q4_0:
            Rows<DType::Q4_0>::run(args...);
            return true;
        case DType::MXFP4:
            Rows<DType::MXFP4>::run(args...);
            return true;
        case DType::IQ4_XS:
            Rows<DType::IQ4_XS>::run(args...);
            return true;
        case DType::Q4_K:
            Rows<DType::Q4_K>::run(args...);
            return true;
        case DType::Q5_K:
            Rows<DType::Q5_K>::run(args...);
            return true;
        case DType::Q6_K:
            Rows<DType::Q6_K>::run(args...);
            return true;
        case DType::IQ2_XXS:
            Rows<DType::IQ2_XXS>::run(args...);
            return true;
        case DType::IQ1_M:
            Rows<DType::IQ1_M>::run(args...);
            return true;
        default:
            return false;
    }
}

}  // namespace
}  // namespace strata::mmvq_detail
