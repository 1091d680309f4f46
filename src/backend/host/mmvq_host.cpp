// The GPU's decode mat-vec on the host, step for step (mmvq_host.h). Compiled without FMA contraction
// (CMakeLists.txt): every fused multiply-add here is an explicit std::fma, as every one in k_mmvq is a __fmaf_rn.
#include "backend/host/mmvq_host.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/host/mmvq_host_avx2.h"
#include "backend/host/mmvq_host_impl.h"
#include "backend/exact_math.h"
#include "core/error.h"
#include "core/fp16.h"
#include "format/iq_grids.h"
#include "format/quant.h"
#include "format/quant_blocks.h"

namespace strata {

using namespace mmvq_detail;

bool mmvq_host_supported(DType t) {
    switch (t) {
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::MXFP4:
        case DType::IQ4_XS:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ2_XXS:
        case DType::IQ1_M:
            return true;
        default:
            return false;
    }
}

// k_quantize_act_q8_0 and k_quantize_act_q8_k, element for element.
float host_exp(float x) {
    return exact::exp(x);
}

float host_silu_mul(float v, float m) {
    return exact::silu_mul(v, m);
}

void quantize_act_gpu(DType vt, const float *xin, int64_t k, int8_t *q, ActScale *ds, const float *silu_mul_by) {
    std::vector<float> gated;
    const float *x = xin;
    if (silu_mul_by) {
        gated.resize(size_t(k));
        for (int64_t i = 0; i < k; i++) gated[size_t(i)] = exact::silu_mul(xin[i], silu_mul_by[i]);
        x = gated.data();
    }
    if (vt == DType::Q8_0 || vt == DType::Q8_1) {
        STRATA_ASSERT(k % 32 == 0);
        for (int64_t blk = 0; blk < k / 32; blk++) {
            const float *v = x + blk * 32;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = std::fmax(amax, std::fabs(v[i]));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                const float s = v[i] * id;
                const int qi = std::isnan(s) ? 0 : int(std::fmin(std::fmax(std::round(s), -128.0f), 127.0f));
                q[blk * 32 + i] = int8_t(qi);
                sum += qi;
            }
            const float dr = f16_to_f32(f32_to_f16(d));
            ds[blk] = {dr, dr * float(sum)};
        }
        return;
    }
    STRATA_ASSERT(vt == DType::Q8_K && k % 256 == 0);
    for (int64_t blk = 0; blk < k / 256; blk++) {
        const float *v = x + blk * 256;
        // the largest magnitude, ties to the lowest index (the warp's order: element i * 32 + lane)
        float amax = 0.0f, smax = 0.0f;
        for (int i = 0; i < 256; i++)
            if (std::fabs(v[i]) > amax) amax = std::fabs(v[i]), smax = v[i];
        const float iscale = smax != 0.0f ? -127.0f / smax : 0.0f;
        const float d = smax != 0.0f ? 1.0f / iscale : 0.0f;
        for (int sub = 0; sub < 8; sub++) {
            int sum = 0;
            for (int lane = 0; lane < 32; lane++) {
                const float s = iscale * v[sub * 32 + lane];
                const int qi = smax == 0.0f ? 0 : !(s > -128.0f) ? -128 : s >= 127.0f ? 127 : int(std::nearbyint(s));
                q[blk * 256 + sub * 32 + lane] = int8_t(qi);
                sum += qi;
            }
            ds[blk * 8 + sub] = {d, d * float(sum)};
        }
    }
}

float mmvq_host_dot(DType t, const uint8_t *row, int64_t k, const int8_t *q, const ActScale *ds) {
    STRATA_ASSERT(k % 32 == 0);
    const bool bias = has_bias(t);
    float lane[32] = {};
    Sub w;
    for (int64_t sb = 0; sb < k / 32; sb++) {
        unpack(t, row, int(sb), w);
        const int8_t *x = q + sb * 32;
        float s = 0.0f;
        for (int g = 0; g < 4; g++) {
            int dot = 0, xs = 0;
            for (int i = 8 * g; i < 8 * g + 8; i++) dot += w.q[i] * x[i], xs += x[i];
            s = std::fma(w.scale[g], float(dot), s);
            if (bias) s = std::fma(w.bias[g], float(xs), s);
        }
        float &acc = lane[sb % 32];
        acc = acc + std::fma(ds[sb].d, s, w.off * ds[sb].s);
    }
    for (int o = 16; o > 0; o >>= 1) {  // the warp's butterfly: lane l adds lane l ^ o, every lane alike
        float next[32];
        for (int l = 0; l < 32; l++) next[l] = lane[l] + lane[l ^ o];
        std::memcpy(lane, next, sizeof lane);
    }
    return lane[0];
}

bool mmvq_host_vectorized() {
    static const bool on = [] {
        const char *isa = std::getenv("STRATA_CPU_ISA");  // "scalar": row by row, as the CPU backend's kernels
        if (isa && std::strcmp(isa, "scalar") == 0) return false;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
        return false;
#endif
    }();
    return on;
}

void mmvq_host_rows(const HostMatrix &m, int64_t r0, int64_t r1, const int8_t *q, const ActScale *ds, float *out,
                    bool vectorized) {
    STRATA_ASSERT(r0 >= 0 && r0 <= r1 && r1 <= m.n && m.k % 32 == 0);
    if (r0 == r1) return;
    if (vectorized && mmvq_host_vectorized() &&
        mmvq_detail::mmvq_rows_avx2(m.type, m.data, m.row_bytes, m.k, r0, r1, q, ds, out))
        return;
    for (int64_t r = r0; r < r1; r++) out[r - r0] = mmvq_host_dot(m.type, m.data + size_t(r) * m.row_bytes, m.k, q, ds);
}

void expert_ffn_host(const HostMatrix &gate, const HostMatrix &up, const HostMatrix &down, const float *x, float *y) {
    STRATA_ASSERT(gate.k == up.k && gate.n == up.n && down.k == gate.n);
    for (const HostMatrix *m : {&gate, &up, &down})
        if (!mmvq_host_supported(m->type))
            fail("internal: no host mat-vec in the GPU's order for %s", dtype_name(m->type));
    const int64_t E = gate.k, F = gate.n;
    std::vector<int8_t> q(static_cast<size_t>(std::max(E, F)));
    std::vector<ActScale> ds(static_cast<size_t>(std::max(E, F) / 32));
    std::vector<float> g(static_cast<size_t>(F)), u(static_cast<size_t>(F));
    auto rows = [&](const HostMatrix &m, const float *in, const float *silu_by, float *out) {
        quantize_act_gpu(dot_act_type(m.type), in, m.k, q.data(), ds.data(), silu_by);
        mmvq_host_rows(m, 0, m.n, q.data(), ds.data(), out);
    };
    rows(gate, x, nullptr, g.data());
    rows(up, x, nullptr, u.data());
    rows(down, g.data(), u.data(), y);
}

}  // namespace strata
