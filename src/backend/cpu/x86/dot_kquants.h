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
float dot_q45_k(int64_t n, const void *vw, const void *vx) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        alignas(8) uint8_t sc[8], mn[8];
        unpack_q4k_scales(w[i].scales, sc, mn);
        mins += x[i].d * fp16_to_f32(w[i].dmin) * float(q4k_min_sum(mn, x[i].bsums));

        __m256i hbits;
        if constexpr (five_bits) hbits = load_256(w[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {  // elements 64p .. 64p+63: sub-blocks 2p (low nibbles), 2p+1 (high)
            const __m256i q = load_256(w[i].qs + 32 * p);
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if constexpr (five_bits) {  // bit 2p of qh[l] for the low half, bit 2p+1 for the high half
                const __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
                hbits = _mm256_srli_epi16(hbits, 2);
            }
            const __m256i p_lo = mul_pairs_u8i8(lo, load_256(x[i].qs + 64 * p));
            const __m256i p_hi = mul_pairs_u8i8(hi, load_256(x[i].qs + 64 * p + 32));
            sumi = madd_acc(sumi, p_lo, _mm256_set1_epi16(sc[2 * p]));
            sumi = madd_acc(sumi, p_hi, _mm256_set1_epi16(sc[2 * p + 1]));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc) - mins;
}

float dot_q4_k(int64_t n, const void *w, const void *x) { return dot_q45_k<BlockQ4K, false>(n, w, x); }
float dot_q5_k(int64_t n, const void *w, const void *x) { return dot_q45_k<BlockQ5K, true>(n, w, x); }

// Sixteen int16 scales s[0..15] of 16-element sub-blocks; element group (h, t) of 32 (h = 0, 1; t = 0..3) covers
// sub-blocks 8h+2t and 8h+2t+1. sumi += sum over the group of level * qx * scale, via scale_pair.
template <int t>
inline __m256i add_group16(__m256i sumi, __m256i levels, const int8_t *xq, __m256i scales8) {
    return madd_acc(sumi, mul_pairs_u8i8(levels, load_256(xq + 32 * t)), scale_pair<t>(scales8));
}

// Q6_K: level = (low 4 bits | high 2 bits << 4) - 32; the -32 comes back as 32 * sum_j s_j * bsums[j].
float dot_q6_k(int64_t n, const void *vw, const void *vx) {
    const BlockQ6K *w = static_cast<const BlockQ6K *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        const __m128i s8 = load_128(w[i].scales);
        const __m256i s16 = _mm256_cvtepi8_epi16(s8);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = load_256(w[i].ql + 64 * h), ql1 = load_256(w[i].ql + 64 * h + 32);
            const __m256i qh = load_256(w[i].qh + 32 * h);
            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
            const int8_t *xq = x[i].qs + 128 * h;
            sumi = add_group16<0>(sumi, q0, xq, sc);
            sumi = add_group16<1>(sumi, q1, xq, sc);
            sumi = add_group16<2>(sumi, q2, xq, sc);
            sumi = add_group16<3>(sumi, q3, xq, sc);
        }
        const __m256i offset = _mm256_madd_epi16(load_256(x[i].bsums), s16);
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offset, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

// Q3_K's sixteen 6-bit scales (stored +32) as int8 s - 32: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high),
// high bit pairs in bytes 8-11 (bit pair k of byte j: scale 4k + j).
inline __m128i unpack_q3k_scales(const uint8_t *s) {
    const uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
    const uint32_t lo = 0x0f0f0f0f, hi = 0x03030303;
    const uint32_t s0 = (a & lo) | ((c & hi) << 4);
    const uint32_t s1 = (b & lo) | (((c >> 2) & hi) << 4);
    const uint32_t s2 = ((a >> 4) & lo) | (((c >> 4) & hi) << 4);
    const uint32_t s3 = ((b >> 4) & lo) | (((c >> 6) & hi) << 4);
    return _mm_sub_epi8(_mm_setr_epi32(int(s0), int(s1), int(s2), int(s3)), _mm_set1_epi8(32));
}

// Q3_K: level = (2 low bits | hmask bit << 2) - 4; the -4 comes back as 4 * sum_j s_j * bsums[j].
float dot_q3_k(int64_t n, const void *vw, const void *vx) {
    const BlockQ3K *w = static_cast<const BlockQ3K *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        const __m128i s8 = unpack_q3k_scales(w[i].scales);
        const __m256i hmask = load_256(w[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qs = load_256(w[i].qs + 32 * h);
            const __m256i hm = _mm256_srli_epi16(hmask, 4 * h);
            const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
            const int8_t *xq = x[i].qs + 128 * h;
            auto level = [&](int j) {  // bits 2j of qs, bit 4h + j of hmask
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hm, j), one);
                return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
            };
            sumi = add_group16<0>(sumi, level(0), xq, sc);
            sumi = add_group16<1>(sumi, level(1), xq, sc);
            sumi = add_group16<2>(sumi, level(2), xq, sc);
            sumi = add_group16<3>(sumi, level(3), xq, sc);
        }
        const __m256i offset = _mm256_madd_epi16(load_256(x[i].bsums), _mm256_cvtepi8_epi16(s8));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offset, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc);
}

// Q2_K: level = 2 bits, scale = low nibble of scales[j], minimum = high nibble (times dmin, from bsums).
float dot_q2_k(int64_t n, const void *vw, const void *vx) {
    const BlockQ2K *w = static_cast<const BlockQ2K *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    const __m256i m2 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t i = 0; i < n / 256; i++) {
        const __m128i raw = load_128(w[i].scales);
        const __m128i s8 = _mm_and_si128(raw, m4), m8 = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
        const int msum = hsum_i32x8(_mm256_madd_epi16(load_256(x[i].bsums), _mm256_cvtepu8_epi16(m8)));
        mins += x[i].d * fp16_to_f32(w[i].dmin) * float(msum);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qs = load_256(w[i].qs + 32 * h);
            const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(h ? _mm_srli_si128(s8, 8) : s8));
            const int8_t *xq = x[i].qs + 128 * h;
            sumi = add_group16<0>(sumi, _mm256_and_si256(qs, m2), xq, sc);
            sumi = add_group16<1>(sumi, _mm256_and_si256(_mm256_srli_epi16(qs, 2), m2), xq, sc);
            sumi = add_group16<2>(sumi, _mm256_and_si256(_mm256_srli_epi16(qs, 4), m2), xq, sc);
            sumi = add_group16<3>(sumi, _mm256_and_si256(_mm256_srli_epi16(qs, 6), m2), xq, sc);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * fp16_to_f32(w[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_f32x8(acc) - mins;
}
