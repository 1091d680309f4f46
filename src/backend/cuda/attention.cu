// Attention on the device: cache stores (q8_0 quantized exactly as format/quant.h does) and a one-pass attention
// kernel with an online softmax over key tiles. One block of four warps per (row, query head); warps compute a
// tile's scores with lanes across head_dim, then every thread updates the output dims it owns.
#include "backend/cuda/attention.cuh"

#include <algorithm>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

template <KvType KT>
__device__ __forceinline__ float kv_elem(const uint8_t *row, int64_t i) {
    if constexpr (KT == KvType::F32)
        return reinterpret_cast<const float *>(row)[i];
    else if constexpr (KT == KvType::F16)
        return f16_to_f32(reinterpret_cast<const uint16_t *>(row)[i]);
    else {
        const uint8_t *b = row + (i / 32) * 34;
        return __fmul_rn(float(int8_t(b[2 + i % 32])), f16_to_f32(*reinterpret_cast<const uint16_t *>(b)));
    }
}

// Value i of a cache row: f32 and f16 as themselves, q8_0 by the whole warp (its lanes put 32 consecutive values of
// a block together: the block's scale from their largest magnitude, as format/quant.h quantizes).
template <KvType KT>
__device__ __forceinline__ void kv_put(uint8_t *row, int64_t i, float x) {
    if constexpr (KT == KvType::F32) {
        reinterpret_cast<float *>(row)[i] = x;
    } else if constexpr (KT == KvType::F16) {
        reinterpret_cast<uint16_t *>(row)[i] = f32_to_f16(x);
    } else {
        const float amax = warp_max(fabsf(x));
        const float d = __fdiv_rn(amax, 127.0f);
        const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        const float s = __fmul_rn(x, id);
        const float q = isnan(s) ? 0.0f : fminf(fmaxf(roundf(s), -128.0f), 127.0f);
        uint8_t *b = row + (i / 32) * 34;
        b[2 + i % 32] = uint8_t(int8_t(q));
        if ((threadIdx.x & 31) == 0) *reinterpret_cast<uint16_t *>(b) = f32_to_f16(d);
    }
}

// Where row r's position lies in a cache (k or v).
__device__ __forceinline__ size_t kv_offset(const KvCacheView &c, int2 sp) {
    return (size_t(sp.x) * size_t(c.n_ctx) + size_t(sp.y)) * c.row_bytes;
}

// One warp per 32 values of a row (q8_0: one block); f32 and f16 just convert.
template <KvType KT>
__global__ void k_kv_store(KvCacheView c, Rows k, Rows v, const int2 *seq_pos) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    const size_t off = kv_offset(c, seq_pos[r]);
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= c.kv_cols) return;  // kv_cols is a multiple of 32 for q8_0, so whole warps leave together
    kv_put<KT>(c.k + off, i, k.data[r * k.stride + i]);
    kv_put<KT>(c.v + off, i, v.data[r * v.stride + i]);
}

// q and k of an attention layer at once: block (h, r) takes head h of row r (q's heads first, then k's), its RMSNorm
// with the same block size and tree as k_rms_norm, then the NeoX rotation of its first n_rot dims with the same
// arithmetic as k_rope_neox: the results are those of the four separate kernels, from one launch. STORE: k's heads
// also put their results in the cache c at the row's position as k_kv_store puts them, and blocks after k's put v's
// heads there: the cache holds what launch_kv_store of the results would put, with no launch of its own. early: the
// rotation's angles (from the positions and frequencies) and the norm's weights before the wait (pdl.cuh); at most
// k_qk_rope_per values a thread (launch_qk_norm_rope's block sizes).
constexpr int k_qk_rope_per = 4;

template <bool STORE, KvType KT>
__global__ void k_qk_norm_rope(Rows q, Rows k, Rows v, const float *wq, const float *wk, int64_t head_dim, float eps,
                               int64_t half, const float *inv_freq, const int2 *seq_pos, KvCacheView c, bool early) {
    __shared__ float red[32];
    __shared__ float y[256];
    const int64_t r = blockIdx.y, n_q = q.cols / head_dim, n_k = k.cols / head_dim;
    const bool is_v = STORE && int64_t(blockIdx.x) >= n_q + n_k, is_q = int64_t(blockIdx.x) < n_q;
    const float *w = is_q ? wq : wk;
    float sn[k_qk_rope_per], cs[k_qk_rope_per], wi[k_qk_rope_per];
    // this thread's values' sines and cosines (values i = threadIdx.x + n blockDim.x) and the norm's weights
    auto reads = [&] {
        const float p = float(seq_pos[r].y);
#pragma unroll
        for (int n = 0; n < k_qk_rope_per; n++) {
            const int64_t i = threadIdx.x + int64_t(n) * blockDim.x;
            sn[n] = 0.0f, cs[n] = 1.0f, wi[n] = 0.0f;
            if (is_v || i >= head_dim) continue;
            wi[n] = w[i];
            if (i < 2 * half) sincosf(__fmul_rn(p, inv_freq[i < half ? i : i - half]), &sn[n], &cs[n]);
        }
    };
    if (early) reads();
    pdl_wait();
    pdl_release();
    if (!early) reads();
    if (is_v) {  // a head of v: stored as it is
        const int64_t h = int64_t(blockIdx.x) - n_q - n_k;
        uint8_t *row = c.v + kv_offset(c, seq_pos[r]);
        for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x)
            kv_put<KT>(row, h * head_dim + i, v.data[r * v.stride + h * head_dim + i]);
        return;
    }
    const int64_t h = is_q ? int64_t(blockIdx.x) : int64_t(blockIdx.x) - n_q;
    const Rows &x = is_q ? q : k;
    float *xr = x.data + r * x.stride + h * head_dim;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / float(head_dim) + eps);
#pragma unroll
    for (int n = 0; n < k_qk_rope_per; n++) {
        const int64_t i = threadIdx.x + int64_t(n) * blockDim.x;
        if (i < head_dim) y[i] = xr[i] * scale * wi[n];
    }
    __syncthreads();
    uint8_t *krow = STORE && !is_q ? c.k + kv_offset(c, seq_pos[r]) : nullptr;
#pragma unroll
    for (int n = 0; n < k_qk_rope_per; n++) {
        const int64_t i = threadIdx.x + int64_t(n) * blockDim.x;
        if (i >= head_dim) break;
        float o;
        if (i < 2 * half) {
            const int64_t j = i < half ? i : i - half;
            const float2 ab = rope_pair(y[j], y[j + half], cs[n], sn[n]);
            o = i < half ? ab.x : ab.y;
        } else {
            o = y[i];
        }
        xr[i] = o;
        if (STORE && krow) kv_put<KT>(krow, h * head_dim + i, o);
    }
}

constexpr int k_att_threads = 128, k_att_tile = 64, k_att_max_dim = 512;

template <KvType KT>
__global__ __launch_bounds__(k_att_threads) void k_attention(KvCacheView c, Rows q, Rows out, int64_t group,
                                                             int64_t head_dim, float scale, const int2 *seq_pos) {
    pdl_wait();
    pdl_release();
    __shared__ float qh[k_att_max_dim];
    __shared__ float sc[k_att_tile];
    const int64_t h = blockIdx.x, r = blockIdx.y, kvh = h / group;
    const int2 sp = seq_pos[r];
    const int64_t n_vis = int64_t(sp.y) + 1;
    const uint8_t *kbase = c.k + size_t(sp.x) * size_t(c.n_ctx) * c.row_bytes;
    const uint8_t *vbase = c.v + size_t(sp.x) * size_t(c.n_ctx) * c.row_bytes;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    for (int64_t i = tid; i < head_dim; i += k_att_threads) qh[i] = q.data[r * q.stride + h * head_dim + i];
    __syncthreads();

    constexpr int n_own = k_att_max_dim / k_att_threads;
    float o[n_own];
#pragma unroll
    for (int j = 0; j < n_own; j++) o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int64_t col0 = kvh * head_dim;

    for (int64_t p0 = 0; p0 < n_vis; p0 += k_att_tile) {
        for (int pp = warp; pp < k_att_tile; pp += k_att_threads / 32) {
            const int64_t p = p0 + pp;
            float s = -INFINITY;
            if (p < n_vis) {
                const uint8_t *kr = kbase + size_t(p) * c.row_bytes;
                float d = 0.0f;
                for (int64_t i = lane; i < head_dim; i += 32) d += qh[i] * kv_elem<KT>(kr, col0 + i);
                s = warp_sum(d) * scale;
            }
            if (lane == 0) sc[pp] = s;
        }
        __syncthreads();
        float tmax = -INFINITY;
        for (int pp = 0; pp < k_att_tile; pp++) tmax = fmaxf(tmax, sc[pp]);
        const float m_new = fmaxf(m, tmax);
        const float corr = expf(m - m_new);
        __syncthreads();
        if (tid < k_att_tile) sc[tid] = expf(sc[tid] - m_new);  // -inf (past the end) gives 0
        __syncthreads();
        float lsum = 0.0f;
        for (int pp = 0; pp < k_att_tile; pp++) lsum += sc[pp];
        l = l * corr + lsum;
        const int64_t n_tile = min(int64_t(k_att_tile), n_vis - p0);
#pragma unroll
        for (int j = 0; j < n_own; j++) {
            const int64_t i = tid + int64_t(j) * k_att_threads;
            if (i >= head_dim) break;
            float acc = o[j] * corr;
            for (int64_t pp = 0; pp < n_tile; pp++)
                acc += sc[pp] * kv_elem<KT>(vbase + size_t(p0 + pp) * c.row_bytes, col0 + i);
            o[j] = acc;
        }
        m = m_new;
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < n_own; j++) {
        const int64_t i = tid + int64_t(j) * k_att_threads;
        if (i >= head_dim) break;
        out.data[r * out.stride + h * head_dim + i] = o[j] / l;
    }
}

}  // namespace

void launch_kv_store(const KvCacheView &c, Rows k, Rows v, const int2 *seq_pos_dev, cudaStream_t stream) {
    if (k.rows == 0) return;
    STRATA_ASSERT(k.rows <= 65535 && (c.type != KvType::Q8_0 || c.kv_cols % 32 == 0));
    const dim3 grid(ceil_div(c.kv_cols, 128), unsigned(k.rows));
    switch (c.type) {
        case KvType::F32:
            pdl_launch(k_kv_store<KvType::F32>, grid, 128, 0, stream, c, k, v, seq_pos_dev);
            break;
        case KvType::F16:
            pdl_launch(k_kv_store<KvType::F16>, grid, 128, 0, stream, c, k, v, seq_pos_dev);
            break;
        case KvType::Q8_0:
            pdl_launch(k_kv_store<KvType::Q8_0>, grid, 128, 0, stream, c, k, v, seq_pos_dev);
            break;
    }
    STRATA_CUDA_LAUNCH_CHECK("k_kv_store");
}

void launch_qk_norm_rope(Rows q, Rows k, const float *wq, const float *wk, int64_t head_dim, float eps, int64_t n_rot,
                         const float *inv_freq_dev, const int2 *seq_pos_dev, cudaStream_t stream,
                         const KvCacheView *store, Rows v, bool early) {
    if (q.rows == 0) return;
    STRATA_ASSERT(k.rows == q.rows && head_dim <= 256 && q.cols % head_dim == 0 && k.cols % head_dim == 0);
    STRATA_ASSERT(n_rot % 2 == 0 && n_rot <= head_dim);
    STRATA_ASSERT(!store || (qk_norm_rope_stores(*store, head_dim) && v.rows == k.rows && k.cols == store->kv_cols &&
                             v.cols == store->kv_cols));
    const unsigned threads = head_dim >= 1024 ? 256 : head_dim >= 128 ? 128 : 32;  // launch_rms_norm's choice
    STRATA_ASSERT(head_dim <= int64_t(threads) * k_qk_rope_per);
    const unsigned heads = unsigned(q.cols / head_dim + (store ? 2 : 1) * (k.cols / head_dim));
    const KvCacheView c = store ? *store : KvCacheView{};
    auto slice = [](const Rows &a, int64_t r0, int64_t n) { return Rows{a.data + r0 * a.stride, n, a.cols, a.stride}; };
    for (int64_t r0 = 0; r0 < q.rows; r0 += 65535) {  // the rows a grid's y takes at a time
        const int64_t n = std::min<int64_t>(65535, q.rows - r0);
        const dim3 grid(heads, unsigned(n));
        const Rows qs = slice(q, r0, n), ks = slice(k, r0, n), vs = store ? slice(v, r0, n) : Rows{};
        const int2 *sp = seq_pos_dev + r0;
        const int64_t half = n_rot / 2;
        if (!store)
            pdl_launch(k_qk_norm_rope<false, KvType::F32>, grid, threads, 0, stream, qs, ks, vs, wq, wk, head_dim, eps,
                       half, inv_freq_dev, sp, c, early);
        else if (c.type == KvType::F32)
            pdl_launch(k_qk_norm_rope<true, KvType::F32>, grid, threads, 0, stream, qs, ks, vs, wq, wk, head_dim, eps,
                       half, inv_freq_dev, sp, c, early);
        else if (c.type == KvType::F16)
            pdl_launch(k_qk_norm_rope<true, KvType::F16>, grid, threads, 0, stream, qs, ks, vs, wq, wk, head_dim, eps,
                       half, inv_freq_dev, sp, c, early);
        else
            pdl_launch(k_qk_norm_rope<true, KvType::Q8_0>, grid, threads, 0, stream, qs, ks, vs, wq, wk, head_dim, eps,
                       half, inv_freq_dev, sp, c, early);
    }
    STRATA_CUDA_LAUNCH_CHECK("k_qk_norm_rope");
}

bool qk_norm_rope_stores(const KvCacheView &c, int64_t head_dim) {
    return head_dim % 32 == 0 && c.kv_cols % head_dim == 0;
}

void launch_attention(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      float scale, const int2 *seq_pos_dev, cudaStream_t stream) {
    if (q.rows == 0) return;
    if (head_dim > k_att_max_dim)
        fail("CUDA attention: head size %lld is above %d", (long long)head_dim, k_att_max_dim);
    STRATA_ASSERT(q.rows <= 65535 && n_head % n_head_kv == 0);
    const dim3 grid(unsigned(n_head), unsigned(q.rows));
    const int64_t group = n_head / n_head_kv;
    switch (c.type) {
        case KvType::F32:
            pdl_launch(k_attention<KvType::F32>, grid, k_att_threads, 0, stream, c, q, out, group, head_dim, scale,
                       seq_pos_dev);
            break;
        case KvType::F16:
            pdl_launch(k_attention<KvType::F16>, grid, k_att_threads, 0, stream, c, q, out, group, head_dim, scale,
                       seq_pos_dev);
            break;
        case KvType::Q8_0:
            pdl_launch(k_attention<KvType::Q8_0>, grid, k_att_threads, 0, stream, c, q, out, group, head_dim, scale,
                       seq_pos_dev);
            break;
    }
    STRATA_CUDA_LAUNCH_CHECK("k_attention");
}

}  // namespace strata::cuda
