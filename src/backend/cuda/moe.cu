// MoE kernels: routing (one warp per token; at decode sizes also with the router's mat-vec in the same launch) and
// the combination of expert outputs.
#include "backend/cuda/moe.cuh"

#include <algorithm>
#include <cfloat>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/mmv_split.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/route_draws.h"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

// Token t's routing by one warp: softmax in f32, then k rounds of arg-max over the probabilities (larger wins, ties
// to the lower id). prob: the warp's own logits.cols floats of shared memory. Logits are read from L2 (__ldcg): in the
// one-launch form other blocks of the same grid wrote them.
__device__ __forceinline__ void router_softmax_warp(const float *l, int64_t ne, float *prob) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int64_t e = lane; e < ne; e += 32) mx = fmaxf(mx, __ldcg(l + e));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t e = lane; e < ne; e += 32) {
        const float v = expf(__ldcg(l + e) - mx);
        prob[e] = v;
        sum += v;
    }
    sum = warp_sum(sum);
    for (int64_t e = lane; e < ne; e += 32) prob[e] /= sum;
    __syncwarp();
}

// The chosen weights' renormalisation and scale, by lane 0, as route_topk's reference does.
__device__ __forceinline__ void router_scale_weights(float *w, int64_t k, float wsum, bool norm, float scale) {
    if (norm) {
        wsum = fmaxf(wsum, 6.103515625e-5f);
        for (int64_t j = 0; j < k; j++) w[j] /= wsum;
    }
    if (scale != 0.0f)
        for (int64_t j = 0; j < k; j++) w[j] *= scale;
}

__device__ __forceinline__ void router_topk_token(Rows logits, int64_t t, int64_t k, bool norm, float scale,
                                                  float *prob, int32_t *ids, float *weights) {
    const int64_t ne = logits.cols;
    const int lane = threadIdx.x & 31;
    router_softmax_warp(logits.data + t * logits.stride, ne, prob);
    float wsum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        // Ranked by probability, a NaN (from NaN logits) below every number and above the experts already picked
        // (-inf), so that k distinct experts of the layer come out whatever the logits hold.
        float key = -INFINITY;
        int best_id = int(ne);
        for (int64_t e = lane; e < ne; e += 32) {
            const float q = prob[e] == prob[e] ? prob[e] : -FLT_MAX;
            if (q > key) key = q, best_id = int(e);  // ascending e: the first of equals stays
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float k2 = __shfl_xor_sync(k_full_mask, key, o);
            const int i2 = __shfl_xor_sync(k_full_mask, best_id, o);
            if (k2 > key || (k2 == key && i2 < best_id)) key = k2, best_id = i2;
        }
        const float best = prob[best_id];
        __syncwarp();
        if (lane == 0) {
            ids[t * k + j] = best_id;
            weights[t * k + j] = best;
            prob[best_id] = -INFINITY;
        }
        wsum += best;  // in rank order, as the reference sums
        __syncwarp();
    }
    if (lane == 0) router_scale_weights(weights + t * k, k, wsum, norm, scale);
}

// Pair i = t k + j of the routing: its three matmul groups, and its place among token t's pairs by expert id.
__device__ __forceinline__ void pair_group(int64_t i, const int32_t *ids, int64_t n_tokens, int64_t k,
                                           const uint8_t *const *table, MatmulGroup *gate, MatmulGroup *up,
                                           MatmulGroup *down, int32_t *yrow, int32_t *widx, const uint8_t *from_host,
                                           unsigned long long *counts) {
    const int64_t t = i / k;
    const int32_t *id = ids + t * k;
    const int32_t e = ids[i];
    if (counts) atomicAdd(counts + (from_host[e] ? 1 : 0), 1ull);
    gate[i] = {table[3 * e + 0], int32_t(t), 1, int32_t(i)};
    up[i] = {table[3 * e + 1], int32_t(t), 1, int32_t(n_tokens * k + i)};  // rows after the gate's
    down[i] = {table[3 * e + 2], int32_t(i), 1, int32_t(i)};
    // rank of this pair among the token's pairs by expert id (ids of one token are distinct)
    int64_t r = 0;
    for (int64_t j2 = 0; j2 < k; j2++) r += id[j2] < e;
    yrow[t * k + r] = int32_t(i);
    widx[t * k + r] = int32_t(i);
}

// Warp-wide integer maximum and minimum (redux.sync where the device has it).
__device__ __forceinline__ unsigned warp_max_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(k_full_mask, v);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(k_full_mask, v, o));
    return v;
#endif
}
__device__ __forceinline__ unsigned warp_min_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_min_sync(k_full_mask, v);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(k_full_mask, v, o));
    return v;
#endif
}
// Larger q, larger key; -0 taken as +0 (equal, as the comparisons of the shared-memory form find them).
__device__ __forceinline__ unsigned order_key(float q) {
    const unsigned u = __float_as_uint(q == 0.0f ? 0.0f : q);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The register form of router_topk_token, for up to 32 PER experts and k <= 32 (the same picks and weights, bit for
// bit): lane l holds the probabilities of experts l + 32 i in p[i]; a round takes the warp's largest by one integer
// maximum over an order-preserving key (redux.sync where the device has it) and the lowest id among equals by one
// integer minimum, where the shared-memory form walked five shuffle steps a round; pick j stays in lane j's registers,
// the weights are renormalised there and written by k lanes at once (the shared-memory form's lane 0 read back and
// rewrote each weight in global memory, one after another). With pairs, the same lanes then make the pair's matmul
// groups as pair_group does (the same entries).
template <int PER>
__device__ __forceinline__ void router_topk_regs(const float *l, int64_t ne, int64_t t, int64_t k, bool norm,
                                                 float scale, int32_t *ids, float *weights, const RouterPairs *pairs,
                                                 int64_t n_tokens) {
    const int lane = threadIdx.x & 31;
    float p[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int64_t e = lane + 32 * i;
        p[i] = e < ne ? __ldcg(l + e) : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++)
        if (lane + 32 * i < ne) {
            p[i] = expf(p[i] - mx);
            sum += p[i];
        }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < PER; i++)
        if (lane + 32 * i < ne) p[i] /= sum;
    int32_t my_id = 0;
    float my_w = 0.0f, wsum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        // this lane's best: the largest key, the first of equals (lowest id); experts past ne never
        unsigned bu = 0;
        int bi = 0;
        float bv = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            if (lane + 32 * i >= ne) continue;
            const unsigned u = order_key(p[i] == p[i] ? p[i] : -FLT_MAX);
            if (u > bu) bu = u, bi = i, bv = p[i];
        }
        const unsigned top = warp_max_u32(bu);
        const unsigned best_id = warp_min_u32(bu == top ? unsigned(lane + 32 * bi) : 0xffffffffu);
        const int owner = int(best_id & 31u);
        const float best = __shfl_sync(k_full_mask, bv, owner);
        if (lane == owner) {
#pragma unroll
            for (int i = 0; i < PER; i++)
                if (i == int(best_id >> 5)) p[i] = -INFINITY;
        }
        if (lane == j) my_id = int32_t(best_id), my_w = best;
        wsum += best;  // in rank order, as the reference sums
    }
    if (norm) my_w /= fmaxf(wsum, 6.103515625e-5f);
    if (scale != 0.0f) my_w *= scale;
    if (lane < k) ids[t * k + lane] = my_id, weights[t * k + lane] = my_w;
    if (!pairs) return;
    int64_t r = 0;  // the pair's rank among the token's by expert id
    for (int64_t j2 = 0; j2 < k; j2++) r += __shfl_sync(k_full_mask, my_id, int(j2)) < my_id;
    if (lane >= k) return;
    const int64_t i = t * k + lane, M = n_tokens * k;
    const uint8_t *const *tb = pairs->table + 3 * size_t(my_id);
    pairs->groups[i] = {tb[0], int32_t(t), 1, int32_t(i)};
    pairs->groups[M + i] = {tb[1], int32_t(t), 1, int32_t(M + i)};
    pairs->groups[2 * M + i] = {tb[2], int32_t(i), 1, int32_t(i)};
    pairs->yrow[t * k + r] = int32_t(i);
    pairs->widx[t * k + r] = int32_t(i);
}

// Whether the register form takes a layer's routing (regs: STRATA_CUDA_ROUTER_REGS, on).
__host__ __device__ constexpr bool router_regs_take(int64_t ne, int64_t k) {
    return k <= 32 && ne <= 512;
}

// Token t's routing by one warp: the register form where regs is set (router_regs_take holding), else
// router_topk_token with prob (no pairs).
__device__ __forceinline__ void router_topk_any(Rows logits, int64_t t, int64_t k, bool norm, float scale, bool regs,
                                                float *prob, int32_t *ids, float *weights, const RouterPairs *pairs) {
    const int64_t ne = logits.cols;
    const float *l = logits.data + t * logits.stride;
    if (!regs)
        router_topk_token(logits, t, k, norm, scale, prob, ids, weights);
    else if (ne <= 128)
        router_topk_regs<4>(l, ne, t, k, norm, scale, ids, weights, pairs, logits.rows);
    else if (ne <= 256)
        router_topk_regs<8>(l, ne, t, k, norm, scale, ids, weights, pairs, logits.rows);
    else
        router_topk_regs<16>(l, ne, t, k, norm, scale, ids, weights, pairs, logits.rows);
}

// Benchmark routing's draws (route_draws.h), a warp per token: lane 0 draws k distinct experts (the
// host's draw, the same integers), ranks them by the softmax of the logits (larger first, ties to the lower id) and
// weights them as router_topk_token weights its choice. Token blockIdx.x of those from row0. smem: the logits'
// probabilities, then k ids.
__global__ void k_route_draws(Rows logits, int64_t row0, int64_t k, bool norm, float scale, uint64_t seed, int64_t il,
                              const int64_t *pass, const double *cdf, const int32_t *expert_of_rank, int32_t *ids,
                              float *weights) {
    extern __shared__ float prob[];
    const int64_t t = row0 + blockIdx.x, ne = logits.cols;
    int32_t *drawn = reinterpret_cast<int32_t *>(prob + ne);
    router_softmax_warp(logits.data + t * logits.stride, ne, prob);
    if ((threadIdx.x & 31) != 0) return;
    draw_row(seed, il, *pass, t, ne, k, cdf, expert_of_rank, drawn);
    for (int64_t i = 1; i < k; i++) {  // insertion sort into rank order
        const int32_t e = drawn[i];
        int64_t j = i;
        for (; j > 0; j--) {
            const int32_t d = drawn[j - 1];
            if (prob[d] > prob[e] || (prob[d] == prob[e] && d < e)) break;
            drawn[j] = d;
        }
        drawn[j] = e;
    }
    float wsum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        ids[t * k + j] = drawn[j];
        wsum += weights[t * k + j] = prob[drawn[j]];
    }
    router_scale_weights(weights + t * k, k, wsum, norm, scale);
}

__global__ void k_count_pass(int64_t *pass) {
    *pass += 1;
}

__global__ void k_router_topk(Rows logits, int64_t k, bool norm, float scale, bool regs, int32_t *ids,
                              float *weights) {
    pdl_wait();
    pdl_release();
    extern __shared__ float prob[];
    router_topk_any(logits, blockIdx.x, k, norm, scale, regs, prob, ids, weights, nullptr);
}

// A router row's first PRE k_mmv_split_threads weights, thread threadIdx.x's (0 past the row's end): loaded before the
// kernel's wait (constant: pdl.cuh), while the kernel before still runs. words: an F32 row whose floats are 4-byte
// aligned, each loaded as one word instead of byte by byte (row_elem's loads take any alignment): the same values.
template <DType T, int PRE>
__device__ __forceinline__ void router_weights(const MatmulArgs &a, const IqGrids &g, float (&w)[PRE],
                                               bool words = false) {
    const uint8_t *wrow = static_cast<const uint8_t *>(a.single.w) + size_t(blockIdx.x) * a.row_bytes;
    if constexpr (T == DType::F32)
        if (words) {
            const float *f = reinterpret_cast<const float *>(wrow);
#pragma unroll
            for (int i = 0; i < PRE; i++) {
                const int64_t kk = threadIdx.x + int64_t(i) * k_mmv_split_threads;
                w[i] = kk < a.k ? f[kk] : 0.0f;
            }
            return;
        }
#pragma unroll
    for (int i = 0; i < PRE; i++) {
        const int64_t kk = threadIdx.x + int64_t(i) * k_mmv_split_threads;
        w[i] = kk < a.k ? row_elem<T>(wrow, kk, g) : 0.0f;
    }
}

// Whether this block finished last of the grid (its logits written; done counted, then set back to zero by the last).
__device__ __forceinline__ bool router_last_block(unsigned *done, bool &last) {
    if (threadIdx.x == 0) {
        __threadfence();  // this block's logits (thread 0 wrote them) reach every block before it is counted
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// The last block's ranking of every token's logits, a warp per token (k_router_topk's), and the pair groups.
__device__ __forceinline__ void router_rank(const MatmulArgs &a, int64_t k, bool norm, float scale, bool regs,
                                            int32_t *ids, float *weights, unsigned *done, const RouterPairs &pairs,
                                            float *prob) {
    const Rows logits{a.y, a.single.n_rows, a.n, a.y_stride};
    const int warp = threadIdx.x / 32;
    for (int64_t t = warp; t < logits.rows; t += k_mmv_split_threads / 32)
        router_topk_any(logits, t, k, norm, scale, regs, prob + warp * logits.cols, ids, weights,
                        pairs.table ? &pairs : nullptr);
    if (threadIdx.x == 0) *done = 0;
    if (!pairs.table || regs) return;  // the register form made the pairs
    __syncthreads();                   // the block's ids are visible to all its threads
    const int64_t M = logits.rows * k;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x)
        pair_group(i, ids, logits.rows, k, pairs.table, pairs.groups, pairs.groups + M, pairs.groups + 2 * M,
                   pairs.yrow, pairs.widx, nullptr, nullptr);
}

// The router's mat-vec and top-k in one launch (decode): block n computes logit n of every token exactly as the
// split mat-vec does, and the block that finishes last ranks them, a warp per token, exactly as k_router_topk does.
// done counts the finished blocks; the last one sets it back to zero for the next launch (a graph replays it as is).
// MAXT: the most tokens (1: one decoding token's form, launch_router_fused's `one`; words as router_weights takes it).
template <DType T, int MAXT>
__global__ __launch_bounds__(k_mmv_split_threads) void k_router_fused(MatmulArgs a, IqGrids g, int64_t k, bool norm,
                                                                      float scale, bool regs, int32_t *ids,
                                                                      float *weights, unsigned *done, RouterPairs pairs,
                                                                      bool words) {
    constexpr int PRE = 16;
    const bool loaded = a.k <= PRE * k_mmv_split_threads;
    float w[PRE];
    if (loaded) router_weights<T, PRE>(a, g, w, MAXT == 1 && words);  // the general form as it was
    pdl_wait();
    pdl_release();
    extern __shared__ float prob[];
    __shared__ float red[32];
    __shared__ bool last;
    if (loaded)
        mmv_split_row_loaded<PRE, MAXT>(a, a.single, blockIdx.x, w, red);
    else
        mmv_split_row<T, MAXT>(a, a.single, blockIdx.x, g, red);
    if (!router_last_block(done, last)) return;
    router_rank(a, k, norm, scale, regs, ids, weights, done, pairs, prob);
}

// k_router_fused with the residual step before it (RouterNorm): each block forms token t's row x + y as
// k_rms_norm_wide<KPT, true> does and its scale by the norm's tree, then each thread takes the normed values it
// multiplies (columns threadIdx.x + i 256) as the norm computes them, in mmv_split_row_loaded's order: the logits'
// bits. The last block, once every block has read x, writes x + y, the normed row and its 8-bit form as
// k_rms_norm_wide<KPT, true> does, then ranks.
template <int KPT>
__global__ __launch_bounds__(k_mmv_split_threads) void k_router_norm(MatmulArgs a, IqGrids g, int64_t k, bool norm,
                                                                     float scale, bool regs, int32_t *ids,
                                                                     float *weights, unsigned *done, RouterPairs pairs,
                                                                     RouterNorm rn) {
    constexpr int PRE = 16;
    float w[PRE];
    router_weights<DType::F32, PRE>(a, g, w);
    pdl_wait();
    pdl_release();
    extern __shared__ float prob[];
    __shared__ float red[32], pick[24];
    __shared__ bool last;
    const int n4 = int(a.k >> 2);
    for (int64_t t = 0; t < a.single.n_rows; t++) {
        const float *xr = rn.resid.data + t * rn.resid.stride, *yr = rn.y.data + t * rn.y.stride;
        float4 v[KPT], wv[KPT];
        wide_row_load<KPT>(xr, yr, rn.w, n4, v, wv);
        const float sc = rms_scale_wide<KPT>(v, a.k, rn.eps, red);
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < PRE; i++) {
            const int64_t kk = threadIdx.x + int64_t(i) * k_mmv_split_threads;
            if (kk >= a.k) break;
            acc = __fmaf_rn(w[i], rms_normed(xr[kk] + yr[kk], sc, rn.w[kk]), acc);
        }
        const float s = block_sum(acc, red);
        if (threadIdx.x == 0) a.y[t * a.y_stride + blockIdx.x] = s;
        __syncthreads();  // red is reused by the next row's sums
    }
    if (!router_last_block(done, last)) return;
    for (int64_t t = 0; t < a.single.n_rows; t++) {
        float *xr = rn.resid.data + t * rn.resid.stride;
        float4 v[KPT], wv[KPT];
        wide_row_load<KPT>(xr, rn.y.data + t * rn.y.stride, rn.w, n4, v, wv);
        __syncthreads();  // every thread has read x before any writes it
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const int i = int(threadIdx.x) + j * 256;
            if (i < n4) reinterpret_cast<float4 *>(xr)[i] = v[j];
        }
        NormQ8 q8 = rn.q8;
        if (q8.form) q8.q += t * a.k, q8.ds += t * (a.k / 32);
        rms_norm_wide_row<KPT>(v, wv, n4, a.k, rn.eps, red,
                               reinterpret_cast<float4 *>(rn.normed.data + t * rn.normed.stride), q8, pick);
    }
    router_rank(a, k, norm, scale, regs, ids, weights, done, pairs, prob);
}

// Column c of token t's combination, the pairs' products added in the order given from zero (each a fused
// multiply-add, spelled out so that every kernel below that combines gives the same bits).
__device__ __forceinline__ float combine_at(const Rows &ys, const int32_t *yrow, const int32_t *widx,
                                            const float *weights, int64_t k, int64_t t, int64_t c) {
    float o = 0.0f;
    for (int64_t j = 0; j < k; j++)
        o = __fmaf_rn(weights[widx[t * k + j]], ys.data[int64_t(yrow[t * k + j]) * ys.stride + c], o);
    return o;
}

// The shared expert's gate for token t, sigmoid(w . x[t]), by a block of 256 threads (thread i adding columns i,
// i + 256, ..., then the block's tree).
__device__ __forceinline__ float shared_gate_of(const Rows &x, const float *w, int64_t t, float *red) {
    const float *xr = x.data + t * x.stride;
    float d = 0.0f;
    for (int64_t c = threadIdx.x; c < x.cols; c += 256) d = __fmaf_rn(w[c], xr[c], d);
    d = block_sum(d, red);
    return 1.0f / (1.0f + expf(-d));
}

__global__ void k_moe_combine(Rows ys, const int32_t *yrow, const int32_t *widx, const float *weights, int64_t k,
                              Rows out) {
    pdl_wait();
    pdl_release();
    const int64_t t = blockIdx.y;
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < out.cols;
         c += int64_t(gridDim.x) * blockDim.x)
        out.data[t * out.stride + c] = combine_at(ys, yrow, widx, weights, k, t, c);
}

// A decoding MoE layer's last steps in one launch, a block of 256 threads per token: out = the combination (as
// k_moe_combine), plus the shared expert's gated rows where shared_w is set (as k_shared_expert_add), then where
// norm_w is set the residual step (resid += out; normed = rms_norm(resid), as k_rms_norm_wide<KPT, true>). Each
// value is computed by the same expressions as in those kernels, so the bits are theirs. normed may be x (the
// layer's input, which the gate reads first).
// AHEAD (a decoding pass's few tokens): each thread loads its columns of the first 16 / KPT pairs' rows and of the
// shared expert's row before adding any, then adds them in the same order (the same bits): the loop of pairs waited
// for each pair's loads in turn (about eight waits a column group).
template <int KPT, bool AHEAD>
__global__ __launch_bounds__(256) void k_moe_tail(Rows ys, const int32_t *yrow, const int32_t *widx,
                                                  const float *weights, int64_t k, Rows x, const float *shared_w,
                                                  Rows shared_y, Rows out, Rows resid, const float *norm_w, float eps,
                                                  Rows normed, NormQ8 q8, bool early) {
    __shared__ float red[32], pick[24];
    __shared__ float pw[k_moe_tail_max_k];
    __shared__ const float4 *py[k_moe_tail_max_k];
    const int64_t t = blockIdx.x;
    const int n4 = int(out.cols >> 2);
    float4 r[KPT], wv[KPT];  // the residual row and the norm's weights, where norm_w is set
    // What the down matrices' launch just before does not write (early: before the wait, pdl.cuh): the pairs'
    // weights and rows (the routing's, three launches back or more), the residual row and the norm's weights.
    auto reads = [&] {
        if (threadIdx.x < k) {  // the token's pairs: weight and row, in the order to add them
            pw[threadIdx.x] = weights[widx[t * k + threadIdx.x]];
            py[threadIdx.x] =
                reinterpret_cast<const float4 *>(ys.data + int64_t(yrow[t * k + threadIdx.x]) * ys.stride);
        }
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const int i = int(threadIdx.x) + j * 256;
            r[j] = wv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (!norm_w || i >= n4) continue;
            r[j] = reinterpret_cast<const float4 *>(resid.data + t * resid.stride)[i];
            wv[j] = reinterpret_cast<const float4 *>(norm_w)[i];
        }
    };
    if (early) reads();
    pdl_wait();
    pdl_release();
    if (!early) reads();
    const float gate = shared_w ? shared_gate_of(x, shared_w, t, red) : 0.0f;  // ends with a barrier
    if (!shared_w) __syncthreads();
    // AHEAD: this thread's columns of the first PRE pairs' rows and of the shared expert's row (a valid row and column
    // stand in for those past k and n4: loaded, never added)
    constexpr int PRE = AHEAD ? 16 / KPT : 1;
    float4 ya[KPT][PRE], sya[KPT];
    if constexpr (AHEAD) {
        const float4 *srow = reinterpret_cast<const float4 *>(shared_y.data + t * shared_y.stride);
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const int i = min(int(threadIdx.x) + j * 256, n4 - 1);
#pragma unroll
            for (int p = 0; p < PRE; p++) {
                const float4 *row = py[p < k ? p : 0];
                __builtin_assume(__isGlobal(row));
                ya[j][p] = row[i];
            }
            sya[j] = shared_w ? srow[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    auto add = [](float4 o, float wp, float4 y) {
        return make_float4(__fmaf_rn(wp, y.x, o.x), __fmaf_rn(wp, y.y, o.y), __fmaf_rn(wp, y.z, o.z),
                           __fmaf_rn(wp, y.w, o.w));
    };
    float4 v[KPT];
#pragma unroll
    for (int j = 0; j < KPT; j++) {
        const int i = int(threadIdx.x) + j * 256;
        v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i >= n4) continue;
        // combine_at's sums for four columns: from zero, a fused multiply-add a pair, in the order given
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int64_t p0 = 0;
        if constexpr (AHEAD) {
#pragma unroll
            for (int p = 0; p < PRE; p++)
                if (p < k) o = add(o, pw[p], ya[j][p]);
            p0 = PRE;
        }
#pragma unroll 4
        for (int64_t p = p0; p < k; p++) o = add(o, pw[p], py[p][i]);
        if (shared_w) {
            const float4 sy = AHEAD ? sya[j] : reinterpret_cast<const float4 *>(shared_y.data + t * shared_y.stride)[i];
            o = make_float4(__fmaf_rn(gate, sy.x, o.x), __fmaf_rn(gate, sy.y, o.y), __fmaf_rn(gate, sy.z, o.z),
                            __fmaf_rn(gate, sy.w, o.w));
        }
        reinterpret_cast<float4 *>(out.data + t * out.stride)[i] = o;
        if (norm_w) {
            v[j] = make_float4(r[j].x + o.x, r[j].y + o.y, r[j].z + o.z, r[j].w + o.w);
            reinterpret_cast<float4 *>(resid.data + t * resid.stride)[i] = v[j];
        }
    }
    if (q8.form) q8.q += t * out.cols, q8.ds += t * (out.cols / 32);
    if (norm_w)
        rms_norm_wide_row<KPT>(v, wv, n4, out.cols, eps, red, reinterpret_cast<float4 *>(normed.data + t * normed.stride),
                               q8, pick);
}

// One thread per (token, pair): every load of a thread is independent of the others (one thread per token walking
// its pairs waited for each table read in turn: 7 us a layer on the 30B). The same groups as before, by construction.
__global__ void k_moe_pair_groups(const int32_t *ids, int64_t n_tokens, int64_t k, const uint8_t *const *table,
                                  MatmulGroup *gate, MatmulGroup *up, MatmulGroup *down, int32_t *yrow, int32_t *widx,
                                  const uint8_t *from_host, unsigned long long *counts) {
    pdl_wait();
    pdl_release();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * k) return;
    pair_group(i, ids, n_tokens, k, table, gate, up, down, yrow, widx, from_host, counts);
}

__global__ void k_shared_expert_add(Rows x, const float *w, Rows y, Rows out) {
    pdl_wait();
    pdl_release();
    __shared__ float red[32];
    const int64_t t = blockIdx.x;
    const float gate = shared_gate_of(x, w, t, red);
    for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x)
        out.data[t * out.stride + c] = __fmaf_rn(gate, y.data[t * y.stride + c], out.data[t * out.stride + c]);
}

// A block per gathered row (and slice of 65535 of them: grid y): its int8 values 16 bytes a thread, then its scales.
__global__ void k_gather_q8(const int8_t *q, const float2 *ds, int64_t k, const int32_t *rows, int8_t *q_out,
                            float2 *ds_out) {
    pdl_wait();
    pdl_release();
    const int64_t i = int64_t(blockIdx.y) * 65535 + blockIdx.x, src = rows[i];
    const int4 *qs = reinterpret_cast<const int4 *>(q + src * k);
    int4 *qd = reinterpret_cast<int4 *>(q_out + i * k);
    for (int64_t c = threadIdx.x; c < k / 16; c += blockDim.x) qd[c] = qs[c];
    const float2 *dsrc = ds + src * (k / 32);
    float2 *dd = ds_out + i * (k / 32);
    for (int64_t c = threadIdx.x; c < k / 32; c += blockDim.x) dd[c] = dsrc[c];
}

// STRATA_CUDA_ROUTER_REGS=0: the routing's top-k in its shared-memory form (A/B; the same picks and weights).
bool router_regs_on() {
    static const bool on = env_switch("STRATA_CUDA_ROUTER_REGS", true);
    return on;
}

}  // namespace

void launch_router_topk(Rows logits, int64_t k, bool norm, float scale, int32_t *ids, float *weights,
                        cudaStream_t stream, int regs) {
    if (logits.rows == 0) return;
    STRATA_ASSERT(k >= 1 && k <= logits.cols);
    const size_t smem = size_t(logits.cols) * sizeof(float);
    if (smem > 48 * 1024) fail("CUDA routing: %lld experts are more than this kernel takes", (long long)logits.cols);
    pdl_launch(k_router_topk, unsigned(logits.rows), 32, smem, stream, logits, k, norm, scale,
               (regs < 0 ? router_regs_on() : regs > 0) && router_regs_take(logits.cols, k), ids, weights);
    STRATA_CUDA_LAUNCH_CHECK("k_router_topk");
}

void launch_route_draws(Rows logits, int64_t k, bool norm, float scale, uint64_t seed, int64_t il, int64_t *pass,
                        bool new_pass, const double *cdf, const int32_t *expert_of_rank, int32_t *ids, float *weights,
                        cudaStream_t stream) {
    if (new_pass) {
        k_count_pass<<<1, 1, 0, stream>>>(pass);
        STRATA_CUDA_LAUNCH_CHECK("k_count_pass");
    }
    if (logits.rows == 0) return;
    STRATA_ASSERT(k >= 1 && k <= logits.cols);
    const size_t smem = size_t(logits.cols) * sizeof(float) + size_t(k) * sizeof(int32_t);
    if (smem > 48 * 1024) fail("CUDA routing: %lld experts are more than this kernel takes", (long long)logits.cols);
    for (int64_t t0 = 0; t0 < logits.rows; t0 += 65535) {  // the rows a grid's x takes at a time
        const int64_t n = std::min<int64_t>(65535, logits.rows - t0);
        k_route_draws<<<unsigned(n), 32, smem, stream>>>(logits, t0, k, norm, scale, seed, il, pass, cdf,
                                                         expert_of_rank, ids, weights);
        STRATA_CUDA_LAUNCH_CHECK("k_route_draws");
    }
}

bool router_fused_supported(DType t, int64_t n_expert, int64_t k_row, int64_t n_tokens) {
    const bool type = t == DType::F32 || t == DType::F16 || t == DType::BF16;
    return type && mmv_split_applies(n_expert, k_row) && n_tokens >= 1 && n_tokens <= k_mmv_max_rows &&
           size_t(k_mmv_split_threads / 32) * size_t(n_expert) * sizeof(float) <= 48 * 1024;
}

// STRATA_CUDA_ROUTER_ONE=1: a pass of one token routes by the one-launch router's one-token form (opt-in until measured
// on a GPU; the same bits).
bool router_one_on() {
    static const bool on = env_switch("STRATA_CUDA_ROUTER_ONE", false);
    return on;
}

void launch_router_fused(const MatmulArgs &a, int64_t k, bool norm, float scale, int32_t *ids, float *weights,
                         unsigned *done, cudaStream_t stream, const RouterPairs &pairs, int one) {
    STRATA_ASSERT(router_fused_supported(a.type, a.n, a.k, a.single.n_rows) && a.groups == nullptr);
    STRATA_ASSERT(k >= 1 && k <= a.n && a.single.x_row0 == 0 && a.single.y_row0 == 0);
    const IqGrids &g = iq_grids();
    const size_t smem = size_t(k_mmv_split_threads / 32) * size_t(a.n) * sizeof(float);  // a warp's probabilities
    const unsigned grid = unsigned(a.n);
    const bool regs = router_regs_on() && router_regs_take(a.n, k);
    const bool one_form = (one < 0 ? router_one_on() : one > 0) && a.single.n_rows == 1;
    const bool words =
        one_form && a.type == DType::F32 && (reinterpret_cast<uintptr_t>(a.single.w) % 4 == 0 && a.row_bytes % 4 == 0);
    // clang-format off
    switch (a.type) {
#define X(T_) \
        case DType::T_: \
            if (one_form) pdl_launch(k_router_fused<DType::T_, 1>, grid, k_mmv_split_threads, smem, stream, a, g, k, \
                                     norm, scale, regs, ids, weights, done, pairs, words); \
            else pdl_launch(k_router_fused<DType::T_, k_mmv_max_rows>, grid, k_mmv_split_threads, smem, stream, a, g, \
                            k, norm, scale, regs, ids, weights, done, pairs, false); \
            break;
        X(F32) X(F16) X(BF16)
#undef X
        default:
            fail("CUDA: no one-launch router for %s", dtype_name(a.type));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_router_fused");
}

bool router_norm_supported(const MatmulArgs &a, const RouterNorm &rn) {
    auto wide = [&](const Rows &r) {
        return (reinterpret_cast<uintptr_t>(r.data) & 15) == 0 && r.stride % 4 == 0 && r.cols == a.k &&
               r.rows == a.single.n_rows;
    };
    return a.type == DType::F32 && router_fused_supported(a.type, a.n, a.k, a.single.n_rows) && a.groups == nullptr &&
           a.k >= 1024 && a.k <= 16 * k_mmv_split_threads && a.k % 4 == 0 && wide(rn.resid) && wide(rn.y) &&
           wide(rn.normed) && (reinterpret_cast<uintptr_t>(rn.w) & 15) == 0;
}

void launch_router_norm(const MatmulArgs &a, int64_t k, bool norm, float scale, int32_t *ids, float *weights,
                        unsigned *done, cudaStream_t stream, const RouterPairs &pairs, const RouterNorm &rn) {
    STRATA_ASSERT(router_norm_supported(a, rn) && k >= 1 && k <= a.n && a.single.x_row0 == 0 && a.single.y_row0 == 0);
    STRATA_ASSERT(!rn.q8.form || norm_quantizes(rn.resid, rn.normed, a.k, rn.w, rn.q8.form));
    const IqGrids &g = iq_grids();
    const size_t smem = size_t(k_mmv_split_threads / 32) * size_t(a.n) * sizeof(float);  // a warp's probabilities
    const unsigned grid = unsigned(a.n);
    const bool regs = router_regs_on() && router_regs_take(a.n, k);
    const int64_t n4 = a.k / 4;  // launch_add_rms_norm's register count
    if (n4 <= 256)
        pdl_launch(k_router_norm<1>, grid, k_mmv_split_threads, smem, stream, a, g, k, norm, scale, regs, ids, weights,
                   done, pairs, rn);
    else if (n4 <= 512)
        pdl_launch(k_router_norm<2>, grid, k_mmv_split_threads, smem, stream, a, g, k, norm, scale, regs, ids, weights,
                   done, pairs, rn);
    else
        pdl_launch(k_router_norm<4>, grid, k_mmv_split_threads, smem, stream, a, g, k, norm, scale, regs, ids, weights,
                   done, pairs, rn);
    STRATA_CUDA_LAUNCH_CHECK("k_router_norm");
}

void launch_moe_combine(Rows ys, const int32_t *yrow, const int32_t *widx, const float *weights, int64_t k, Rows out,
                        cudaStream_t stream) {
    if (out.rows == 0) return;
    for (int64_t t0 = 0; t0 < out.rows; t0 += 65535) {  // slices of the tokens a grid's y takes
        const int64_t n = std::min<int64_t>(65535, out.rows - t0);
        const Rows os{out.data + t0 * out.stride, n, out.cols, out.stride};
        pdl_launch(k_moe_combine, dim3(std::min<unsigned>(ceil_div(out.cols, 256), 16), unsigned(n)), 256, 0, stream,
                   ys, yrow + t0 * k, widx + t0 * k, weights, k, os);
        STRATA_CUDA_LAUNCH_CHECK("k_moe_combine");
    }
}

bool moe_tail_fuses(const Rows &out, int64_t norm_group) {
    auto wide = [](const Rows &r) { return (reinterpret_cast<uintptr_t>(r.data) & 15) == 0 && r.stride % 4 == 0; };
    return out.cols >= 1024 && out.cols <= 8192 && out.cols % 4 == 0 && norm_group == out.cols && wide(out);
}

void launch_moe_tail(Rows ys, const int32_t *yrow, const int32_t *widx, const float *weights, int64_t k, Rows x,
                     const float *shared_w, Rows shared_y, Rows out, Rows resid, const float *norm_w, float eps,
                     Rows normed, cudaStream_t stream, const NormQ8 &q8, bool early, bool ahead) {
    if (out.rows == 0) return;
    STRATA_ASSERT(out.rows <= 65535 && k >= 1 && k <= k_moe_tail_max_k && moe_tail_fuses(out, out.cols) &&
                  moe_tail_fuses(ys, out.cols) && (!shared_w || moe_tail_fuses(shared_y, out.cols)) && (!norm_w || (moe_tail_fuses(resid, out.cols) &&
                  moe_tail_fuses(normed, out.cols) && (reinterpret_cast<uintptr_t>(norm_w) & 15) == 0)));
    STRATA_ASSERT(!q8.form || (norm_w && out.cols % (q8.form == 2 ? 256 : 32) == 0));
    const int64_t n4 = out.cols / 4;
    const unsigned grid = unsigned(out.rows);
#define TAIL(KPT_)                                                                                             \
    pdl_launch(ahead ? k_moe_tail<KPT_, true> : k_moe_tail<KPT_, false>, grid, 256, 0, stream, ys, yrow, widx, \
               weights, k, x, shared_w, shared_y, out, resid, norm_w, eps, normed, q8, early)
    if (n4 <= 256)
        TAIL(1);
    else if (n4 <= 512)
        TAIL(2);
    else if (n4 <= 1024)
        TAIL(4);
    else
        TAIL(8);
#undef TAIL
    STRATA_CUDA_LAUNCH_CHECK("k_moe_tail");
}

void launch_moe_pair_groups(const int32_t *ids, int64_t n_tokens, int64_t k, const uint8_t *const *table,
                            MatmulGroup *gate, MatmulGroup *up, MatmulGroup *down, int32_t *yrow, int32_t *widx,
                            const uint8_t *from_host, unsigned long long *counts, cudaStream_t stream) {
    if (n_tokens == 0) return;
    pdl_launch(k_moe_pair_groups, ceil_div(n_tokens * k, 64), 64, 0, stream, ids, n_tokens, k, table, gate, up, down,
               yrow, widx, from_host, counts);
    STRATA_CUDA_LAUNCH_CHECK("k_moe_pair_groups");
}

void launch_gather_q8(const int8_t *q, const float2 *ds, int64_t k, const int32_t *rows, int64_t n, int8_t *q_out,
                      float2 *ds_out, cudaStream_t stream) {
    if (n == 0) return;
    STRATA_ASSERT(k % 32 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(q_out) % 16 == 0);
    // whole slices of 65535 rows in one launch (grid y), the rest in another
    const int64_t full = n / 65535, rest = n % 65535;
    if (full) pdl_launch(k_gather_q8, dim3(65535, unsigned(full)), 128, 0, stream, q, ds, k, rows, q_out, ds_out);
    if (rest)
        pdl_launch(k_gather_q8, dim3(unsigned(rest), 1), 128, 0, stream, q, ds, k, rows + full * 65535,
                   q_out + full * 65535 * k, ds_out + full * 65535 * (k / 32));
    STRATA_CUDA_LAUNCH_CHECK("k_gather_q8");
}

void launch_shared_expert_add(Rows x, const float *w, Rows y, Rows out, cudaStream_t stream) {
    if (out.rows == 0) return;
    pdl_launch(k_shared_expert_add, unsigned(out.rows), 256, 0, stream, x, w, y, out);
    STRATA_CUDA_LAUNCH_CHECK("k_shared_expert_add");
}

}  // namespace strata::cuda
