// Internal to src/format: the per-type block-run functions behind quant.h's dispatch, and the scale-fitting helpers
// the quantizers share. Not part of the engine's API; faster paths should test against quant.h, not call these.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace strata::quant_detail {

// nb blocks at src -> nb * block_size floats; nb * block_size floats -> nb blocks.
using DequantFn = void (*)(const uint8_t *src, float *dst, int64_t nb);
using QuantFn = void (*)(const float *src, uint8_t *dst, int64_t nb);

// Blocks are copied in and out with memcpy: a row may start at any address (17-byte MXFP4 blocks put every other
// block at an odd one), and this keeps the reference free of alignment and aliasing assumptions.
template <class B>
inline B load_block(const uint8_t *src, int64_t i) {
    B b;
    std::memcpy(&b, src + i * int64_t(sizeof(B)), sizeof(B));
    return b;
}

template <class B>
inline void store_block(uint8_t *dst, int64_t i, const B &b) {
    std::memcpy(dst + i * int64_t(sizeof(B)), &b, sizeof(B));
}

// Round to nearest, ties to even (the default rounding mode), clamped to [lo, hi]; safe for any float (NaN gives lo)
// because the clamp happens before the conversion. Our own quantizers round with this; the ones that must match gguf
// byte for byte use that package's rounding instead (see quant_legacy.cpp).
inline int round_clamp(float v, int lo, int hi) {
    if (!(v > float(lo))) return lo;
    if (v >= float(hi)) return hi;
    return int(std::nearbyint(v));
}

// The value an fp16 field will hold for v.
float f16_round(float v);

// ---- scale fitting (quant_fit.cpp) -------------------------------------------------------------------------------
// Weights w (one per element, > 0) say how much each element's error counts; nullptr means all equal.

// Symmetric: x[i] ~ scale * L[i], L in [-nmax, nmax-1]. Tries scales around the one that maps the largest-magnitude
// element to -nmax, solves the least-squares scale for each rounding, refines by re-rounding. Returns the scale
// (0 with all L = 0 for an all-zero x).
float fit_symmetric(int n, int nmax, const float *x, const float *w, int8_t *L);

// Asymmetric with a non-positive offset, as K-quants store it: x[i] ~ scale * L[i] - min, L in [0, nmax], scale >= 0,
// min >= 0. Returns the scale and sets *min.
float fit_asymmetric(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min);

// Non-linear 16 levels (IQ4): x[i] ~ scale * levels[idx[i]]. Returns the scale (may be negative).
float fit_iq4(int n, const int8_t *levels, const float *x, const float *w, uint8_t *idx);

// Index of the level nearest to v in 16 ascending levels (ties: the lower level).
int nearest_level16(const int8_t *levels, float v);

// Signed element of largest magnitude (the first one on ties); 0 for n == 0.
float signed_absmax(int n, const float *x);

// ---- block runs --------------------------------------------------------------------------------------------------
// quant_legacy.cpp
void dequant_f32(const uint8_t *src, float *dst, int64_t nb);
void dequant_f16(const uint8_t *src, float *dst, int64_t nb);
void dequant_bf16(const uint8_t *src, float *dst, int64_t nb);
void dequant_q4_0(const uint8_t *src, float *dst, int64_t nb);
void dequant_q4_1(const uint8_t *src, float *dst, int64_t nb);
void dequant_q5_0(const uint8_t *src, float *dst, int64_t nb);
void dequant_q5_1(const uint8_t *src, float *dst, int64_t nb);
void dequant_q8_0(const uint8_t *src, float *dst, int64_t nb);
void dequant_q8_1(const uint8_t *src, float *dst, int64_t nb);
void dequant_mxfp4(const uint8_t *src, float *dst, int64_t nb);
void quant_f32(const float *src, uint8_t *dst, int64_t nb);
void quant_f16(const float *src, uint8_t *dst, int64_t nb);
void quant_bf16(const float *src, uint8_t *dst, int64_t nb);
void quant_q4_0(const float *src, uint8_t *dst, int64_t nb);
void quant_q4_1(const float *src, uint8_t *dst, int64_t nb);
void quant_q5_0(const float *src, uint8_t *dst, int64_t nb);
void quant_q5_1(const float *src, uint8_t *dst, int64_t nb);
void quant_q8_0(const float *src, uint8_t *dst, int64_t nb);
void quant_q8_1(const float *src, uint8_t *dst, int64_t nb);
void quant_mxfp4(const float *src, uint8_t *dst, int64_t nb);

// quant_k.cpp
void dequant_q2_k(const uint8_t *src, float *dst, int64_t nb);
void dequant_q3_k(const uint8_t *src, float *dst, int64_t nb);
void dequant_q4_k(const uint8_t *src, float *dst, int64_t nb);
void dequant_q5_k(const uint8_t *src, float *dst, int64_t nb);
void dequant_q6_k(const uint8_t *src, float *dst, int64_t nb);
void dequant_q8_k(const uint8_t *src, float *dst, int64_t nb);
void quant_q2_k(const float *src, uint8_t *dst, int64_t nb);
void quant_q3_k(const float *src, uint8_t *dst, int64_t nb);
void quant_q4_k(const float *src, uint8_t *dst, int64_t nb);
void quant_q5_k(const float *src, uint8_t *dst, int64_t nb);
void quant_q6_k(const float *src, uint8_t *dst, int64_t nb);
void quant_q8_k(const float *src, uint8_t *dst, int64_t nb);

// quant_iq.cpp
void dequant_iq4_nl(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq4_xs(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq2_xxs(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq2_xs(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq2_s(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq3_xxs(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq3_s(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq1_s(const uint8_t *src, float *dst, int64_t nb);
void dequant_iq1_m(const uint8_t *src, float *dst, int64_t nb);
void quant_iq4_nl(const float *src, uint8_t *dst, int64_t nb);
void quant_iq4_xs(const float *src, uint8_t *dst, int64_t nb);

// quant_iq_grid.cpp
void quant_iq2_xxs(const float *src, uint8_t *dst, int64_t nb);
void quant_iq2_xs(const float *src, uint8_t *dst, int64_t nb);
void quant_iq2_s(const float *src, uint8_t *dst, int64_t nb);
void quant_iq3_xxs(const float *src, uint8_t *dst, int64_t nb);
void quant_iq3_s(const float *src, uint8_t *dst, int64_t nb);
void quant_iq1_s(const float *src, uint8_t *dst, int64_t nb);
void quant_iq1_m(const float *src, uint8_t *dst, int64_t nb);

// quant_ternary.cpp
void dequant_tq1_0(const uint8_t *src, float *dst, int64_t nb);
void dequant_tq2_0(const uint8_t *src, float *dst, int64_t nb);
void quant_tq1_0(const float *src, uint8_t *dst, int64_t nb);
void quant_tq2_0(const float *src, uint8_t *dst, int64_t nb);

}  // namespace strata::quant_detail
