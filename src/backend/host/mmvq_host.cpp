// The GPU's decode mat-vec on the host, step for step (mmvq_host.h). Compiled without FMA contraction
// (CMakeLists.txt): every fused multiply-add here is an explicit std::fma, as every one in k_mmvq is a __fmaf_rn.
#include "backend/host/mmvq_host.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/exact_math.h"
#include "backend/host/mmvq_host_avx2.h"
#include "backend/host/mmvq_host_avx512.h"
#include "backend/host/mmvq_host_impl.h"
#include "core/env.h"
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

namespace {

// The highest form this CPU runs and STRATA_CPU_ISA allows.
CpuIsa top_form() {
    return std::min(cpu_isa_hardware(), cpu_isa_requested().value_or(CpuIsa::avx512));
}

// Each vectorized form's best time of a few turns over 256 rows of 2048 Q4_K values (the experts' commonest shape
// and type; 288 KB, in cache after the first turn), the forms taking turns so that a clock change hits both.
MmvqHostTiming time_forms() {
    MmvqHostTiming t;
    const CpuIsa top = top_form();
    if (top < CpuIsa::avx2) return t;
    const int64_t k = 2048, n = 256;
    const size_t rb = row_bytes(DType::Q4_K, k);
    std::vector<uint8_t> w(rb * size_t(n));
    uint32_t h = 12345;  // any bytes are valid Q4_K blocks but for the f16 scales: keep those small and finite
    for (uint8_t &b : w) b = uint8_t((h = h * 1664525u + 1013904223u) >> 24);
    for (int64_t r = 0; r < n; r++)
        for (int64_t blk = 0; blk < k / 256; blk++) {
            uint8_t *b = w.data() + size_t(r) * rb + size_t(blk) * 144;
            b[1] = 0x1c, b[3] = 0x1c;  // d and dmin about 2^-8
        }
    std::vector<int8_t> q(static_cast<size_t>(k));
    std::vector<ActScale> ds(size_t(k / 32), ActScale{0.01f, 0.0f});
    for (size_t i = 0; i < q.size(); i++) q[i] = int8_t(int(i * 37 % 255) - 127);
    std::vector<float> out(static_cast<size_t>(n));
    const HostMatrix m{DType::Q4_K, w.data(), rb, k, n};
    auto once = [&](CpuIsa isa) {
        const auto t0 = std::chrono::steady_clock::now();
        mmvq_host_rows(m, 0, n, q.data(), ds.data(), out.data(), isa);
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    double best2 = 1e30, best512 = 1e30;
    for (int turn = 0; turn < 6; turn++) {
        best2 = std::min(best2, once(CpuIsa::avx2));
        if (top >= CpuIsa::avx512) best512 = std::min(best512, once(CpuIsa::avx512));
    }
    t.avx2_us = best2;
    t.avx512_us = top >= CpuIsa::avx512 ? best512 : 0.0;
    return t;
}

}  // namespace

MmvqHostTiming mmvq_host_timing() {
    static const MmvqHostTiming t = time_forms();
    return t;
}

CpuIsa mmvq_host_form() {
    static const CpuIsa form = [] {
        if (top_form() < CpuIsa::avx2) return CpuIsa::scalar;
        const MmvqHostTiming t = mmvq_host_timing();
        return t.avx512_us > 0 && t.avx512_us < t.avx2_us ? CpuIsa::avx512 : CpuIsa::avx2;
    }();
    return form;
}

void mmvq_host_rows(const HostMatrix &m, int64_t r0, int64_t r1, const int8_t *q, const ActScale *ds, float *out,
                    CpuIsa isa) {
    STRATA_ASSERT(r0 >= 0 && r0 <= r1 && r1 <= m.n && m.k % 32 == 0);
    if (r0 == r1) return;
    const CpuIsa level = std::min(isa, cpu_isa_hardware());
    auto vector_rows = [&](const uint8_t *data, int64_t a, int64_t b, float *o) {
        return (level >= CpuIsa::avx512 &&
                mmvq_detail::mmvq_rows_avx512(m.type, data, m.row_bytes, m.k, a, b, q, ds, o)) ||
               (level >= CpuIsa::avx2 && mmvq_detail::mmvq_rows_avx2(m.type, data, m.row_bytes, m.k, a, b, q, ds, o));
    };
    static const bool stage_on = env_switch("STRATA_HOST_STAGE", true);
    if (level >= CpuIsa::avx2 && stage_on && m.row_bytes <= k_host_stage_bytes / 16) {
        // Pieces of whole 16-row groups (the AVX-512 form's), copied in order and computed from the copy.
        const int64_t piece = int64_t(k_host_stage_bytes / m.row_bytes) / 16 * 16;
        static thread_local std::vector<uint8_t> stage;
        if (stage.size() < k_host_stage_bytes) stage.resize(k_host_stage_bytes);
        bool done = true;
        for (int64_t a = r0; a < r1 && done; a += piece) {
            const int64_t b = std::min(r1, a + piece);
            std::memcpy(stage.data(), m.data + size_t(a) * m.row_bytes, size_t(b - a) * m.row_bytes);
            done = vector_rows(stage.data(), 0, b - a, out + (a - r0));
        }
        if (done) return;  // false only for a type no vector form takes, at the first piece
    } else if (vector_rows(m.data, r0, r1, out)) {
        return;
    }
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
