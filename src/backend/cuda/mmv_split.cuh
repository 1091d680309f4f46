// The split mat-vec's work for one weight row (matrices of few, long rows: routers): a block's threads over k, one
// fp32 sum per activation row in a fixed order. Shared by the generic mat-vec (matmul_generic.cu) and the router's
// one-launch form (moe.cu), so that a logit has the same bits from either. Included by .cu files only.
#pragma once

#include "backend/cuda/matmul.cuh"
#include "backend/cuda/quant_device.cuh"

namespace strata::cuda {

constexpr int k_mmv_split_threads = 256;

// The block's sums of rows [0, n) of acc into column n of y's rows y_row0.. (thread 0 writes). MAXT 1: the one row's,
// with acc in registers (the loop over a run-time count of rows indexes acc at run time, which puts it in local
// memory).
template <int MAXT>
__device__ __forceinline__ void mmv_split_put(const MatmulArgs &a, const MatmulGroup &grp, int64_t n,
                                              const float (&acc)[MAXT], float *red) {
    if constexpr (MAXT == 1) {
        const float s = block_sum(acc[0], red);
        if (threadIdx.x == 0) a.y[int64_t(grp.y_row0) * a.y_stride + n] = s;
        __syncthreads();
    } else {
        for (int t = 0; t < grp.n_rows; t++) {
            const float s = block_sum(acc[t], red);
            if (threadIdx.x == 0) a.y[int64_t(grp.y_row0 + t) * a.y_stride + n] = s;
            __syncthreads();  // red is reused by the next row's sum
        }
    }
}

// Row n of grp's weight times its activation rows, into y (thread 0 writes). red: 32 floats of shared memory. MAXT:
// the most activation rows (1: a decoding token's, fewer registers and instructions; the same sums).
template <DType T, int MAXT = k_mmv_max_rows>
__device__ __forceinline__ void mmv_split_row(const MatmulArgs &a, const MatmulGroup &grp, int64_t n, const IqGrids &g,
                                              float *red) {
    const uint8_t *wrow = static_cast<const uint8_t *>(grp.w) + size_t(n) * a.row_bytes;
    const float *x = a.x + int64_t(grp.x_row0) * a.x_stride;
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < a.k; k += k_mmv_split_threads) {
        const float w = row_elem<T>(wrow, k, g);
#pragma unroll
        for (int t = 0; t < MAXT; t++)
            if (t < grp.n_rows) acc[t] = __fmaf_rn(w, x[t * a.x_stride + k], acc[t]);
    }
    mmv_split_put<MAXT>(a, grp, n, acc, red);
}

// The same row with its weights loaded beforehand (w[i] = element threadIdx.x + i k_mmv_split_threads of the row, 0
// past its end; rows of at most PRE k_mmv_split_threads elements): the same products in the same order, so the same
// bits, with the weights' loads free to run before the kernel's wait for its input (pdl.cuh).
template <int PRE, int MAXT = k_mmv_max_rows>
__device__ __forceinline__ void mmv_split_row_loaded(const MatmulArgs &a, const MatmulGroup &grp, int64_t n,
                                                     const float (&w)[PRE], float *red) {
    const float *x = a.x + int64_t(grp.x_row0) * a.x_stride;
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
#pragma unroll
    for (int i = 0; i < PRE; i++) {
        const int64_t k = threadIdx.x + int64_t(i) * k_mmv_split_threads;
        if (k >= a.k) break;
#pragma unroll
        for (int t = 0; t < MAXT; t++)
            if (t < grp.n_rows) acc[t] = __fmaf_rn(w[i], x[t * a.x_stride + k], acc[t]);
    }
    mmv_split_put<MAXT>(a, grp, n, acc, red);
}

}  // namespace strata::cuda
