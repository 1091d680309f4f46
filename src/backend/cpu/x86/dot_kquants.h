// x86 kernels of the K-quants (Q2_K ... Q6_K) with Q8_K activations. Included only by vec_dot_avx2.cpp /
// vec_dot_avx512.cpp inside an anonymous namespace, after simd_common.h.
//
// Shape of every kernel: per 256-element super-block, unsigned levels times activations as 16-bit pair sums
// (maddubs), times the sub-block scales into int32 lanes (madd); offsets (Q3_K's -4, Q6_K's -32) and minimums come
// out of the activation's bsums, so the integer total is exact; one fp32 multiply-add per super-block.
#pragma once

// Q4_K / Q5_K: eight 6-bit scales and eight 6-bit minimums from 12 bytes, as two 8-byte arrays. Bytes 0-3 hold the
// low 6 bits of scales 0-3 (top bits: high bits of scales 4-7), bytes 4-7 the same for minimums, bytes 8-11 the low
// nibbles of scales 4-7 (low) and minimums 4-7 (high).
inline void unpack_q4k_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    const uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
    const uint32_t sc_lo = a & 0x3f3f3f3f, mn_lo = b & 0x3f3f3f3f;
    const uint32_t sc_hi = (c & 0x0f0f0f0f) | ((a >> 2) & 0x30303030);
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0f) | ((b >> 2) & 0x30303030);
    std::memcpy(sc, &sc_lo, 4), std::memcpy(sc + 4, &sc_hi, 4);
    std::memcpy(mn, &mn_lo, 4), std::memcpy(mn + 4, &mn_hi, 4);
}

// sum_b m_b * (bsums[2b] + bsums[2b+1]) over the eight 32-element sub-blocks.
inline int q4k_min_sum(const uint8_t *mn, const int16_t *bsums) {
    const __m128i m8 = _mm_loadl_epi64((const __m128i *)mn);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));  // m0 m0 m1 m1 ... m7 m7
    return hsum_i32x8(_mm256_madd_epi16(load_256(bsums), m16));
}

template <class Block, bool five_bits>
struct Q45KKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Block *w = static_cast<const Block *>(vw);
        const __m256i m4 = _mm256_set1_epi8(15);
        __m256 acc[NT];
        float mins[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps(), mins[t] = 0.0f;
        for (int64_t i = 0; i < n / 256; i++) {
            alignas(8) uint8_t sc[8], mn[8];
            unpack_q4k_scales(w[i].scales, sc, mn);
            const float d = fp16_to_f32(w[i].d), dmin = fp16_to_f32(w[i].dmin);
            __m256i sumi[NT];
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const BlockQ8K &xb = xblock<BlockQ8K>(x, xs, t, i);
                mins[t] += xb.d * dmin * float(q4k_min_sum(mn, xb.bsums));
                sumi[t] = _mm256_setzero_si256();
            }
            __m256i hbits;
            if constexpr (five_bits) hbits = load_256(w[i].qh);
            // elements 64p .. 64p+63: sub-blocks 2p (low nibbles) and 2p+1 (high nibbles)
            STRATA_UNROLL for (int p = 0; p < 4; p++) {
                const __m256i q = load_256(w[i].qs + 32 * p);
                __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if constexpr (five_bits) {  // bit 2p of qh[l] for the low half, bit 2p+1 for the high half
                    const __m256i one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
                    hi = _mm256_or_si256(hi,
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
                    hbits = _mm256_srli_epi16(hbits, 2);
                }
                const __m256i s_lo = _mm256_set1_epi16(sc[2 * p]), s_hi = _mm256_set1_epi16(sc[2 * p + 1]);
                STRATA_UNROLL for (int t = 0; t < NT; t++) {
                    const int8_t *xq = xblock<BlockQ8K>(x, xs, t, i).qs + 64 * p;
                    sumi[t] = madd_acc(sumi[t], mul_pairs_u8i8(lo, load_256(xq)), s_lo);
                    sumi[t] = madd_acc(sumi[t], mul_pairs_u8i8(hi, load_256(xq + 32)), s_hi);
                }
            }
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const float dt = xblock<BlockQ8K>(x, xs, t, i).d * d;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dt), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(acc[t]) - mins[t];
    }
};

using KernelQ4_K = Q45KKernel<BlockQ4K, false>;
using KernelQ5_K = Q45KKernel<BlockQ5K, true>;

// Sixteen int16 scales s[0..15] of 16-element sub-blocks; element group (h, t) of 32 (h = 0, 1; t = 0..3) covers
// sub-blocks 8h+2t and 8h+2t+1, whose scales scale_pair<t> picks from the eight of half h.
// The symmetric K-quants below store level + offset (Q3_K: +4, Q6_K: +32) as an unsigned value u; the offset comes
// back as offset * sum_j s_j * bsums[j]. Levels(block, h, g) gives the unsigned levels of group (h, g).
template <class Block, class Levels, class Scales, int offset_shift>
struct SymKKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Block *w = static_cast<const Block *>(vw);
        __m256 acc[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n / 256; i++) {
            const __m128i s8 = Scales()(w[i]);  // sixteen int8 scales
            __m256i sumi[NT];
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const __m256i offset = _mm256_madd_epi16(load_256(xblock<BlockQ8K>(x, xs, t, i).bsums),
                                                         _mm256_cvtepi8_epi16(s8));
                sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, offset_shift));
            }
            STRATA_UNROLL for (int h = 0; h < 2; h++) {
                const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
                const Levels levels(w[i], h);
                add_groups<0>(levels, sc, x, xs, i, h, sumi);
                add_groups<1>(levels, sc, x, xs, i, h, sumi);
                add_groups<2>(levels, sc, x, xs, i, h, sumi);
                add_groups<3>(levels, sc, x, xs, i, h, sumi);
            }
            const float d = fp16_to_f32(w[i].d);
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const float dt = xblock<BlockQ8K>(x, xs, t, i).d * d;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dt), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(acc[t]);
    }

    template <int g, class L, int NT>
    static void add_groups(const L &levels, __m256i sc, const uint8_t *x, size_t xs, int64_t i, int h,
                           __m256i (&sumi)[NT]) {
        const __m256i u = levels.template group<g>(), s = scale_pair<g>(sc);
        STRATA_UNROLL for (int t = 0; t < NT; t++) {
            const int8_t *xq = xblock<BlockQ8K>(x, xs, t, i).qs + 128 * h + 32 * g;
            sumi[t] = madd_acc(sumi[t], mul_pairs_u8i8(u, load_256(xq)), s);
        }
    }
};

// Q6_K: u = low 4 bits | high 2 bits << 4 (0..63), level u - 32.
struct LevelsQ6K {
    __m256i ql0, ql1, qh;
    LevelsQ6K(const BlockQ6K &b, int h)
        : ql0(load_256(b.ql + 64 * h)), ql1(load_256(b.ql + 64 * h + 32)), qh(load_256(b.qh + 32 * h)) {}
    template <int g>
    __m256i group() const {
        const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
        const __m256i low = g < 2 ? (g == 0 ? ql0 : ql1) : _mm256_srli_epi16(g == 2 ? ql0 : ql1, 4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m2);
        return _mm256_or_si256(_mm256_and_si256(low, m4), _mm256_slli_epi16(high, 4));
    }
};
struct ScalesQ6K {
    __m128i operator()(const BlockQ6K &b) const { return load_128(b.scales); }
};

// Q3_K's sixteen 6-bit scales (stored +32) as int8 s - 32: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high),
// high bit pairs in bytes 8-11 (bit pair k of byte j: scale 4k + j).
struct ScalesQ3K {
    __m128i operator()(const BlockQ3K &b) const {
        const uint32_t a = load_u32(b.scales), c4 = load_u32(b.scales + 4), c = load_u32(b.scales + 8);
        const uint32_t lo = 0x0f0f0f0f, hi = 0x03030303;
        const uint32_t s0 = (a & lo) | ((c & hi) << 4);
        const uint32_t s1 = (c4 & lo) | (((c >> 2) & hi) << 4);
        const uint32_t s2 = ((a >> 4) & lo) | (((c >> 4) & hi) << 4);
        const uint32_t s3 = ((c4 >> 4) & lo) | (((c >> 6) & hi) << 4);
        return _mm_sub_epi8(_mm_setr_epi32(int(s0), int(s1), int(s2), int(s3)), _mm_set1_epi8(32));
    }
};

// Q3_K: u = 2 low bits (bits 2g of qs) | hmask bit 4h + g << 2 (0..7), level u - 4.
struct LevelsQ3K {
    __m256i qs, hm;
    LevelsQ3K(const BlockQ3K &b, int h)
        : qs(load_256(b.qs + 32 * h)), hm(_mm256_srli_epi16(load_256(b.hmask), 4 * h)) {}
    template <int g>
    __m256i group() const {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * g), _mm256_set1_epi8(3));
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hm, g), _mm256_set1_epi8(1));
        return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
    }
};

using KernelQ6_K = SymKKernel<BlockQ6K, LevelsQ6K, ScalesQ6K, 5>;
using KernelQ3_K = SymKKernel<BlockQ3K, LevelsQ3K, ScalesQ3K, 2>;

// Q2_K: level = 2 bits, scale = low nibble of scales[j], minimum = high nibble (times dmin, from bsums).
struct Q2KKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const BlockQ2K *w = static_cast<const BlockQ2K *>(vw);
        const __m256i m2 = _mm256_set1_epi8(3);
        const __m128i m4 = _mm_set1_epi8(15);
        __m256 acc[NT];
        float mins[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps(), mins[t] = 0.0f;
        for (int64_t i = 0; i < n / 256; i++) {
            const __m128i raw = load_128(w[i].scales);
            const __m128i s8 = _mm_and_si128(raw, m4);
            const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
            const float d = fp16_to_f32(w[i].d), dmin = fp16_to_f32(w[i].dmin);
            __m256i sumi[NT];
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const BlockQ8K &xb = xblock<BlockQ8K>(x, xs, t, i);
                mins[t] += xb.d * dmin * float(hsum_i32x8(_mm256_madd_epi16(load_256(xb.bsums), m16)));
                sumi[t] = _mm256_setzero_si256();
            }
            STRATA_UNROLL for (int h = 0; h < 2; h++) {
                const __m256i qs = load_256(w[i].qs + 32 * h);
                const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
                const __m256i u[4] = {_mm256_and_si256(qs, m2), _mm256_and_si256(_mm256_srli_epi16(qs, 2), m2),
                                      _mm256_and_si256(_mm256_srli_epi16(qs, 4), m2),
                                      _mm256_and_si256(_mm256_srli_epi16(qs, 6), m2)};
                const __m256i s[4] = {scale_pair<0>(sc), scale_pair<1>(sc), scale_pair<2>(sc), scale_pair<3>(sc)};
                STRATA_UNROLL for (int t = 0; t < NT; t++) {
                    const int8_t *xq = xblock<BlockQ8K>(x, xs, t, i).qs + 128 * h;
                    STRATA_UNROLL for (int g = 0; g < 4; g++)
                        sumi[t] = madd_acc(sumi[t], mul_pairs_u8i8(u[g], load_256(xq + 32 * g)), s[g]);
                }
            }
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const float dt = xblock<BlockQ8K>(x, xs, t, i).d * d;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dt), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(acc[t]) - mins[t];
    }
};

using KernelQ2_K = Q2KKernel;
