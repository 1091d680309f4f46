// Scalar dot products of the float, 32-element and K-quant weight types with their activation formats: the
// readable reference every SIMD kernel is tested against, written from the block layouts (REFERENCE.md §2).
// Integer levels are multiplied and summed exactly per sub-block; each block then adds its scaled sums to one fp32
// total in block order. Not fast on purpose; i-quants and ternary types are in vec_dot_scalar_iq.cpp.
#include <cstring>

#include "backend/cpu/vec_dot_impl.h"
#include "core/fp16.h"
#include "format/quant.h"
#include "format/quant_blocks.h"

namespace strata::vec_dot_detail {

namespace {

inline float f16(uint16_t h) { return f16_to_f32(h); }

inline uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Element j (0..31) of a 32-element block's nibbles: low nibbles hold elements 0..15, high nibbles 16..31.
inline int nibble(const uint8_t *qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }

// Fifth bit of element j of Q5_0 / Q5_1.
inline int bit5(const uint8_t *qh, int j) { return int((load_u32(qh) >> j) & 1); }

// MXFP4's scale 2^(e-128) (the levels are doubled E2M1 values).
inline float e8m0_half(uint8_t e) {
    return e < 2 ? bits_to_f32(0x00200000u << e) : bits_to_f32(uint32_t(e - 1) << 23);
}

// ---- float weights, f32 activations -------------------------------------------------------------------------------
// Eight partial sums combined pairwise, as the reference matmul does.

template <class Load>
float dot_float(int64_t n, Load load, const float *x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) acc[i & 7] += load(i) * x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float dot_f32(int64_t n, const void *w, const void *x) {
    const float *wf = static_cast<const float *>(w);
    return dot_float(n, [&](int64_t i) { return wf[i]; }, static_cast<const float *>(x));
}

float dot_f16(int64_t n, const void *w, const void *x) {
    const uint16_t *wh = static_cast<const uint16_t *>(w);
    return dot_float(n, [&](int64_t i) { return f16_to_f32(wh[i]); }, static_cast<const float *>(x));
}

float dot_bf16(int64_t n, const void *w, const void *x) {
    const uint16_t *wh = static_cast<const uint16_t *>(w);
    return dot_float(n, [&](int64_t i) { return bf16_to_f32(wh[i]); }, static_cast<const float *>(x));
}

// ---- 32-element blocks with Q8_0 activations ----------------------------------------------------------------------
// sum_j level(j) * qx[j] per block, scaled by d_w * d_x.

template <class Block, class Level, class Scale>
float dot_q8_0_blocks(int64_t n, const void *vw, const void *vx, Level level, Scale scale) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += level(w[i], j) * x[i].qs[j];
        sum += scale(w[i]) * f16(x[i].d) * float(isum);
    }
    return sum;
}

float dot_q8_0(int64_t n, const void *w, const void *x) {
    return dot_q8_0_blocks<BlockQ8_0>(
        n, w, x, [](const BlockQ8_0 &b, int j) { return int(b.qs[j]); },
        [](const BlockQ8_0 &b) { return f16(b.d); });
}

float dot_q4_0(int64_t n, const void *w, const void *x) {
    return dot_q8_0_blocks<BlockQ4_0>(
        n, w, x, [](const BlockQ4_0 &b, int j) { return nibble(b.qs, j) - 8; },
        [](const BlockQ4_0 &b) { return f16(b.d); });
}

float dot_q5_0(int64_t n, const void *w, const void *x) {
    return dot_q8_0_blocks<BlockQ5_0>(
        n, w, x, [](const BlockQ5_0 &b, int j) { return (nibble(b.qs, j) | (bit5(b.qh, j) << 4)) - 16; },
        [](const BlockQ5_0 &b) { return f16(b.d); });
}

float dot_iq4_nl(int64_t n, const void *w, const void *x) {
    return dot_q8_0_blocks<BlockIQ4NL>(
        n, w, x, [](const BlockIQ4NL &b, int j) { return int(kvalues_iq4nl[nibble(b.qs, j)]); },
        [](const BlockIQ4NL &b) { return f16(b.d); });
}

float dot_mxfp4(int64_t n, const void *w, const void *x) {
    return dot_q8_0_blocks<BlockMXFP4>(
        n, w, x, [](const BlockMXFP4 &b, int j) { return int(kvalues_mxfp4[nibble(b.qs, j)]); },
        [](const BlockMXFP4 &b) { return e8m0_half(b.e); });
}

// ---- 32-element blocks with a minimum, Q8_1 activations -----------------------------------------------------------
// y = d*q + m, so a block gives d_w*d_x*sum(q*qx) + m*s_x, with s_x = d_x*sum(qx) stored by the activation.

template <class Block, class Level>
float dot_q8_1_blocks(int64_t n, const void *vw, const void *vx, Level level) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8_1 *x = static_cast<const BlockQ8_1 *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += level(w[i], j) * x[i].qs[j];
        sum += f16(w[i].d) * f16(x[i].d) * float(isum) + f16(w[i].m) * f16(x[i].s);
    }
    return sum;
}

float dot_q4_1(int64_t n, const void *w, const void *x) {
    return dot_q8_1_blocks<BlockQ4_1>(n, w, x, [](const BlockQ4_1 &b, int j) { return nibble(b.qs, j); });
}

float dot_q5_1(int64_t n, const void *w, const void *x) {
    return dot_q8_1_blocks<BlockQ5_1>(
        n, w, x, [](const BlockQ5_1 &b, int j) { return nibble(b.qs, j) | (bit5(b.qh, j) << 4); });
}

// ---- K-quants with Q8_K activations -------------------------------------------------------------------------------
// Element e of a 256-element super-block pairs with x.qs[e]; bsums[j] is the sum of x.qs[16j .. 16j+15].

// Q2_K: 16 sub-blocks of 16, y = d*sc*q - dmin*m with sc, m the nibbles of scales[e/16]; the minimum part is
// dmin * sum_j m_j * bsums[j].
float dot_q2_k(int64_t n, const void *vw, const void *vx) {
    const BlockQ2K *w = static_cast<const BlockQ2K *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0, msum = 0;
        for (int sub = 0; sub < 16; sub++) {
            int s = 0;
            for (int e = 16 * sub; e < 16 * sub + 16; e++) {
                const int h = e / 128, j = (e % 128) / 32, l = e % 32;
                s += ((w[i].qs[32 * h + l] >> (2 * j)) & 3) * x[i].qs[e];
            }
            isum += (w[i].scales[sub] & 15) * s;
            msum += (w[i].scales[sub] >> 4) * x[i].bsums[sub];
        }
        sum += x[i].d * (f16(w[i].d) * float(isum) - f16(w[i].dmin) * float(msum));
    }
    return sum;
}

// Q3_K's 16 six-bit scales, stored +32.
int q3k_scale(const uint8_t *scales, int i) {
    const int lo = i < 8 ? (scales[i] & 15) : (scales[i - 8] >> 4);
    const int hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

float dot_q3_k(int64_t n, const void *vw, const void *vx) {
    const BlockQ3K *w = static_cast<const BlockQ3K *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int sub = 0; sub < 16; sub++) {
            int s = 0;
            for (int e = 16 * sub; e < 16 * sub + 16; e++) {
                const int h = e / 128, j = (e % 128) / 32, l = e % 32;
                int q = (w[i].qs[32 * h + l] >> (2 * j)) & 3;
                if (!((w[i].hmask[l] >> (4 * h + j)) & 1)) q -= 4;
                s += q * x[i].qs[e];
            }
            isum += q3k_scale(w[i].scales, sub) * s;
        }
        sum += x[i].d * f16(w[i].d) * float(isum);
    }
    return sum;
}

// Q4_K / Q5_K: scale and minimum of sub-block b (of 32), six bits each, packed in 12 bytes.
void qk_scale_min(const uint8_t *scales, int b, int *sc, int *m) {
    if (b < 4) {
        *sc = scales[b] & 63;
        *m = scales[b + 4] & 63;
    } else {
        *sc = (scales[b + 4] & 15) | ((scales[b - 4] >> 6) << 4);
        *m = (scales[b + 4] >> 4) | ((scales[b] >> 6) << 4);
    }
}

// Shared by Q4_K and Q5_K: level(block, e) gives the unsigned level of element e.
template <class Block, class Level>
float dot_q45_k(int64_t n, const void *vw, const void *vx, Level level) {
    const Block *w = static_cast<const Block *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0, msum = 0;
        for (int b = 0; b < 8; b++) {
            int sc, m;
            qk_scale_min(w[i].scales, b, &sc, &m);
            int s = 0;
            for (int e = 32 * b; e < 32 * b + 32; e++) s += level(w[i], e) * x[i].qs[e];
            isum += sc * s;
            msum += m * (x[i].bsums[2 * b] + x[i].bsums[2 * b + 1]);
        }
        sum += x[i].d * (f16(w[i].d) * float(isum) - f16(w[i].dmin) * float(msum));
    }
    return sum;
}

float dot_q4_k(int64_t n, const void *w, const void *x) {
    return dot_q45_k<BlockQ4K>(n, w, x, [](const BlockQ4K &b, int e) {
        const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
        return (e % 64) < 32 ? (byte & 15) : (byte >> 4);
    });
}

float dot_q5_k(int64_t n, const void *w, const void *x) {
    return dot_q45_k<BlockQ5K>(n, w, x, [](const BlockQ5K &b, int e) {
        const int p = e / 64, l = e % 32;
        const bool high = (e % 64) >= 32;
        const int q = high ? (b.qs[32 * p + l] >> 4) : (b.qs[32 * p + l] & 15);
        return q | (((b.qh[l] >> (2 * p + (high ? 1 : 0))) & 1) << 4);
    });
}

float dot_q6_k(int64_t n, const void *vw, const void *vx) {
    const BlockQ6K *w = static_cast<const BlockQ6K *>(vw);
    const BlockQ8K *x = static_cast<const BlockQ8K *>(vx);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K_BLOCK; i++) {
        int isum = 0;
        for (int sub = 0; sub < 16; sub++) {
            int s = 0;
            for (int e = 16 * sub; e < 16 * sub + 16; e++) {
                const int h = e / 128, r = e % 128, t = r / 32, l = r % 32;
                const uint8_t byte = w[i].ql[64 * h + 32 * (t & 1) + l];
                const int low = t < 2 ? (byte & 15) : (byte >> 4);
                const int high = (w[i].qh[32 * h + l] >> (2 * t)) & 3;
                s += ((low | (high << 4)) - 32) * x[i].qs[e];
            }
            isum += w[i].scales[sub] * s;
        }
        sum += x[i].d * f16(w[i].d) * float(isum);
    }
    return sum;
}

// The reference activation quantizers are quantize_row's.
void quantize_q8_0(const float *x, void *xq, int64_t n) { quantize_row(DType::Q8_0, x, xq, n); }
void quantize_q8_1(const float *x, void *xq, int64_t n) { quantize_row(DType::Q8_1, x, xq, n); }
void quantize_q8_k(const float *x, void *xq, int64_t n) { quantize_row(DType::Q8_K, x, xq, n); }

DotEntry k_dots[64];

int build_dots() {
    const DotEntry own[] = {
        {DType::F32, dot_f32},     {DType::F16, dot_f16},   {DType::BF16, dot_bf16},   {DType::Q8_0, dot_q8_0},
        {DType::Q4_0, dot_q4_0},   {DType::Q5_0, dot_q5_0}, {DType::IQ4_NL, dot_iq4_nl}, {DType::MXFP4, dot_mxfp4},
        {DType::Q4_1, dot_q4_1},   {DType::Q5_1, dot_q5_1}, {DType::Q2_K, dot_q2_k},   {DType::Q3_K, dot_q3_k},
        {DType::Q4_K, dot_q4_k},   {DType::Q5_K, dot_q5_k}, {DType::Q6_K, dot_q6_k},
    };
    int n = 0;
    for (const DotEntry &e : own) k_dots[n++] = e;
    int n_iq = 0;
    const DotEntry *iq = scalar_iq_dots(&n_iq);
    for (int i = 0; i < n_iq; i++) k_dots[n++] = iq[i];
    return n;
}

}  // namespace

const KernelTable &scalar_kernels() {
    static const KernelTable table = {k_dots, build_dots(), quantize_q8_0, quantize_q8_1, quantize_q8_k};
    return table;
}

}  // namespace strata::vec_dot_detail
