// Scale fitting shared by our own quantizers (K-quants, IQ4): weighted least squares over a small set of candidate
// roundings, then refinement by re-rounding. Deterministic fp32 code; no format knowledge beyond the level ranges.
#include <cmath>
#include <limits>

#include "core/fp16.h"
#include "format/quant_impl.h"

namespace strata::quant_detail {

namespace {

inline float weight(const float *w, int i) {
    return w ? w[i] : 1.0f;
}

// Weighted least squares for x ~ scale * L: returns sum(w x L)^2 / sum(w L^2), the error reduction the best scale for
// these levels achieves (larger is better), and the scale itself.
template <class Level>
float symmetric_score(int n, const float *x, const float *w, const Level *L, float *scale) {
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const float wi = weight(w, i), l = float(L[i]);
        sumlx += wi * x[i] * l;
        suml2 += wi * l * l;
    }
    if (suml2 <= 0.0f) {
        *scale = 0.0f;
        return 0.0f;
    }
    *scale = sumlx / suml2;
    return sumlx * *scale;
}

// Weighted least squares for x ~ scale * L + offset with offset <= 0. Returns the weighted squared error.
float asymmetric_fit(int n, const float *x, const float *w, const uint8_t *L, float *scale, float *offset) {
    float sw = 0.0f, sl = 0.0f, sl2 = 0.0f, sx = 0.0f, slx = 0.0f;
    for (int i = 0; i < n; i++) {
        const float wi = weight(w, i), l = float(L[i]);
        sw += wi;
        sl += wi * l;
        sl2 += wi * l * l;
        sx += wi * x[i];
        slx += wi * l * x[i];
    }
    float a = 0.0f, b = 0.0f;
    const float det = sw * sl2 - sl * sl;
    if (det > 0.0f) {
        a = (sw * slx - sl * sx) / det;
        b = (sl2 * sx - sl * slx) / det;
    }
    if (det <= 0.0f || b > 0.0f || a < 0.0f) {
        // The offset cannot be positive (the format subtracts a non-negative min): fit the scale alone.
        b = 0.0f;
        a = sl2 > 0.0f ? slx / sl2 : 0.0f;
        if (a < 0.0f) a = 0.0f;
        if (a == 0.0f) b = std::fmin(0.0f, sw > 0.0f ? sx / sw : 0.0f);
    }
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        const float diff = a * float(L[i]) + b - x[i];
        err += weight(w, i) * diff * diff;
    }
    *scale = a;
    *offset = b;
    return err;
}

}  // namespace

float f16_round(float v) {
    return f16_to_f32(f32_to_f16(v));
}

float signed_absmax(int n, const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = std::fabs(x[i]);
        if (a > amax) amax = a, max = x[i];
    }
    return max;
}

int nearest_level16(const int8_t *levels, float v) {
    // Count the midpoints below v: branch-free, and exact (midpoints of integers are exact in f32).
    int idx = 0;
    for (int k = 1; k < 16; k++) idx += v > 0.5f * float(levels[k - 1] + levels[k]) ? 1 : 0;
    return idx;
}

float fit_symmetric(int n, int nmax, const float *x, const float *w, int8_t *L) {
    const float max = signed_absmax(n, x);
    for (int i = 0; i < n; i++) L[i] = 0;
    if (max == 0.0f) return 0.0f;

    // Candidate inverse scales around -nmax / max (the largest magnitude on level -nmax, which has no positive twin).
    int8_t trial[256];
    float best_score = -1.0f, best_scale = 0.0f;
    for (int step = -9; step <= 9; step++) {
        const float iscale = -(float(nmax) + 0.1f * float(step)) / max;
        for (int i = 0; i < n; i++) trial[i] = int8_t(round_clamp(iscale * x[i], -nmax, nmax - 1));
        float scale;
        const float score = symmetric_score(n, x, w, trial, &scale);
        if (score > best_score) {
            best_score = score, best_scale = scale;
            for (int i = 0; i < n; i++) L[i] = trial[i];
        }
    }
    // Refine: re-round with the least-squares scale until that stops helping.
    for (int iter = 0; iter < 4 && best_scale != 0.0f; iter++) {
        const float iscale = 1.0f / best_scale;
        for (int i = 0; i < n; i++) trial[i] = int8_t(round_clamp(iscale * x[i], -nmax, nmax - 1));
        float scale;
        const float score = symmetric_score(n, x, w, trial, &scale);
        if (!(score > best_score)) break;
        best_score = score, best_scale = scale;
        for (int i = 0; i < n; i++) L[i] = trial[i];
    }
    return best_scale;
}

float fit_asymmetric(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = std::fmin(lo, x[i]), hi = std::fmax(hi, x[i]);
    if (lo > 0.0f) lo = 0.0f;
    for (int i = 0; i < n; i++) L[i] = 0;
    if (!(hi > lo)) {  // constant block at or below zero: the min alone represents it
        *min = -lo;
        return 0.0f;
    }

    uint8_t trial[256];
    float best_err = std::numeric_limits<float>::infinity(), best_a = 0.0f, best_b = lo;
    for (int step = -10; step <= 10; step++) {
        const float iscale = (float(nmax) + 0.1f * float(step)) / (hi - lo);
        for (int i = 0; i < n; i++) trial[i] = uint8_t(round_clamp(iscale * (x[i] - lo), 0, nmax));
        float a, b;
        const float err = asymmetric_fit(n, x, w, trial, &a, &b);
        if (err < best_err) {
            best_err = err, best_a = a, best_b = b;
            for (int i = 0; i < n; i++) L[i] = trial[i];
        }
    }
    for (int iter = 0; iter < 4 && best_a > 0.0f; iter++) {
        const float iscale = 1.0f / best_a;
        for (int i = 0; i < n; i++) trial[i] = uint8_t(round_clamp(iscale * (x[i] - best_b), 0, nmax));
        float a, b;
        const float err = asymmetric_fit(n, x, w, trial, &a, &b);
        if (!(err < best_err)) break;
        best_err = err, best_a = a, best_b = b;
        for (int i = 0; i < n; i++) L[i] = trial[i];
    }
    *min = -best_b;
    return best_a;
}

float fit_iq4(int n, const int8_t *levels, const float *x, const float *w, uint8_t *idx) {
    const float max = signed_absmax(n, x);
    const int zero_level = nearest_level16(levels, 0.0f);
    for (int i = 0; i < n; i++) idx[i] = uint8_t(zero_level);
    if (max == 0.0f) return 0.0f;

    // Candidates put the largest magnitude near either end level; the levels are asymmetric, so both signs count.
    uint8_t trial[256];
    float best_score = -1.0f, best_scale = 0.0f;
    for (int end = 0; end < 2; end++) {
        const float top = float(end == 0 ? levels[0] : levels[15]);
        for (int step = -10; step <= 10; step++) {
            const float iscale = (top + float(end == 0 ? step : -step)) / max;
            for (int i = 0; i < n; i++) trial[i] = uint8_t(nearest_level16(levels, iscale * x[i]));
            float sumlx = 0.0f, suml2 = 0.0f;
            for (int i = 0; i < n; i++) {
                const float wi = weight(w, i), l = float(levels[trial[i]]);
                sumlx += wi * x[i] * l;
                suml2 += wi * l * l;
            }
            if (suml2 <= 0.0f) continue;
            const float score = sumlx * sumlx / suml2;
            if (score > best_score) {
                best_score = score, best_scale = sumlx / suml2;
                for (int i = 0; i < n; i++) idx[i] = trial[i];
            }
        }
    }
    for (int iter = 0; iter < 4 && best_scale != 0.0f; iter++) {
        const float iscale = 1.0f / best_scale;
        for (int i = 0; i < n; i++) trial[i] = uint8_t(nearest_level16(levels, iscale * x[i]));
        float sumlx = 0.0f, suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const float wi = weight(w, i), l = float(levels[trial[i]]);
            sumlx += wi * x[i] * l;
            suml2 += wi * l * l;
        }
        if (suml2 <= 0.0f) break;
        const float score = sumlx * sumlx / suml2;
        if (!(score > best_score)) break;
        best_score = score, best_scale = sumlx / suml2;
        for (int i = 0; i < n; i++) idx[i] = trial[i];
    }
    return best_scale;
}

}  // namespace strata::quant_detail
