// The host mat-vec in the GPU's order (mmvq_host.h), sixteen weight rows at a time with AVX-512. The integer dot of
// each 8-element group comes from VNNI (vpdpbusd: four byte products summed into a 32-bit lane, exact, no
// saturation) and a transposition that leaves row l's groups in vector lane l; from there each lane goes through
// exactly the scalar code's float operations in the same order, as the AVX2 form's lanes do (mmvq_host_avx2.cpp),
// so the results are the row-by-row form's bits. The per-row scales are the AVX2 form's (mmvq_host_x86.h), eight
// rows at a time, two of them side by side. Compiled with AVX-512 F/BW/VL/DQ/VNNI and no contraction
// (CMakeLists.txt); chosen at run time where the CPU runs them (mmvq_host.cpp).
#include "backend/host/mmvq_host_avx512.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>

// GCC 12's AVX-512 headers give several intrinsics (broadcast, insert, int-to-float) an undefined pass-through vector
// and then warn that it may be used uninitialized (GCC bug 105593); nothing here reads such a value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "backend/host/mmvq_host_x86.h"

namespace strata::mmvq_detail {

namespace {

// The exact integer dot of each 8-element group of one sub-block for sixteen rows: w[i] holds the weights of rows
// 2i (low 256 bits) and 2i + 1 (high), x the sub-block's 32 activations in both halves; g[j] gets group j's dots,
// row l in lane l. Activations are never -128 (quantize_act_gpu rounds values within +-127), so negating them where
// a weight is negative (its magnitude then unsigned, as vpdpbusd takes it) cannot overflow.
template <bool unsigned_weights>
STRATA_INLINE void group_dots16(const __m512i w[8], __m512i x, __m512i g[4]) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i p[8];  // p[i] lane 8h + 2j + e: row 2i + h, group j, its elements 4e .. 4e + 3
    for (int i = 0; i < 8; i++) {
        if (unsigned_weights) {
            p[i] = _mm512_dpbusd_epi32(zero, w[i], x);
        } else {
            const __mmask64 neg = _mm512_movepi8_mask(w[i]);
            p[i] = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w[i]), _mm512_mask_sub_epi8(x, neg, zero, x));
        }
    }
    // Both halves of each group added: q[m] lane 4r + j is row 4m + r, group j.
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512i q[4];
    for (int m = 0; m < 4; m++)
        q[m] = _mm512_add_epi32(_mm512_permutex2var_epi32(p[2 * m], even, p[2 * m + 1]),
                                _mm512_permutex2var_epi32(p[2 * m], odd, p[2 * m + 1]));
    // Group j of every row: lanes 0-7 from q[0] and q[1], lanes 8-15 from q[2] and q[3], by the same index.
    for (int j = 0; j < 4; j++) {
        const __m512i idx = _mm512_setr_epi32(j, 4 + j, 8 + j, 12 + j, 16 + j, 20 + j, 24 + j, 28 + j, j, 4 + j, 8 + j,
                                              12 + j, 16 + j, 20 + j, 24 + j, 28 + j);
        g[j] = _mm512_mask_blend_epi32(0xff00, _mm512_permutex2var_epi32(q[0], idx, q[1]),
                                       _mm512_permutex2var_epi32(q[2], idx, q[3]));
    }
}

STRATA_INLINE __m512 join(__m256 lo, __m256 hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

// The float side of a sub-block for sixteen rows in order: the AVX2 form's scales of rows 0-7 and of rows 8-15.
struct LaneScales16 {
    __m512 scale[4], bias[4], off;
};

template <DType T>
struct Scales16 {
    using S = Scales<T>;
    S lo, hi;
    STRATA_INLINE void super_block(const uint8_t *const *row, int sb) {
        lo.super_block(row, sb);
        hi.super_block(row + 8, sb);
    }
    STRATA_INLINE void get(const uint8_t *const *row, int sb, LaneScales16 &o) {
        LaneScales a, b;
        lo.get(row, sb, a);
        hi.get(row + 8, sb, b);
        for (int j = 0; j < (S::uniform ? 1 : 4); j++) o.scale[j] = join(a.scale[j], b.scale[j]);
        if (has_bias(T))
            for (int j = 0; j < 4; j++) o.bias[j] = join(a.bias[j], b.bias[j]);
        o.off = join(a.off, b.off);
    }
};

// Rows [r0, r1) of a matrix of type T: mmvq_host_dot for each, sixteen at a time.
template <DType T>
void rows_t(const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1, const int8_t *q,
            const ActScale *ds, float *out) {
    using W = Weights<T>;
    Scales16<T> sc;
    const int n_sub = int(k / 32);
    const bool bias = has_bias(T);
    for (int64_t b0 = r0; b0 < r1; b0 += 16) {
        const uint8_t *row[16];  // row b0 + i, in vector lane i; past the end the last row again, its results dropped
        for (int i = 0; i < 16; i++) row[i] = data + size_t(std::min<int64_t>(b0 + i, r1 - 1)) * row_bytes;
        __m512 lane[32];
        for (__m512 &l : lane) l = _mm512_setzero_ps();
        for (int sb = 0; sb < n_sub; sb++) {
            const __m512i x =
                _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + size_t(sb) * 32)));
            __m512i w[8];
            for (int i = 0; i < 8; i++)
                w[i] =
                    _mm512_inserti64x4(_mm512_castsi256_si512(W::load(row[2 * i], sb)), W::load(row[2 * i + 1], sb), 1);
            __m512i g[4];
            group_dots16<W::unsigned_weights>(w, x, g);
            if (sb % 8 == 0) sc.super_block(row, sb);
            LaneScales16 ls;
            sc.get(row, sb, ls);
            __m512 s = _mm512_setzero_ps();
            for (int j = 0; j < 4; j++) {
                s = _mm512_fmadd_ps(Scales<T>::uniform ? ls.scale[0] : ls.scale[j], _mm512_cvtepi32_ps(g[j]), s);
                if (bias) {
                    const int8_t *xg = q + size_t(sb) * 32 + 8 * j;
                    int xs = 0;
                    for (int e = 0; e < 8; e++) xs += xg[e];
                    s = _mm512_fmadd_ps(ls.bias[j], _mm512_set1_ps(float(xs)), s);
                }
            }
            const __m512 t =
                _mm512_fmadd_ps(_mm512_set1_ps(ds[sb].d), s, _mm512_mul_ps(ls.off, _mm512_set1_ps(ds[sb].s)));
            lane[sb % 32] = _mm512_add_ps(lane[sb % 32], t);
        }
        for (int o = 16; o > 0; o >>= 1)  // the warp's butterfly, as far as lane 0 needs it
            for (int l = 0; l < o; l++) lane[l] = _mm512_add_ps(lane[l], lane[l + o]);
        alignas(64) float res[16];
        _mm512_store_ps(res, lane[0]);
        for (int i = 0; i < 16 && b0 + i < r1; i++) out[b0 + i - r0] = res[i];
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

bool mmvq_rows_avx512(DType t, const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1,
                      const int8_t *q, const ActScale *ds, float *out) {
    return by_type<RowsOf>(t, data, row_bytes, k, r0, r1, q, ds, out);
}

}  // namespace strata::mmvq_detail

#else

namespace strata::mmvq_detail {

bool mmvq_rows_avx512(DType, const uint8_t *, size_t, int64_t, int64_t, int64_t, const int8_t *, const ActScale *,
                      float *) {
    return false;
}

}  // namespace strata::mmvq_detail

#endif
