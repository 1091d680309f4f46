// x86 kernels of the float weight types, the 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4),
// and the activation quantizers (Q8_0, Q8_1, Q8_K; byte-exact with quantize_row). Included only by
// vec_dot_avx2.cpp / vec_dot_avx512.cpp inside an anonymous namespace, after simd_common.h. K- and i-quants live in
// dot_kquants.h and dot_iquants.h.
#pragma once

// ---- float weights ------------------------------------------------------------------------------------------------

#if STRATA_X86_AVX512
template <class Load16>
float dot_float(int64_t n, const float *x, Load16 load16) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(load16(i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load16(i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(load16(i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(load16(i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(load16(i), _mm512_loadu_ps(x + i), a0);
    if (i < n) {  // the last n - i < 16 elements through masked loads: nothing past the row is read
        const __mmask16 m = __mmask16((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(load16.masked(i, m), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#else
template <class Load8>
float dot_float(int64_t n, const float *x, Load8 load8) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load8(i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load8(i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load8(i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(x + i), a0);
    float tail = 0.0f;
    for (; i < n; i++) tail += load8.scalar(i) * x[i];
    return hsum_f32x8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail;
}
#endif

// Loaders of 8 (AVX2) or 16 (AVX-512) weights as floats; scalar() serves the AVX2 tail, masked() the AVX-512 one.
struct LoadF32 {
    const float *w;
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

float dot_f32(int64_t n, const void *w, const void *x) {
    return dot_float(n, static_cast<const float *>(x), LoadF32{static_cast<const float *>(w)});
}
float dot_f16(int64_t n, const void *w, const void *x) {
    return dot_float(n, static_cast<const float *>(x), LoadF16{static_cast<const uint16_t *>(w)});
}
float dot_bf16(int64_t n, const void *w, const void *x) {
    return dot_float(n, static_cast<const float *>(x), LoadBF16{static_cast<const uint16_t *>(w)});
}

// ---- 32-element blocks with Q8_0 activations ----------------------------------------------------------------------
// Per block: eight int32 partial sums of level * qx, scaled by d_w * d_x into eight float lanes. Two accumulators so
// consecutive blocks' multiply-adds overlap.

template <class Block, class Levels, class Scale>
float dot_blocks_q8_0(int64_t n, const void *vw, const void *vx, Levels levels, Scale scale) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(vx);
    const int64_t nb = n / 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i p0 = levels(w[i], load_256(x[i].qs));
        const __m256i p1 = levels(w[i + 1], load_256(x[i + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w[i]) * fp16_to_f32(x[i].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w[i + 1]) * fp16_to_f32(x[i + 1].d)), _mm256_cvtepi32_ps(p1),
                               acc1);
    }
    if (i < nb) {
        const __m256i p0 = levels(w[i], load_256(x[i].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale(w[i]) * fp16_to_f32(x[i].d)), _mm256_cvtepi32_ps(p0), acc0);
    }
    return hsum_f32x8(_mm256_add_ps(acc0, acc1));
}

inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

float dot_q8_0(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_0<BlockQ8_0>(
        n, w, x, [](const BlockQ8_0 &b, __m256i xq) { return mul_sum_i8i8(load_256(b.qs), xq); },
        [](const BlockQ8_0 &b) { return fp16_to_f32(b.d); });
}

float dot_q4_0(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_0<BlockQ4_0>(
        n, w, x,
        [](const BlockQ4_0 &b, __m256i xq) {
            return mul_sum_i8i8(_mm256_sub_epi8(unpack_nibbles32(b.qs), _mm256_set1_epi8(8)), xq);
        },
        [](const BlockQ4_0 &b) { return fp16_to_f32(b.d); });
}

// Q5_0: (nibble | bit5 << 4) - 16, i.e. nibble - 16 where the fifth bit is clear.
float dot_q5_0(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_0<BlockQ5_0>(
        n, w, x,
        [](const BlockQ5_0 &b, __m256i xq) {
            const __m256i clear16 = _mm256_andnot_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(16));
            return mul_sum_i8i8(_mm256_sub_epi8(unpack_nibbles32(b.qs), clear16), xq);
        },
        [](const BlockQ5_0 &b) { return fp16_to_f32(b.d); });
}

float dot_iq4_nl(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_0<BlockIQ4NL>(
        n, w, x,
        [](const BlockIQ4NL &b, __m256i xq) {
            const __m256i table = _mm256_broadcastsi128_si256(load_128(kvalues_iq4nl));
            return mul_sum_i8i8(_mm256_shuffle_epi8(table, unpack_nibbles32(b.qs)), xq);
        },
        [](const BlockIQ4NL &b) { return fp16_to_f32(b.d); });
}

float dot_mxfp4(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_0<BlockMXFP4>(
        n, w, x,
        [](const BlockMXFP4 &b, __m256i xq) {
            const __m256i table = _mm256_broadcastsi128_si256(load_128(kvalues_mxfp4));
            return mul_sum_i8i8(_mm256_shuffle_epi8(table, unpack_nibbles32(b.qs)), xq);
        },
        [](const BlockMXFP4 &b) { return e8m0_half(b.e); });
}

// ---- 32-element blocks with a minimum, Q8_1 activations -----------------------------------------------------------
// Levels are unsigned (0..15 or 0..31), so they go straight to the unsigned side; m * s_x is summed separately.

template <class Block, class Levels>
float dot_blocks_q8_1(int64_t n, const void *vw, const void *vx, Levels levels) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8_1 *x = static_cast<const BlockQ8_1 *>(vx);
    const int64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const __m256i p = mul_sum_u8i8(levels(w[i]), load_256(x[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_f32(w[i].d) * fp16_to_f32(x[i].d)), _mm256_cvtepi32_ps(p), acc);
        mins += fp16_to_f32(w[i].m) * fp16_to_f32(x[i].s);
    }
    return hsum_f32x8(acc) + mins;
}

float dot_q4_1(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_1<BlockQ4_1>(n, w, x, [](const BlockQ4_1 &b) { return unpack_nibbles32(b.qs); });
}

float dot_q5_1(int64_t n, const void *w, const void *x) {
    return dot_blocks_q8_1<BlockQ5_1>(n, w, x, [](const BlockQ5_1 &b) {
        const __m256i bit16 = _mm256_and_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(16));
        return _mm256_or_si256(unpack_nibbles32(b.qs), bit16);
    });
}

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
