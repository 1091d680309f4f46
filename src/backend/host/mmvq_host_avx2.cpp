// The host mat-vec in the GPU's order (mmvq_host.h), eight weight rows at a time with AVX2. Each vector lane is one
// row and goes through exactly the scalar code's float operations in the same order (an FMA where it has std::fma,
// a rounded product or sum where it has one), so the lanes give the scalar results bit for bit; the integer dot
// products of each 8-element group are exact in any order. Compiled with -mavx2 -mfma -mf16c and no contraction
// (CMakeLists.txt); chosen at run time where the CPU has AVX2 (mmvq_host.cpp).
#include "backend/host/mmvq_host_avx2.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <algorithm>

#include "backend/host/mmvq_host_impl.h"

namespace strata::mmvq_detail {

namespace {

#define STRATA_INLINE inline __attribute__((always_inline))

// The vector lane of each of the eight rows a block reduces (the transposition in group_dots leaves them so).
constexpr int k_lane_row[8] = {0, 2, 1, 3, 4, 6, 5, 7};

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

// The exact integer dot of each 8-element group of one sub-block, for eight rows w[0..7]: g[j] holds group j's
// dots, lane i for w[k_lane_row[i]]. Activations are never -128 (quantize_act_gpu rounds values within +-127), so
// flipping their sign for a negative weight cannot overflow.
template <bool unsigned_weights>
STRATA_INLINE void group_dots(const __m256i w[8], __m256i x, __m256i g[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p[8];
    for (int r = 0; r < 8; r++) {
        const __m256i pairs = unsigned_weights ? _mm256_maddubs_epi16(w[r], x)
                                               : _mm256_maddubs_epi16(_mm256_abs_epi8(w[r]), _mm256_sign_epi8(x, w[r]));
        p[r] = _mm256_madd_epi16(pairs, ones);  // sums of 4: groups 0,1 in the low half, 2,3 in the high half
    }
    const __m256i a = _mm256_hadd_epi32(p[0], p[1]), b = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i c = _mm256_hadd_epi32(p[4], p[5]), d = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i ab_lo = _mm256_unpacklo_epi32(a, b), ab_hi = _mm256_unpackhi_epi32(a, b);
    const __m256i cd_lo = _mm256_unpacklo_epi32(c, d), cd_hi = _mm256_unpackhi_epi32(c, d);
    const __m256i g02_ab = _mm256_unpacklo_epi64(ab_lo, ab_hi), g13_ab = _mm256_unpackhi_epi64(ab_lo, ab_hi);
    const __m256i g02_cd = _mm256_unpacklo_epi64(cd_lo, cd_hi), g13_cd = _mm256_unpackhi_epi64(cd_lo, cd_hi);
    g[0] = _mm256_permute2x128_si256(g02_ab, g02_cd, 0x20);
    g[2] = _mm256_permute2x128_si256(g02_ab, g02_cd, 0x31);
    g[1] = _mm256_permute2x128_si256(g13_ab, g13_cd, 0x20);
    g[3] = _mm256_permute2x128_si256(g13_ab, g13_cd, 0x31);
}

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

// Rows [r0, r1) of a matrix of type T: mmvq_host_dot for each, eight at a time.
template <DType T>
void rows_t(const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1, const int8_t *q,
            const ActScale *ds, float *out) {
    using W = Weights<T>;
    using S = Scales<T>;
    S sc;
    const int n_sub = int(k / 32);
    const bool bias = has_bias(T);
    for (int64_t b0 = r0; b0 < r1; b0 += 8) {
        const uint8_t *row[8], *lane_row[8];  // row b0 + i; the row of vector lane i
        for (int i = 0; i < 8; i++)           // past the end: the last row again, its results dropped
            row[i] = data + size_t(std::min<int64_t>(b0 + i, r1 - 1)) * row_bytes;
        for (int i = 0; i < 8; i++) lane_row[i] = row[k_lane_row[i]];
        __m256 lane[32];
        for (__m256 &l : lane) l = _mm256_setzero_ps();
        for (int sb = 0; sb < n_sub; sb++) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + size_t(sb) * 32));
            __m256i w[8];
            for (int i = 0; i < 8; i++) w[i] = W::load(row[i], sb);
            __m256i g[4];
            group_dots<W::unsigned_weights>(w, x, g);
            if (sb % 8 == 0) sc.super_block(lane_row, sb);
            LaneScales ls;
            sc.get(lane_row, sb, ls);
            __m256 s = _mm256_setzero_ps();
            for (int j = 0; j < 4; j++) {
                s = _mm256_fmadd_ps(S::uniform ? ls.scale[0] : ls.scale[j], _mm256_cvtepi32_ps(g[j]), s);
                if (bias) {
                    const int8_t *xg = q + size_t(sb) * 32 + 8 * j;
                    int xs = 0;
                    for (int e = 0; e < 8; e++) xs += xg[e];
                    s = _mm256_fmadd_ps(ls.bias[j], _mm256_set1_ps(float(xs)), s);
                }
            }
            const __m256 t =
                _mm256_fmadd_ps(_mm256_set1_ps(ds[sb].d), s, _mm256_mul_ps(ls.off, _mm256_set1_ps(ds[sb].s)));
            lane[sb % 32] = _mm256_add_ps(lane[sb % 32], t);
        }
        for (int o = 16; o > 0; o >>= 1)  // the warp's butterfly, as far as lane 0 needs it
            for (int l = 0; l < o; l++) lane[l] = _mm256_add_ps(lane[l], lane[l + o]);
        alignas(32) float res[8];
        _mm256_store_ps(res, lane[0]);
        for (int i = 0; i < 8; i++)
            if (b0 + k_lane_row[i] < r1) out[b0 + k_lane_row[i] - r0] = res[i];
    }
}

#undef STRATA_INLINE

}  // namespace

bool mmvq_rows_avx2(DType t, const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1, const int8_t *q,
                    const ActScale *ds, float *out) {
    switch (t) {
        case DType::Q8_0:
            rows_t<DType::Q8_0>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::Q4_0:
            rows_t<DType::Q4_0>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::MXFP4:
            rows_t<DType::MXFP4>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::IQ4_XS:
            rows_t<DType::IQ4_XS>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::Q4_K:
            rows_t<DType::Q4_K>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::Q5_K:
            rows_t<DType::Q5_K>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::Q6_K:
            rows_t<DType::Q6_K>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::IQ2_XXS:
            rows_t<DType::IQ2_XXS>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        case DType::IQ1_M:
            rows_t<DType::IQ1_M>(data, row_bytes, k, r0, r1, q, ds, out);
            return true;
        default:
            return false;
    }
}

}  // namespace strata::mmvq_detail

#else

namespace strata::mmvq_detail {

bool mmvq_rows_avx2(DType, const uint8_t *, size_t, int64_t, int64_t, int64_t, const int8_t *, const ActScale *,
                    float *) {
    return false;
}

}  // namespace strata::mmvq_detail

#endif
