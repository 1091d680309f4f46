// Device helpers shared by the kernels: warp and block reductions in a fixed order (results never depend on timing),
// unaligned little-endian loads for packed blocks, fp16 conversions that equal core/fp16.h bit for bit, and
// asynchronous copies to shared memory (cp.async, sm_80 and later). Included by .cu files only.
#pragma once

#include <cuda_fp16.h>
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
// The hardware's conversions (one instruction each; exact for every half, subnormals included, and round to nearest
// even the other way), with a NaN's payload kept as core/fp16.h keeps it by a select, so the bits are the host's.
// Written by hand, as the host form is, these conversions were most of the decode attention kernels' code.

// IEEE half bits to float, NaN payloads kept (as core/fp16.h's f16_to_f32).
__device__ __forceinline__ float f16_to_f32(uint32_t h) {
    const float hw = __half2float(__ushort_as_half(uint16_t(h)));
    const uint32_t nan = ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13);
    return (h & 0x7fffu) > 0x7c00u ? __uint_as_float(nan) : hw;
}

// For values that only enter arithmetic: the device's arithmetic gives one canonical NaN whatever NaN went in, so the
// payload's select would change no result.
__device__ __forceinline__ float f16_to_f32_arith(uint32_t h) {
    return __half2float(__ushort_as_half(uint16_t(h)));
}

__device__ __forceinline__ float ld_f16(const uint8_t *p) {
    return f16_to_f32(ld_u16(p));
}

// Float to half bits, round to nearest even (as core/fp16.h's f32_to_f16).
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    const uint16_t hw = __half_as_ushort(__float2half_rn(f));
    const uint32_t u = __float_as_uint(f);
    const uint16_t nan = uint16_t(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : hw;
}

__device__ __forceinline__ float sigmoidf_dev(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float siluf_dev(float x) {
    return x / (1.0f + expf(-x));
}

// The NeoX rotation of the pair (a, b) (elements i and i + half of a head) by the angle whose cosine and sine are cs
// and sn: {a cs - b sn, b cs + a sn}, every rounding spelled out, so that each kernel that rotates gives the same bits
// (left to the compiler, the contraction into fused multiply-adds followed each kernel's code shape: the q/k norm's
// launch and k_rope_neox gave different bits).
__device__ __forceinline__ float2 rope_pair(float a, float b, float cs, float sn) {
    return make_float2(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)), __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
}

// ---- cp.async (sm_80 and later) ----------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return uint32_t(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, asynchronously, bypassing L1; zeros where !valid (src is then not read, but
// must still be a valid address).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}

// 4 bytes likewise, through L1.
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}

// 8 bytes likewise, through L1.
__device__ __forceinline__ void cp_async8(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 8 : 0));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

inline unsigned ceil_div(int64_t a, int64_t b) {
    return unsigned((a + b - 1) / b);
}

}  // namespace strata::cuda
