// The host mat-vec in the GPU's order (mmvq_host.h), eight weight rows at a time with AVX2. Each vector lane is one
// row and goes through exactly the scalar code's float operations in the same order (an FMA where it has std::fma,
// a rounded product or sum where it has one), so the lanes give the scalar results bit for bit; the integer dot
// products of each 8-element group are exact in any order. Compiled with -mavx2 -mfma -mf16c and no contraction
// (CMakeLists.txt); chosen at run time where the CPU has AVX2 (mmvq_host.cpp).
#include "backend/host/mmvq_host_avx2.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>

#include "backend/host/mmvq_host_x86.h"

namespace strata::mmvq_detail {

namespace {

// The vector lane of each of the eight rows a block reduces (the transposition in group_dots leaves them so).
constexpr int k_lane_row[8] = {0, 2, 1, 3, 4, 6, 5, 7};

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

template <DType T>
struct RowsOf {
    static void run(const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1, const int8_t *q,
                    const ActScale *ds, float *out) {
        rows_t<T>(data, row_bytes, k, r0, r1, q, ds, out);
    }
};

}  // namespace

bool mmvq_rows_avx2(DType t, const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1, const int8_t *q,
                    const ActScale *ds, float *out) {
    return by_type<RowsOf>(t, data, row_bytes, k, r0, r1, q, ds, out);
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
