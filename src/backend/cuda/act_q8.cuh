// The Q8_0 activation form (k_quantize_act_q8_0's levels and scales) made by a kernel as it writes the values, for
// the mat-vec that reads them next (NormQ8 form 1): a warp whose lanes hold R consecutive values each, 32 / R lanes a
// 32-value block. Included by .cu files only.
#pragma once

#include "backend/cuda/device_common.cuh"

namespace strata::cuda {

// v: the lane's R values at columns col..col + R - 1 of a row (col a multiple of R, the lanes of a block consecutive);
// q, ds: that row's levels and scales. The block's largest magnitude (NaNs aside, NaN only where all are) and the sum
// of its levels are taken by shuffles over the block's lanes: a maximum and a sum of integers, the same in any order,
// so the same bytes as the warp-per-block kernel. Every lane of the warp takes part.
template <int R>
__device__ __forceinline__ void q8_0_lanes(const float (&v)[R], int64_t col, int8_t *q, float2 *ds) {
    static_assert(R >= 1 && R <= 32 && 32 % R == 0, "a block is whole lanes");
    constexpr int G = 32 / R;  // lanes a block
    float a = fabsf(v[0]);
#pragma unroll
    for (int r = 1; r < R; r++) a = fmaxf(a, fabsf(v[r]));
#pragma unroll
    for (int o = 1; o < G; o <<= 1) a = fmaxf(a, __shfl_xor_sync(k_full_mask, a, o));
    const float d = __fdiv_rn(a, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int sum = 0;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float s = __fmul_rn(v[r], id);
        const int l = isnan(s) ? 0 : int(fminf(fmaxf(roundf(s), -128.0f), 127.0f));
        q[col + r] = int8_t(l);
        sum += l;
    }
#pragma unroll
    for (int o = 1; o < G; o <<= 1) sum += __shfl_xor_sync(k_full_mask, sum, o);
    const float dr = f16_to_f32(f32_to_f16(d));
    if (col % 32 == 0) ds[col / 32] = make_float2(dr, dr * float(sum));
}

}  // namespace strata::cuda
