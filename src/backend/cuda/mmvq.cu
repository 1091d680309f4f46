// Quantized mat-vec products (decode): weights stay packed, activations are 8-bit (int8 per element, a float scale
// and the scaled sum per 32 elements, in the reference's activation format: matmul.cuh), and each 32-element
// sub-block contributes an integer dot product (dp4a) times its scales. One warp per weight row, lanes over sub-blocks,
// up to 8 activation rows sharing each decoded weight sub-block. Every type writes its sub-block as 8 packed int8x4
// words in four groups of 8 elements:
//   sum_i w_i x_i = dx * sum_g (scale_g * dot_g + bias_g * xsum_g) + off * (dx * sum_i q_i)
// where dot_g is the integer dot product of group g and xsum_g the sum of its activation integers.
#include "backend/cuda/matmul.cuh"

#include "backend/cuda/quant_device.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

struct WSub {
    int q[8];
    float scale[4];
    float bias[4];  // used when the type's k_bias is set
    float off;
};

// 32-bit word at a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}
__device__ __forceinline__ uint32_t ld_u32_a4(const uint8_t *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

// Four 4-bit indices (one per byte, low nibbles) looked up in a 16-entry int8 table held in four words.
__device__ __forceinline__ int lut16(uint32_t idx4, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t v = idx4 & 0x07070707u;
    const uint32_t sel = (v & 7u) | ((v >> 4) & 0x70u) | ((v >> 8) & 0x700u) | ((v >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t mask = ((idx4 >> 3) & 0x01010101u) * 0xffu;
    return int((lo & ~mask) | (hi & mask));
}

// kvalues_iq4nl and kvalues_mxfp4 (format/quant_blocks.h) as bytes, four per word.
constexpr uint32_t k_iq4nl_t0 = 0xbfad9881u, k_iq4nl_t1 = 0xf6eaddcfu, k_iq4nl_t2 = 0x26190d01u,
                   k_iq4nl_t3 = 0x71594535u;
constexpr uint32_t k_mxfp4_t0 = 0x03020100u, k_mxfp4_t1 = 0x0c080604u, k_mxfp4_t2 = 0xfdfeff00u,
                   k_mxfp4_t3 = 0xf4f8fafcu;

// Per-byte sign flip: byte i negated where bit i of the 4-bit mask is set.
__device__ __forceinline__ int apply_signs4(uint32_t v, uint32_t bits4) {
    const uint32_t m = (((bits4 & 15u) * 0x00204081u) & 0x01010101u) * 0xffu;
    return int(__vsub4(v ^ m, m));
}

__device__ __forceinline__ void uniform_scale(WSub &w, float s) {
#pragma unroll
    for (int i = 0; i < 4; i++) w.scale[i] = s;
    w.off = 0.0f;
}

template <DType T>
struct QV;

template <>
struct QV<DType::Q8_0> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb) * 34;
#pragma unroll
        for (int i = 0; i < 8; i++) w.q[i] = int(ld_u32_a2(b + 2 + 4 * i));
        uniform_scale(w, ld_f16(b));
    }
};

template <>
struct QV<DType::Q4_0> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb) * 18;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = ld_u32_a2(b + 2 + 4 * i);
            w.q[i] = int(__vsub4(v & 0x0f0f0f0fu, 0x08080808u));
            w.q[i + 4] = int(__vsub4((v >> 4) & 0x0f0f0f0fu, 0x08080808u));
        }
        uniform_scale(w, ld_f16(b));
    }
};

template <>
struct QV<DType::MXFP4> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb) * 17;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = ld_u32(b + 1 + 4 * i);
            w.q[i] = lut16(v & 0x0f0f0f0fu, k_mxfp4_t0, k_mxfp4_t1, k_mxfp4_t2, k_mxfp4_t3);
            w.q[i + 4] = lut16((v >> 4) & 0x0f0f0f0fu, k_mxfp4_t0, k_mxfp4_t1, k_mxfp4_t2, k_mxfp4_t3);
        }
        uniform_scale(w, qd::e8m0_half(b[0]));
    }
};

template <>
struct QV<DType::IQ4_XS> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb / 8) * 136;
        const int ib = sb % 8;
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | int(((ld_u16(b + 2) >> (2 * ib)) & 3) << 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t v = ld_u32_a4(b + 8 + 16 * ib + 4 * i);
            w.q[i] = lut16(v & 0x0f0f0f0fu, k_iq4nl_t0, k_iq4nl_t1, k_iq4nl_t2, k_iq4nl_t3);
            w.q[i + 4] = lut16((v >> 4) & 0x0f0f0f0fu, k_iq4nl_t0, k_iq4nl_t1, k_iq4nl_t2, k_iq4nl_t3);
        }
        uniform_scale(w, __fmul_rn(ld_f16(b), float(ls - 32)));
    }
};

template <>
struct QV<DType::Q4_K> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb / 8) * 144;
        const int j = sb % 8;
        int sc, m;
        qd::k_scale_min(b + 4, j, sc, m);
        const uint4 *qs = reinterpret_cast<const uint4 *>(b + 16 + 32 * (j / 2));
        const uint4 v0 = qs[0], v1 = qs[1];
        const uint32_t v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) w.q[i] = int((v[i] >> shift) & 0x0f0f0f0fu);
        uniform_scale(w, __fmul_rn(ld_f16(b), float(sc)));
        w.off = -__fmul_rn(ld_f16(b + 2), float(m));
    }
};

template <>
struct QV<DType::Q5_K> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb / 8) * 176;
        const int j = sb % 8, p = j / 2;
        int sc, m;
        qd::k_scale_min(b + 4, j, sc, m);
        const uint4 *qs = reinterpret_cast<const uint4 *>(b + 48 + 32 * p);
        const uint4 *qh = reinterpret_cast<const uint4 *>(b + 16);
        const uint4 v0 = qs[0], v1 = qs[1], h0 = qh[0], h1 = qh[1];
        const uint32_t v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const uint32_t h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const int shift = 4 * (j & 1), hshift = 2 * p + (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++)
            w.q[i] = int(((v[i] >> shift) & 0x0f0f0f0fu) | (((h[i] >> hshift) & 0x01010101u) << 4));
        uniform_scale(w, __fmul_rn(ld_f16(b), float(sc)));
        w.off = -__fmul_rn(ld_f16(b + 2), float(m));
    }
};

template <>
struct QV<DType::Q6_K> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &) {
        const uint8_t *b = row + size_t(sb / 8) * 210;
        const int j = sb % 8, h = j / 4, t = j % 4;
        const uint8_t *ql = b + 64 * h + 32 * (t & 1);
        const uint8_t *qh = b + 128 + 32 * h;
        const int shift = t < 2 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (ld_u32_a2(ql + 4 * i) >> shift) & 0x0f0f0f0fu;
            const uint32_t hi = ((ld_u32_a2(qh + 4 * i) >> (2 * t)) & 0x03030303u) << 4;
            w.q[i] = int(__vsub4(lo | hi, 0x20202020u));
        }
        const float d = ld_f16(b + 208);
        const float s0 = __fmul_rn(d, float(int8_t(b[192 + 2 * j]))), s1 = __fmul_rn(d, float(int8_t(b[193 + 2 * j])));
        w.scale[0] = w.scale[1] = s0;
        w.scale[2] = w.scale[3] = s1;
        w.off = 0.0f;
    }
};

template <>
struct QV<DType::IQ2_XXS> {
    static constexpr bool k_bias = false;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &g) {
        const uint8_t *b = row + size_t(sb / 8) * 66;
        const int ib = sb % 8;
        const uint32_t a0 = ld_u32_a2(b + 2 + 8 * ib), a1 = ld_u32_a2(b + 6 + 8 * ib);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint64_t gr = ld_u64(g.iq2xxs + ((a0 >> (8 * l)) & 255));
            const uint32_t signs = g.ksigns[(a1 >> (7 * l)) & 127];
            w.q[2 * l] = apply_signs4(uint32_t(gr), signs);
            w.q[2 * l + 1] = apply_signs4(uint32_t(gr >> 32), signs >> 4);
        }
        uniform_scale(w, __fmul_rn(__fmul_rn(ld_f16(b), __fadd_rn(0.5f, float(a1 >> 28))), 0.25f));
    }
};

template <>
struct QV<DType::IQ1_M> {
    static constexpr bool k_bias = true;
    __device__ static void load(const uint8_t *row, int sb, WSub &w, const IqGrids &g) {
        const uint8_t *b = row + size_t(sb / 8) * 56;
        const int ib = sb % 8;
        const uint32_t sc0 = ld_u16(b + 48), sc1 = ld_u16(b + 50), sc2 = ld_u16(b + 52), sc3 = ld_u16(b + 54);
        const float d = f16_to_f32((sc0 >> 12) | ((sc1 >> 8) & 0x00f0) | ((sc2 >> 4) & 0x0f00) | (sc3 & 0xf000));
        const uint32_t scw = ld_u16(b + 48 + 2 * (ib / 2));
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const int s = (scw >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
            const float dl = __fmul_rn(d, float(2 * s + 1));
            const int nib = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) & 15;
            const uint64_t gr = ld_u64(g.iq1s + (b[4 * ib + l] | ((nib & 7) << 8)));
            w.q[2 * l] = int(uint32_t(gr));
            w.q[2 * l + 1] = int(uint32_t(gr >> 32));
            w.scale[l] = dl;
            w.bias[l] = __fmul_rn(dl, (nib & 8) ? -0.125f : 0.125f);
        }
        w.off = 0.0f;
    }
};

constexpr int k_mmvq_warps = 4;

template <DType T>
__global__ __launch_bounds__(k_mmvq_warps * 32) void k_mmvq(MatmulArgs a, IqGrids g) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t n = int64_t(blockIdx.x) * k_mmvq_warps + warp;
    if (n >= a.n) return;
    const MatmulGroup grp = a.groups ? a.groups[blockIdx.y] : a.single;
    const int rows = grp.n_rows;
    const uint8_t *wrow = static_cast<const uint8_t *>(grp.w) + size_t(n) * a.row_bytes;
    const int64_t n_sub = a.k / 32;
    float acc[k_mmv_max_rows];
#pragma unroll
    for (int t = 0; t < k_mmv_max_rows; t++) acc[t] = 0.0f;
    for (int64_t sb = lane; sb < n_sub; sb += 32) {
        WSub w;
        QV<T>::load(wrow, int(sb), w, g);
#pragma unroll
        for (int t = 0; t < k_mmv_max_rows; t++) {
            if (t >= rows) break;
            const int64_t xr = grp.x_row0 + t;
            const int4 *xp = reinterpret_cast<const int4 *>(a.xq + xr * a.k + sb * 32);
            const int4 x0 = xp[0], x1 = xp[1];
            const int x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            const float2 ds = a.xds[xr * n_sub + sb];
            float s = 0.0f;
#pragma unroll
            for (int gi = 0; gi < 4; gi++) {
                const int dot = __dp4a(w.q[2 * gi + 1], x[2 * gi + 1], __dp4a(w.q[2 * gi], x[2 * gi], 0));
                s += w.scale[gi] * float(dot);
                if constexpr (QV<T>::k_bias) {
                    const int xs = __dp4a(0x01010101, x[2 * gi + 1], __dp4a(0x01010101, x[2 * gi], 0));
                    s += w.bias[gi] * float(xs);
                }
            }
            acc[t] += ds.x * s + w.off * ds.y;
        }
    }
#pragma unroll
    for (int t = 0; t < k_mmv_max_rows; t++) {
        if (t >= rows) break;
        const float s = warp_sum(acc[t]);
        if (lane == 0) a.y[int64_t(grp.y_row0 + t) * a.y_stride + n] = s;
    }
}

// Q8_0 / Q8_1 levels and scales as format/quant.h makes them; one warp per 32-element block.
__global__ void k_quantize_act_q8_0(const float *x, int64_t x_stride, int64_t k, int8_t *qs, float2 *ds) {
    const int64_t r = blockIdx.y;
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (blk * 32 >= k) return;
    const float v = x[r * x_stride + blk * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float s = __fmul_rn(v, id);
    const int q = isnan(s) ? 0 : int(fminf(fmaxf(roundf(s), -128.0f), 127.0f));
    const float sum = warp_sum(float(q));
    qs[r * k + blk * 32 + lane] = int8_t(q);
    const float dr = f16_to_f32(f32_to_f16(d));
    if (lane == 0) ds[r * (k / 32) + blk] = make_float2(dr, dr * sum);
}

// Q8_K levels and scale per 256 elements (one warp, element i * 32 + lane in lane's slot i, so slot i of all lanes
// is one 32-element sub-block).
__global__ void k_quantize_act_q8_k(const float *x, int64_t x_stride, int64_t k, int8_t *qs, float2 *ds) {
    const int64_t r = blockIdx.y;
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (blk * 256 >= k) return;
    const float *xb = x + r * x_stride + blk * 256;
    float v[8];
    float amax = 0.0f, smax = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i * 32 + lane];
        const float a = fabsf(v[i]);
        if (a > amax) amax = a, smax = v[i], idx = i * 32 + lane;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(k_full_mask, amax, o), s2 = __shfl_xor_sync(k_full_mask, smax, o);
        const int i2 = __shfl_xor_sync(k_full_mask, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) amax = a2, smax = s2, idx = i2;
    }
    const float iscale = smax != 0.0f ? __fdiv_rn(-127.0f, smax) : 0.0f;
    const float d = smax != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
    int8_t *qb = qs + r * k + blk * 256;
    float2 *db = ds + r * (k / 32) + blk * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float s = __fmul_rn(iscale, v[i]);
        const int q = smax == 0.0f ? 0 : !(s > -128.0f) ? -128 : s >= 127.0f ? 127 : int(rintf(s));
        qb[i * 32 + lane] = int8_t(q);
        const float sum = warp_sum(float(q));
        if (lane == 0) db[i] = make_float2(d, d * sum);
    }
}

}  // namespace

bool mmvq_supported(DType t) {
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

void launch_mmvq(const MatmulArgs &a, cudaStream_t stream) {
    if (a.n_groups == 0 || a.n == 0) return;
    STRATA_ASSERT(a.k % 32 == 0 && a.n_groups <= 65535);
    const IqGrids &g = iq_grids();
    const dim3 grid(ceil_div(a.n, k_mmvq_warps), unsigned(a.n_groups));
    // clang-format off
    switch (a.type) {
#define X(T_) \
    case DType::T_: k_mmvq<DType::T_><<<grid, k_mmvq_warps * 32, 0, stream>>>(a, g); break;
        X(Q8_0) X(Q4_0) X(MXFP4) X(IQ4_XS) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ2_XXS) X(IQ1_M)
#undef X
        default: fail("CUDA: no quantized mat-vec kernel for %s", dtype_name(a.type));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_mmvq");
}

void launch_quantize_act(DType vt, const float *x, int64_t x_stride, int64_t rows, int64_t k, int8_t *qs, float2 *ds,
                         cudaStream_t stream) {
    if (rows == 0) return;
    STRATA_ASSERT(rows <= 65535);
    switch (vt) {
        case DType::Q8_0:
        case DType::Q8_1:
            STRATA_ASSERT(k % 32 == 0);
            k_quantize_act_q8_0<<<dim3(ceil_div(k / 32, 8), unsigned(rows)), 256, 0, stream>>>(x, x_stride, k, qs, ds);
            break;
        case DType::Q8_K:
            STRATA_ASSERT(k % 256 == 0);
            k_quantize_act_q8_k<<<dim3(ceil_div(k / 256, 4), unsigned(rows)), 128, 0, stream>>>(x, x_stride, k, qs, ds);
            break;
        default:
            fail("CUDA: no 8-bit activation format %s", dtype_name(vt));
    }
    STRATA_CUDA_LAUNCH_CHECK("quantize_act");
}

}  // namespace strata::cuda
