// f32 weights times f32 activations for a single group of more than 8 rows: a prompt's router. 16 activation rows x
// 32 weight rows a block of 128 threads, k in steps of 32 copied into shared memory by cp.async, three steps ahead
// of the one computed. The generic tiled kernel gave the 30B-A3B's router (512 rows x 128 experts, k = 2048) 16
// blocks of 64 rows, each waiting on its own loads: 221 us a layer on an H200, 16% of its pp512 pass.
//
// Each output is summed in fp32 in k order from zero by the expression k_mm_generic uses (acc += x * w), so the
// bits are that kernel's (test: CudaMatmulGeneric.F32FormIsTheTileListsBits). On by default (1.15-1.18x the 30B's
// pp512 on an H100, bench/RESULTS.md's twenty-fifth round); STRATA_CUDA_MM_F32=0 sends every f32 matrix to
// k_mm_generic.
#include "backend/cuda/matmul.cuh"

#include "backend/cuda/device_common.cuh"
#include "core/env.h"

namespace strata::cuda {

namespace {

constexpr int BM = 16, BN = 32, BK = 32, STAGES = 4;
// A row of a tile in shared memory, in floats: 16-byte aligned for cp.async, and 36 puts the 8 rows a float4 read
// of a warp's eighth touches on 8 distinct groups of 4 banks.
constexpr int LD = BK + 4;

__global__ __launch_bounds__(128) void k_mm_f32(MatmulArgs a) {
    __shared__ __align__(16) float xs[STAGES][BM][LD];
    __shared__ __align__(16) float ws[STAGES][BN][LD];
    const int tid = threadIdx.x;
    const MatmulGroup grp = a.single;
    const int row0 = int(blockIdx.x) * BM;
    const int64_t n0 = int64_t(blockIdx.y) * BN;

    // Copy roles: thread tid copies floats [4c, 4c + 4) of a k step for activation row lr and weight rows lr and
    // lr + 16 of the tile; rows past the matrices are zeros (their source clamped to row 0, never read).
    const int c = tid % 8, lr = tid / 8;
    const bool x_ok = row0 + lr < grp.n_rows;
    const float *xsrc = a.x + int64_t(grp.x_row0 + (x_ok ? row0 + lr : 0)) * a.x_stride + 4 * c;
    const float *w = static_cast<const float *>(grp.w);
    const int64_t w_stride = int64_t(a.row_bytes / 4);
    const bool w_ok0 = n0 + lr < a.n, w_ok1 = n0 + lr + 16 < a.n;
    const float *wsrc0 = w + (w_ok0 ? n0 + lr : 0) * w_stride + 4 * c;
    const float *wsrc1 = w + (w_ok1 ? n0 + lr + 16 : 0) * w_stride + 4 * c;
    auto copy = [&](int s, int64_t k0) {
        cp_async16(&xs[s][lr][4 * c], xsrc + k0, x_ok);
        cp_async16(&ws[s][lr][4 * c], wsrc0 + k0, w_ok0);
        cp_async16(&ws[s][lr + 16][4 * c], wsrc1 + k0, w_ok1);
    };

    // This thread's outputs: activation row ty, weight rows tx + 8 j.
    const int tx = tid % 8, ty = tid / 8;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int steps = int(a.k / BK);
    // Protocol: one commit group per step (empty past the last), so that before computing step t the groups of
    // steps up to t are complete when at most STAGES - 2 are in flight; the barrier after that wait also says every
    // thread has finished step t - 1, whose stage the copy of step t + STAGES - 1 then overwrites.
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < steps) copy(s, int64_t(s) * BK);
        cp_async_commit();
    }
    for (int t = 0; t < steps; t++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = t + STAGES - 1;
        if (next < steps) copy(next % STAGES, int64_t(next) * BK);
        cp_async_commit();
        const int s = t % STAGES;
#pragma unroll
        for (int q = 0; q < BK / 4; q++) {
            const float4 xv = *reinterpret_cast<const float4 *>(&xs[s][ty][4 * q]);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 wv = *reinterpret_cast<const float4 *>(&ws[s][tx + 8 * j][4 * q]);
                acc[j] += xv.x * wv.x;
                acc[j] += xv.y * wv.y;
                acc[j] += xv.z * wv.z;
                acc[j] += xv.w * wv.w;
            }
        }
    }
    const int r = row0 + ty;
    if (r >= grp.n_rows) return;
    float *yr = a.y + int64_t(grp.y_row0 + r) * a.y_stride;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int64_t n = n0 + tx + 8 * j;
        if (n < a.n) yr[n] = acc[j];
    }
}

bool aligned16(const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool mm_f32_applies(const MatmulArgs &a) {
    static const bool on = env_switch("STRATA_CUDA_MM_F32", true);
    return on && a.type == DType::F32 && !a.tiles && !a.groups && a.k % BK == 0 && a.x_stride % 4 == 0 &&
           a.row_bytes % 16 == 0 && aligned16(a.x) && aligned16(a.single.w) && a.n <= int64_t(65535) * BN &&
           a.single.n_rows > k_mmv_max_rows;
}

void launch_mm_f32(const MatmulArgs &a, cudaStream_t stream) {
    const dim3 grid(ceil_div(a.single.n_rows, BM), ceil_div(a.n, BN));
    k_mm_f32<<<grid, 128, 0, stream>>>(a);
    STRATA_CUDA_LAUNCH_CHECK("k_mm_f32");
}

}  // namespace strata::cuda
