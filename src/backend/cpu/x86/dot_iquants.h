// x86 kernels of the i-quants (IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with Q8_K
// activations. Included only by vec_dot_avx2.cpp / vec_dot_avx512.cpp inside an anonymous namespace, after
// simd_common.h.
//
// Grid types gather their 32 levels per sub-block from the lookup tables with scalar loads (the tables are too large
// for in-register shuffles), apply the sign masks to the activations (_mm256_sign_epi8), and go through the same
// pair-sum / scale steps as the K-quants. Sub-block scales are odd integers; the common power of two is applied once
// per super-block, so each super-block's integer total is exact.
#pragma once

// IQ4_XS: 4-bit indices into kvalues_iq4nl, 6-bit scales ls - 32 per 32 elements.
float dot_iq4_xs(int64_t n, const void *vw, const void *vx) {
    const BlockIQ4XS *w = static_cast<const BlockIQ4XS *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    const __m256i table = _mm256_broadcastsi128_si256(load_128(kvalues_iq4nl));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        const uint32_t sl = load_u32(w[i].scales_l), sh = w[i].scales_h;
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const int ls = int((sl >> (4 * ib)) & 15) | int(((sh >> (2 * ib)) & 3) << 4);
            const __m256i v = _mm256_shuffle_epi8(table, unpack_nibbles32(w[i].qs + 16 * ib));
            const __m256i xq = load_256(x[i].qs + 32 * ib);
            const __m256i pairs = mul_pairs_u8i8(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xq, v));
            sumi = madd_acc(sumi, pairs, _mm256_set1_epi16(short(ls - 32)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

inline __m256i grid4_u64(const uint64_t *grid, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_set_epi64x(int64_t(grid[i3]), int64_t(grid[i2]), int64_t(grid[i1]), int64_t(grid[i0]));
}

inline __m256i signs4_iq2(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    const uint64_t *t = vec_dot_detail::k_sign_bytes.v;
    return _mm256_set_epi64x(int64_t(t[i3]), int64_t(t[i2]), int64_t(t[i1]), int64_t(t[i0]));
}

// IQ2_XXS: per sub-block two u32: a0 = four 8-bit grid indices, a1 = four 7-bit sign indices and a 4-bit scale;
// level scale 2 ls + 1, common factor 1/8.
float dot_iq2_xxs(int64_t n, const void *vw, const void *vx) {
    const BlockIQ2XXS *w = static_cast<const BlockIQ2XXS *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a0 = load_u32(&w[i].qs[4 * ib]), a1 = load_u32(&w[i].qs[4 * ib + 2]);
            const __m256i g = grid4_u64(iq::iq2xxs_grid, a0 & 255, (a0 >> 8) & 255, (a0 >> 16) & 255, a0 >> 24);
            const __m256i s = signs4_iq2(a1 & 127, (a1 >> 7) & 127, (a1 >> 14) & 127, (a1 >> 21) & 127);
            const __m256i pairs = mul_pairs_u8i8(g, _mm256_sign_epi8(load_256(x[i].qs + 32 * ib), s));
            sumi = madd_acc(sumi, pairs, _mm256_set1_epi16(short(2 * (a1 >> 28) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

// IQ2_XS / IQ2_S: a 4-bit scale per 16 elements; group(b, ib, g, s) fills the grid levels and sign vector of
// sub-block ib.
template <class Block, class Group>
float dot_iq2_scaled(int64_t n, const void *vw, const void *vx, Group group) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            __m256i g, s;
            group(w[i], ib, g, s);
            const int sc = w[i].scales[ib];
            const __m256i pairs = mul_pairs_u8i8(g, _mm256_sign_epi8(load_256(x[i].qs + 32 * ib), s));
            sumi = madd_acc(sumi, pairs, scale_halves(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

float dot_iq2_xs(int64_t n, const void *w, const void *x) {
    return dot_iq2_scaled<BlockIQ2XS>(n, w, x, [](const BlockIQ2XS &b, int ib, __m256i &g, __m256i &s) {
        const uint16_t *q = b.qs + 4 * ib;
        g = grid4_u64(iq::iq2xs_grid, q[0] & 511, q[1] & 511, q[2] & 511, q[3] & 511);
        s = signs4_iq2(q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9);
    });
}

float dot_iq2_s(int64_t n, const void *w, const void *x) {
    return dot_iq2_scaled<BlockIQ2S>(n, w, x, [](const BlockIQ2S &b, int ib, __m256i &g, __m256i &s) {
        const uint8_t *q = b.qs + 4 * ib;
        const uint32_t h = b.qh[ib];
        g = grid4_u64(iq::iq2s_grid, q[0] | ((h << 8) & 0x300), q[1] | ((h << 6) & 0x300),
                      q[2] | ((h << 4) & 0x300), q[3] | ((h << 2) & 0x300));
        s = bits_to_signs(load_u32(b.qs + 32 + 4 * ib));
    });
}

inline __m256i grid8_u32(const uint32_t *grid, const uint32_t *idx) {
    return _mm256_set_epi32(int(grid[idx[7]]), int(grid[idx[6]]), int(grid[idx[5]]), int(grid[idx[4]]),
                            int(grid[idx[3]]), int(grid[idx[2]]), int(grid[idx[1]]), int(grid[idx[0]]));
}

// IQ3_XXS: eight 8-bit indices into the 4-value grid, then a u32 of four 7-bit sign indices and a 4-bit scale;
// level scale 2 ls + 1, common factor 1/4.
float dot_iq3_xxs(int64_t n, const void *vw, const void *vx) {
    const BlockIQ3XXS *w = static_cast<const BlockIQ3XXS *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = w[i].qs + 8 * ib;
            const uint32_t idx[8] = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
            const uint32_t a = load_u32(w[i].qs + 64 + 4 * ib);
            const __m256i g = grid8_u32(iq::iq3xxs_grid, idx);
            const __m256i s = signs4_iq2(a & 127, (a >> 7) & 127, (a >> 14) & 127, (a >> 21) & 127);
            const __m256i pairs = mul_pairs_u8i8(g, _mm256_sign_epi8(load_256(x[i].qs + 32 * ib), s));
            sumi = madd_acc(sumi, pairs, _mm256_set1_epi16(short(2 * (a >> 28) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.25f * x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

// IQ3_S: 9-bit indices (the ninth bit from qh), explicit sign bits, scale 1 + 2 s per 32 elements.
float dot_iq3_s(int64_t n, const void *vw, const void *vx) {
    const BlockIQ3S *w = static_cast<const BlockIQ3S *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = w[i].qs + 8 * ib;
            const uint32_t h = w[i].qh[ib];
            uint32_t idx[8];
            for (int k = 0; k < 8; k++) idx[k] = q[k] | (((h >> k) & 1) << 8);
            const __m256i g = grid8_u32(iq::iq3s_grid, idx);
            const __m256i s = bits_to_signs(load_u32(w[i].signs + 4 * ib));
            const int sc = (w[i].scales[ib / 2] >> (4 * (ib % 2))) & 15;
            const __m256i pairs = mul_pairs_u8i8(g, _mm256_sign_epi8(load_256(x[i].qs + 32 * ib), s));
            sumi = madd_acc(sumi, pairs, _mm256_set1_epi16(short(1 + 2 * sc)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

// IQ1_S / IQ1_M: 8 * (grid + delta) = 8 g +- 1 with g in {-1, 0, 1}, an odd level of magnitude <= 9; deltas is a
// byte vector of +-1, one sign per group of 8. The common factor 1/8 is applied per super-block.
inline __m256i iq1_pairs(__m256i grid, __m256i deltas, const int8_t *xq) {
    const __m256i level = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), deltas);
    return mul_pairs_u8i8(_mm256_sign_epi8(level, level), _mm256_sign_epi8(load_256(xq), level));
}

float dot_iq1_s(int64_t n, const void *vw, const void *vx) {
    const BlockIQ1S *w = static_cast<const BlockIQ1S *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = w[i].qs + 4 * ib;
            const uint32_t h = w[i].qh[ib];
            const __m256i g = grid4_u64(iq::iq1s_grid, q[0] | ((h << 8) & 0x700), q[1] | ((h << 5) & 0x700),
                                        q[2] | ((h << 2) & 0x700), q[3] | ((h >> 1) & 0x700));
            const __m256i deltas = _mm256_set1_epi8((h & 0x8000) ? -1 : 1);
            const __m256i pairs = iq1_pairs(g, deltas, x[i].qs + 32 * ib);
            sumi = madd_acc(sumi, pairs, _mm256_set1_epi16(short(2 * ((h >> 12) & 7) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

// IQ1_M: no block-wide d field; its fp16 bits are the top nibbles of the four u16 scale words. Per sub-block two
// 3-bit scales (groups 0-1, 2-3) and, per group, 3 high index bits and a delta sign in one nibble of qh.
float dot_iq1_m(int64_t n, const void *vw, const void *vx) {
    const BlockIQ1M *w = static_cast<const BlockIQ1M *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    constexpr int64_t plus = 0x0101010101010101, minus = -1;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        uint16_t sc[4];
        std::memcpy(sc, w[i].scales, 8);
        const uint16_t d_bits =
            uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        __m256i sumi = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = w[i].qs + 4 * ib;
            const uint32_t h0 = w[i].qh[2 * ib], h1 = w[i].qh[2 * ib + 1];
            const __m256i g = grid4_u64(iq::iq1s_grid, q[0] | ((h0 << 8) & 0x700), q[1] | ((h0 << 4) & 0x700),
                                        q[2] | ((h1 << 8) & 0x700), q[3] | ((h1 << 4) & 0x700));
            const __m256i deltas = _mm256_set_epi64x((h1 & 0x80) ? minus : plus, (h1 & 0x08) ? minus : plus,
                                                     (h0 & 0x80) ? minus : plus, (h0 & 0x08) ? minus : plus);
            const int s = sc[ib / 2] >> (6 * (ib % 2));
            const __m256i pairs = iq1_pairs(g, deltas, x[i].qs + 32 * ib);
            sumi = madd_acc(sumi, pairs, scale_halves(2 * (s & 7) + 1, 2 * ((s >> 3) & 7) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * x[i].d * fp16_to_f32(d_bits)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}
