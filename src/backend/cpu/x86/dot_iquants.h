// x86 kernels of the i-quants (IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the ternary types
// (TQ1_0, TQ2_0) with Q8_K activations. Included only by vec_dot_avx2.cpp / vec_dot_avx512.cpp inside an anonymous
// namespace, after simd_common.h.
//
// All i-quants share one loop (IQKernel): per 32-element sub-block the weight side is built once, as unsigned
// magnitudes, a sign vector to apply to the activations (_mm256_sign_epi8) and int16 scales (one per 16 elements);
// each activation row then costs one pair-sum and one scaled accumulation. Grid types gather their levels from the
// lookup tables with scalar loads (too large for in-register shuffles). Sub-block scales are integers; the common
// factor (a power of two) and d are applied once per super-block, so each super-block's integer total is exact.
#pragma once

// Sub(block, ib) builds sub-block ib: .mag (u8 magnitudes), .sign (the sign of each product), .scale (int16);
// Sub::d(block) is the super-block's d and Sub::factor the common power of two.
template <class Block, class Sub>
struct IQKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Block *w = static_cast<const Block *>(vw);
        __m256 acc[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n / 256; i++) {
            __m256i sumi[NT];
            STRATA_UNROLL for (int t = 0; t < NT; t++) sumi[t] = _mm256_setzero_si256();
            STRATA_UNROLL for (int ib = 0; ib < 8; ib++) {
                const Sub sub(w[i], ib);
                STRATA_UNROLL for (int t = 0; t < NT; t++) {
                    const __m256i xq = load_256(xblock<BlockQ8K>(x, xs, t, i).qs + 32 * ib);
                    sumi[t] = madd_acc(sumi[t], mul_pairs_u8i8(sub.mag, _mm256_sign_epi8(xq, sub.sign)), sub.scale);
                }
            }
            const float d = Sub::factor * Sub::d(w[i]);
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const float dt = xblock<BlockQ8K>(x, xs, t, i).d * d;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dt), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(acc[t]);
    }
};

struct SubBase {
    __m256i mag, sign, scale;
    template <class B>
    static float d(const B &b) { return fp16_to_f32(b.d); }
};

// IQ4_XS: 4-bit indices into kvalues_iq4nl, 6-bit scales ls - 32 per 32 elements.
struct SubIQ4XS : SubBase {
    static constexpr float factor = 1.0f;
    SubIQ4XS(const BlockIQ4XS &b, int ib) {
        const __m256i table = _mm256_broadcastsi128_si256(load_128(kvalues_iq4nl));
        const __m256i v = _mm256_shuffle_epi8(table, unpack_nibbles32(b.qs + 16 * ib));
        const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b.scales_h >> (2 * ib)) & 3) << 4);
        mag = _mm256_sign_epi8(v, v), sign = v, scale = _mm256_set1_epi16(short(ls - 32));
    }
};

inline __m256i grid4_u64(const uint64_t *grid, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_set_epi64x(int64_t(grid[i3]), int64_t(grid[i2]), int64_t(grid[i1]), int64_t(grid[i0]));
}

// Four 7-bit indices of ksigns_iq2xs (bits 0-27 of a) as a sign vector.
inline __m256i signs4_iq2(uint32_t a) {
    const uint64_t *t = vec_dot_detail::k_sign_bytes.v;
    return _mm256_set_epi64x(int64_t(t[(a >> 21) & 127]), int64_t(t[(a >> 14) & 127]), int64_t(t[(a >> 7) & 127]),
                             int64_t(t[a & 127]));
}

// IQ2_XXS: per sub-block two u32: a0 = four 8-bit grid indices, a1 = four 7-bit sign indices and a 4-bit scale;
// scale 2 ls + 1, common factor 1/8.
struct SubIQ2XXS : SubBase {
    static constexpr float factor = 0.125f;
    SubIQ2XXS(const BlockIQ2XXS &b, int ib) {
        const uint32_t a0 = load_u32(&b.qs[4 * ib]), a1 = load_u32(&b.qs[4 * ib + 2]);
        mag = grid4_u64(iq::iq2xxs_grid, a0 & 255, (a0 >> 8) & 255, (a0 >> 16) & 255, a0 >> 24);
        sign = signs4_iq2(a1);
        scale = _mm256_set1_epi16(short(2 * (a1 >> 28) + 1));
    }
};

// IQ2_XS: 9-bit grid index and 7-bit sign index per group; a 4-bit scale per 16 elements, 2 s + 1, factor 1/8.
struct SubIQ2XS : SubBase {
    static constexpr float factor = 0.125f;
    SubIQ2XS(const BlockIQ2XS &b, int ib) {
        const uint16_t *q = b.qs + 4 * ib;
        mag = grid4_u64(iq::iq2xs_grid, q[0] & 511, q[1] & 511, q[2] & 511, q[3] & 511);
        const uint64_t *t = vec_dot_detail::k_sign_bytes.v;
        sign = _mm256_set_epi64x(int64_t(t[q[3] >> 9]), int64_t(t[q[2] >> 9]), int64_t(t[q[1] >> 9]),
                                 int64_t(t[q[0] >> 9]));
        scale = scale_halves(2 * (b.scales[ib] & 15) + 1, 2 * (b.scales[ib] >> 4) + 1);
    }
};

// IQ2_S: 10-bit grid index (two high bits per group in qh), explicit sign bytes, scales as IQ2_XS.
struct SubIQ2S : SubBase {
    static constexpr float factor = 0.125f;
    SubIQ2S(const BlockIQ2S &b, int ib) {
        const uint8_t *q = b.qs + 4 * ib;
        const uint32_t h = b.qh[ib];
        mag = grid4_u64(iq::iq2s_grid, q[0] | ((h << 8) & 0x300), q[1] | ((h << 6) & 0x300),
                        q[2] | ((h << 4) & 0x300), q[3] | ((h << 2) & 0x300));
        sign = bits_to_signs(load_u32(b.qs + 32 + 4 * ib));
        scale = scale_halves(2 * (b.scales[ib] & 15) + 1, 2 * (b.scales[ib] >> 4) + 1);
    }
};

inline __m256i grid8_u32(const uint32_t *grid, const uint32_t *idx) {
    return _mm256_set_epi32(int(grid[idx[7]]), int(grid[idx[6]]), int(grid[idx[5]]), int(grid[idx[4]]),
                            int(grid[idx[3]]), int(grid[idx[2]]), int(grid[idx[1]]), int(grid[idx[0]]));
}

// IQ3_XXS: eight 8-bit indices into the 4-value grid, then a u32 of four 7-bit sign indices and a 4-bit scale;
// scale 2 ls + 1, common factor 1/4.
struct SubIQ3XXS : SubBase {
    static constexpr float factor = 0.25f;
    SubIQ3XXS(const BlockIQ3XXS &b, int ib) {
        const uint8_t *q = b.qs + 8 * ib;
        const uint32_t idx[8] = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
        const uint32_t a = load_u32(b.qs + 64 + 4 * ib);
        mag = grid8_u32(iq::iq3xxs_grid, idx);
        sign = signs4_iq2(a);
        scale = _mm256_set1_epi16(short(2 * (a >> 28) + 1));
    }
};

// IQ3_S: 9-bit indices (the ninth bit from qh), explicit sign bits, scale 1 + 2 s per 32 elements.
struct SubIQ3S : SubBase {
    static constexpr float factor = 1.0f;
    SubIQ3S(const BlockIQ3S &b, int ib) {
        const uint8_t *q = b.qs + 8 * ib;
        const uint32_t h = b.qh[ib];
        uint32_t idx[8];
        for (int k = 0; k < 8; k++) idx[k] = q[k] | (((h >> k) & 1) << 8);
        mag = grid8_u32(iq::iq3s_grid, idx);
        sign = bits_to_signs(load_u32(b.signs + 4 * ib));
        scale = _mm256_set1_epi16(short(1 + 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15)));
    }
};

// IQ1_S / IQ1_M: 8 * (grid + delta) = 8 g +- 1 with g in {-1, 0, 1}: an odd level of magnitude <= 9. deltas is a
// byte vector of +-1, one sign per group of 8 (IQ1_S: per sub-block). Common factor 1/8.
inline void iq1_levels(SubBase &s, __m256i grid, __m256i deltas) {
    const __m256i level = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), deltas);
    s.mag = _mm256_sign_epi8(level, level), s.sign = level;
}

struct SubIQ1S : SubBase {
    static constexpr float factor = 0.125f;
    SubIQ1S(const BlockIQ1S &b, int ib) {
        const uint8_t *q = b.qs + 4 * ib;
        const uint32_t h = b.qh[ib];
        const __m256i g = grid4_u64(iq::iq1s_grid, q[0] | ((h << 8) & 0x700), q[1] | ((h << 5) & 0x700),
                                    q[2] | ((h << 2) & 0x700), q[3] | ((h >> 1) & 0x700));
        iq1_levels(*this, g, _mm256_set1_epi8((h & 0x8000) ? -1 : 1));
        scale = _mm256_set1_epi16(short(2 * ((h >> 12) & 7) + 1));
    }
};

// IQ1_M: no block-wide d field; its fp16 bits are the top nibbles of the four u16 scale words. Per sub-block two
// 3-bit scales (groups 0-1, 2-3) and, per group, 3 high index bits and a delta sign in one nibble of qh.
struct SubIQ1M : SubBase {
    static constexpr float factor = 0.125f;
    static float d(const BlockIQ1M &b) {
        uint16_t sc[4];
        std::memcpy(sc, b.scales, 8);
        return fp16_to_f32(
            uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
    }
    SubIQ1M(const BlockIQ1M &b, int ib) {
        const uint8_t *q = b.qs + 4 * ib;
        const uint32_t h0 = b.qh[2 * ib], h1 = b.qh[2 * ib + 1];
        const __m256i g = grid4_u64(iq::iq1s_grid, q[0] | ((h0 << 8) & 0x700), q[1] | ((h0 << 4) & 0x700),
                                    q[2] | ((h1 << 8) & 0x700), q[3] | ((h1 << 4) & 0x700));
        // Delta signs: bit 3 (groups 0, 2) or bit 7 (groups 1, 3) of h0 (groups 0-1) or h1 (groups 2-3), spread to
        // the groups' bytes (h0 to the low 128 bits, h1 to the high), tested, and turned into -1 / +1.
        const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi16(short(h0 | (h1 << 8))),
                                              _mm256_set_m128i(_mm_set1_epi8(1), _mm_setzero_si128()));
        const int64_t b3 = 0x0808080808080808, b7 = int64_t(0x8080808080808080ull);
        const __m256i bit = _mm256_set_epi64x(b7, b3, b7, b3);
        const __m256i negative = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
        iq1_levels(*this, g, _mm256_or_si256(negative, _mm256_set1_epi8(1)));
        uint16_t sc;
        std::memcpy(&sc, b.scales + 2 * (ib / 2), 2);
        const int s = sc >> (6 * (ib % 2));
        scale = scale_halves(2 * (s & 7) + 1, 2 * ((s >> 3) & 7) + 1);
    }
};

using KernelIQ4_XS = IQKernel<BlockIQ4XS, SubIQ4XS>;
using KernelIQ2_XXS = IQKernel<BlockIQ2XXS, SubIQ2XXS>;
using KernelIQ2_XS = IQKernel<BlockIQ2XS, SubIQ2XS>;
using KernelIQ2_S = IQKernel<BlockIQ2S, SubIQ2S>;
using KernelIQ3_XXS = IQKernel<BlockIQ3XXS, SubIQ3XXS>;
using KernelIQ3_S = IQKernel<BlockIQ3S, SubIQ3S>;
using KernelIQ1_S = IQKernel<BlockIQ1S, SubIQ1S>;
using KernelIQ1_M = IQKernel<BlockIQ1M, SubIQ1M>;

// ---- ternary (TQ2_0, TQ1_0): levels q - 1 with q in {0, 1, 2}; the -1 comes back as sum(bsums) ----------------------

// TQ1_0 packs five base-3 digits per byte as a fixed-point fraction of 243: digit p of byte b is
// (uint8(b * 3^p) * 3) >> 8, which is 0, 1 or 2 as m = uint8(b * 3^p) is below 86, below 171, or above.
inline __m256i tq1_digits(__m256i m) {
    const __m256i ge86 = _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(86)), m);
    const __m256i ge171 = _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(char(171))), m);
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
}
inline __m256i times3(__m256i m) { return _mm256_add_epi8(m, _mm256_add_epi8(m, m)); }  // byte-wise, mod 256
inline __m128i times3(__m128i m) { return _mm_add_epi8(m, _mm_add_epi8(m, m)); }

// Unsigned digits of a ternary block, 32 elements at a time (group g covers elements 32g .. 32g+31).
struct DigitsTQ2 {
    __m256i q0, q1;
    explicit DigitsTQ2(const BlockTQ2_0 &b) : q0(load_256(b.qs)), q1(load_256(b.qs + 32)) {}
    __m256i group(int g) const {  // element 128h + 32j + l: bits 2j of qs[32h + l]
        const __m256i q = g < 4 ? q0 : q1;
        return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (g & 3))), _mm256_set1_epi8(3));
    }
};

struct DigitsTQ1 {
    __m256i m;    // qs[0..31] * 3^p for the next group p < 5
    __m128i m16;  // qs[32..47] * 3^p for the next digit p of those bytes
    const BlockTQ1_0 &b;
    explicit DigitsTQ1(const BlockTQ1_0 &blk) : m(load_256(blk.qs)), m16(load_128(blk.qs + 32)), b(blk) {}
    // Called for g = 0, 1, ..., 7 in order. Groups 0-4: digit g of qs[j] is element 32g + j. Groups 5-6: digits
    // 2(g-5) and 2(g-5)+1 of qs[32 + j] are elements 160 + 32(g-5) + j and + 16. Group 7: digit 4 of qs[32 + j]
    // (elements 224 + j), then digit p of qh[j] (elements 240 + 4p + j).
    __m256i group(int g) {
        if (g < 5) {
            const __m256i d = tq1_digits(m);
            m = times3(m);
            return d;
        }
        if (g < 7) {
            const __m128i next = times3(m16);
            const __m256i d = tq1_digits(_mm256_set_m128i(next, m16));
            m16 = times3(next);
            return d;
        }
        const __m128i a1 = _mm_set1_epi32(int(load_u32(b.qh))), a3 = times3(a1), a9 = times3(a3), a27 = times3(a9);
        const __m128i qh = _mm_blend_epi32(_mm_blend_epi32(a1, a3, 0x2), _mm_blend_epi32(a9, a27, 0x8), 0xc);
        return tq1_digits(_mm256_set_m128i(qh, m16));
    }
};

template <class Block, class Digits>
struct TernaryKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Block *w = static_cast<const Block *>(vw);
        __m256 acc[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n / 256; i++) {
            __m256i sumi[NT];
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const __m256i bsums = _mm256_madd_epi16(load_256(xblock<BlockQ8K>(x, xs, t, i).bsums),
                                                        _mm256_set1_epi16(1));
                sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), bsums);
            }
            Digits digits(w[i]);
            STRATA_UNROLL for (int g = 0; g < 8; g++) {
                const __m256i q = digits.group(g);
                STRATA_UNROLL for (int t = 0; t < NT; t++) {
                    const __m256i xq = load_256(xblock<BlockQ8K>(x, xs, t, i).qs + 32 * g);
                    sumi[t] = _mm256_add_epi32(sumi[t], mul_sum_u8i8(q, xq));
                }
            }
            const float d = fp16_to_f32(w[i].d);
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const float dt = xblock<BlockQ8K>(x, xs, t, i).d * d;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dt), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            }
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(acc[t]);
    }
};

using KernelTQ1_0 = TernaryKernel<BlockTQ1_0, DigitsTQ1>;
using KernelTQ2_0 = TernaryKernel<BlockTQ2_0, DigitsTQ2>;
