// Quantized matrix-matrix products (prefill and large expert groups) on the tensor cores: weights stay packed in
// global memory and are unpacked tile by tile into int8 (qv_device.cuh), activations are the 8-bit rows of
// launch_quantize_act, and each 32-element sub-block is an int8 MMA (mma.sync m16n8k32, or two m16n8k16 halves where
// a type scales every 16 elements) whose integer sums are scaled into fp32 accumulators:
//   y[t, n] += dx[t] * (scale[n] * dot(n, t)) + off[n] * (dx * sum q)[t]
// which is the function the mat-vec kernels and the reference compute, float rounding apart.
//
// A block computes 128 weight rows x MT activation rows of one group, k in steps of 4 sub-blocks: 8 warps, each 32
// weight rows x MT / 2 activation rows (2 x MT / 16 MMA tiles). Forms of one kernel:
//   - Plain: MT = 64, a k step loaded and then computed; one tile of launch_mm_generic's list (a group's rows in
//     64-row tiles: the experts) or of a single group;
//   - Narrow: MT = 64, the next k step's weights and activations loaded into registers while the tensor cores work
//     on this one (loads issued before the MMAs, stored to shared memory after them);
//   - Wide: MT = 128 and pipelined like Narrow, for a single large group (the dense matrices of a prompt): each
//     weight tile unpacked once for twice the rows.
// Every output element sums its sub-blocks in k order with the same code (mmq_step), so every form gives the same
// bits (the choice and its switches: launch_mmq).
#include "backend/cuda/matmul.cuh"

#include "backend/cuda/qv_device.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

using qv::QV;
using qv::WSub;

constexpr int MW = 128;                  // weight rows per block
constexpr int MS = 4;                    // 32-element sub-blocks per k step
constexpr int ROW_BYTES = MS * 32 + 16;  // shared-memory row pitch: rows 8 apart land 4 banks apart
constexpr int THREADS = 256;
constexpr int k_wide_rows = 128;         // activation rows per block of the single-group form
static_assert(k_mm_tile_rows == 64, "the tile list's rows are the narrow form's");

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

// One sub-block of a weight row: 32 int8 values, the scales of its two 16-element halves and its offset. IQ1_M's
// +-1/8 deltas become integers: (g + delta) = (8 g +- 1) / 8, with the 1/8 moved to the scale.
struct WUnit {
    int q[8];
    float2 sc;
    float off;
};

template <DType T>
__device__ __forceinline__ void unpack_weight(const uint8_t *row, int sb, WUnit &u, const IqGrids &g) {
    WSub w;
    QV<T>::load(row, sb, w, g);
    if constexpr (T == DType::IQ1_M) {
#pragma unroll
        for (int l = 0; l < 4; l++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t v8 = (uint32_t(w.q[2 * l + h]) << 3) & 0xf8f8f8f8u;
                u.q[2 * l + h] = int((w.delta_neg >> l) & 1 ? __vsub4(v8, 0x01010101u) : __vadd4(v8, 0x01010101u));
            }
        u.sc = make_float2(__fmul_rn(w.scale[0], 0.125f), __fmul_rn(w.scale[2], 0.125f));
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) u.q[i] = w.q[i];
        u.sc = make_float2(w.scale[0], w.scale[2]);
    }
    u.off = w.off;
}

// The shared-memory tiles of one k step.
template <int MT>
struct Tiles {
    uint8_t wq[MW * ROW_BYTES];
    uint8_t xq[MT * ROW_BYTES];
    float2 wsc[MW][MS];
    float woff[MW][MS];
    float2 xds[MT][MS];
};

// What one thread loads of a k step: PW weight units, PX 16-byte pieces of activations, PD activation scales.
template <int MT>
struct Loads {
    static constexpr int PW = MW * MS / THREADS, PX = MT * MS * 2 / THREADS, PD = (MT * MS + THREADS - 1) / THREADS;
    WUnit w[PW];
    int4 x[PX];
    float2 d[PD];
};

struct Where {
    const uint8_t *w;
    int64_t n0, n_sub;
    int n_tok;
    int64_t x_row;  // the block's first activation row in xq / xds
};

template <DType T, int MT>
__device__ __forceinline__ void load_step(const MatmulArgs &a, const Where &at, int64_t s0, Loads<MT> &l,
                                          const IqGrids &g) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int p = 0; p < Loads<MT>::PW; p++) {
        const int i = tid + p * THREADS, r = i / MS, s = i % MS;
        WUnit &u = l.w[p];
        if (at.n0 + r < a.n && s0 + s < at.n_sub) {
            unpack_weight<T>(at.w + size_t(at.n0 + r) * a.row_bytes, int(s0 + s), u, g);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) u.q[j] = 0;
            u.sc = make_float2(0.0f, 0.0f);
            u.off = 0.0f;
        }
    }
#pragma unroll
    for (int p = 0; p < Loads<MT>::PX; p++) {
        const int i = tid + p * THREADS, r = i / (MS * 2), c = i % (MS * 2);
        const int64_t s = s0 + c / 2;
        l.x[p] = r < at.n_tok && s < at.n_sub
                     ? *reinterpret_cast<const int4 *>(a.xq + (at.x_row + r) * a.k + s0 * 32 + c * 16)
                     : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < Loads<MT>::PD; p++) {
        const int i = tid + p * THREADS, r = i / MS, s = i % MS;
        l.d[p] = i < MT * MS && r < at.n_tok && s0 + s < at.n_sub ? a.xds[(at.x_row + r) * at.n_sub + s0 + s]
                                                                   : make_float2(0.0f, 0.0f);
    }
}

template <int MT>
__device__ __forceinline__ void store_step(const Loads<MT> &l, Tiles<MT> &sm) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int p = 0; p < Loads<MT>::PW; p++) {
        const int i = tid + p * THREADS, r = i / MS, s = i % MS;
        const WUnit &u = l.w[p];
        int4 *dst = reinterpret_cast<int4 *>(sm.wq + r * ROW_BYTES + s * 32);
        dst[0] = make_int4(u.q[0], u.q[1], u.q[2], u.q[3]);
        dst[1] = make_int4(u.q[4], u.q[5], u.q[6], u.q[7]);
        sm.wsc[r][s] = u.sc;
        sm.woff[r][s] = u.off;
    }
#pragma unroll
    for (int p = 0; p < Loads<MT>::PX; p++) {
        const int i = tid + p * THREADS, r = i / (MS * 2), c = i % (MS * 2);
        *reinterpret_cast<int4 *>(sm.xq + r * ROW_BYTES + c * 16) = l.x[p];
    }
#pragma unroll
    for (int p = 0; p < Loads<MT>::PD; p++) {
        const int i = tid + p * THREADS;
        if (i < MT * MS) sm.xds[i / MS][i % MS] = l.d[p];
    }
}

// The MMAs of one k step into a warp's accumulators (weight rows [ww, ww + 32), activation rows [wt, wt + 8 J)).
template <DType T, int MT, int J>
__device__ __forceinline__ void mmq_step(const Tiles<MT> &sm, int ww, int wt, float (&acc)[2][J][4]) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int s = 0; s < MS; s++) {
        int af[2][4], bf[J][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint8_t *r0 = sm.wq + (ww + 16 * i + gid) * ROW_BYTES + s * 32 + tig * 4;
            const uint8_t *r1 = r0 + 8 * ROW_BYTES;
            af[i][0] = *reinterpret_cast<const int *>(r0);
            af[i][1] = *reinterpret_cast<const int *>(r1);
            af[i][2] = *reinterpret_cast<const int *>(r0 + 16);
            af[i][3] = *reinterpret_cast<const int *>(r1 + 16);
        }
#pragma unroll
        for (int j = 0; j < J; j++) {
            const uint8_t *t0 = sm.xq + (wt + 8 * j + gid) * ROW_BYTES + s * 32 + tig * 4;
            bf[j][0] = *reinterpret_cast<const int *>(t0);
            bf[j][1] = *reinterpret_cast<const int *>(t0 + 16);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rA = ww + 16 * i + gid, rB = rA + 8;
            const float2 scA = sm.wsc[rA][s], scB = sm.wsc[rB][s];
            const float offA = sm.woff[rA][s], offB = sm.woff[rB][s];
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int tA = wt + 8 * j + 2 * tig;
                const float2 dA = sm.xds[tA][s], dB = sm.xds[tA + 1][s];
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
}

// PIPE: the next k step's loads issued before this step's MMAs (registers), stored after them.
template <DType T, int MT, bool PIPE>
__global__ __launch_bounds__(THREADS) void k_mmq(MatmulArgs a, IqGrids g) {
    constexpr int J = MT / 16;  // 8-row activation tiles per warp
    __shared__ __align__(16) Tiles<MT> sm;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    int group = 0, row0 = int(blockIdx.x) * MT;
    if (a.tiles) {
        const int2 t = a.tiles[blockIdx.x];
        group = t.x;
        row0 = t.y;
    }
    const MatmulGroup grp = a.groups ? a.groups[group] : a.single;
    const Where at{static_cast<const uint8_t *>(grp.w), int64_t(blockIdx.y) * MW, a.k / 32,
                   min(MT, grp.n_rows - row0), int64_t(grp.x_row0) + row0};

    // Warp tile: weight rows [ww, ww + 32), activation rows [wt, wt + MT / 2).
    const int ww = (warp % 4) * 32, wt = (warp / 4) * (MT / 2);
    float acc[2][J][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    Loads<MT> l;
    if constexpr (PIPE) {
        load_step<T, MT>(a, at, 0, l, g);
        store_step<MT>(l, sm);
    }
    for (int64_t s0 = 0; s0 < at.n_sub; s0 += MS) {
        if constexpr (!PIPE) {
            load_step<T, MT>(a, at, s0, l, g);
            store_step<MT>(l, sm);
        }
        __syncthreads();
        const bool more = PIPE && s0 + MS < at.n_sub;
        if (more) load_step<T, MT>(a, at, s0 + MS, l, g);
        mmq_step<T, MT, J>(sm, ww, wt, acc);
        __syncthreads();
        if (more) store_step<MT>(l, sm);
    }

    // C fragment: element e of tile (i, j) is weight row ww + 16 i + gid (+ 8 for e >= 2), activation row
    // wt + 8 j + 2 tig (+ 1 for odd e).
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t n = at.n0 + ww + 16 * i + gid + (e >= 2 ? 8 : 0);
                const int t = wt + 8 * j + 2 * tig + (e & 1);
                if (n < a.n && t < at.n_tok) a.y[int64_t(grp.y_row0 + row0 + t) * a.y_stride + n] = acc[i][j][e];
            }
}

// STRATA_CUDA_MMQ_WIDE=0: single groups in the Plain form. STRATA_CUDA_MMQ_PIPE=1: tile lists in the Narrow form
// (opt-in until measured: its registers leave one block per SM where Plain has two).
bool wide_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_WIDE", true);
    return on;
}
bool pipe_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_PIPE", false);
    return on;
}

template <int MT, bool PIPE>
void launch_form(const MatmulArgs &a, int64_t n_tiles, cudaStream_t stream) {
    const IqGrids &g = iq_grids();
    const dim3 grid(unsigned(n_tiles), ceil_div(a.n, MW));
    // clang-format off
    switch (a.type) {
#define X(T_) \
    case DType::T_: k_mmq<DType::T_, MT, PIPE><<<grid, THREADS, 0, stream>>>(a, g); break;
        X(Q8_0) X(Q4_0) X(MXFP4) X(IQ4_XS) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ2_XXS) X(IQ1_M)
#undef X
        default: fail("CUDA: no quantized matrix kernel for %s", dtype_name(a.type));
    }
    // clang-format on
}

}  // namespace

bool mmq_supported(DType t) {
    return mmvq_supported(t);
}

void launch_mmq(const MatmulArgs &a, cudaStream_t stream, MmqForm form) {
    if (a.n == 0) return;
    STRATA_ASSERT(a.k % 32 == 0 && a.n <= int64_t(65535) * MW);
    if (form == MmqForm::Auto)
        form = a.tiles ? (pipe_enabled() ? MmqForm::Narrow : MmqForm::Plain)
                       : (wide_enabled() ? MmqForm::Wide : MmqForm::Plain);
    if (form == MmqForm::Wide && a.tiles) form = MmqForm::Narrow;  // the tile list's tiles are 64 rows
    if (a.tiles) {
        if (a.n_tiles == 0) return;
        if (form == MmqForm::Plain) launch_form<64, false>(a, a.n_tiles, stream);
        else launch_form<64, true>(a, a.n_tiles, stream);
    } else {
        const int rows = form == MmqForm::Wide ? k_wide_rows : 64;
        const int64_t n_tiles = (a.single.n_rows + rows - 1) / rows;
        if (n_tiles == 0) return;
        if (form == MmqForm::Wide) launch_form<k_wide_rows, true>(a, n_tiles, stream);
        else if (form == MmqForm::Narrow) launch_form<64, true>(a, n_tiles, stream);
        else launch_form<64, false>(a, n_tiles, stream);
    }
    STRATA_CUDA_LAUNCH_CHECK("k_mmq");
}

}  // namespace strata::cuda
