// x86 kernels of the float weight types, the 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4),
// and the activation quantizers (Q8_0, Q8_1, Q8_K; byte-exact with quantize_row). Included only by
// vec_dot_avx2.cpp / vec_dot_avx512.cpp inside an anonymous namespace, after simd_common.h. K- and i-quants live in
// dot_kquants.h and dot_iquants.h.
#pragma once

// ---- float weights ------------------------------------------------------------------------------------------------
// Four accumulator chains per activation row over steps of four vectors; a shorter remainder goes to chain 0, the
// last partial vector to chain 1 (AVX-512, masked) or to a scalar tail (AVX2).

#if STRATA_X86_AVX512
constexpr int k_float_rows = 4;
template <class Load>
struct FloatKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Load load{vw};
        const float *xr[NT];
        __m512 acc[NT][4];
        STRATA_UNROLL for (int t = 0; t < NT; t++) {
            xr[t] = reinterpret_cast<const float *>(x + size_t(t) * xs);
            for (int c = 0; c < 4; c++) acc[t][c] = _mm512_setzero_ps();
        }
        int64_t i = 0;
        for (; i + 64 <= n; i += 64) {
            const __m512 w0 = load(i), w1 = load(i + 16), w2 = load(i + 32), w3 = load(i + 48);
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr[t] + i), acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr[t] + i + 16), acc[t][1]);
                acc[t][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xr[t] + i + 32), acc[t][2]);
                acc[t][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xr[t] + i + 48), acc[t][3]);
            }
        }
        for (; i + 16 <= n; i += 16) {
            const __m512 w0 = load(i);
            STRATA_UNROLL for (int t = 0; t < NT; t++)
                acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr[t] + i), acc[t][0]);
        }
        if (i < n) {  // the last n - i < 16 elements through masked loads: nothing past the row is read
            const __mmask16 m = __mmask16((1u << (n - i)) - 1);
            const __m512 w0 = load.masked(i, m);
            STRATA_UNROLL for (int t = 0; t < NT; t++)
                acc[t][1] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, xr[t] + i), acc[t][1]);
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = _mm512_reduce_add_ps(
            _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3])));
    }
};
#else
constexpr int k_float_rows = 2;  // 16 registers: two rows of four chains plus four weight vectors
template <class Load>
struct FloatKernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Load load{vw};
        const float *xr[NT];
        __m256 acc[NT][4];
        STRATA_UNROLL for (int t = 0; t < NT; t++) {
            xr[t] = reinterpret_cast<const float *>(x + size_t(t) * xs);
            for (int c = 0; c < 4; c++) acc[t][c] = _mm256_setzero_ps();
        }
        int64_t i = 0;
        for (; i + 32 <= n; i += 32) {
            const __m256 w0 = load(i), w1 = load(i + 8), w2 = load(i + 16), w3 = load(i + 24);
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr[t] + i), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr[t] + i + 8), acc[t][1]);
                acc[t][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr[t] + i + 16), acc[t][2]);
                acc[t][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr[t] + i + 24), acc[t][3]);
            }
        }
        for (; i + 8 <= n; i += 8) {
            const __m256 w0 = load(i);
            STRATA_UNROLL for (int t = 0; t < NT; t++)
                acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr[t] + i), acc[t][0]);
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) {
            float tail = 0.0f;
            for (int64_t j = i; j < n; j++) tail += load.scalar(j) * xr[t][j];
            out[t] = hsum_f32x8(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]),
                                              _mm256_add_ps(acc[t][2], acc[t][3]))) + tail;
        }
    }
};
#endif

// Loaders of 8 (AVX2) or 16 (AVX-512) weights as floats; scalar() serves the AVX2 tail, masked() the AVX-512 one.
struct LoadF32 {
    const float *w;
    explicit LoadF32(const void *p) : w(static_cast<const float *>(p)) {}
#if STRATA_X86_AVX512
    __m512 operator()(int64_t i) const { return _mm512_loadu_ps(w + i); }
    __m512 masked(int64_t i, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, w + i); }
#else
    __m256 operator()(int64_t i) const { return _mm256_loadu_ps(w + i); }
    float scalar(int64_t i) const { return w[i]; }
#endif
};

struct LoadF16 {
    const uint16_t *w;
    explicit LoadF16(const void *p) : w(static_cast<const uint16_t *>(p)) {}
#if STRATA_X86_AVX512
    __m512 operator()(int64_t i) const { return _mm512_cvtph_ps(load_256(w + i)); }
    __m512 masked(int64_t i, __mmask16 m) const { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i)); }
#else
    __m256 operator()(int64_t i) const { return _mm256_cvtph_ps(load_128(w + i)); }
    float scalar(int64_t i) const { return _cvtsh_ss(w[i]); }
#endif
};

struct LoadBF16 {
    const uint16_t *w;
    explicit LoadBF16(const void *p) : w(static_cast<const uint16_t *>(p)) {}
#if STRATA_X86_AVX512
    static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
    __m512 operator()(int64_t i) const { return widen(load_256(w + i)); }
    __m512 masked(int64_t i, __mmask16 m) const { return widen(_mm256_maskz_loadu_epi16(m, w + i)); }
#else
    __m256 operator()(int64_t i) const {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_128(w + i)), 16));
    }
    float scalar(int64_t i) const {
        const uint32_t u = uint32_t(w[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
#endif
};

using KernelF32 = FloatKernel<LoadF32>;
using KernelF16 = FloatKernel<LoadF16>;
using KernelBF16 = FloatKernel<LoadBF16>;

// ---- 32-element blocks with Q8_0 activations ----------------------------------------------------------------------
// Per block: eight int32 partial sums of level * qx, scaled by d_w * d_x into eight float lanes; even and odd blocks
// go to two accumulators so consecutive blocks' multiply-adds overlap. Levels(block) gives the weight levels as
// signed bytes, Scale(block) the weight scale.

template <class Block, class Levels, class Scale>
struct Q8_0Kernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Block *w = static_cast<const Block *>(vw);
        const int64_t nb = n / 32;
        __m256 acc0[NT], acc1[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc0[t] = acc1[t] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            add_block(w[i], x, xs, i, acc0);
            add_block(w[i + 1], x, xs, i + 1, acc1);
        }
        if (i < nb) add_block(w[i], x, xs, i, acc0);
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(_mm256_add_ps(acc0[t], acc1[t]));
    }

    template <int NT>
    static void add_block(const Block &b, const uint8_t *x, size_t xs, int64_t i, __m256 (&acc)[NT]) {
        const __m256i q = Levels()(b), q_abs = _mm256_sign_epi8(q, q);
        const float dw = Scale()(b);
        STRATA_UNROLL for (int t = 0; t < NT; t++) {
            const BlockQ8_0 &xb = xblock<BlockQ8_0>(x, xs, t, i);
            const __m256i p = mul_sum_u8i8(q_abs, _mm256_sign_epi8(load_256(xb.qs), q));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * fp16_to_f32(xb.d)), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
};

inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

struct ScaleD {
    template <class B>
    float operator()(const B &b) const { return fp16_to_f32(b.d); }
};
struct ScaleE8M0 {
    float operator()(const BlockMXFP4 &b) const { return e8m0_half(b.e); }
};

struct LevelsQ8_0 {
    __m256i operator()(const BlockQ8_0 &b) const { return load_256(b.qs); }
};
struct LevelsQ4_0 {
    __m256i operator()(const BlockQ4_0 &b) const {
        return _mm256_sub_epi8(unpack_nibbles32(b.qs), _mm256_set1_epi8(8));
    }
};
// Q5_0: (nibble | bit5 << 4) - 16, i.e. nibble - 16 where the fifth bit is clear.
struct LevelsQ5_0 {
    __m256i operator()(const BlockQ5_0 &b) const {
        const __m256i clear16 = _mm256_andnot_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(16));
        return _mm256_sub_epi8(unpack_nibbles32(b.qs), clear16);
    }
};
template <const int8_t *table16>
struct LevelsTable {
    template <class B>
    __m256i operator()(const B &b) const {
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(load_128(table16)), unpack_nibbles32(b.qs));
    }
};

using KernelQ8_0 = Q8_0Kernel<BlockQ8_0, LevelsQ8_0, ScaleD>;
using KernelQ4_0 = Q8_0Kernel<BlockQ4_0, LevelsQ4_0, ScaleD>;
using KernelQ5_0 = Q8_0Kernel<BlockQ5_0, LevelsQ5_0, ScaleD>;
using KernelIQ4_NL = Q8_0Kernel<BlockIQ4NL, LevelsTable<kvalues_iq4nl>, ScaleD>;
using KernelMXFP4 = Q8_0Kernel<BlockMXFP4, LevelsTable<kvalues_mxfp4>, ScaleE8M0>;

// ---- 32-element blocks with a minimum, Q8_1 activations -----------------------------------------------------------
// Levels are unsigned (0..15 or 0..31), so they go straight to the unsigned side; m * s_x is summed separately.

template <class Block, class Levels>
struct Q8_1Kernel {
    template <int NT>
    static void run(int64_t n, const void *vw, const uint8_t *x, size_t xs, float *out) {
        const Block *w = static_cast<const Block *>(vw);
        __m256 acc[NT];
        float mins[NT];
        STRATA_UNROLL for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps(), mins[t] = 0.0f;
        for (int64_t i = 0; i < n / 32; i++) {
            const __m256i q = Levels()(w[i]);
            const float dw = fp16_to_f32(w[i].d), mw = fp16_to_f32(w[i].m);
            STRATA_UNROLL for (int t = 0; t < NT; t++) {
                const BlockQ8_1 &xb = xblock<BlockQ8_1>(x, xs, t, i);
                const __m256i p = mul_sum_u8i8(q, load_256(xb.qs));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * fp16_to_f32(xb.d)), _mm256_cvtepi32_ps(p), acc[t]);
                mins[t] += mw * fp16_to_f32(xb.s);
            }
        }
        STRATA_UNROLL for (int t = 0; t < NT; t++) out[t] = hsum_f32x8(acc[t]) + mins[t];
    }
};

struct LevelsQ4_1 {
    __m256i operator()(const BlockQ4_1 &b) const { return unpack_nibbles32(b.qs); }
};
struct LevelsQ5_1 {
    __m256i operator()(const BlockQ5_1 &b) const {
        const __m256i bit16 = _mm256_and_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(16));
        return _mm256_or_si256(unpack_nibbles32(b.qs), bit16);
    }
};

using KernelQ4_1 = Q8_1Kernel<BlockQ4_1, LevelsQ4_1>;
using KernelQ5_1 = Q8_1Kernel<BlockQ5_1, LevelsQ5_1>;

// ---- activation quantizers ----------------------------------------------------------------------------------------
// They repeat quant_legacy.cpp / quant_k.cpp's arithmetic operation for operation (same products, same roundings,
// same treatment of NaN and infinity), so the bytes are identical.

// max(|v|, acc) that ignores NaN in v as std::fmax does: maxps returns its second operand when either is NaN.
inline __m256 absmax_step(__m256 v, __m256 acc) {
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), acc);
}

// gguf's round-half-away-from-zero, clamped to [-128, 127], NaN -> 0. v - trunc(v) is exact, so the comparison
// with 0.5 decides ties exactly.
inline __m256i round_away_clamp(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, t));
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
    r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(r);
}

// Round to nearest even, clamped to [-128, 127], NaN -> -128 (quant_impl.h's round_clamp): maxps returns its second
// operand, -128, for a NaN.
inline __m256i round_even_clamp(__m256 v) {
    const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f)));
}

// Four vectors of eight int32 in [-128, 127] -> 32 int8 in element order.
inline __m256i pack_i32x32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    const __m256i abcd = _mm256_packs_epi16(ab, cd);  // dword order 0 4 1 5 2 6 3 7 after the two in-lane packs
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <bool with_sum>
void quantize_32(const float *x, void *vy, int64_t n) {
    using Block = std::conditional_t<with_sum, BlockQ8_1, BlockQ8_0>;
    Block *y = static_cast<Block *>(vy);
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
                     v3 = _mm256_loadu_ps(x + 24);
        __m256 m = absmax_step(v0, _mm256_setzero_ps());
        m = absmax_step(v1, m);
        m = absmax_step(v2, m);
        m = absmax_step(v3, m);
        const float d = hmax_f32x8(m) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        const __m256i q0 = round_away_clamp(_mm256_mul_ps(v0, id)), q1 = round_away_clamp(_mm256_mul_ps(v1, id)),
                      q2 = round_away_clamp(_mm256_mul_ps(v2, id)), q3 = round_away_clamp(_mm256_mul_ps(v3, id));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32x32_to_i8(q0, q1, q2, q3));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        if constexpr (with_sum) {
            const int sum = hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
            y[i].s = _cvtss_sh(d * float(sum), _MM_FROUND_TO_NEAREST_INT);
        }
    }
}

void quantize_q8_0(const float *x, void *y, int64_t n) { quantize_32<false>(x, y, n); }
void quantize_q8_1(const float *x, void *y, int64_t n) { quantize_32<true>(x, y, n); }

// Q8_K: the signed value of largest magnitude (its first occurrence) goes to -127; levels round to nearest even;
// bsums are the sums of 16 levels.
void quantize_q8_k(const float *x, void *vy, int64_t n) {
    BlockQ8K *y = static_cast<BlockQ8K *>(vy);
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 256; k += 8) m = absmax_step(_mm256_loadu_ps(x + k), m);
        const float amax = hmax_f32x8(m);
        BlockQ8K &b = y[i];
        if (amax == 0.0f) {  // also all-NaN: nothing is larger than 0
            std::memset(&b, 0, sizeof(b));
            continue;
        }
        float max = 0.0f;
        const __m256 vmax = _mm256_set1_ps(amax);
        for (int k = 0; k < 256; k += 8) {
            const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + k));
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, vmax, _CMP_EQ_OQ));
            if (hit) {
                max = x[k + __builtin_ctz(unsigned(hit))];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        __m256i sums16[16];
        for (int k = 0; k < 256; k += 32) {
            const __m256i q0 = round_even_clamp(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k)));
            const __m256i q1 = round_even_clamp(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 8)));
            const __m256i q2 = round_even_clamp(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 16)));
            const __m256i q3 = round_even_clamp(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 24)));
            _mm256_storeu_si256((__m256i *)(b.qs + k), pack_i32x32_to_i8(q0, q1, q2, q3));
            sums16[k / 16] = _mm256_add_epi32(q0, q1);
            sums16[k / 16 + 1] = _mm256_add_epi32(q2, q3);
        }
        // Four groups at a time: two rounds of pairwise adds leave each group's lane sums in one 128-bit half.
        for (int g = 0; g < 16; g += 4) {
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(sums16[g], sums16[g + 1]),
                                                _mm256_hadd_epi32(sums16[g + 2], sums16[g + 3]));
            const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            _mm_storel_epi64((__m128i *)(b.bsums + g), _mm_packs_epi32(s, s));
        }
        b.d = 1.0f / iscale;
    }
}
