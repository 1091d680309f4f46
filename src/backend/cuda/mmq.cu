// Quantized matrix-matrix products (prefill and large expert groups) on the tensor cores: weights stay packed in
// global memory and are unpacked tile by tile into int8 (qv_device.cuh), activations are the 8-bit rows of
// launch_quantize_act, and each 32-element sub-block is an int8 MMA (mma.sync m16n8k32, or two m16n8k16 halves where
// a type scales every 16 elements) whose integer sums are scaled into fp32 accumulators:
//   y[t, n] += dx[t] * (scale[n] * dot(n, t)) + off[n] * (dx * sum q)[t]
// which is the function the mat-vec kernels and the reference compute, float rounding apart.
//
// A block computes 128 weight rows x 64 activation rows of one group (the tile list of launch_mm_generic), k in
// steps of 4 sub-blocks: 8 warps, each 32 weight rows x 32 activation rows (2 x 4 MMA tiles).
#include "backend/cuda/matmul.cuh"

#include "backend/cuda/qv_device.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

using qv::QV;
using qv::WSub;

constexpr int MW = 128;                  // weight rows per block
constexpr int MT = k_mm_tile_rows;       // activation rows per block
constexpr int MS = 4;                    // 32-element sub-blocks per k step
constexpr int ROW_BYTES = MS * 32 + 16;  // shared-memory row pitch: rows 8 apart land 4 banks apart
constexpr int THREADS = 256;

// Types whose scale changes every 16 elements (the others have one scale per 32-element sub-block).
template <DType T>
constexpr bool k_per16 = T == DType::Q6_K || T == DType::IQ1_M;

__device__ __forceinline__ void mma_k32(int c[4], const int a[4], const int b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_k16(int c[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// One sub-block of a weight row into shared memory: 32 int8 values, the scales of its two 16-element halves and
// its offset. IQ1_M's +-1/8 deltas become integers: (g + delta) = (8 g +- 1) / 8, with the 1/8 moved to the scale.
template <DType T>
__device__ __forceinline__ void unpack_weight(const uint8_t *row, int sb, int *q, float2 &sc, float &off,
                                              const IqGrids &g) {
    WSub w;
    QV<T>::load(row, sb, w, g);
    if constexpr (T == DType::IQ1_M) {
#pragma unroll
        for (int l = 0; l < 4; l++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t v8 = (uint32_t(w.q[2 * l + h]) << 3) & 0xf8f8f8f8u;
                q[2 * l + h] = int((w.delta_neg >> l) & 1 ? __vsub4(v8, 0x01010101u) : __vadd4(v8, 0x01010101u));
            }
        sc = make_float2(__fmul_rn(w.scale[0], 0.125f), __fmul_rn(w.scale[2], 0.125f));
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = w.q[i];
        sc = make_float2(w.scale[0], w.scale[2]);
    }
    off = w.off;
}

template <DType T>
__global__ __launch_bounds__(THREADS) void k_mmq(MatmulArgs a, IqGrids g) {
    __shared__ __align__(16) uint8_t wq[MW * ROW_BYTES];
    __shared__ __align__(16) uint8_t xq[MT * ROW_BYTES];
    __shared__ float2 wsc[MW][MS];
    __shared__ float woff[MW][MS];
    __shared__ float2 xds[MT][MS];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    int group = 0, row0 = int(blockIdx.x) * MT;
    if (a.tiles) {
        const int2 t = a.tiles[blockIdx.x];
        group = t.x;
        row0 = t.y;
    }
    const MatmulGroup grp = a.groups ? a.groups[group] : a.single;
    const int64_t n0 = int64_t(blockIdx.y) * MW;
    const int n_tok = min(MT, grp.n_rows - row0);
    const uint8_t *w = static_cast<const uint8_t *>(grp.w);
    const int64_t n_sub = a.k / 32;

    // Warp tile: weight rows [ww, ww + 32), activation rows [wt, wt + 32).
    const int ww = (warp % 4) * 32, wt = (warp / 4) * 32;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    for (int64_t s0 = 0; s0 < n_sub; s0 += MS) {
        // Weights: MW rows x MS sub-blocks, one (row, sub-block) per thread and pass.
#pragma unroll
        for (int p = 0; p < MW * MS / THREADS; p++) {
            const int i = tid + p * THREADS, r = i / MS, s = i % MS;
            int q[8];
            float2 sc = make_float2(0.0f, 0.0f);
            float off = 0.0f;
            if (n0 + r < a.n && s0 + s < n_sub) {
                unpack_weight<T>(w + size_t(n0 + r) * a.row_bytes, int(s0 + s), q, sc, off, g);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) q[j] = 0;
            }
            int4 *dst = reinterpret_cast<int4 *>(wq + r * ROW_BYTES + s * 32);
            dst[0] = make_int4(q[0], q[1], q[2], q[3]);
            dst[1] = make_int4(q[4], q[5], q[6], q[7]);
            wsc[r][s] = sc;
            woff[r][s] = off;
        }
        // Activations: MT rows x MS * 32 bytes in 16-byte pieces, and their per-sub-block {d, d * sum}.
#pragma unroll
        for (int p = 0; p < MT * MS * 2 / THREADS; p++) {
            const int i = tid + p * THREADS, r = i / (MS * 2), c = i % (MS * 2);
            const int64_t s = s0 + c / 2;
            int4 v = make_int4(0, 0, 0, 0);
            if (r < n_tok && s < n_sub)
                v = *reinterpret_cast<const int4 *>(a.xq + int64_t(grp.x_row0 + row0 + r) * a.k + s0 * 32 + c * 16);
            *reinterpret_cast<int4 *>(xq + r * ROW_BYTES + c * 16) = v;
        }
        for (int i = tid; i < MT * MS; i += THREADS) {
            const int r = i / MS, s = i % MS;
            xds[r][s] = r < n_tok && s0 + s < n_sub ? a.xds[int64_t(grp.x_row0 + row0 + r) * n_sub + s0 + s]
                                                    : make_float2(0.0f, 0.0f);
        }
        __syncthreads();

#pragma unroll
        for (int s = 0; s < MS; s++) {
            int af[2][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const uint8_t *r0 = wq + (ww + 16 * i + gid) * ROW_BYTES + s * 32 + tig * 4;
                const uint8_t *r1 = r0 + 8 * ROW_BYTES;
                af[i][0] = *reinterpret_cast<const int *>(r0);
                af[i][1] = *reinterpret_cast<const int *>(r1);
                af[i][2] = *reinterpret_cast<const int *>(r0 + 16);
                af[i][3] = *reinterpret_cast<const int *>(r1 + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint8_t *t0 = xq + (wt + 8 * j + gid) * ROW_BYTES + s * 32 + tig * 4;
                bf[j][0] = *reinterpret_cast<const int *>(t0);
                bf[j][1] = *reinterpret_cast<const int *>(t0 + 16);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int rA = ww + 16 * i + gid, rB = rA + 8;
                const float2 scA = wsc[rA][s], scB = wsc[rB][s];
                const float offA = woff[rA][s], offB = woff[rB][s];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int tA = wt + 8 * j + 2 * tig;
                    const float2 dA = xds[tA][s], dB = xds[tA + 1][s];
                    if constexpr (k_per16<T>) {
                        int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                        mma_k16(lo, af[i][0], af[i][1], bf[j][0]);
                        mma_k16(hi, af[i][2], af[i][3], bf[j][1]);
                        const float sA0 = scA.x * float(lo[0]) + scA.y * float(hi[0]);
                        const float sA1 = scA.x * float(lo[1]) + scA.y * float(hi[1]);
                        const float sB0 = scB.x * float(lo[2]) + scB.y * float(hi[2]);
                        const float sB1 = scB.x * float(lo[3]) + scB.y * float(hi[3]);
                        acc[i][j][0] += dA.x * sA0 + offA * dA.y;
                        acc[i][j][1] += dB.x * sA1 + offA * dB.y;
                        acc[i][j][2] += dA.x * sB0 + offB * dA.y;
                        acc[i][j][3] += dB.x * sB1 + offB * dB.y;
                    } else {
                        int c[4] = {0, 0, 0, 0};
                        mma_k32(c, af[i], bf[j]);
                        acc[i][j][0] += dA.x * (scA.x * float(c[0])) + offA * dA.y;
                        acc[i][j][1] += dB.x * (scA.x * float(c[1])) + offA * dB.y;
                        acc[i][j][2] += dA.x * (scB.x * float(c[2])) + offB * dA.y;
                        acc[i][j][3] += dB.x * (scB.x * float(c[3])) + offB * dB.y;
                    }
                }
            }
        }
        __syncthreads();
    }

    // C fragment: element e of tile (i, j) is weight row ww + 16 i + gid (+ 8 for e >= 2), activation row
    // wt + 8 j + 2 tig (+ 1 for odd e).
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t n = n0 + ww + 16 * i + gid + (e >= 2 ? 8 : 0);
                const int t = wt + 8 * j + 2 * tig + (e & 1);
                if (n < a.n && t < n_tok) a.y[int64_t(grp.y_row0 + row0 + t) * a.y_stride + n] = acc[i][j][e];
            }
}

}  // namespace

bool mmq_supported(DType t) {
    return mmvq_supported(t);
}

void launch_mmq(const MatmulArgs &a, cudaStream_t stream) {
    const int64_t n_tiles = a.tiles ? a.n_tiles : (a.single.n_rows + MT - 1) / MT;
    if (n_tiles == 0 || a.n == 0) return;
    STRATA_ASSERT(a.k % 32 == 0 && a.n <= int64_t(65535) * MW);
    const IqGrids &g = iq_grids();
    const dim3 grid(unsigned(n_tiles), ceil_div(a.n, MW));
    // clang-format off
    switch (a.type) {
#define X(T_) \
    case DType::T_: k_mmq<DType::T_><<<grid, THREADS, 0, stream>>>(a, g); break;
        X(Q8_0) X(Q4_0) X(MXFP4) X(IQ4_XS) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ2_XXS) X(IQ1_M)
#undef X
        default: fail("CUDA: no quantized matrix kernel for %s", dtype_name(a.type));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_mmq");
}

}  // namespace strata::cuda
