// x86 building blocks shared by the SIMD kernels: the multi-row kernel plumbing, horizontal sums, int8 dot-product
// steps, nibble and bit unpacking.
// Included only by vec_dot_avx2.cpp and vec_dot_avx512.cpp, inside an anonymous namespace, so every file compiled
// for an instruction set keeps its own copies. STRATA_X86_AVX512 selects the AVX-512 VNNI forms of the int8 steps.
#pragma once

// ---- kernels over several activation rows -------------------------------------------------------------------------
// A kernel is a struct with `template <int NT> static void run(int64_t n, const void *w, const uint8_t *x,
// size_t x_stride, float *out)`: the dot products of one weight row with NT activation rows. The weight row is
// unpacked once for all of them; each row's arithmetic is the same sequence whatever NT is, so a batch of tokens
// gives bit for bit what one token at a time would.

#define STRATA_UNROLL _Pragma("GCC unroll 8")

template <class Kernel>
float dot_one(int64_t n, const void *w, const void *x) {
    float r;
    Kernel::template run<1>(n, w, static_cast<const uint8_t *>(x), 0, &r);
    return r;
}

template <class Kernel, int max_rows>
void dot_rows(int64_t n, const void *w, const void *x, size_t x_stride, float *out, int nx) {
    const uint8_t *xb = static_cast<const uint8_t *>(x);
    if constexpr (max_rows >= 4) {
        if (nx >= 4) return Kernel::template run<4>(n, w, xb, x_stride, out);
        if (nx == 3) return Kernel::template run<3>(n, w, xb, x_stride, out);
    }
    if (nx >= 2) return Kernel::template run<2>(n, w, xb, x_stride, out);
    Kernel::template run<1>(n, w, xb, x_stride, out);
}

// Block i of activation row t.
template <class B>
inline const B &xblock(const uint8_t *x, size_t x_stride, int t, int64_t i) {
    return reinterpret_cast<const B *>(x + size_t(t) * x_stride)[i];
}

// ---- horizontal reductions ----------------------------------------------------------------------------------------

inline float hsum_f32x8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

inline float hmax_f32x8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// ---- scalar field reads ---------------------------------------------------------------------------------------------

inline float fp16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline uint32_t load_u32(const void *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline __m256i load_256(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }
inline __m128i load_128(const void *p) { return _mm_loadu_si128(static_cast<const __m128i *>(p)); }

// ---- int8 products ------------------------------------------------------------------------------------------------
// AVX2 multiplies u8 by i8 into saturating 16-bit pair sums: with u <= 128 and |s| <= 127 (activation levels never
// reach -128) a pair stays within 32512, so nothing saturates and both forms give the same integers.

// Eight int32 lanes, each the sum of four products u[i] * s[i].
inline __m256i mul_sum_u8i8(__m256i u, __m256i s) {
#if STRATA_X86_AVX512
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Signed by signed: the magnitude of a moves to the unsigned side and its sign onto b.
inline __m256i mul_sum_i8i8(__m256i a, __m256i b) {
    return mul_sum_u8i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

// Sixteen int16 lanes, each u[2i] * s[2i] + u[2i+1] * s[2i+1] (the same no-saturation bound applies).
inline __m256i mul_pairs_u8i8(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

// acc + pairwise sums of a16 * scale16 (int16 x int16 -> int32).
inline __m256i madd_acc(__m256i acc, __m256i a16, __m256i scale16) {
#if STRATA_X86_AVX512
    return _mm256_dpwssd_epi32(acc, a16, scale16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a16, scale16));
#endif
}

// ---- unpacking ----------------------------------------------------------------------------------------------------

// 16 bytes of a 32-element block -> 32 levels 0..15: low nibbles (elements 0..15) then high nibbles (16..31).
inline __m256i unpack_nibbles32(const uint8_t *qs) {
    const __m128i b = load_128(qs), m4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

// Byte j = 0xff where bit j of bits is set, else 0.
inline __m256i bits_to_bytes(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(int(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// Byte j = -1 where bit j of bits is set, else +1: a sign vector for _mm256_sign_epi8.
inline __m256i bits_to_signs(uint32_t bits) { return _mm256_or_si256(bits_to_bytes(bits), _mm256_set1_epi8(1)); }

// Eight int16 scales s[0..7] -> for k = 0..3, a vector whose low 128 bits hold s[2k] eight times and whose high
// 128 bits hold s[2k+1]: the scales of two consecutive 16-element sub-blocks, matching maddubs' output lanes.
template <int k>
inline __m256i scale_pair(__m256i s8_both_lanes) {
    const __m256i idx = _mm256_set_m128i(_mm_set1_epi16(short(((4 * k + 3) << 8) | (4 * k + 2))),
                                         _mm_set1_epi16(short(((4 * k + 1) << 8) | (4 * k))));
    return _mm256_shuffle_epi8(s8_both_lanes, idx);
}

// Two int16 scales as a vector: lo in the low 128 bits, hi in the high 128 bits.
inline __m256i scale_halves(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(short(hi)), _mm_set1_epi16(short(lo)));
}
