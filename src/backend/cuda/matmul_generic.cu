// Generic mat-vec kernel (groups of <= 8 activation rows, every weight type) and the activation round trip through
// the CPU reference's activation formats, which makes the generic path compute the reference's function.
#include "backend/cuda/matmul.cuh"

#include <algorithm>

#include "backend/cuda/mmv_split.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quant_device.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

// ---- activation round trip ------------------------------------------------------------------------------------

// Q8_0 / Q8_1 values as format/quant.h produces them: d = amax / 127, q = round half away (x * (1 / d)), value
// q * fp16(d). One warp per 32-element block.
__global__ void k_round_trip_q8_0(const float *x, int64_t x_stride, int64_t k, float *out) {
    const int64_t r = blockIdx.y;
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (blk * 32 >= k) return;
    const float v = x[r * x_stride + blk * 32 + lane];
    const float amax = warp_max(fabsf(v));  // fmaxf ignores NaN, as the reference's fmax does
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float s = __fmul_rn(v, id);
    // through an integer, as the reference stores it: -0.5 < s < 0 gives +0, not -0
    const int q = isnan(s) ? 0 : int(fminf(fmaxf(roundf(s), -128.0f), 127.0f));
    out[r * k + blk * 32 + lane] = __fmul_rn(float(q), f16_to_f32(f32_to_f16(d)));
}

// Q8_K: the signed value of largest magnitude (the first on ties) maps to -127; q = round half even, clamped; value
// (1 / iscale) * q. One warp per 256-element block, eight elements per lane.
__global__ void k_round_trip_q8_k(const float *x, int64_t x_stride, int64_t k, float *out) {
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
    float *ob = out + r * k + blk * 256;
    if (smax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) ob[i * 32 + lane] = 0.0f;
        return;
    }
    const float iscale = __fdiv_rn(-127.0f, smax), d = __fdiv_rn(1.0f, iscale);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float s = __fmul_rn(iscale, v[i]);
        const int q = !(s > -128.0f) ? -128 : s >= 127.0f ? 127 : int(rintf(s));
        ob[i * 32 + lane] = __fmul_rn(d, float(q));
    }
}

__global__ void k_copy_rows(const float *x, int64_t x_stride, int64_t k, float *out) {
    const int64_t r = blockIdx.y;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < k; i += int64_t(gridDim.x) * blockDim.x)
        out[r * k + i] = x[r * x_stride + i];
}

// ---- generic mat-vec --------------------------------------------------------------------------------------------

constexpr int k_mmv_warps = 8;  // weight rows per block, one warp each

template <DType T>
__global__ __launch_bounds__(k_mmv_warps * 32) void k_mmv_generic(MatmulArgs a, IqGrids g) {
    pdl_wait();
    pdl_release();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t n = int64_t(blockIdx.x) * k_mmv_warps + warp;
    if (n >= a.n) return;
    const MatmulGroup grp = a.groups ? a.groups[blockIdx.y] : a.single;
    const int rows = grp.n_rows;
    const uint8_t *wrow = static_cast<const uint8_t *>(grp.w) + size_t(n) * a.row_bytes;
    const float *x = a.x + int64_t(grp.x_row0) * a.x_stride;
    float acc[k_mmv_max_rows];
#pragma unroll
    for (int t = 0; t < k_mmv_max_rows; t++) acc[t] = 0.0f;
        // Unrolled so that several weight loads are in flight: a small matrix (a router) has too few rows to hide
        // their latency with other warps.
#pragma unroll 8
    for (int64_t k = lane; k < a.k; k += 32) {
        const float w = row_elem<T>(wrow, k, g);
#pragma unroll
        for (int t = 0; t < k_mmv_max_rows; t++)
            if (t < rows) acc[t] += w * x[t * a.x_stride + k];
    }
#pragma unroll
    for (int t = 0; t < k_mmv_max_rows; t++) {
        if (t >= rows) break;
        const float s = warp_sum(acc[t]);
        if (lane == 0) a.y[int64_t(grp.y_row0 + t) * a.y_stride + n] = s;
    }
}

// Matrices with few rows (routers): a block per weight row and group, its threads over k, so that enough loads are
// in flight to stream the matrix at memory speed.
template <DType T>
__global__ __launch_bounds__(k_mmv_split_threads) void k_mmv_split(MatmulArgs a, IqGrids g) {
    pdl_wait();
    pdl_release();
    __shared__ float red[32];
    mmv_split_row<T>(a, a.groups ? a.groups[blockIdx.y] : a.single, blockIdx.x, g, red);
}

}  // namespace

void launch_act_round_trip(DType vt, const float *x, int64_t x_stride, int64_t rows, int64_t k, float *out,
                           cudaStream_t stream) {
    // more rows than a grid's y takes: slices of 65535
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
        const unsigned n = unsigned(std::min<int64_t>(65535, rows - r0));
        const float *xs = x + r0 * x_stride;
        float *os = out + r0 * k;
        switch (vt) {
            case DType::F32:
                k_copy_rows<<<dim3(std::min<unsigned>(ceil_div(k, 256), 32), n), 256, 0, stream>>>(xs, x_stride, k, os);
                break;
            case DType::Q8_0:
            case DType::Q8_1:
                STRATA_ASSERT(k % 32 == 0);
                k_round_trip_q8_0<<<dim3(ceil_div(k / 32, 8), n), 256, 0, stream>>>(xs, x_stride, k, os);
                break;
            case DType::Q8_K:
                STRATA_ASSERT(k % 256 == 0);
                k_round_trip_q8_k<<<dim3(ceil_div(k / 256, 4), n), 128, 0, stream>>>(xs, x_stride, k, os);
                break;
            default:
                fail("CUDA: no activation round trip through %s", dtype_name(vt));
        }
        STRATA_CUDA_LAUNCH_CHECK("act_round_trip");
    }
}

void launch_mmv_generic(const MatmulArgs &a, cudaStream_t stream) {
    if (a.n_groups == 0 || a.n == 0) return;
    STRATA_ASSERT(a.n_groups <= 65535);
    const IqGrids &g = iq_grids();
    const bool split = mmv_split_applies(a.n, a.k);
    const dim3 grid(split ? unsigned(a.n) : ceil_div(a.n, k_mmv_warps), unsigned(a.n_groups));
    // clang-format off
    switch (a.type) {
#define X(T_)                                                                                    \
    case DType::T_:                                                                              \
        if (split) pdl_launch(k_mmv_split<DType::T_>, grid, k_mmv_split_threads, 0, stream, a, g);       \
        else pdl_launch(k_mmv_generic<DType::T_>, grid, k_mmv_warps * 32, 0, stream, a, g);              \
        break;
        STRATA_CUDA_DTYPES(X)
#undef X
        default: fail("CUDA: no matmul kernel for %s", dtype_name(a.type));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_mmv_generic");
}

}  // namespace strata::cuda
