// Device helpers shared by the kernels: warp and block reductions in a fixed order (results never depend on timing),
// unaligned little-endian loads for packed blocks, and fp16 conversions that equal core/fp16.h bit for bit.
// Included by .cu files only.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace strata::cuda {

constexpr unsigned k_full_mask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(k_full_mask, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(k_full_mask, v, o));
    return v;
}

// Sum over a block of n_threads (a multiple of 32, at most 1024); every thread gets the result. `red` is shared
// memory of at least 32 floats; the call ends with a barrier so `red` may be reused right away.
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = lane < n_warps ? red[lane] : 0.0f;
    r = warp_sum(r);
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = lane < n_warps ? red[lane] : -INFINITY;
    r = warp_max(r);
    __syncthreads();
    return r;
}

// ---- loads from packed blocks (any alignment) ------------------------------------------------------------------
__device__ __forceinline__ uint32_t ld_u8(const uint8_t *p) {
    return p[0];
}
__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8);
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
    return ld_u16(p) | (ld_u16(p + 2) << 16);
}
__device__ __forceinline__ uint64_t ld_u64(const uint64_t *p) {
    return __ldg(reinterpret_cast<const unsigned long long *>(p));
}

// ---- fp16 ------------------------------------------------------------------------------------------------------
// IEEE half bits to float, NaN payloads kept (as core/fp16.h's f16_to_f32).
__device__ __forceinline__ float f16_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return __uint_as_float(sign);
        const float v = __fmul_rn(float(mant), 5.9604644775390625e-08f);
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

__device__ __forceinline__ float ld_f16(const uint8_t *p) {
    return f16_to_f32(ld_u16(p));
}

// Float to half bits, round to nearest even (as core/fp16.h's f32_to_f16).
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    const uint32_t u = __float_as_uint(f);
    const uint16_t sign = uint16_t((u >> 16) & 0x8000);
    const uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) {
        if (abs == 0x7f800000u) return sign | 0x7c00;
        return uint16_t(sign | 0x7e00 | ((abs >> 13) & 0x3ff));
    }
    if (abs >= 0x477ff000u) return sign | 0x7c00;
    if (abs < 0x38800000u) {
        const uint32_t exp = abs >> 23;
        if (exp < 102) return sign;
        const uint32_t mant = (abs & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - exp;
        uint32_t q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return uint16_t(sign | q);
    }
    const uint32_t r = abs + 0xfff + ((abs >> 13) & 1);
    return uint16_t(sign | (((r >> 13) - (112u << 10)) & 0x7fff));
}

__device__ __forceinline__ float sigmoidf_dev(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float siluf_dev(float x) {
    return x / (1.0f + expf(-x));
}

inline unsigned ceil_div(int64_t a, int64_t b) {
    return unsigned((a + b - 1) / b);
}

}  // namespace strata::cuda
