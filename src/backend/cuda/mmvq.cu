// Quantized mat-vec products (decode): weights stay packed, activations are 8-bit (int8 per element, a float scale
// and the scaled sum per 32 elements, in the reference's activation format: matmul.cuh), and each 32-element
// sub-block contributes an integer dot product (dp4a) times its scales. One warp per weight row, lanes over sub-blocks
// (lane l takes l, l + 32, ...: the order of the sums, which the host's copy keeps), up to 8 activation rows sharing
// each decoded weight sub-block; a decoding row's lane may load several of its sub-blocks at once (lane_sum_ahead).
// Every type writes its sub-block as 8 packed int8x4 words in four groups of 8 elements:
//   sum_i w_i x_i = dx * sum_g (scale_g * dot_g + bias_g * xsum_g) + off * (dx * sum_i q_i)
// where dot_g is the integer dot product of group g and xsum_g the sum of its activation integers.
#include "backend/cuda/matmul.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/qv_device.cuh"
#include "backend/exact_math.h"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

using qv::QV;
using qv::WSub;

constexpr int k_mmvq_warps = 4;

// One sub-block's term of a row's sum: its weights w against activation words x with scales ds. Every rounding
// step spelled out (no contraction left to the compiler), so that the host's copy of this kernel
// (backend/host/mmvq_host.cpp) gives the same bits.
template <DType T>
__device__ __forceinline__ float sub_term(const WSub &w, const int4 x0, const int4 x1, const float2 ds) {
    const int x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    float s = 0.0f;
#pragma unroll
    for (int gi = 0; gi < 4; gi++) {
        const int dot = __dp4a(w.q[2 * gi + 1], x[2 * gi + 1], __dp4a(w.q[2 * gi], x[2 * gi], 0));
        s = __fmaf_rn(w.scale[gi], float(dot), s);
        if constexpr (QV<T>::k_bias) {
            const int xs = __dp4a(0x01010101, x[2 * gi + 1], __dp4a(0x01010101, x[2 * gi], 0));
            s = __fmaf_rn(w.bias[gi], float(xs), s);
        }
    }
    return __fmaf_rn(ds.x, s, __fmul_rn(w.off, ds.y));
}

// A lane's part of one activation row's sum (decoding: one row a group): its sub-blocks sb = lane, lane + 32, ...
// of weight row wrow (the first n_staged from srow in shared memory, where STAGED), AHEAD of them at a time, all of
// their loads issued before the first is used, then their terms added in sub-block order as one at a time adds them:
// the same bits, with AHEAD times the loads in flight (the loop of one sub-block at a time waited for each load
// before issuing the next: a 4096-long Q8_0 row took four waits in turn). xq, xds: the activation row's words and
// scales. A lane past the row's last sub-block loads that one again and adds nothing for it.
template <DType T, int AHEAD, bool STAGED>
__device__ __forceinline__ float lane_sum_ahead(const uint8_t *srow, const uint8_t *wrow, int64_t n_staged,
                                                int64_t n_sub, int lane, const int8_t *xq, const float2 *xds,
                                                const IqGrids &g) {
    float acc = 0.0f;
    if (!STAGED) __builtin_assume(__isGlobal(wrow));  // global loads of the weights (the select made them generic)
    for (int64_t sb0 = lane; sb0 < n_sub; sb0 += 32 * AHEAD) {
        WSub w[AHEAD];
        int4 x0[AHEAD], x1[AHEAD];
        float2 ds[AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            const int64_t sb = min(sb0 + 32 * u, n_sub - 1);
            QV<T>::load(STAGED && sb < n_staged ? srow : wrow, int(sb), w[u], g);
            const int4 *xp = reinterpret_cast<const int4 *>(xq + sb * 32);
            x0[u] = xp[0], x1[u] = xp[1];
            ds[u] = xds[sb];
        }
#pragma unroll
        for (int u = 0; u < AHEAD; u++)
            if (sb0 + 32 * u < n_sub) acc = __fadd_rn(acc, sub_term<T>(w[u], x0[u], x1[u], ds[u]));
    }
    return acc;
}

// One warp per weight row, MAXT activation rows at most (k_mmv_max_rows; 1 for a decoding token's groups, a form
// with fewer registers).
// Staged rows (a.stage_bytes > 0; STRATA_CUDA_MMVQ_STAGE=1, opt-in: 1.003x on an H100): before pdl_wait each warp
// copies the first stage_sub sub-blocks of its weight row into its part of the dynamic shared memory by cp.async, so a
// decoding mat-vec's weights stream in while the kernel before it still runs (the weights are constant; a group table
// read there was written two launches or more back: MatmulArgs::groups_early); after the wait the lanes read those
// sub-blocks from shared memory. The same bytes, so the same bits.
template <DType T, int MAXT, int AHEAD>
__global__ __launch_bounds__(k_mmvq_warps * 32) void k_mmvq(MatmulArgs a, IqGrids g, MatmulParts parts) {
    extern __shared__ __align__(16) uint8_t stage[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    MatmulGroup grp = a.single;
    int64_t n_w = a.n, y_stride = a.y_stride;
    float *y = a.y;
    uint32_t blk = blockIdx.x;
    if (parts.n_parts > 0) {  // the part this block's rows are in (static indices: the parts stay in parameters)
        MatmulPart m = parts.part[0];
        uint32_t b0 = 0;
#pragma unroll
        for (int p = 1; p < k_matmul_max_parts; p++)
            if (p < parts.n_parts && blk >= parts.block0[p]) m = parts.part[p], b0 = parts.block0[p];
        grp.w = m.w, n_w = m.n, y = m.y, y_stride = m.y_stride;
        blk -= b0;
    }
    const int64_t n = int64_t(blk) * k_mmvq_warps + warp;
    const bool early = a.groups && a.groups_early;
    if (early) grp = a.groups[blockIdx.y];
    uint8_t *srow = stage + warp * a.stage_stride;
    const uint8_t *wrow = static_cast<const uint8_t *>(grp.w) + size_t(n) * a.row_bytes;
    const bool staged = a.stage_bytes > 0 && (!a.groups || early) && n < n_w &&
                        (reinterpret_cast<uintptr_t>(wrow) & uintptr_t(a.stage_piece - 1)) == 0;
    if (staged) {
        if (a.stage_piece == 16)
            for (int o = lane * 16; o < a.stage_bytes; o += 32 * 16) cp_async16(srow + o, wrow + o, true);
        else
            for (int o = lane * 4; o < a.stage_bytes; o += 32 * 4) cp_async4(srow + o, wrow + o, true);
        cp_async_commit();
    }
    pdl_wait();
    pdl_release();
    if (a.groups && !early) {
        grp = a.groups[blockIdx.y];
        wrow = static_cast<const uint8_t *>(grp.w) + size_t(n) * a.row_bytes;
    }
    if (n >= n_w) return;
    const int rows = MAXT == 1 ? 1 : grp.n_rows;
    const int64_t n_sub = a.k / 32, n_staged = staged ? a.stage_sub : 0;
    if (staged) {
        cp_async_wait<0>();
        __syncwarp();
    }
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
    if constexpr (AHEAD > 1) {  // a decoding row: its loads ahead (lane_sum_ahead)
        const int8_t *xq = a.xq + int64_t(grp.x_row0) * a.k;
        const float2 *xds = a.xds + int64_t(grp.x_row0) * n_sub;
        if (staged)
            acc[0] = lane_sum_ahead<T, AHEAD, true>(srow, wrow, n_staged, n_sub, lane, xq, xds, g);
        else
            acc[0] = lane_sum_ahead<T, AHEAD, false>(srow, wrow, 0, n_sub, lane, xq, xds, g);
    } else {
        for (int64_t sb = lane; sb < n_sub; sb += 32) {
            WSub w;
            QV<T>::load(sb < n_staged ? srow : wrow, int(sb), w, g);
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
                if (t >= rows) break;
                const int64_t xr = grp.x_row0 + t;
                const int4 *xp = reinterpret_cast<const int4 *>(a.xq + xr * a.k + sb * 32);
                const int4 x0 = xp[0], x1 = xp[1];
                const float2 ds = a.xds[xr * n_sub + sb];
                acc[t] = __fadd_rn(acc[t], sub_term<T>(w, x0, x1, ds));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        if (t >= rows) break;
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[int64_t(grp.y_row0 + t) * y_stride + n] = s;
    }
}

// Q8_0 / Q8_1 levels and scales as format/quant.h makes them; one warp per 32-element block.
// silu(x) * m, as k_silu_mul computes it (exact_math.h: the same bits on the host), for quantizing a gated product
// without storing it first.
__device__ __forceinline__ float act_in(const float *x, int64_t x_stride, const float *m, int64_t m_stride, int64_t r,
                                        int64_t c) {
    const float v = x[r * x_stride + c];
    return m ? exact::silu_mul(v, m[r * m_stride + c]) : v;
}

__global__ void k_quantize_act_q8_0(const float *x, int64_t x_stride, const float *m, int64_t m_stride, int64_t k,
                                    int8_t *qs, float2 *ds) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (blk * 32 >= k) return;
    const float v = act_in(x, x_stride, m, m_stride, r, blk * 32 + lane);
    const float amax = warp_max(fabsf(v));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float s = __fmul_rn(v, id);
    const int q = isnan(s) ? 0 : int(fminf(fmaxf(roundf(s), -128.0f), 127.0f));
    const float sum = warp_sum(float(q));
    qs[r * k + blk * 32 + lane] = int8_t(q);
    const float dr = f16_to_f32(f32_to_f16(d));
    if (lane == 0) ds[r * (k / 32) + blk] = make_float2(dr, dr * sum);
}

// Q8_K levels and scale per 256 elements (one warp, element i * 32 + lane in lane's slot i, so slot i of all lanes
// is one 32-element sub-block).
__global__ void k_quantize_act_q8_k(const float *x, int64_t x_stride, const float *m, int64_t m_stride, int64_t k,
                                    int8_t *qs, float2 *ds) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    const int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (blk * 256 >= k) return;
    float v[8];
    float amax = 0.0f, smax = 0.0f;
    int idx = 1 << 30;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = act_in(x, x_stride, m, m_stride, r, blk * 256 + i * 32 + lane);
        const float a = fabsf(v[i]);
        if (a > amax) amax = a, smax = v[i], idx = i * 32 + lane;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(k_full_mask, amax, o), s2 = __shfl_xor_sync(k_full_mask, smax, o);
        const int i2 = __shfl_xor_sync(k_full_mask, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) amax = a2, smax = s2, idx = i2;
    }
    const float iscale = smax != 0.0f ? __fdiv_rn(-127.0f, smax) : 0.0f;
    const float d = smax != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
    int8_t *qb = qs + r * k + blk * 256;
    float2 *db = ds + r * (k / 32) + blk * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float s = __fmul_rn(iscale, v[i]);
        const int q = smax == 0.0f ? 0 : !(s > -128.0f) ? -128 : s >= 127.0f ? 127 : int(rintf(s));
        qb[i * 32 + lane] = int8_t(q);
        const float sum = warp_sum(float(q));
        if (lane == 0) db[i] = make_float2(d, d * sum);
    }
}

// The same levels and scales with a thread per element (a block of 256 per Q8_K block): the element of largest
// magnitude (the first of equals, by index) found across the block instead of along a warp's 8 slots, each 32-element
// sub-block's sum by its own warp. The same bits (the pick is by value and index; the sums are of integers), in one
// dependent step of loads where the warp form had eight: 2-3x shorter for a decoding token's few blocks.
__global__ __launch_bounds__(256) void k_quantize_act_q8_k_wide(const float *x, int64_t x_stride, const float *m,
                                                                int64_t m_stride, int64_t k, int8_t *qs, float2 *ds) {
    pdl_wait();
    pdl_release();
    __shared__ float s_amax[8], s_smax[8];
    __shared__ int s_idx[8];
    const int64_t r = blockIdx.y, blk = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float v = act_in(x, x_stride, m, m_stride, r, blk * 256 + tid);
    // as the warp form's slots start: a zero or a NaN is never the pick
    float amax = 0.0f, smax = 0.0f;
    int idx = 1 << 30;
    if (fabsf(v) > amax) amax = fabsf(v), smax = v, idx = tid;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(k_full_mask, amax, o), s2 = __shfl_xor_sync(k_full_mask, smax, o);
        const int i2 = __shfl_xor_sync(k_full_mask, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) amax = a2, smax = s2, idx = i2;
    }
    if (lane == 0) s_amax[warp] = amax, s_smax[warp] = smax, s_idx[warp] = idx;
    __syncthreads();
    amax = s_amax[0], smax = s_smax[0], idx = s_idx[0];
#pragma unroll
    for (int w = 1; w < 8; w++)
        if (s_amax[w] > amax || (s_amax[w] == amax && s_idx[w] < idx))
            amax = s_amax[w], smax = s_smax[w], idx = s_idx[w];
    const float iscale = smax != 0.0f ? __fdiv_rn(-127.0f, smax) : 0.0f;
    const float d = smax != 0.0f ? __fdiv_rn(1.0f, iscale) : 0.0f;
    const float sc = __fmul_rn(iscale, v);
    const int q = smax == 0.0f ? 0 : !(sc > -128.0f) ? -128 : sc >= 127.0f ? 127 : int(rintf(sc));
    qs[r * k + blk * 256 + tid] = int8_t(q);
    const float sum = warp_sum(float(q));
    if (lane == 0) ds[r * (k / 32) + blk * 8 + warp] = make_float2(d, d * sum);
}

// STRATA_CUDA_Q8K_WIDE=0 keeps the warp-per-block Q8_K quantization (the same bits; A/B of the wide form).
bool q8k_wide_enabled() {
    static const bool on = env_switch("STRATA_CUDA_Q8K_WIDE", true);
    return on;
}
// The thread-per-element form only for at most STRATA_CUDA_Q8K_WIDE_ROWS rows (default 64; 0: every size), the warp
// form above (the same bits). A 512-token prompt's expert input (512 x 2048) and down input (4096 x 768) took 22 us
// each in the wide form on an H200; with the line at 64 the 30B-A3B's pp512 went 7272 -> 7781 tok/s on an H100.
int64_t q8k_wide_rows() {
    static const int64_t n = env_count("STRATA_CUDA_Q8K_WIDE_ROWS", 64);
    return n;
}

}  // namespace

bool mmvq_supported(DType t) {
    switch (t) {
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::MXFP4:
        case DType::IQ4_XS:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ2_XXS:
        case DType::IQ1_M:
            return true;
        default:
            return false;
    }
}

namespace {

// STRATA_CUDA_MMVQ_STAGE=1: staged rows (opt-in; the same bits, 1.003x the 30B's resident tg128 on an H100).
bool mmvq_stage_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMVQ_STAGE", false);
    return on;
}

// The staged part of a's rows (k_mmvq): the first k_stage_sub sub-blocks at most (two a lane), whole blocks of the
// type, copied in 16-byte pieces where the rows allow, else 4-byte ones, else not staged.
constexpr int64_t k_stage_sub = 64;
void set_stage(MatmulArgs &a) {
    a.stage_bytes = a.stage_sub = a.stage_piece = a.stage_stride = 0;
    if (!mmvq_stage_enabled() || (a.groups && !a.groups_early)) return;
    const DTypeInfo &ti = dtype_info(a.type);
    int64_t elems = std::min<int64_t>(a.k, k_stage_sub * 32);
    elems -= elems % ti.block_size;
    const int64_t bytes = elems / ti.block_size * ti.block_bytes;
    const int piece = bytes % 16 == 0 && a.row_bytes % 16 == 0 ? 16 : bytes % 4 == 0 && a.row_bytes % 4 == 0 ? 4 : 0;
    if (elems == 0 || piece == 0) return;
    a.stage_bytes = int32_t(bytes), a.stage_sub = int32_t(elems / 32), a.stage_piece = piece;
    a.stage_stride = int32_t((bytes + 15) / 16 * 16 + 16);
}

// STRATA_CUDA_MMVQ_AHEAD: whether a decoding mat-vec's lane issues the loads of 2 or 4 of its sub-blocks before
// using the first (lane_sum_ahead; the same bits). 0 (default): never; 1: wherever a lane has several; 2: only where
// the form ahead takes no more waves of blocks than the one-at-a-time form (its 70-128 registers a thread hold fewer
// blocks an SM: a launch of few rows, such as a 2048-row o matrix, loses nothing by them, one of many rows loses
// occupancy). 1 measured 0.976-0.987x the 30B's resident tg128 on an H100 (bench/RESULTS.md); 2 is opt-in until
// measured.
int mmvq_ahead_mode() {
    static const int mode = int(std::min<long>(env_count("STRATA_CUDA_MMVQ_AHEAD", 0), 2));
    return mode;
}

// Blocks of k an SM of the current device holds at once with smem bytes of dynamic shared memory (cached: one query
// per kernel, device and size).
int blocks_per_sm(const void *k, size_t smem) {
    static std::mutex mu;
    static std::map<std::tuple<const void *, int, size_t>, int> known;
    int dev = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&dev));
    const std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(k, dev, smem);
    if (auto it = known.find(key); it != known.end()) return it->second;
    int n = 0;
    STRATA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, k_mmvq_warps * 32, smem));
    return known[key] = std::max(n, 1);
}

// Whether a launch of `blocks` blocks takes no more waves in form `ahead` than in `one` (mode 2 above).
bool ahead_costs_no_wave(const void *ahead, const void *one, int64_t blocks, size_t smem) {
    int dev = 0, sms = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&dev));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const auto waves = [&](const void *k) {
        const int64_t per_wave = int64_t(sms) * blocks_per_sm(k, smem);
        return (blocks + per_wave - 1) / per_wave;
    };
    return waves(ahead) <= waves(one);
}

// The forms of k_mmvq for one weight type: up to k_mmv_max_rows activation rows a group, one, and one with 2 or 4
// sub-blocks a lane loaded ahead.
using MmvqKernel = void (*)(MatmulArgs, IqGrids, MatmulParts);
struct MmvqForms {
    MmvqKernel rows, one, ahead2, ahead4;
};
MmvqForms mmvq_forms(DType t) {
    switch (t) {
#define X(T_)                                                                                           \
    case DType::T_:                                                                                     \
        return {k_mmvq<DType::T_, k_mmv_max_rows, 1>, k_mmvq<DType::T_, 1, 1>, k_mmvq<DType::T_, 1, 2>, \
                k_mmvq<DType::T_, 1, 4>};
        X(Q8_0)
        X(Q4_0) X(MXFP4) X(IQ4_XS) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ2_XXS) X(IQ1_M)
#undef X
            default : fail("CUDA: no quantized mat-vec kernel for %s", dtype_name(t));
    }
}

// one_row: every group has one activation row (a decoding token's).
void launch(MatmulArgs a, const MatmulParts &parts, dim3 grid, bool one_row, cudaStream_t stream) {
    const IqGrids &g = iq_grids();
    set_stage(a);
    const MmvqForms f = mmvq_forms(a.type);
    const int64_t per_lane = (a.k / 32 + 31) / 32;  // a lane's sub-blocks of a row
    const int mode = a.loads_ahead < 0 ? mmvq_ahead_mode() : a.loads_ahead > 0 ? 1 : 0;
    const size_t smem = size_t(k_mmvq_warps) * size_t(a.stage_stride);
    MmvqKernel k = one_row ? f.one : f.rows;
    if (one_row && mode > 0 && per_lane > 1) {  // the loads of 2 or 4 sub-blocks a lane at once
        const MmvqKernel ahead = per_lane == 2 ? f.ahead2 : f.ahead4;
        if (mode == 1 || ahead_costs_no_wave(reinterpret_cast<const void *>(ahead), reinterpret_cast<const void *>(k),
                                             int64_t(grid.x) * grid.y, smem))
            k = ahead;
    }
    pdl_launch(k, grid, k_mmvq_warps * 32, smem, stream, a, g, parts);
    STRATA_CUDA_LAUNCH_CHECK("k_mmvq");
}

}  // namespace

void launch_mmvq(const MatmulArgs &a, cudaStream_t stream, bool one_row) {
    if (a.n_groups == 0 || a.n == 0) return;
    STRATA_ASSERT(a.k % 32 == 0 && a.n_groups <= 65535);
    STRATA_ASSERT(!one_row || a.groups || a.single.n_rows == 1);
    launch(a, MatmulParts{}, dim3(ceil_div(a.n, k_mmvq_warps), unsigned(a.n_groups)), one_row, stream);
}

void launch_mmvq_parts(const MatmulArgs &a, const MatmulPart *parts, int n_parts, cudaStream_t stream) {
    STRATA_ASSERT(a.k % 32 == 0 && a.groups == nullptr && n_parts >= 1 && n_parts <= k_matmul_max_parts);
    const MatmulParts mp(parts, n_parts, k_mmvq_warps);
    if (mp.blocks == 0 || a.single.n_rows == 0) return;
    launch(a, mp, dim3(mp.blocks, 1), a.single.n_rows == 1, stream);
}

void launch_quantize_act(DType vt, const float *x, int64_t x_stride, int64_t rows, int64_t k, int8_t *qs, float2 *ds,
                         cudaStream_t stream, const float *silu_mul_by, int64_t mul_stride) {
    // more rows than a grid's y takes: slices of 65535
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
        const int64_t n = std::min<int64_t>(65535, rows - r0);
        const float *xs = x + r0 * x_stride, *ms = silu_mul_by ? silu_mul_by + r0 * mul_stride : nullptr;
        switch (vt) {
            case DType::Q8_0:
            case DType::Q8_1:
                STRATA_ASSERT(k % 32 == 0);
                pdl_launch(k_quantize_act_q8_0, dim3(ceil_div(k / 32, 8), unsigned(n)), 256, 0, stream, xs, x_stride,
                           ms, mul_stride, k, qs + r0 * k, ds + r0 * (k / 32));
                break;
            case DType::Q8_K:
                STRATA_ASSERT(k % 256 == 0);
                if (q8k_wide_enabled() && (q8k_wide_rows() == 0 || rows <= q8k_wide_rows())) {
                    pdl_launch(k_quantize_act_q8_k_wide, dim3(unsigned(k / 256), unsigned(n)), 256, 0, stream, xs,
                               x_stride, ms, mul_stride, k, qs + r0 * k, ds + r0 * (k / 32));
                    break;
                }
                pdl_launch(k_quantize_act_q8_k, dim3(ceil_div(k / 256, 4), unsigned(n)), 128, 0, stream, xs, x_stride,
                           ms, mul_stride, k, qs + r0 * k, ds + r0 * (k / 32));  // ds rows: k / 32 each
                break;
            default:
                fail("CUDA: no 8-bit activation format %s", dtype_name(vt));
        }
        STRATA_CUDA_LAUNCH_CHECK("quantize_act");
    }
}

}  // namespace strata::cuda
