// Generic tiled matmul for groups of more than 8 activation rows, every weight type: 64 activation rows x 64 weight
// rows per block, 4 x 4 outputs a thread, k in steps of 32; weights are dequantized exactly into shared memory,
// products summed in fp32 in k order by the same expression from zero. A single group of f32 weights (a prompt's
// router) goes to matmul_f32.cu's pipelined kernel, of the same bits, unless STRATA_CUDA_MM_F32=0.
#include "backend/cuda/matmul.cuh"

#include "backend/cuda/quant_device.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int BM = k_mm_tile_rows, BN = 64, BK = 32;

// Tiles are stored k-major (xs[k][row], ws[k][n]) so that each thread reads its 4 activation rows and 4 weight rows
// of a k step as two 16-byte loads; the padding keeps those loads aligned.
constexpr int PAD = 4;

template <DType T>
__global__ __launch_bounds__(256) void k_mm_generic(MatmulArgs a, IqGrids g) {
    constexpr int RT = BM / 16;  // activation rows a thread
    __shared__ __align__(16) float xs[BK][BM + PAD];
    __shared__ __align__(16) float ws[BK][BN + PAD];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int group = 0, row0 = int(blockIdx.x) * BM;
    if (a.tiles) {
        const int2 t = a.tiles[blockIdx.x];
        group = t.x;
        row0 = t.y;
    }
    const MatmulGroup grp = a.groups ? a.groups[group] : a.single;
    const int64_t n0 = int64_t(blockIdx.y) * BN;
    const uint8_t *w = static_cast<const uint8_t *>(grp.w);

    // Loader roles: thread tid fills row (tid / 4) of each tile, 8 consecutive k from (tid % 4) * 8.
    const int lr = tid / 4, lk = (tid % 4) * 8;
    const bool x_valid = row0 + lr < grp.n_rows;
    const float *xrow = a.x + int64_t(grp.x_row0 + row0 + lr) * a.x_stride;
    const bool w_valid = n0 + lr < a.n;
    const uint8_t *wrow = w + size_t(n0 + lr) * a.row_bytes;

    // This thread's outputs: activation rows ty * RT + i, weight rows tx * 4 + j.
    float acc[RT][4];
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    float xn[8], wn[8];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int64_t k = k0 + lk + u;
            xn[u] = x_valid && k < a.k ? xrow[k] : 0.0f;
            wn[u] = w_valid && k < a.k ? row_elem<T>(wrow, k, g) : 0.0f;
        }
    };
    for (int64_t k0 = 0; k0 < a.k; k0 += BK) {
        load(k0);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            xs[lk + u][lr] = xn[u];
            ws[lk + u][lr] = wn[u];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < BK; kk++) {
            const float4 xv = *reinterpret_cast<const float4 *>(&xs[kk][ty * 4]);
            const float xa[RT] = {xv.x, xv.y, xv.z, xv.w};
            const float4 wv = *reinterpret_cast<const float4 *>(&ws[kk][tx * 4]);
            const float wa[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int i = 0; i < RT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += xa[i] * wa[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < RT; i++) {
        const int r = row0 + ty * RT + i;
        if (r >= grp.n_rows) continue;
        float *yr = a.y + int64_t(grp.y_row0 + r) * a.y_stride;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t n = n0 + tx * 4 + j;
            if (n < a.n) yr[n] = acc[i][j];
        }
    }
}

}  // namespace

void launch_mm_generic(const MatmulArgs &a, cudaStream_t stream) {
    if (mm_f32_applies(a)) return launch_mm_f32(a, stream);
    const int64_t n_tiles = a.tiles ? a.n_tiles : (a.single.n_rows + BM - 1) / BM;
    if (n_tiles == 0 || a.n == 0) return;
    STRATA_ASSERT(a.n <= int64_t(65535) * BN);
    const IqGrids &g = iq_grids();
    const dim3 grid(unsigned(n_tiles), ceil_div(a.n, BN));
    // clang-format off
    switch (a.type) {
#define X(T_) \
    case DType::T_: \
        k_mm_generic<DType::T_><<<grid, 256, 0, stream>>>(a, g); \
        break;
        STRATA_CUDA_DTYPES(X)
#undef X
        default: fail("CUDA: no matmul kernel for %s", dtype_name(a.type));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_mm_generic");
}

}  // namespace strata::cuda
