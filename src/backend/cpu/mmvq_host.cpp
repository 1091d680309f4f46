// The GPU's decode mat-vec on the host, step for step (mmvq_host.h). Compiled without FMA contraction
// (CMakeLists.txt): every fused multiply-add here is an explicit std::fma, as every one in k_mmvq is a __fmaf_rn.
#include "backend/cpu/mmvq_host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/exact_math.h"
#include "core/error.h"
#include "core/fp16.h"
#include "format/iq_grids.h"
#include "format/quant.h"
#include "format/quant_blocks.h"

namespace strata {

namespace {

// One 32-element sub-block as cuda/qv_device.cuh's QV<T>::load unpacks it: the integer weight of each element (in
// the activations' order), a scale (and for IQ1_M a bias) per 8-element group, and an offset times the activation
// sum.
struct Sub {
    int q[32];
    float scale[4];
    float bias[4] = {0, 0, 0, 0};
    float off = 0.0f;
};

uint16_t u16(const uint8_t *p) {
    return uint16_t(p[0] | (p[1] << 8));
}
uint32_t u32(const uint8_t *p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
float f16(const uint8_t *p) {
    return f16_to_f32(u16(p));
}
float bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
void uniform(Sub &w, float s) {
    for (float &x : w.scale) x = s;
    w.off = 0.0f;
}
int8_t grid_byte(uint64_t g, int i) {
    return int8_t(uint8_t(g >> (8 * i)));
}

// Q4_K / Q5_K six-bit scale and min of sub-block j (quant_device.cuh k_scale_min).
void k_scale_min(const uint8_t *s, int j, int &sc, int &m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

void unpack(DType t, const uint8_t *row, int sb, Sub &w) {
    switch (t) {
        case DType::Q8_0: {
            const uint8_t *b = row + size_t(sb) * 34;
            for (int e = 0; e < 32; e++) w.q[e] = int8_t(b[2 + e]);
            return uniform(w, f16(b));
        }
        case DType::Q4_0: {
            const uint8_t *b = row + size_t(sb) * 18;
            for (int e = 0; e < 16; e++) w.q[e] = (b[2 + e] & 15) - 8, w.q[e + 16] = (b[2 + e] >> 4) - 8;
            return uniform(w, f16(b));
        }
        case DType::MXFP4: {
            const uint8_t *b = row + size_t(sb) * 17;
            for (int e = 0; e < 16; e++)
                w.q[e] = kvalues_mxfp4[b[1 + e] & 15], w.q[e + 16] = kvalues_mxfp4[b[1 + e] >> 4];
            const uint32_t x = b[0];
            return uniform(w, x < 2 ? bits(0x00200000u << x) : bits((x - 1) << 23));
        }
        case DType::IQ4_XS: {
            const uint8_t *b = row + size_t(sb / 8) * 136;
            const int ib = sb % 8;
            const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | int(((u16(b + 2) >> (2 * ib)) & 3) << 4);
            for (int e = 0; e < 16; e++) {
                const uint8_t v = b[8 + 16 * ib + e];
                w.q[e] = kvalues_iq4nl[v & 15], w.q[e + 16] = kvalues_iq4nl[v >> 4];
            }
            return uniform(w, f16(b) * float(ls - 32));
        }
        case DType::Q4_K: {
            const uint8_t *b = row + size_t(sb / 8) * 144;
            const int j = sb % 8;
            int sc, m;
            k_scale_min(b + 4, j, sc, m);
            const uint8_t *qs = b + 16 + 32 * (j / 2);
            for (int e = 0; e < 32; e++) w.q[e] = (qs[e] >> (4 * (j & 1))) & 15;
            uniform(w, f16(b) * float(sc));
            w.off = -(f16(b + 2) * float(m));
            return;
        }
        case DType::Q5_K: {
            const uint8_t *b = row + size_t(sb / 8) * 176;
            const int j = sb % 8, p = j / 2;
            int sc, m;
            k_scale_min(b + 4, j, sc, m);
            const uint8_t *qs = b + 48 + 32 * p, *qh = b + 16;
            for (int e = 0; e < 32; e++)
                w.q[e] = ((qs[e] >> (4 * (j & 1))) & 15) | (((qh[e] >> (2 * p + (j & 1))) & 1) << 4);
            uniform(w, f16(b) * float(sc));
            w.off = -(f16(b + 2) * float(m));
            return;
        }
        case DType::Q6_K: {
            const uint8_t *b = row + size_t(sb / 8) * 210;
            const int j = sb % 8, h = j / 4, tt = j % 4;
            const uint8_t *ql = b + 64 * h + 32 * (tt & 1), *qh = b + 128 + 32 * h;
            const int shift = tt < 2 ? 0 : 4;
            for (int e = 0; e < 32; e++) w.q[e] = (((ql[e] >> shift) & 15) | (((qh[e] >> (2 * tt)) & 3) << 4)) - 32;
            const float d = f16(b + 208);
            const float s0 = d * float(int8_t(b[192 + 2 * j])), s1 = d * float(int8_t(b[193 + 2 * j]));
            w.scale[0] = w.scale[1] = s0;
            w.scale[2] = w.scale[3] = s1;
            w.off = 0.0f;
            return;
        }
        case DType::IQ2_XXS: {
            const uint8_t *b = row + size_t(sb / 8) * 66;
            const int ib = sb % 8;
            const uint32_t a0 = u32(b + 2 + 8 * ib), a1 = u32(b + 6 + 8 * ib);
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq::iq2xxs_grid[(a0 >> (8 * l)) & 255];
                const uint8_t signs = iq::ksigns_iq2xs[(a1 >> (7 * l)) & 127];
                for (int i = 0; i < 8; i++) {
                    const int v = grid_byte(g, i);
                    w.q[8 * l + i] = (signs >> i) & 1 ? -v : v;
                }
            }
            return uniform(w, (f16(b) * (0.5f + float(a1 >> 28))) * 0.25f);
        }
        case DType::IQ1_M: {
            const uint8_t *b = row + size_t(sb / 8) * 56;
            const int ib = sb % 8;
            const uint32_t sc0 = u16(b + 48), sc1 = u16(b + 50), sc2 = u16(b + 52), sc3 = u16(b + 54);
            const float d =
                f16_to_f32(uint16_t((sc0 >> 12) | ((sc1 >> 8) & 0x00f0) | ((sc2 >> 4) & 0x0f00) | (sc3 & 0xf000)));
            const uint32_t scw = u16(b + 48 + 2 * (ib / 2));
            for (int l = 0; l < 4; l++) {
                const int s = int(scw >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
                const float dl = d * float(2 * s + 1);
                const int nib = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15;
                const uint64_t g = iq::iq1s_grid[b[4 * ib + l] | ((nib & 7) << 8)];
                for (int i = 0; i < 8; i++) w.q[8 * l + i] = grid_byte(g, i);
                w.scale[l] = dl;
                w.bias[l] = dl * ((nib & 8) ? -0.125f : 0.125f);
            }
            w.off = 0.0f;
            return;
        }
        default:
            fail("internal: no host mat-vec in the GPU's order for %s", dtype_name(t));
    }
}

bool has_bias(DType t) {
    return t == DType::IQ1_M;
}

}  // namespace

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
        for (int64_t j = 0; j < m.n; j++)
            out[j] = mmvq_host_dot(m.type, m.data + size_t(j) * m.row_bytes, m.k, q.data(), ds.data());
    };
    rows(gate, x, nullptr, g.data());
    rows(up, x, nullptr, u.data());
    rows(down, g.data(), u.data(), y);
}

}  // namespace strata
