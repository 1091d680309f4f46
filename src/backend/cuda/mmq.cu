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
//     weight tile unpacked once for twice the rows;
//   - Staged (Q4_K, MT = 64: the experts), Q4Direct (its variant reading the copied quants) and Q8Staged (Q8_0,
//     MT = 128: a prompt's dense matrices): each k step's bytes copied by cp.async into shared-memory stages steps
//     ahead of the step computed (below, at each kernel).
// Every output element sums its sub-blocks in k order with the same code (mmq_accumulate), so every form gives the
// same bits (the choice and its switches: launch_mmq). Several matrices of one type and row length times the same rows
// (a prompt's q, k and v) can share a Wide launch (launch_mmq_parts), each block computing what it would alone.
// A k step's tiles in shared memory: weights unpacked to int8 rows, activation rows, weight scales per row and
// sub-block, the activations' {d, d * sum} sub-block-major (a thread's two rows in one 16-byte load). Weights come
// from global memory one sub-block a thread through the type's unpacking (QV<T>::load), except in the Wide form of
// Q8_0 rows of whole 4-byte words (k a multiple of 64; STRATA_CUDA_MMQ_COALESCED=0 turns it off): there a k step's
// rows are copied as they are into shared memory by cp.async, word i of the step by thread i % 256 (a warp's copies
// one run of bytes: its 34-byte blocks are only 2-byte aligned, and read a block a thread they took 17 two-byte loads
// each, scattered over the warp), then split into the tiles, half a row a thread; the next step's copies run while
// the tensor cores work on this one.
#include "backend/cuda/matmul.cuh"

#include "backend/cuda/device.h"
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
// Types with an offset term (the min of Q4_K and Q5_K; every other type's unpacking sets off = 0).
template <DType T>
constexpr bool k_off = T == DType::Q4_K || T == DType::Q5_K;

__device__ __forceinline__ void mma_k32(int c[4], const int a[4], const int b[2]) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_k16(int c[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
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
    float2 xds[MS][MT];
};

// Q8_0 rows copied as words (COAL): a k step is MS blocks of 34 bytes a row, PR words a thread.
constexpr int Q8_BLOCK = 34;
constexpr int Q8_WORDS = MS * Q8_BLOCK / 4;  // a row's words in a k step
constexpr int PR = MW * Q8_WORDS / THREADS;
static_assert(MW * Q8_WORDS % THREADS == 0, "a k step's Q8_0 words split evenly over the threads");
static_assert(MS == 4 && THREADS == 2 * MW, "the split: half a row's k step (two blocks) a thread");

// What one thread loads of a k step: PW weight units (none where COAL copies the weights), PX 16-byte pieces of
// activations, PD activation scales.
template <int MT, bool COAL>
struct Loads {
    static constexpr int PW = COAL ? 0 : MW * MS / THREADS, PX = MT * MS * 2 / THREADS,
                         PD = (MT * MS + THREADS - 1) / THREADS;
    WUnit w[COAL ? 1 : PW];
    int4 x[PX];
    float2 d[PD];
};

struct Where {
    const uint8_t *w;
    int64_t n0, n_sub;
    int n_tok;
    int64_t x_row;  // the block's first activation row in xq / xds
};

template <DType T, int MT, bool COAL>
__device__ __forceinline__ void load_step(const MatmulArgs &a, const Where &at, int64_t s0, Loads<MT, COAL> &l,
                                          const IqGrids &g) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int p = 0; p < Loads<MT, COAL>::PW; p++) {
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
    for (int p = 0; p < Loads<MT, COAL>::PX; p++) {
        const int i = tid + p * THREADS, r = i / (MS * 2), c = i % (MS * 2);
        const int64_t s = s0 + c / 2;
        l.x[p] = r < at.n_tok && s < at.n_sub
                     ? *reinterpret_cast<const int4 *>(a.xq + (at.x_row + r) * a.k + s0 * 32 + c * 16)
                     : make_int4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < Loads<MT, COAL>::PD; p++) {
        const int i = tid + p * THREADS, r = i / MS, s = i % MS;
        l.d[p] = i < MT * MS && r < at.n_tok && s0 + s < at.n_sub ? a.xds[(at.x_row + r) * at.n_sub + s0 + s]
                                                                   : make_float2(0.0f, 0.0f);
    }
}

template <int MT, bool COAL>
__device__ __forceinline__ void store_step(const Loads<MT, COAL> &l, Tiles<MT> &sm) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int p = 0; p < Loads<MT, COAL>::PW; p++) {
        const int i = tid + p * THREADS, r = i / MS, s = i % MS;
        const WUnit &u = l.w[p];
        int4 *dst = reinterpret_cast<int4 *>(sm.wq + r * ROW_BYTES + s * 32);
        dst[0] = make_int4(u.q[0], u.q[1], u.q[2], u.q[3]);
        dst[1] = make_int4(u.q[4], u.q[5], u.q[6], u.q[7]);
        sm.wsc[r][s] = u.sc;
        sm.woff[r][s] = u.off;
    }
#pragma unroll
    for (int p = 0; p < Loads<MT, COAL>::PX; p++) {
        const int i = tid + p * THREADS, r = i / (MS * 2), c = i % (MS * 2);
        *reinterpret_cast<int4 *>(sm.xq + r * ROW_BYTES + c * 16) = l.x[p];
    }
#pragma unroll
    for (int p = 0; p < Loads<MT, COAL>::PD; p++) {
        const int i = tid + p * THREADS;
        if (i < MT * MS) sm.xds[i % MS][i / MS] = l.d[p];
    }
}

// COAL: a k step of Q8_0 rows into `raw` as they are (row r at r * 4 * Q8_WORDS), by cp.async in one group; zeros
// past the matrix's rows and a partial last step's end (n_sub is even, so the step ends on a word).
__device__ __forceinline__ void copy_q8_step(const MatmulArgs &a, const Where &at, int64_t s0, uint8_t *raw) {
    const int tid = threadIdx.x;
    const int64_t words = min(int64_t(Q8_WORDS), (at.n_sub - s0) * Q8_BLOCK / 4);
    const uint8_t *base = at.w + size_t(at.n0) * a.row_bytes + size_t(s0) * Q8_BLOCK;
#pragma unroll 4  // fully unrolled, the 17 addresses stay live across the k loop and spill
    for (int p = 0; p < PR; p++) {
        const int i = tid + p * THREADS, r = i / Q8_WORDS, c = i - r * Q8_WORDS;
        const bool ok = at.n0 + r < a.n && c < words;
        cp_async4(raw + 4 * i, ok ? base + size_t(r) * a.row_bytes + 4 * c : at.w, ok);
    }
    cp_async_commit();
}

// COAL: the copied step into the tiles, once every thread's copies have landed. Thread t takes half of row t / 2:
// words W[0..16] of it hold blocks 2h and 2h + 1 (h = t % 2), {d, q[0..31]} at bytes 0 and 34: the first block's
// values are 2 bytes into a word (W[n] and W[n + 1] shifted), the second's whole words.
template <int MT>
__device__ __forceinline__ void split_q8_step(const uint8_t *raw, Tiles<MT> &sm) {
    cp_async_wait<0>();
    __syncthreads();
    const int r = threadIdx.x >> 1, h = threadIdx.x & 1;
    const uint32_t *w = reinterpret_cast<const uint32_t *>(raw) + r * Q8_WORDS + h * (Q8_WORDS / 2);
    uint32_t W[Q8_WORDS / 2];
#pragma unroll
    for (int n = 0; n < Q8_WORDS / 2; n++) W[n] = w[n];
    int q0[8], q1[8];
#pragma unroll
    for (int n = 0; n < 8; n++) {
        q0[n] = int(__byte_perm(W[n], W[n + 1], 0x5432));
        q1[n] = int(W[9 + n]);
    }
    const float d0 = f16_to_f32(uint16_t(W[0] & 0xffffu)), d1 = f16_to_f32(uint16_t(W[8] >> 16));
    int4 *dst = reinterpret_cast<int4 *>(sm.wq + r * ROW_BYTES + 2 * h * 32);
    dst[0] = make_int4(q0[0], q0[1], q0[2], q0[3]);
    dst[1] = make_int4(q0[4], q0[5], q0[6], q0[7]);
    dst[2] = make_int4(q1[0], q1[1], q1[2], q1[3]);
    dst[3] = make_int4(q1[4], q1[5], q1[6], q1[7]);
    sm.wsc[r][2 * h] = make_float2(d0, d0);
    sm.wsc[r][2 * h + 1] = make_float2(d1, d1);
    sm.woff[r][2 * h] = 0.0f;
    sm.woff[r][2 * h + 1] = 0.0f;
}

// Dynamic shared memory of the COAL form: its tiles and the copied step.
template <int MT>
constexpr size_t coal_smem = sizeof(Tiles<MT>) + size_t(MW) * Q8_WORDS * 4;

extern __shared__ __align__(16) uint8_t mmq_dyn_smem[];

// Where mmq_step reads a k step's tiles: one Tiles struct, or (the staged form) weights unpacked into one buffer and
// activations in the stage they were copied to.
template <int MT>
struct TileView {
    const uint8_t *wq, *xq;
    const float2 (*wsc)[MS];
    const float (*woff)[MS];
    const float2 (*xds)[MT];
    __device__ TileView(const Tiles<MT> &t) : wq(t.wq), xq(t.xq), wsc(t.wsc), woff(t.woff), xds(t.xds) {}
    __device__ TileView(const uint8_t *wq_, const uint8_t *xq_, const float2 (*wsc_)[MS], const float (*woff_)[MS],
                        const float2 (*xds_)[MT])
        : wq(wq_), xq(xq_), wsc(wsc_), woff(woff_), xds(xds_) {}
};

// One sub-block's MMAs of a warp's weight rows [16 i, 16 i + 16) into their accumulators (activation rows
// [wt, wt + 8 J)), from the A fragment af, the B fragments bf, the two rows' scales and offsets and the activations'
// {d, d * sum} (load_dx): y += dx * (scale * dot) + off * (dx * sum q), the offset term only for the
// types that have one (k_off). Every form adds its sub-blocks in k order through this, so every form's bits are one.
template <DType T, int J, typename Dx>
__device__ __forceinline__ void mmq_accumulate(const int (&af)[4], const int (&bf)[J][2], float2 scA, float2 scB,
                                               float offA, float offB, const Dx &dx, float (&acc)[J][4]) {
#pragma unroll
    for (int j = 0; j < J; j++) {
        const float4 d = dx(j);
        const float2 dA = make_float2(d.x, d.y), dB = make_float2(d.z, d.w);
        float sA0, sA1, sB0, sB1;  // scale * dot for the fragment's four elements
        if constexpr (k_per16<T>) {
            int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
            mma_k16(lo, af[0], af[1], bf[j][0]);
            mma_k16(hi, af[2], af[3], bf[j][1]);
            sA0 = scA.x * float(lo[0]) + scA.y * float(hi[0]);
            sA1 = scA.x * float(lo[1]) + scA.y * float(hi[1]);
            sB0 = scB.x * float(lo[2]) + scB.y * float(hi[2]);
            sB1 = scB.x * float(lo[3]) + scB.y * float(hi[3]);
        } else {
            int c[4] = {0, 0, 0, 0};
            mma_k32(c, af, bf[j]);
            sA0 = scA.x * float(c[0]);
            sA1 = scA.x * float(c[1]);
            sB0 = scB.x * float(c[2]);
            sB1 = scB.x * float(c[3]);
        }
        if constexpr (k_off<T>) {
            acc[j][0] += dA.x * sA0 + offA * dA.y;
            acc[j][1] += dB.x * sA1 + offA * dB.y;
            acc[j][2] += dA.x * sB0 + offB * dA.y;
            acc[j][3] += dB.x * sB1 + offB * dB.y;
        } else {
            acc[j][0] = __fmaf_rn(dA.x, sA0, acc[j][0]);
            acc[j][1] = __fmaf_rn(dB.x, sA1, acc[j][1]);
            acc[j][2] = __fmaf_rn(dA.x, sB0, acc[j][2]);
            acc[j][3] = __fmaf_rn(dB.x, sB1, acc[j][3]);
        }
    }
}

// {dx, dx * sum} of activation rows wt + 8 j + 2 tig and the one after, from sub-block s's (xds_s).
__device__ __forceinline__ float4 load_dx(const float2 *xds_s, int wt, int j) {
    return *reinterpret_cast<const float4 *>(&xds_s[wt + 8 * j + 2 * (threadIdx.x & 3)]);
}

// A warp's B fragments of sub-block s: activation rows [wt, wt + 8 J) of tiles xq (rows ROW_BYTES apart).
template <int J>
__device__ __forceinline__ void load_b(const uint8_t *xq, int s, int wt, int (&bf)[J][2]) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const uint8_t *t0 = xq + (wt + 8 * j + gid) * ROW_BYTES + s * 32 + tig * 4;
        bf[j][0] = *reinterpret_cast<const int *>(t0);
        bf[j][1] = *reinterpret_cast<const int *>(t0 + 16);
    }
}

// The MMAs of one k step into a warp's accumulators (weight rows [ww, ww + 32), activation rows [wt, wt + 8 J)).
template <DType T, int MT, int J>
__device__ __forceinline__ void mmq_step(const TileView<MT> sm, int ww, int wt, float (&acc)[2][J][4]) {
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
        load_b<J>(sm.xq, s, wt, bf);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rA = ww + 16 * i + gid, rB = rA + 8;
            const float2 scA = sm.wsc[rA][s], scB = sm.wsc[rB][s];
            const float offA = k_off<T> ? sm.woff[rA][s] : 0.0f, offB = k_off<T> ? sm.woff[rB][s] : 0.0f;
            const float2 *xds_s = sm.xds[s];
            auto get_dx = [&](int j) { return load_dx(xds_s, wt, j); };
            mmq_accumulate<T, J>(af[i], bf, scA, scB, offA, offB, get_dx, acc[i]);
        }
    }
}

// PARTS: the part a block of weight rows `wblock` (blockIdx.y) is in becomes the block's matrix (a's n, y, y_stride
// and grp's weights), wblock its block within that part (static indices: the parts stay kernel parameters).
__device__ __forceinline__ void select_part(const MatmulParts &parts, MatmulArgs &a, MatmulGroup &grp,
                                            uint32_t &wblock) {
    MatmulPart m = parts.part[0];
    uint32_t b0 = 0;
#pragma unroll
    for (int p = 1; p < k_matmul_max_parts; p++)
        if (p < parts.n_parts && wblock >= parts.block0[p]) m = parts.part[p], b0 = parts.block0[p];
    grp.w = m.w, a.n = m.n, a.y = m.y, a.y_stride = m.y_stride;
    wblock -= b0;
}

// The blocks along the weight rows: a's matrix, or every part's from its own first row.
uint32_t weight_blocks(const MatmulArgs &a, const MatmulParts &parts) {
    return parts.n_parts == 0 ? ceil_div(a.n, MW) : parts.blocks;
}

// A warp's accumulators to y (C fragment: element e of tile (i, j) is weight row ww + 16 i + gid (+ 8 for e >= 2),
// activation row wt + 8 j + 2 tig (+ 1 for odd e)), rows of y from y_row.
template <int J>
__device__ __forceinline__ void store_acc(const MatmulArgs &a, const Where &at, int y_row, int ww, int wt,
                                          const float (&acc)[2][J][4]) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < J; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t n = at.n0 + ww + 16 * i + gid + (e >= 2 ? 8 : 0);
                const int t = wt + 8 * j + 2 * tig + (e & 1);
                if (n < a.n && t < at.n_tok) a.y[int64_t(y_row + t) * a.y_stride + n] = acc[i][j][e];
            }
}

// PIPE: the next k step's loads issued before this step's MMAs (registers), stored after them. COAL: Q8_0 rows
// read as words (load_step).
// PARTS: several matrices in one launch (launch_mmq_parts, the Wide form only); a block of part p computes what the
// same block of a launch of that matrix alone computes. A template argument: the selection's registers would push
// the Wide form past 255 for every launch.
template <DType T, int MT, bool PIPE, bool COAL, bool PARTS>
__global__ __launch_bounds__(THREADS) void k_mmq(MatmulArgs a, IqGrids g, MatmulParts parts) {
    static_assert(!COAL || T == DType::Q8_0, "only Q8_0 rows are read as words");
    constexpr int J = MT / 16;  // 8-row activation tiles per warp
    Tiles<MT> *smp;
    uint8_t *raw = nullptr;  // COAL: the copied k step
    if constexpr (COAL) {
        smp = reinterpret_cast<Tiles<MT> *>(mmq_dyn_smem);
        raw = mmq_dyn_smem + sizeof(Tiles<MT>);
    } else {
        __shared__ __align__(16) Tiles<MT> tiles;
        smp = &tiles;
    }
    Tiles<MT> &sm = *smp;

    const int tid = threadIdx.x, warp = tid / 32;
    int group = 0, row0 = int(blockIdx.x) * MT;
    if (a.tiles) {
        const int2 t = a.tiles[blockIdx.x];
        group = t.x;
        row0 = t.y;
    }
    MatmulGroup grp = a.groups ? a.groups[group] : a.single;
    uint32_t wblock = blockIdx.y;
    if constexpr (PARTS) select_part(parts, a, grp, wblock);
    const Where at{static_cast<const uint8_t *>(grp.w), int64_t(wblock) * MW, a.k / 32, min(MT, grp.n_rows - row0),
                   int64_t(grp.x_row0) + row0};

    // Warp tile: weight rows [ww, ww + 32), activation rows [wt, wt + MT / 2).
    const int ww = (warp % 4) * 32, wt = (warp / 4) * (MT / 2);
    float acc[2][J][4] = {};

    // fetch: a k step's loads issued (COAL: the weights' copies); put: stored into the tiles (COAL: once copied).
    Loads<MT, COAL> l;
    auto fetch = [&](int64_t s0) {
        if constexpr (COAL) copy_q8_step(a, at, s0, raw);
        load_step<T, MT, COAL>(a, at, s0, l, g);
    };
    auto put = [&] {
        if constexpr (COAL) split_q8_step<MT>(raw, sm);
        store_step<MT, COAL>(l, sm);
    };
    if constexpr (PIPE) {
        fetch(0);
        put();
    }
    for (int64_t s0 = 0; s0 < at.n_sub; s0 += MS) {
        if constexpr (!PIPE) {
            fetch(s0);
            put();
        }
        __syncthreads();
        const bool more = PIPE && s0 + MS < at.n_sub;
        if (more) fetch(s0 + MS);
        mmq_step<T, MT, J>(sm, ww, wt, acc);
        __syncthreads();
        if (more) put();
    }

    store_acc<J>(a, at, grp.y_row0 + row0, ww, wt, acc);
}

// The staged form (Q4_K, 64 activation rows): a k step's bytes copied by cp.async into one of three stages two
// steps ahead of the step computed, then unpacked from shared memory. A stage holds, per weight row, the
// super-block's 16-byte head and the step's 64 bytes of quants (80 bytes), and per activation row the step's 128
// int8 values and four {d, d * sum} (transposed as the tiles hold them). The Plain form waits on its global loads
// at every step (about 3,400 cycles a step for the 30B-A3B's experts at 512 tokens on an H200, the tensor cores
// busy a tenth of it). The unpacked tiles are the Plain form's to the bit, so are the results.
constexpr int ST_STAGES = 3, ST_ROW = 80, ST_MT = 64;
struct Staged {
    uint8_t raw[ST_STAGES][MW * ST_ROW];
    uint8_t xq[ST_STAGES][ST_MT * ROW_BYTES];
    float2 xds[ST_STAGES][MS][ST_MT];
    uint8_t wq[MW * ROW_BYTES];
    float2 wsc[MW][MS];
    float woff[MW][MS];
};

// Step t's copies into a stage's raw rows, activation rows and activation scales (one commit group, made by the
// caller).
__device__ __forceinline__ void stage_copy(const MatmulArgs &a, const Where &at, int t, uint8_t *raw, uint8_t *xq,
                                           float2 (*xds)[ST_MT]) {
    const int tid = threadIdx.x;
    const int64_t s0 = int64_t(t) * MS;
    const size_t head = size_t(s0 / 8) * 144, quants = head + 16 + 64 * size_t((s0 % 8) / 4);
    for (int i = tid; i < MW * (ST_ROW / 16); i += THREADS) {
        const int r = i / (ST_ROW / 16), c = i % (ST_ROW / 16);
        const bool ok = at.n0 + r < a.n;
        const uint8_t *row = at.w + size_t(ok ? at.n0 + r : at.n0) * a.row_bytes;
        cp_async16(raw + r * ST_ROW + 16 * c, row + (c == 0 ? head : quants + 16 * (c - 1)), ok);
    }
#pragma unroll
    for (int p = 0; p < ST_MT * 8 / THREADS; p++) {  // 8 16-byte pieces a row
        const int i = tid + p * THREADS, r = i / 8, c = i % 8;
        const bool ok = r < at.n_tok;
        cp_async16(xq + r * ROW_BYTES + 16 * c, a.xq + (at.x_row + (ok ? r : 0)) * a.k + s0 * 32 + 16 * c, ok);
    }
    static_assert(ST_MT * MS == THREADS, "a thread's activation scale a step");
    {
        const int r = tid / MS, s = tid % MS;
        const bool ok = r < at.n_tok;
        cp_async8(&xds[s][r], a.xds + (at.x_row + (ok ? r : 0)) * at.n_sub + s0 + s, ok);
    }
}

__global__ __launch_bounds__(THREADS, 2) void k_mmq_staged(MatmulArgs a, IqGrids g) {
    constexpr int MT = ST_MT, J = MT / 16;
    Staged &sm = *reinterpret_cast<Staged *>(mmq_dyn_smem);
    const int tid = threadIdx.x, warp = tid / 32;
    int group = 0, row0 = int(blockIdx.x) * MT;
    if (a.tiles) {
        const int2 t = a.tiles[blockIdx.x];
        group = t.x;
        row0 = t.y;
    }
    const MatmulGroup grp = a.groups ? a.groups[group] : a.single;
    const Where at{static_cast<const uint8_t *>(grp.w), int64_t(blockIdx.y) * MW, a.k / 32, min(MT, grp.n_rows - row0),
                   int64_t(grp.x_row0) + row0};
    const int ww = (warp % 4) * 32, wt = (warp / 4) * (MT / 2);
    float acc[2][J][4] = {};

    // Protocol: one commit group per step (empty past the last); before step t, groups up to t are complete when at
    // most one is in flight (t + 1's); the barrier after that wait also says every thread is past step t - 1's MMAs,
    // so the stage step t + 2 is copied into (t - 1's) and the unpacked weight tile are free.
    const int steps = int(at.n_sub / MS);
    stage_copy(a, at, 0, sm.raw[0], sm.xq[0], sm.xds[0]);
    cp_async_commit();
    if (steps > 1) stage_copy(a, at, 1, sm.raw[1], sm.xq[1], sm.xds[1]);
    cp_async_commit();
    for (int t = 0; t < steps; t++) {
        cp_async_wait<1>();
        __syncthreads();
        if (t + 2 < steps) {
            const int sn = (t + 2) % ST_STAGES;
            stage_copy(a, at, t + 2, sm.raw[sn], sm.xq[sn], sm.xds[sn]);
        }
        cp_async_commit();
        const int st = t % ST_STAGES, h = (t * MS) % 8 / 4;
        // The Plain form's unpacking and stores (load_step, store_step), from the stage.
#pragma unroll
        for (int p = 0; p < MW * MS / THREADS; p++) {
            const int i = tid + p * THREADS, r = i / MS, s = i % MS;
            const uint8_t *b = sm.raw[st] + r * ST_ROW;
            WSub w;
            QV<DType::Q4_K>::load_parts(b, b + 16 + 32 * (s / 2), 4 * h + s, w);
            int4 *dst = reinterpret_cast<int4 *>(sm.wq + r * ROW_BYTES + s * 32);
            dst[0] = make_int4(w.q[0], w.q[1], w.q[2], w.q[3]);
            dst[1] = make_int4(w.q[4], w.q[5], w.q[6], w.q[7]);
            sm.wsc[r][s] = make_float2(w.scale[0], w.scale[2]);
            sm.woff[r][s] = w.off;
        }
        __syncthreads();
        mmq_step<DType::Q4_K, MT, J>(TileView<MT>(sm.wq, sm.xq[st], sm.wsc, sm.woff, sm.xds[st]), ww, wt, acc);
    }
    cp_async_wait<0>();
    (void)g;
    store_acc<J>(a, at, grp.y_row0 + row0, ww, wt, acc);
}

// The Q8_0 staged form (a single group of Q8_0 rows, 128 activation rows a block, the Wide form's warp tiles): each
// k step's weight and activation bytes are copied by cp.async into one of S stages, S - 1 steps ahead of the step
// computed, and the MMAs read their fragments from the copied bytes as they are: no unpacking, no tiles, one barrier
// a step. A Q8_0 block is a 2-byte scale and 32 quants (34 bytes), so a step's 4 blocks of a row are 136 bytes; in
// the stage a row takes Q8_PITCH bytes (36 words: the 8 rows and 4 word columns of a fragment load fall in 32
// banks). Block s's quants start 2 bytes into a word for even s (the fragment's word from two words, as
// split_q8_step does) and on a word for odd s. The scales (f16) are read where they lie. The sums are mmq_accumulate's
// in k order, so the bits are the Wide form's.
constexpr int Q8_PITCH = 144;
constexpr int Q8_PIECES = MS * Q8_BLOCK / 8;  // 8-byte copies of a row's step
static_assert(MS * Q8_BLOCK % 8 == 0 && Q8_PITCH >= MS * Q8_BLOCK && Q8_PITCH / 4 % 32 == 4, "the stage's rows");

template <int S>
struct Q8Stages {
    uint8_t w[S][MW * Q8_PITCH];
    uint8_t xq[S][k_wide_rows * ROW_BYTES];
    float2 xds[S][MS][k_wide_rows];
};

// A thread's share of a step's weight copies: piece tid + p * THREADS (of MW rows x Q8_PIECES), from byte src[p] past
// the step's first byte of the block's first row to byte dst[p] of the stage; pieces past the matrix's rows (or past
// the step) have valid's bit p clear.
constexpr int Q8_THREAD_PIECES = (MW * Q8_PIECES + THREADS - 1) / THREADS;
struct Q8Copies {
    uint32_t src[Q8_THREAD_PIECES], dst[Q8_THREAD_PIECES];
    uint32_t valid = 0;
};

__device__ __forceinline__ Q8Copies q8_copies(const MatmulArgs &a, const Where &at) {
    Q8Copies c;
#pragma unroll
    for (int p = 0; p < Q8_THREAD_PIECES; p++) {
        const int i = int(threadIdx.x) + p * THREADS, r = i / Q8_PIECES, col = i - r * Q8_PIECES;
        c.src[p] = uint32_t(r) * uint32_t(a.row_bytes) + 8 * col;
        c.dst[p] = uint32_t(r * Q8_PITCH + 8 * col);
        if (i < MW * Q8_PIECES && at.n0 + r < a.n) c.valid |= 1u << p;
    }
    return c;
}

// Step t's copies into stage st (one commit group, made by the caller); zeros past the matrix's rows and the
// group's activation rows.
template <int S>
__device__ __forceinline__ void q8_stage_copy(const MatmulArgs &a, const Where &at, const Q8Copies &c, int t,
                                              Q8Stages<S> &sm, int st) {
    const int tid = threadIdx.x;
    const int64_t s0 = int64_t(t) * MS;
    const uint8_t *base = at.w + size_t(at.n0) * a.row_bytes + size_t(s0) * Q8_BLOCK;
#pragma unroll
    for (int p = 0; p < Q8_THREAD_PIECES; p++) {
        if (p + 1 < Q8_THREAD_PIECES || tid + p * THREADS < MW * Q8_PIECES) {
            const bool ok = (c.valid >> p) & 1;
            cp_async8(sm.w[st] + c.dst[p], base + (ok ? c.src[p] : 0u), ok);
        }
    }
#pragma unroll
    for (int p = 0; p < k_wide_rows * 8 / THREADS; p++) {  // 8 16-byte pieces a row
        const int i = tid + p * THREADS, r = i / 8, col = i % 8;
        const bool ok = r < at.n_tok;
        cp_async16(sm.xq[st] + r * ROW_BYTES + 16 * col, a.xq + (at.x_row + (ok ? r : 0)) * a.k + s0 * 32 + 16 * col,
                   ok);
    }
#pragma unroll
    for (int p = 0; p < k_wide_rows * MS / THREADS; p++) {
        const int i = tid + p * THREADS, r = i / MS, s = i % MS;
        const bool ok = r < at.n_tok;
        cp_async8(&sm.xds[st][s][r], a.xds + (at.x_row + (ok ? r : 0)) * at.n_sub + s0 + s, ok);
    }
}

// A fragment's two words of a weight row's block s in a stage (`blk`: the block's first byte): quants tig * 4 and
// 16 + tig * 4.
template <int s>
__device__ __forceinline__ void q8_quant_words(const uint8_t *blk, int tig, int &lo, int &hi) {
    if constexpr (s % 2 == 1) {  // quants on a word
        lo = *reinterpret_cast<const int *>(blk + 2 + 4 * tig);
        hi = *reinterpret_cast<const int *>(blk + 18 + 4 * tig);
    } else {  // 2 bytes into a word
        const uint32_t *w = reinterpret_cast<const uint32_t *>(blk) + tig;
        lo = int(__byte_perm(w[0], w[1], 0x5432));
        hi = int(__byte_perm(w[4], w[5], 0x5432));
    }
}

template <int J, int s>
__device__ __forceinline__ void q8_direct_sub(const uint8_t *w, const uint8_t *xq, const float2 *xds_s, int ww, int wt,
                                              float (&acc)[2][J][4]) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    int af[2][4], bf[J][2];
    float dA[2], dB[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint8_t *a0 = w + (ww + 16 * i + gid) * Q8_PITCH + s * Q8_BLOCK, *b0 = a0 + 8 * Q8_PITCH;
        q8_quant_words<s>(a0, tig, af[i][0], af[i][2]);
        q8_quant_words<s>(b0, tig, af[i][1], af[i][3]);
        dA[i] = f16_to_f32(*reinterpret_cast<const uint16_t *>(a0));
        dB[i] = f16_to_f32(*reinterpret_cast<const uint16_t *>(b0));
    }
    load_b<J>(xq, s, wt, bf);
    float4 dx[J];  // loaded once for both row halves
#pragma unroll
    for (int j = 0; j < J; j++) dx[j] = load_dx(xds_s, wt, j);
    auto get_dx = [&](int j) { return dx[j]; };
#pragma unroll
    for (int i = 0; i < 2; i++)
        mmq_accumulate<DType::Q8_0, J>(af[i], bf, make_float2(dA[i], dA[i]), make_float2(dB[i], dB[i]), 0.0f, 0.0f,
                                       get_dx, acc[i]);
}

template <int S, bool PARTS>
__global__ __launch_bounds__(THREADS, 1) void k_mmq_q8_staged(MatmulArgs a, MatmulParts parts) {
    constexpr int MT = k_wide_rows, J = MT / 16;
    static_assert(MS == 4, "q8_direct_sub's four sub-blocks");
    Q8Stages<S> &sm = *reinterpret_cast<Q8Stages<S> *>(mmq_dyn_smem);
    const int warp = threadIdx.x / 32;
    const int row0 = int(blockIdx.x) * MT;
    MatmulGroup grp = a.single;
    uint32_t wblock = blockIdx.y;
    if constexpr (PARTS) select_part(parts, a, grp, wblock);
    const Where at{static_cast<const uint8_t *>(grp.w), int64_t(wblock) * MW, a.k / 32, min(MT, grp.n_rows - row0),
                   int64_t(grp.x_row0) + row0};
    const int ww = (warp % 4) * 32, wt = (warp / 4) * (MT / 2);
    float acc[2][J][4] = {};

    // Protocol: one commit group per step (empty past the last), S - 1 before the loop; before step t at most S - 2
    // groups are left in flight, so step t's has landed, and the barrier after that wait says every thread's copies
    // of it are visible and every thread is past step t - 1's MMAs: the stage step t + S - 1 is copied into
    // (t - 1's) is free.
    const int steps = int(at.n_sub / MS);
    const Q8Copies copies = q8_copies(a, at);
#pragma unroll
    for (int t = 0; t < S - 1; t++) {
        if (t < steps) q8_stage_copy<S>(a, at, copies, t, sm, t);
        cp_async_commit();
    }
    for (int t = 0; t < steps; t++) {
        cp_async_wait<S - 2>();
        __syncthreads();
        if (t + S - 1 < steps) q8_stage_copy<S>(a, at, copies, t + S - 1, sm, (t + S - 1) % S);
        cp_async_commit();
        const int st = t % S;
        q8_direct_sub<J, 0>(sm.w[st], sm.xq[st], sm.xds[st][0], ww, wt, acc);
        q8_direct_sub<J, 1>(sm.w[st], sm.xq[st], sm.xds[st][1], ww, wt, acc);
        q8_direct_sub<J, 2>(sm.w[st], sm.xq[st], sm.xds[st][2], ww, wt, acc);
        q8_direct_sub<J, 3>(sm.w[st], sm.xq[st], sm.xds[st][3], ww, wt, acc);
    }
    cp_async_wait<0>();
    store_acc<J>(a, at, grp.y_row0 + row0, ww, wt, acc);
}

// Where the Q8_0 staged form takes a launch: a single group (or parts) of Q8_0 rows in whole steps (k a multiple of
// 128, so rows and steps are whole 8-byte pieces), 8-byte aligned weights, 16-byte aligned activations.
bool q8_staged_applies(const MatmulArgs &a, const MatmulParts &parts) {
    if (a.type != DType::Q8_0 || a.tiles || a.groups || a.k % (MS * 32) != 0 || a.row_bytes % 8 != 0 ||
        reinterpret_cast<uintptr_t>(a.xq) % 16 != 0 || reinterpret_cast<uintptr_t>(a.xds) % 8 != 0)
        return false;
    auto aligned = [](const void *w) { return reinterpret_cast<uintptr_t>(w) % 8 == 0; };
    for (int p = 0; p < parts.n_parts; p++)
        if (!aligned(parts.part[p].w)) return false;
    return parts.n_parts > 0 || aligned(a.single.w);
}

// The stages a block can have on the current device: 4 where its shared memory per block allows (Hopper, 227 KiB),
// else 3 (A100's 163 KiB), else 2 (the RTX cards' 99 KiB).
int q8_stages() {
    const size_t smem = size_t(device_fact(DeviceFact::SmemOptin));
    return smem >= sizeof(Q8Stages<4>) ? 4 : smem >= sizeof(Q8Stages<3>) ? 3 : 2;
}

template <int S, bool PARTS>
void launch_q8_staged_s(const MatmulArgs &a, const MatmulParts &parts, int64_t n_tiles, cudaStream_t stream) {
    const void *k = reinterpret_cast<const void *>(k_mmq_q8_staged<S, PARTS>);
    if (!allow_dynamic_smem(k, sizeof(Q8Stages<S>)))
        fail("CUDA mmq: %zu bytes of shared memory per block are not available", sizeof(Q8Stages<S>));
    const dim3 grid(unsigned(n_tiles), weight_blocks(a, parts));
    k_mmq_q8_staged<S, PARTS><<<grid, THREADS, sizeof(Q8Stages<S>), stream>>>(a, parts);
}

template <bool PARTS>
void launch_q8_staged(const MatmulArgs &a, const MatmulParts &parts, int64_t n_tiles, cudaStream_t stream) {
    switch (q8_stages()) {
        case 4:
            launch_q8_staged_s<4, PARTS>(a, parts, n_tiles, stream);
            break;
        case 3:
            launch_q8_staged_s<3, PARTS>(a, parts, n_tiles, stream);
            break;
        default:
            launch_q8_staged_s<2, PARTS>(a, parts, n_tiles, stream);
            break;
    }
}

// The Q4_K direct form (STRATA_CUDA_MMQ_Q4_DIRECT=1, opt-in until measured; where the staged form applies): the
// staged form's copies into four stages, three steps ahead, and its tiles, but the MMAs' A fragments are taken from
// the copied quants as they lie (a word's nibbles shifted and masked, as QV<Q4_K>::load_parts unpacks them), and
// only the weights' scales and offsets are unpacked, a step ahead into one of two buffers: one barrier a step, no
// unpacked weight tile. A stage row of 80 bytes (20 words) puts a fragment load's 8 rows and 4 word columns in 32
// banks. The same values reach mmq_accumulate as in the staged form, in the same order, so the same bits.
constexpr int QD_STAGES = 4;
struct Q4Direct {
    uint8_t raw[QD_STAGES][MW * ST_ROW];
    uint8_t xq[QD_STAGES][ST_MT * ROW_BYTES];
    float2 xds[QD_STAGES][MS][ST_MT];
    float wsc[2][MW][MS];
    float woff[2][MW][MS];
};

template <int J>
__device__ __forceinline__ void q4_direct_step(const uint8_t *raw, const uint8_t *xq, const float2 (*xds)[ST_MT],
                                               const float (*wsc)[MS], const float (*woff)[MS], int ww, int wt,
                                               float (&acc)[2][J][4]) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int s = 0; s < MS; s++) {
        const int shift = 4 * (s & 1);
        auto word = [&](const uint8_t *p) {
            return int((*reinterpret_cast<const uint32_t *>(p) >> shift) & 0x0f0f0f0fu);
        };
        int af[2][4], bf[J][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint8_t *qa = raw + (ww + 16 * i + gid) * ST_ROW + 16 + 32 * (s / 2) + 4 * tig;
            const uint8_t *qb = qa + 8 * ST_ROW;
            af[i][0] = word(qa);
            af[i][1] = word(qb);
            af[i][2] = word(qa + 16);
            af[i][3] = word(qb + 16);
        }
        load_b<J>(xq, s, wt, bf);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int rA = ww + 16 * i + gid, rB = rA + 8;
            const float2 scA = make_float2(wsc[rA][s], wsc[rA][s]), scB = make_float2(wsc[rB][s], wsc[rB][s]);
            const float2 *xds_s = xds[s];
            auto get_dx = [&](int j) { return load_dx(xds_s, wt, j); };
            mmq_accumulate<DType::Q4_K, J>(af[i], bf, scA, scB, woff[rA][s], woff[rB][s], get_dx, acc[i]);
        }
    }
}

__global__ __launch_bounds__(THREADS, 2) void k_mmq_q4_direct(MatmulArgs a) {
    constexpr int MT = ST_MT, J = MT / 16;
    Q4Direct &sm = *reinterpret_cast<Q4Direct *>(mmq_dyn_smem);
    const int tid = threadIdx.x, warp = tid / 32;
    int group = 0, row0 = int(blockIdx.x) * MT;
    if (a.tiles) {
        const int2 t = a.tiles[blockIdx.x];
        group = t.x;
        row0 = t.y;
    }
    const MatmulGroup grp = a.groups ? a.groups[group] : a.single;
    const Where at{static_cast<const uint8_t *>(grp.w), int64_t(blockIdx.y) * MW, a.k / 32, min(MT, grp.n_rows - row0),
                   int64_t(grp.x_row0) + row0};
    const int ww = (warp % 4) * 32, wt = (warp / 4) * (MT / 2);
    float acc[2][J][4] = {};

    // Protocol: one commit group per step (empty past the last), three before the loop. Step 0's scales are unpacked
    // once its group has landed (and a barrier made every thread's copies visible). Before step t at most one group is
    // left in flight, so steps t and t + 1 have landed; the barrier after that wait says every thread's copies of them
    // are visible, step t's scales (unpacked before it) are written, and every thread is past step t - 1's MMAs: the
    // stage step t + 3 is copied into (t - 1's) and the scale buffer step t + 1's are unpacked into (t - 1's) are
    // free.
    const int steps = int(at.n_sub / MS);
    auto copy = [&](int t) {
        const int st = t % QD_STAGES;
        stage_copy(a, at, t, sm.raw[st], sm.xq[st], sm.xds[st]);
    };
    auto unpack_scales = [&](int t) {
        const uint8_t *raw = sm.raw[t % QD_STAGES];
        const int h = (t * MS) % 8 / 4, b = t % 2;
#pragma unroll
        for (int p = 0; p < MW * MS / THREADS; p++) {
            const int i = tid + p * THREADS, r = i / MS, s = i % MS;
            QV<DType::Q4_K>::scale_off(raw + r * ST_ROW, 4 * h + s, sm.wsc[b][r][s], sm.woff[b][r][s]);
        }
    };
#pragma unroll
    for (int t = 0; t < QD_STAGES - 1; t++) {
        if (t < steps) copy(t);
        cp_async_commit();
    }
    cp_async_wait<QD_STAGES - 2>();
    __syncthreads();
    unpack_scales(0);
    for (int t = 0; t < steps; t++) {
        cp_async_wait<QD_STAGES - 3>();
        __syncthreads();
        if (t + QD_STAGES - 1 < steps) copy(t + QD_STAGES - 1);
        cp_async_commit();
        if (t + 1 < steps) unpack_scales(t + 1);
        const int st = t % QD_STAGES;
        q4_direct_step<J>(sm.raw[st], sm.xq[st], sm.xds[st], sm.wsc[t % 2], sm.woff[t % 2], ww, wt, acc);
    }
    cp_async_wait<0>();
    store_acc<J>(a, at, grp.y_row0 + row0, ww, wt, acc);
}

bool staged_applies(const MatmulArgs &a) {
    return a.type == DType::Q4_K && a.k % 256 == 0 && a.row_bytes % 16 == 0 &&
           reinterpret_cast<uintptr_t>(a.xq) % 16 == 0 &&
           (a.groups || reinterpret_cast<uintptr_t>(a.single.w) % 16 == 0);
}

void launch_q4_direct(const MatmulArgs &a, int64_t n_tiles, cudaStream_t stream) {
    if (!allow_dynamic_smem(reinterpret_cast<const void *>(k_mmq_q4_direct), sizeof(Q4Direct)))
        fail("CUDA mmq: %zu bytes of shared memory per block are not available", sizeof(Q4Direct));
    const dim3 grid(unsigned(n_tiles), ceil_div(a.n, MW));
    k_mmq_q4_direct<<<grid, THREADS, sizeof(Q4Direct), stream>>>(a);
}

void launch_staged(const MatmulArgs &a, int64_t n_tiles, cudaStream_t stream) {
    if (!allow_dynamic_smem(reinterpret_cast<const void *>(k_mmq_staged), sizeof(Staged)))
        fail("CUDA mmq: %zu bytes of shared memory per block are not available", sizeof(Staged));
    const dim3 grid(unsigned(n_tiles), ceil_div(a.n, MW));
    k_mmq_staged<<<grid, THREADS, sizeof(Staged), stream>>>(a, iq_grids());
}

// Q4_K matrices in the staged form where the Plain form would take them (the experts' tile lists, and single groups
// with STRATA_CUDA_MMQ_WIDE=0); STRATA_CUDA_MMQ_STAGED=0 leaves them to Plain.
bool staged_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_STAGED", true);
    return on;
}
bool q4_direct_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_Q4_DIRECT", false);
    return on;
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
// Q8_0 single groups in the Q8_0 staged form where Auto would take Wide; STRATA_CUDA_MMQ_Q8_STAGED=0 leaves them to
// Wide.
bool q8_staged_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_Q8_STAGED", true);
    return on;
}
// STRATA_CUDA_MMQ_COALESCED=0: Q8_0 rows read a sub-block a thread like the other types.
bool coalesced_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_COALESCED", true);
    return on;
}

// STRATA_CUDA_MMQ_SMALL_GRID=1 (opt-in until measured): a single group whose Wide grid would leave SMs idle (fewer
// blocks than the device has SMs: a prompt's k and v at 512 tokens are 16 blocks on an H200's 132, its output
// projection 64) takes the Plain form, twice the blocks of half the rows, two a SM. The same bits.
bool small_grid_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_SMALL_GRID", false);
    return on;
}
int64_t device_sms() {  // of the current device (0: unknown, the line is never crossed)
    return device_fact(DeviceFact::Sms);
}

// Q8_0 rows that are whole 4-byte words (and start on one) can be copied as words (the Wide form only).
bool q8_words(const MatmulArgs &a, const MatmulParts &parts) {
    if (a.type != DType::Q8_0 || a.row_bytes % 4 != 0 || !coalesced_enabled()) return false;
    if (a.groups) return true;  // a list's weights: slots and resident tensors, placed 256-byte aligned, whole rows in
    auto words = [](const void *w) { return reinterpret_cast<uintptr_t>(w) % 4 == 0; };
    for (int p = 0; p < parts.n_parts; p++)
        if (!words(parts.part[p].w)) return false;
    return parts.n_parts > 0 || words(a.single.w);
}

template <int MT, bool PIPE, bool PARTS = false>
void launch_form(const MatmulArgs &a, const MatmulParts &parts, int64_t n_tiles, cudaStream_t stream) {
    static_assert(!PARTS || (MT == k_wide_rows && PIPE), "parts: the Wide form only");
    const IqGrids &g = iq_grids();
    const dim3 grid(unsigned(n_tiles), weight_blocks(a, parts));
    if constexpr (MT == k_wide_rows && PIPE) {
        if (q8_words(a, parts)) {
            if (!allow_dynamic_smem(reinterpret_cast<const void *>(k_mmq<DType::Q8_0, MT, true, true, PARTS>),
                                    coal_smem<MT>))
                fail("CUDA mmq: %zu bytes of shared memory per block are not available", coal_smem<MT>);
            k_mmq<DType::Q8_0, MT, true, true, PARTS><<<grid, THREADS, coal_smem<MT>, stream>>>(a, g, parts);
            return;
        }
    }
    // clang-format off
    switch (a.type) {
#define X(T_) \
    case DType::T_: k_mmq<DType::T_, MT, PIPE, false, PARTS><<<grid, THREADS, 0, stream>>>(a, g, parts); break;
        X(Q8_0) X(Q4_0) X(MXFP4) X(IQ4_XS) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ2_XXS) X(IQ1_M)
#undef X
        default: fail("CUDA: no quantized matrix kernel for %s", dtype_name(a.type));
    }
    // clang-format on
}

// Where Auto would take the Plain form: Staged unless STRATA_CUDA_MMQ_STAGED=0 (launch_single and launch_mmq fall back
// to Plain for the types it does not take).
MmqForm plain_form() {
    return staged_enabled() ? (q4_direct_enabled() ? MmqForm::Q4Direct : MmqForm::Staged) : MmqForm::Plain;
}

// The form a single group of `rows` rows (of a matrix with n_w rows) takes under Auto.
MmqForm single_form(int64_t rows, int64_t n_w) {
    if (!wide_enabled()) return plain_form();
    if (small_grid_enabled() && int64_t(ceil_div(rows, k_wide_rows)) * int64_t(ceil_div(n_w, MW)) < device_sms())
        return plain_form();
    return q8_staged_enabled() ? MmqForm::Q8Staged : MmqForm::Wide;
}

void launch_single(const MatmulArgs &a, MmqForm form, cudaStream_t stream) {
    if ((form == MmqForm::Staged || form == MmqForm::Q4Direct) && !staged_applies(a)) form = MmqForm::Plain;
    if (form == MmqForm::Q8Staged && !q8_staged_applies(a, MatmulParts{})) form = MmqForm::Wide;
    const int rows = form == MmqForm::Wide || form == MmqForm::Q8Staged ? k_wide_rows : 64;
    const int64_t n_tiles = (a.single.n_rows + rows - 1) / rows;
    if (n_tiles == 0) return;
    if (form == MmqForm::Q8Staged)
        launch_q8_staged<false>(a, MatmulParts{}, n_tiles, stream);
    else if (form == MmqForm::Q4Direct)
        launch_q4_direct(a, n_tiles, stream);
    else if (form == MmqForm::Staged)
        launch_staged(a, n_tiles, stream);
    else if (form == MmqForm::Wide)
        launch_form<k_wide_rows, true>(a, MatmulParts{}, n_tiles, stream);
    else if (form == MmqForm::Narrow)
        launch_form<64, true>(a, MatmulParts{}, n_tiles, stream);
    else
        launch_form<64, false>(a, MatmulParts{}, n_tiles, stream);
}

}  // namespace

bool mmq_supported(DType t) {
    return mmvq_supported(t);
}

void launch_mmq(const MatmulArgs &a, cudaStream_t stream, MmqForm form) {
    if (a.n == 0) return;
    STRATA_ASSERT(a.k % 32 == 0 && a.n <= int64_t(65535) * MW);
    if (form == MmqForm::Auto)
        form = a.tiles ? (pipe_enabled() ? MmqForm::Narrow : plain_form()) : single_form(a.single.n_rows, a.n);
    if ((form == MmqForm::Staged || form == MmqForm::Q4Direct) && !staged_applies(a))
        form = MmqForm::Plain;  // Q4_K only
    if ((form == MmqForm::Wide || form == MmqForm::Q8Staged) && a.tiles)
        form = MmqForm::Narrow;  // the tile list's tiles are 64 rows
    if (a.tiles) {
        if (a.n_tiles == 0) return;
        if (form == MmqForm::Staged)
            launch_staged(a, a.n_tiles, stream);
        else if (form == MmqForm::Q4Direct)
            launch_q4_direct(a, a.n_tiles, stream);
        else if (form == MmqForm::Plain)
            launch_form<64, false>(a, MatmulParts{}, a.n_tiles, stream);
        else
            launch_form<64, true>(a, MatmulParts{}, a.n_tiles, stream);
    } else {
        launch_single(a, form, stream);
    }
    STRATA_CUDA_LAUNCH_CHECK("k_mmq");
}

bool mmq_parts_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ_PARTS", true);
    return on;
}

void launch_mmq_parts(const MatmulArgs &a, const MatmulPart *parts, int n_parts, cudaStream_t stream, MmqForm form) {
    STRATA_ASSERT(a.k % 32 == 0 && !a.groups && !a.tiles && n_parts >= 1 && n_parts <= k_matmul_max_parts);
    const MatmulParts mp(parts, n_parts, MW);
    if (mp.blocks == 0 || a.single.n_rows == 0) return;
    STRATA_ASSERT(mp.blocks <= 65535u);
    // Auto: the form a single matrix of the launch's blocks would take (the small grids' line weighs the launch).
    if (form == MmqForm::Auto) form = single_form(a.single.n_rows, int64_t(mp.blocks) * MW);
    if (form == MmqForm::Q8Staged) {
        if (q8_staged_applies(a, mp)) {
            launch_q8_staged<true>(a, mp, ceil_div(a.single.n_rows, k_wide_rows), stream);
            STRATA_CUDA_LAUNCH_CHECK("k_mmq_q8_staged parts");
            return;
        }
        form = MmqForm::Wide;
    }
    if (form != MmqForm::Wide) {  // the other forms have no parts: a launch each, the same bits
        for (int p = 0; p < n_parts; p++) {
            MatmulArgs b = a;
            b.single.w = parts[p].w;
            b.n = parts[p].n, b.y = parts[p].y, b.y_stride = parts[p].y_stride;
            launch_single(b, form, stream);
        }
    } else {
        launch_form<k_wide_rows, true, true>(a, mp, ceil_div(a.single.n_rows, k_wide_rows), stream);
    }
    STRATA_CUDA_LAUNCH_CHECK("k_mmq parts");
}

}  // namespace strata::cuda
