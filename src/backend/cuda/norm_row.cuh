// The RMSNorm of one wide row by a block of 256 threads, each holding KPT float4s of it in registers (float4 i + j 256
// of the row in v[j], zeros past its end). k_rms_norm_wide (elementwise.cu) and the MoE tail (moe.cu) both end with it,
// so a residual step gives the same bits whichever kernel takes it.
#pragma once

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/elementwise.cuh"

namespace strata::cuda {

// Q8_0 levels of float4 i of the row (the 32 values of a block are 8 consecutive threads' float4s): the block's
// largest magnitude and the levels' sum over those 8 lanes (a maximum and a sum of integers: the same in any order, so
// the same bits as the warp-per-block kernel). Every lane of the warp takes part (active: i within the row).
__device__ __forceinline__ void q8_0_of(float4 y, bool active, int i, int8_t *q, float2 *ds) {
    float a = active ? fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w))) : 0.0f;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) a = fmaxf(a, __shfl_xor_sync(k_full_mask, a, o));
    const float d = __fdiv_rn(a, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    auto level = [&](float v) {
        const float s = __fmul_rn(v, id);
        return isnan(s) ? 0 : int(fminf(fmaxf(roundf(s), -128.0f), 127.0f));
    };
    const int q0 = level(y.x), q1 = level(y.y), q2 = level(y.z), q3 = level(y.w);
    int sum = active ? q0 + q1 + q2 + q3 : 0;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(k_full_mask, sum, o);
    if (!active) return;
    reinterpret_cast<char4 *>(q)[i] = make_char4(int8_t(q0), int8_t(q1), int8_t(q2), int8_t(q3));
    const float dr = f16_to_f32(f32_to_f16(d));
    if ((i & 7) == 0) ds[i / 8] = make_float2(dr, dr * float(sum));
}

// Q8_K levels of float4 i (the 256 values of a block are 64 consecutive threads': two warps, the pair of warps
// exchanging through pick): the value of largest magnitude, the first of equals by index (as the Q8_K kernels pick
// it; a total order, so the same in any order of comparing), then each 32-value sub-block's sum of levels.
// pick: 3 x 8 words of shared memory; the call holds a block barrier (every thread of the block calls it).
__device__ __forceinline__ void q8_k_of(float4 y, bool active, int i, int8_t *q, float2 *ds, float *pick) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float v[4] = {y.x, y.y, y.z, y.w};
    float amax = 0.0f, smax = 0.0f;
    int idx = 1 << 30;
    if (active)
#pragma unroll
        for (int c = 0; c < 4; c++)
            if (fabsf(v[c]) > amax) amax = fabsf(v[c]), smax = v[c], idx = 4 * (i & 63) + c;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(k_full_mask, amax, o), s2 = __shfl_xor_sync(k_full_mask, smax, o);
        const int i2 = __shfl_xor_sync(k_full_mask, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) amax = a2, smax = s2, idx = i2;
    }
    float *pa = pick, *ps = pick + 8;
    int *pi = reinterpret_cast<int *>(pick + 16);
    if (lane == 0) pa[warp] = amax, ps[warp] = smax, pi[warp] = idx;
    __syncthreads();
    const int other = warp ^ 1;  // the block's other warp
    if (pa[other] > amax || (pa[other] == amax && pi[other] < idx)) amax = pa[other], smax = ps[other], idx = pi[other];
    __syncthreads();  // pick is reused by the next call
    const float iscale = smax != 0.0f ? __fdiv_rn(-127.0f, smax) : 0.0f;
    const float d = smax != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
    int lv[4], sum = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const float sc = __fmul_rn(iscale, v[c]);
        lv[c] = smax == 0.0f ? 0 : !(sc > -128.0f) ? -128 : sc >= 127.0f ? 127 : int(rintf(sc));
        sum += active ? lv[c] : 0;
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(k_full_mask, sum, o);
    if (!active) return;
    reinterpret_cast<char4 *>(q)[i] = make_char4(int8_t(lv[0]), int8_t(lv[1]), int8_t(lv[2]), int8_t(lv[3]));
    if ((i & 7) == 0) ds[i / 8] = make_float2(d, d * float(sum));
}

// y = v / rms(v) * w over `group` columns: the sum of squares in f32 over a fixed tree, then v * scale * w; with
// q8.form set, the row's 8-bit form too (group a multiple of 32 for form 1, of 256 for form 2; pick: 24 words of
// shared memory for form 2).
// Row r's float4s i + j 256 of x + y (y null: of x) and of w into v and wv (zeros past n4), the sum as k_rms_norm_wide
// forms a residual step's.
template <int KPT>
__device__ __forceinline__ void wide_row_load(const float *x, const float *y, const float *w, int n4, float4 (&v)[KPT],
                                              float4 (&wv)[KPT]) {
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int i = int(threadIdx.x) + j * 256;
        v[j] = wv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n4) {
            v[j] = reinterpret_cast<const float4 *>(x)[i];
            wv[j] = reinterpret_cast<const float4 *>(w)[i];
            if (y) {
                const float4 b = reinterpret_cast<const float4 *>(y)[i];
                v[j].x = v[j].x + b.x, v[j].y = v[j].y + b.y, v[j].z = v[j].z + b.z, v[j].w = v[j].w + b.w;
            }
        }
    }
}

// 1 / rms of the row whose float4 i + j 256 thread threadIdx.x holds in v[j] (zeros past its end): the sum of squares
// in f32 over a fixed tree (every thread of the block of 256 calls it; a block barrier).
template <int KPT>
__device__ __forceinline__ float rms_scale_wide(const float4 (&v)[KPT], int64_t group, float eps, float *red) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        ss += v[j].x * v[j].x;
        ss += v[j].y * v[j].y;
        ss += v[j].z * v[j].z;
        ss += v[j].w * v[j].w;
    }
    ss = block_sum(ss, red);
    return 1.0f / sqrtf(ss / float(group) + eps);
}

// One value of the normed row: v * scale * w, as rms_norm_wide_row writes each.
__device__ __forceinline__ float rms_normed(float v, float scale, float w) {
    return v * scale * w;
}

template <int KPT>
__device__ __forceinline__ void rms_norm_wide_row(const float4 (&v)[KPT], const float4 (&wv)[KPT], int n4,
                                                  int64_t group, float eps, float *red, float4 *y,
                                                  const NormQ8 &q8 = {}, float *pick = nullptr) {
    const float scale = rms_scale_wide<KPT>(v, group, eps, red);
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int i = int(threadIdx.x) + j * 256;
        const float4 o = make_float4(rms_normed(v[j].x, scale, wv[j].x), rms_normed(v[j].y, scale, wv[j].y),
                                     rms_normed(v[j].z, scale, wv[j].z), rms_normed(v[j].w, scale, wv[j].w));
        if (i < n4) y[i] = o;
        if (q8.form == 1)
            q8_0_of(o, i < n4, i, q8.q, q8.ds);
        else if (q8.form == 2)
            q8_k_of(o, i < n4, i, q8.q, q8.ds, pick);
    }
}

}  // namespace strata::cuda
