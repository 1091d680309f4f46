// The RMSNorm of one wide row by a block of 256 threads, each holding KPT float4s of it in registers (float4 i + j 256
// of the row in v[j], zeros past its end). k_rms_norm_wide (elementwise.cu) and the MoE tail (moe.cu) both end with it,
// so a residual step gives the same bits whichever kernel takes it.
#pragma once

#include "backend/cuda/device_common.cuh"

namespace strata::cuda {

// y = v / rms(v) * w over `group` columns: the sum of squares in f32 over a fixed tree, then v * scale * w.
template <int KPT>
__device__ __forceinline__ void rms_norm_wide_row(const float4 (&v)[KPT], const float4 (&wv)[KPT], int n4,
                                                  int64_t group, float eps, float *red, float4 *y) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        ss += v[j].x * v[j].x;
        ss += v[j].y * v[j].y;
        ss += v[j].z * v[j].z;
        ss += v[j].w * v[j].w;
    }
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / float(group) + eps);
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int i = int(threadIdx.x) + j * 256;
        if (i < n4)
            y[i] = make_float4(v[j].x * scale * wv[j].x, v[j].y * scale * wv[j].y, v[j].z * scale * wv[j].z,
                               v[j].w * scale * wv[j].w);
    }
}

}  // namespace strata::cuda
