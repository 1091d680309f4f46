// Packed weight sub-blocks unpacked for integer dot products, shared by the quantized mat-vec (mmvq.cu) and
// matrix-matrix (mmq.cu) kernels. QV<T>::load writes one 32-element sub-block of a row as 8 words of packed int8
// values in four groups of 8 elements, with per-group scales (and biases for IQ1_M) such that
//   sum_i w_i x_i = dx * sum_g (scale_g * dot_g + bias_g * xsum_g) + off * (dx * sum_i q_i)
// for activations x_i = dx * q_i.
#pragma once

#include "backend/cuda/quant_device.cuh"

namespace strata::cuda::qv {

struct WSub {
    int q[8];
    float scale[4];
    float bias[4];  // used when the type's k_bias is set
    float off;
    uint32_t delta_neg = 0;  // IQ1_M: bit l set where group l's delta is negative
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
        if ((reinterpret_cast<uintptr_t>(row) & 3) == 0) {
            // Rows 4-byte aligned (an even number of blocks a row): 9 word loads where the 2-byte form took 17. A block
            // of an even index starts on a word (scale, then levels shifted by 2 bytes); of an odd one, its levels do.
            const uint32_t *a = reinterpret_cast<const uint32_t *>(b - (sb & 1) * 2);
            uint32_t v[9];
#pragma unroll
            for (int i = 0; i < 9; i++) v[i] = a[i];
            uint16_t d;
            if (sb & 1) {
#pragma unroll
                for (int i = 0; i < 8; i++) w.q[i] = int(v[i + 1]);
                d = uint16_t(v[0] >> 16);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) w.q[i] = int(__funnelshift_r(v[i], v[i + 1], 16));
                d = uint16_t(v[0] & 0xffffu);
            }
            uniform_scale(w, f16_to_f32(d));
            return;
        }
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
        load_parts(b, b + 16 + 32 * (j / 2), j, w);
    }
    // Sub-block j of a super-block from its 16-byte head b (d, dmin, scales) and the 32 bytes of quants that hold
    // it (16-byte aligned), wherever each lies: mmq.cu's staged form copies them apart into shared memory.
    __device__ static void load_parts(const uint8_t *b, const uint8_t *qs_at, int j, WSub &w) {
        const uint4 *qs = reinterpret_cast<const uint4 *>(qs_at);
        const uint4 v0 = qs[0], v1 = qs[1];
        const uint32_t v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) w.q[i] = int((v[i] >> shift) & 0x0f0f0f0fu);
        float scale, off;
        scale_off(b, j, scale, off);
        uniform_scale(w, scale);
        w.off = off;
    }
    // Sub-block j's scale (every element's) and offset from its super-block's 16-byte head b.
    __device__ static void scale_off(const uint8_t *b, int j, float &scale, float &off) {
        int sc, m;
        qd::k_scale_min(b + 4, j, sc, m);
        scale = __fmul_rn(ld_f16(b), float(sc));
        off = -__fmul_rn(ld_f16(b + 2), float(m));
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
            w.delta_neg |= uint32_t(nib >> 3) << l;
        }
        w.off = 0.0f;
    }
};

}  // namespace strata::cuda::qv
