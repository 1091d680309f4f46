// Each row's arg-max on the device (core/argmax.h's pick), so greedy decoding reads one id a row back instead of a
// vocabulary's row of logits (600 KB on the Qwen models, plus the host's scan of it). Two launches: blocks scan
// strided parts of a row, each keeping the best {value, index}; one warp a row then picks among the blocks' bests.
// The order (larger value, then lower index; a NaN never larger) is a total order on the candidates, so the pick does
// not depend on how the row is split: it is the first index of the largest value, as the host's scan gives.
#include "backend/cuda/argmax.cuh"

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int k_threads = 256, k_max_parts = 64;

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_best(float &bv, int &bi) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, off);
        const int i = __shfl_xor_sync(0xffffffffu, bi, off);
        if (better(v, i, bv, bi)) bv = v, bi = i;
    }
}

__global__ __launch_bounds__(k_threads) void k_argmax_parts(Rows x, float *part_v, int *part_i) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    const float *row = x.data + r * x.stride;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int64_t i = int64_t(blockIdx.x) * k_threads + threadIdx.x; i < x.cols; i += int64_t(gridDim.x) * k_threads) {
        const float v = row[i];
        if (better(v, int(i), bv, bi)) bv = v, bi = int(i);
    }
    warp_best(bv, bi);
    __shared__ float sv[k_threads / 32];
    __shared__ int si[k_threads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp) return;
    bv = lane < k_threads / 32 ? sv[lane] : -INFINITY;
    bi = lane < k_threads / 32 ? si[lane] : INT_MAX;
    warp_best(bv, bi);
    if (lane == 0) part_v[r * gridDim.x + blockIdx.x] = bv, part_i[r * gridDim.x + blockIdx.x] = bi;
}

__global__ void k_argmax_pick(Rows x, int n_parts, const float *part_v, const int *part_i, int32_t *ids) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.x;
    const int lane = threadIdx.x;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = lane; j < n_parts; j += 32)
        if (better(part_v[r * n_parts + j], part_i[r * n_parts + j], bv, bi))
            bv = part_v[r * n_parts + j], bi = part_i[r * n_parts + j];
    warp_best(bv, bi);
    if (lane == 0) ids[r] = isnan(x.data[r * x.stride]) || bi == INT_MAX ? 0 : bi;
}

}  // namespace

int argmax_parts(int64_t cols) {
    return int(std::clamp<int64_t>((cols + 8 * k_threads - 1) / (8 * k_threads), 1, k_max_parts));
}

void launch_argmax_rows(Rows x, float *part_v, int *part_i, int32_t *ids_dev, cudaStream_t stream) {
    if (x.rows == 0) return;
    STRATA_ASSERT(x.rows <= 65535 && x.cols > 0 && x.cols <= INT_MAX);
    const int parts = argmax_parts(x.cols);
    pdl_launch(k_argmax_parts, dim3(unsigned(parts), unsigned(x.rows)), k_threads, 0, stream, x, part_v, part_i);
    STRATA_CUDA_LAUNCH_CHECK("k_argmax_parts");
    pdl_launch(k_argmax_pick, dim3(unsigned(x.rows)), 32, 0, stream, x, parts, static_cast<const float *>(part_v),
               static_cast<const int *>(part_i), ids_dev);
    STRATA_CUDA_LAUNCH_CHECK("k_argmax_pick");
}

}  // namespace strata::cuda
