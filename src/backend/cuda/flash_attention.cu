// Tiled attention: a block takes M query vectors that share one KV head (consecutive rows of one sequence times the
// heads of their GQA group), walks the visible keys in tiles of N held in shared memory as f32, and keeps an online
// softmax per vector, so every K/V value is read once per tile instead of once per query row and head. Long key
// ranges may be split over several blocks (flash-decoding: each writes its partial output, maximum and sum, and a
// second kernel merges them), so a single decoding sequence still fills the GPU. Scores and sums are fp32 as in the
// reference.
#include "backend/cuda/attention.cuh"

#include "backend/cuda/act_q8.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int k_threads = 128, TM = 16, TN = 8;  // thread grid: TM row groups x TN key (or dim) groups

// SMALL: tiles of 16 vectors, for batches of decoding sequences (a row times its GQA group).
template <int D, bool SMALL>
struct Cfg {
    static constexpr int M = SMALL ? 16 : D <= 128 ? 64 : 32;  // query vectors per block
    static constexpr int N = D <= 128 ? 32 : 16;               // keys per tile
    static constexpr int RM = M / TM, RN = N / TN, RD = D / TN;
    static constexpr int QP = D + 4;  // padded pitch of Q and K rows (16-byte loads, rows 4 banks apart)
    static constexpr int PP = N + 1;
    static constexpr size_t smem = sizeof(float) * size_t(M * QP + N * QP + N * D + M * PP);
};

// Rows [k0, k0 + N) of the tile's K and V (zeros past k_hi) into shared memory as f32. Every global load of a
// thread is issued before its first store, so the loads' latencies overlap: with few blocks (decoding) nothing else
// would hide them.
template <KvType KT, int D, int N, int QP>
__device__ __forceinline__ void load_kv_tile(const uint8_t *kb, const uint8_t *vb, size_t row_bytes, int col0, int k0,
                                             int k_hi, float *Ks, float *Vs, int tid) {
    if constexpr (KT == KvType::Q8_0) {
        constexpr int BPR = D / 32, NB = N * BPR, PER = (NB + k_threads - 1) / k_threads;
        uint16_t kr[PER][17], vr[PER][17];
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * k_threads, kk = i / BPR, b = i % BPR, p = k0 + kk;
            const bool ok = i < NB && p < k_hi;
            const size_t off = size_t(p) * row_bytes + size_t(col0 / 32 + b) * 34;
            const uint16_t *ks = reinterpret_cast<const uint16_t *>(kb + off);
            const uint16_t *vs = reinterpret_cast<const uint16_t *>(vb + off);
#pragma unroll
            for (int h = 0; h < 17; h++) {
                kr[j][h] = ok ? ks[h] : uint16_t(0);
                vr[j][h] = ok ? vs[h] : uint16_t(0);
            }
        }
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * k_threads, kk = i / BPR, b = i % BPR;
            if (i >= NB) continue;
            const float dk = f16_to_f32_arith(kr[j][0]), dv = f16_to_f32_arith(vr[j][0]);
#pragma unroll
            for (int e = 0; e < 32; e++) {
                const int8_t qk = int8_t(kr[j][1 + e / 2] >> (8 * (e % 2)));
                const int8_t qv = int8_t(vr[j][1 + e / 2] >> (8 * (e % 2)));
                Ks[kk * QP + b * 32 + e] = __fmul_rn(float(qk), dk);
                Vs[kk * D + b * 32 + e] = __fmul_rn(float(qv), dv);
            }
        }
    } else {
        // 16-byte pieces: 8 halves or 4 floats.
        constexpr int EL = KT == KvType::F16 ? 8 : 4, CPR = D / EL, NC = N * CPR;
        constexpr int PER = (NC + k_threads - 1) / k_threads;
        constexpr int ES = KT == KvType::F16 ? 2 : 4;
        uint4 kr[PER], vr[PER];
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * k_threads, kk = i / CPR, ch = i % CPR, p = k0 + kk;
            kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
            if (i < NC && p < k_hi) {
                const size_t off = size_t(p) * row_bytes + size_t(col0 + ch * EL) * ES;
                kr[j] = *reinterpret_cast<const uint4 *>(kb + off);
                vr[j] = *reinterpret_cast<const uint4 *>(vb + off);
            }
        }
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int i = tid + j * k_threads, kk = i / CPR, ch = i % CPR;
            if (i >= NC) continue;
            const uint32_t kw[4] = {kr[j].x, kr[j].y, kr[j].z, kr[j].w}, vw[4] = {vr[j].x, vr[j].y, vr[j].z, vr[j].w};
#pragma unroll
            for (int e = 0; e < EL; e++) {
                float kf, vf;
                if constexpr (KT == KvType::F16) {
                    kf = f16_to_f32_arith((kw[e / 2] >> (16 * (e % 2))) & 0xffffu);
                    vf = f16_to_f32_arith((vw[e / 2] >> (16 * (e % 2))) & 0xffffu);
                } else {
                    kf = __uint_as_float(kw[e]);
                    vf = __uint_as_float(vw[e]);
                }
                Ks[kk * QP + ch * EL + e] = kf;
                Vs[kk * D + ch * EL + e] = vf;
            }
        }
    }
}

__device__ __forceinline__ float group_max8(float v) {
    v = fmaxf(v, __shfl_xor_sync(k_full_mask, v, 1));
    v = fmaxf(v, __shfl_xor_sync(k_full_mask, v, 2));
    return fmaxf(v, __shfl_xor_sync(k_full_mask, v, 4));
}
__device__ __forceinline__ float group_sum8(float v) {
    v += __shfl_xor_sync(k_full_mask, v, 1);
    v += __shfl_xor_sync(k_full_mask, v, 2);
    return v + __shfl_xor_sync(k_full_mask, v, 4);
}

template <KvType KT, int D, bool SMALL>
__global__ __launch_bounds__(k_threads) void k_flash(KvCacheView c, Rows q, Rows out, int group, int n_kv, float scale,
                                                     const AttnTile *tiles, int n_split, int chunk, float *ws,
                                                     bool early) {
    using C = Cfg<D, SMALL>;
    constexpr int M = C::M, N = C::N, RM = C::RM, RN = C::RN, RD = C::RD, QP = C::QP, PP = C::PP;
    extern __shared__ float4 smem4[];
    float *Qs = reinterpret_cast<float *>(smem4), *Ks = Qs + M * QP, *Vs = Ks + N * QP, *Ps = Vs + N * D;

    const int kvh = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, tm = tid / TN, tn = tid % TN;
    auto cache_of = [&](const uint8_t *base, const AttnTile &at) {
        return base + (size_t(at.seq) * size_t(c.n_ctx)) * c.row_bytes;
    };
    // early (pdl.cuh; the caller uploaded no tile for this launch): the tile and, where every key of the block's first
    // key tile is older than the pass's rows (the pass writes from t.pos_new on), that key tile, before the wait.
    AttnTile t{};
    bool first_loaded = false;
    if (early) {
        t = tiles[blockIdx.x];
        const int lo = split * chunk, hi = min(t.pos0 + t.n_rows, lo + chunk);
        if (lo < hi && min(lo + N, hi) <= t.pos_new) {
            load_kv_tile<KT, D, N, QP>(cache_of(c.k, t), cache_of(c.v, t), c.row_bytes, kvh * D, lo, hi, Ks, Vs, tid);
            first_loaded = true;
        }
    }
    pdl_wait();
    pdl_release();
    if (!early) t = tiles[blockIdx.x];
    const int n_vec = t.n_rows * group;

#pragma unroll 16
    for (int i = tid; i < M * D; i += k_threads) {
        const int v = i / D, d = i % D;
        float val = 0.0f;
        if (v < n_vec) val = q.data[int64_t(t.row0 + v / group) * q.stride + int64_t(kvh * group + v % group) * D + d];
        Qs[v * QP + d] = val;
    }

    // Vector tm + TM * i is row (tm + TM * i) / group of the tile: its position bounds the keys it sees.
    int pos[RM];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int v = tm + TM * i;
        pos[i] = v < n_vec ? t.pos0 + v / group : -1;
    }
    const int key_end = t.pos0 + t.n_rows;
    const int k_lo = split * chunk, k_hi = min(key_end, k_lo + chunk);
    const uint8_t *kb = cache_of(c.k, t), *vb = cache_of(c.v, t);
    const int col0 = kvh * D;

    float o[RM][RD], m[RM], l[RM];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < RD; j++) o[i][j] = 0.0f;
    }

    for (int k0 = k_lo; k0 < k_hi; k0 += N) {
        __syncthreads();  // the previous tile's K, V and P are no longer read
        if (!first_loaded || k0 != k_lo) load_kv_tile<KT, D, N, QP>(kb, vb, c.row_bytes, col0, k0, k_hi, Ks, Vs, tid);
        __syncthreads();

        float s[RM][RN];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < RN; j++) s[i][j] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < D; d += 4) {
            float4 qv[RM], kv[RN];
#pragma unroll
            for (int i = 0; i < RM; i++) qv[i] = *reinterpret_cast<const float4 *>(Qs + (tm + TM * i) * QP + d);
#pragma unroll
            for (int j = 0; j < RN; j++) kv[j] = *reinterpret_cast<const float4 *>(Ks + (tn + TN * j) * QP + d);
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < RN; j++) {
                    s[i][j] += qv[i].x * kv[j].x;
                    s[i][j] += qv[i].y * kv[j].y;
                    s[i][j] += qv[i].z * kv[j].z;
                    s[i][j] += qv[i].w * kv[j].w;
                }
        }

#pragma unroll
        for (int i = 0; i < RM; i++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                const int p = k0 + tn + TN * j;
                s[i][j] = p < k_hi && p <= pos[i] ? s[i][j] * scale : -INFINITY;
                tmax = fmaxf(tmax, s[i][j]);
            }
            tmax = group_max8(tmax);
            const float m_new = fmaxf(m[i], tmax);
            // A vector that has seen no key yet keeps m = -inf: its weights are 0 and nothing is rescaled.
            const float corr = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            float psum = 0.0f;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                const float p = m_new == -INFINITY ? 0.0f : expf(s[i][j] - m_new);
                psum += p;
                Ps[(tm + TM * i) * PP + tn + TN * j] = p;
            }
            l[i] = l[i] * corr + group_sum8(psum);
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < RD; j++) o[i][j] *= corr;
        }
        __syncthreads();
        const int n_keys = min(N, k_hi - k0);
        for (int kk = 0; kk < n_keys; kk++) {
            float pv[RM], vv[RD];
#pragma unroll
            for (int i = 0; i < RM; i++) pv[i] = Ps[(tm + TM * i) * PP + kk];
#pragma unroll
            for (int j = 0; j < RD; j++) vv[j] = Vs[kk * D + tn + TN * j];
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < RD; j++) o[i][j] += pv[i] * vv[j];
        }
    }

#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int v = tm + TM * i;
        if (v >= n_vec) continue;
        if (n_split == 1) {
            float *dst = out.data + int64_t(t.row0 + v / group) * out.stride + int64_t(kvh * group + v % group) * D;
#pragma unroll
            for (int j = 0; j < RD; j++) dst[tn + TN * j] = o[i][j] / l[i];
        } else {
            const int64_t base = ((int64_t(blockIdx.x) * n_kv + kvh) * n_split + split) * M + v;
            float *dst = ws + base * (D + 2);
#pragma unroll
            for (int j = 0; j < RD; j++) dst[tn + TN * j] = o[i][j];
            if (tn == 0) dst[D] = m[i], dst[D + 1] = l[i];
        }
    }
}

// Merges the splits of each vector: o = sum_s o_s e^(m_s - m) / sum_s l_s e^(m_s - m), splits in order. M: the
// vectors per tile of the kernel that wrote the partials.
__global__ void k_flash_merge(Rows out, int D, int M, int group, int n_kv, const AttnTile *tiles, int n_split,
                              const float *ws) {
    pdl_wait();
    pdl_release();
    const AttnTile t = tiles[blockIdx.x];
    const int kvh = blockIdx.y, n_vec = t.n_rows * group;
    for (int i = threadIdx.x; i < n_vec * D; i += blockDim.x) {
        const int v = i / D, d = i % D;
        const int64_t base = (int64_t(blockIdx.x) * n_kv + kvh) * n_split * M + v;
        float mx = -INFINITY;
        for (int s = 0; s < n_split; s++) mx = fmaxf(mx, ws[(base + int64_t(s) * M) * (D + 2) + D]);
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float *p = ws + (base + int64_t(s) * M) * (D + 2);
            if (p[D] == -INFINITY) continue;  // a split with no visible key
            const float w = expf(p[D] - mx);
            num = __fmaf_rn(p[d], w, num);
            den = __fmaf_rn(p[D + 1], w, den);
        }
        out.data[int64_t(t.row0 + v / group) * out.stride + int64_t(kvh * group + v % group) * D + d] = num / den;
    }
}

// The same merge with a block per (tile, KV head, vector) and a thread per value: the splits' maxima, weights and
// sums read once into shared memory by all threads together, then each value's sum over the splits in order (the
// same products and sums as k_flash_merge, so the same bits). k_flash_merge gives a whole KV head's vectors to one
// block and walks the splits' workspace one dependent load after another: 52 us a layer for a decoding token at a
// 4096-token context on the H200.
__global__ void k_flash_merge_vec(Rows out, int D, int M, int group, int n_kv, const AttnTile *tiles, int n_split,
                                  const float *ws, NormQ8 q8) {
    pdl_wait();
    pdl_release();
    extern __shared__ float sm[];
    float *wt = sm, *ls = sm + n_split;  // per split: its weight (-1: no visible key) and its sum
    __shared__ float red[32];
    const AttnTile t = tiles[blockIdx.x];
    const int kvh = blockIdx.y, v = blockIdx.z, d = threadIdx.x;
    if (v >= t.n_rows * group) return;
    const int64_t base = (int64_t(blockIdx.x) * n_kv + kvh) * n_split * M + v;
    float mx = -INFINITY;
    for (int s = d; s < n_split; s += blockDim.x) {
        const float *p = ws + (base + int64_t(s) * M) * (D + 2);
        const float m = p[D];
        wt[s] = m;
        ls[s] = p[D + 1];
        mx = fmaxf(mx, m);
    }
    mx = block_max(mx, red);
    for (int s = d; s < n_split; s += blockDim.x) wt[s] = wt[s] == -INFINITY ? -1.0f : expf(wt[s] - mx);
    __syncthreads();
    // The splits' values in batches of B loaded together (each a dependent L2 round trip otherwise), then summed in
    // split order.
    constexpr int B = 16;
    float num = 0.0f, den = 0.0f;
    for (int s0 = 0; s0 < n_split; s0 += B) {
        float o[B];
#pragma unroll
        for (int j = 0; j < B; j++)
            o[j] = s0 + j < n_split ? ws[(base + int64_t(s0 + j) * M) * (D + 2) + d] : 0.0f;
#pragma unroll
        for (int j = 0; j < B; j++) {
            if (s0 + j >= n_split) break;
            const float w = wt[s0 + j];
            if (w < 0.0f) continue;  // a split with no visible key
            num = __fmaf_rn(o[j], w, num);
            den = __fmaf_rn(ls[s0 + j], w, den);
        }
    }
    const int64_t row = t.row0 + v / group, col = int64_t(kvh * group + v % group) * D + d;
    const float o[1] = {num / den};
    out.data[row * out.stride + col] = o[0];
    if (q8.form) q8_0_lanes<1>(o, col, q8.q + row * out.cols, q8.ds + row * (out.cols / 32));  // D: whole warps
}

// STRATA_CUDA_FLASH_MERGE_VEC=0 keeps the merge on k_flash_merge (the same bits; A/B of k_flash_merge_vec).
bool merge_vec_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FLASH_MERGE_VEC", true);
    return on;
}

}  // namespace

bool flash_merge_quantizes(int n_split) {
    return merge_vec_enabled() && 2 * size_t(n_split) * sizeof(float) <= 48 * 1024;
}

void launch_flash_merge(Rows out, int64_t head_dim, int vectors_per_tile, int group, int n_kv, const AttnTile *tiles,
                        int n_tiles, int n_split, const float *ws, cudaStream_t stream, MergeForm form,
                        const NormQ8 &q8) {
    const size_t smem = 2 * size_t(n_split) * sizeof(float);
    if (form == MergeForm::Auto) form = merge_vec_enabled() && smem <= 48 * 1024 ? MergeForm::Vector : MergeForm::Block;
    STRATA_ASSERT(!q8.form || (q8.form == 1 && form == MergeForm::Vector && head_dim % 32 == 0));
    if (form == MergeForm::Vector) {
        STRATA_ASSERT(smem <= 48 * 1024);
        pdl_launch(k_flash_merge_vec, dim3(unsigned(n_tiles), unsigned(n_kv), unsigned(vectors_per_tile)),
                   unsigned(head_dim), smem, stream, out, int(head_dim), vectors_per_tile, group, n_kv, tiles, n_split,
                   ws, q8);
        STRATA_CUDA_LAUNCH_CHECK("k_flash_merge_vec");
        return;
    }
    pdl_launch(k_flash_merge, dim3(unsigned(n_tiles), unsigned(n_kv)), 256, 0, stream, out, int(head_dim),
               vectors_per_tile, group, n_kv, tiles, n_split, ws);
    STRATA_CUDA_LAUNCH_CHECK("k_flash_merge");
}

namespace {

template <KvType KT, int D, bool SMALL>
void launch_typed(const KvCacheView &c, Rows q, Rows out, int group, int n_kv, float scale, const AttnTile *tiles,
                  int n_tiles, int n_split, int chunk, float *ws, cudaStream_t stream, const NormQ8 &q8, bool early) {
    if (!allow_dynamic_smem(reinterpret_cast<const void *>(k_flash<KT, D, SMALL>), Cfg<D, SMALL>::smem))
        fail("CUDA attention: %zu bytes of shared memory per block are not available", Cfg<D, SMALL>::smem);
    const dim3 grid{unsigned(n_tiles), unsigned(n_kv), unsigned(n_split)};
    pdl_launch(k_flash<KT, D, SMALL>, grid, k_threads, Cfg<D, SMALL>::smem, stream, c, q, out, group, n_kv, scale,
               tiles, n_split, chunk, ws, early);
    STRATA_CUDA_LAUNCH_CHECK("k_flash");
    STRATA_ASSERT(!q8.form || n_split > 1);
    if (n_split > 1)
        launch_flash_merge(out, D, Cfg<D, SMALL>::M, group, n_kv, tiles, n_tiles, n_split, ws, stream, MergeForm::Auto,
                           q8);
}

template <int D, bool SMALL>
void launch_dim(const KvCacheView &c, Rows q, Rows out, int group, int n_kv, float scale, const AttnTile *tiles,
                int n_tiles, int n_split, int chunk, float *ws, cudaStream_t stream, const NormQ8 &q8, bool early) {
    switch (c.type) {
        case KvType::F32:
            return launch_typed<KvType::F32, D, SMALL>(c, q, out, group, n_kv, scale, tiles, n_tiles, n_split, chunk,
                                                       ws, stream, q8, early);
        case KvType::F16:
            return launch_typed<KvType::F16, D, SMALL>(c, q, out, group, n_kv, scale, tiles, n_tiles, n_split, chunk,
                                                       ws, stream, q8, early);
        case KvType::Q8_0:
            return launch_typed<KvType::Q8_0, D, SMALL>(c, q, out, group, n_kv, scale, tiles, n_tiles, n_split, chunk,
                                                        ws, stream, q8, early);
    }
}

int tile_vectors(int64_t head_dim, bool small) {
    if (head_dim != 64 && head_dim != 128 && head_dim != 256) return 0;
    return small ? Cfg<64, true>::M : head_dim <= 128 ? Cfg<128, false>::M : Cfg<256, false>::M;
}

}  // namespace

int flash_rows_per_tile(int64_t head_dim, int64_t group, bool small) {
    const int m = tile_vectors(head_dim, small);
    return m && group >= 1 && group <= m ? int(m / group) : 0;
}

size_t flash_workspace_floats(int n_tiles, int64_t n_head_kv, int n_split, int64_t head_dim, bool small) {
    if (n_split <= 1) return 0;
    return size_t(n_tiles) * size_t(n_head_kv) * size_t(n_split) * size_t(tile_vectors(head_dim, small)) *
           size_t(head_dim + 2);
}

void launch_flash_attention(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                            float scale, bool small, const AttnTile *tiles_dev, int n_tiles, int n_split, int chunk,
                            float *ws, cudaStream_t stream, const NormQ8 &q8, bool early) {
    if (n_tiles == 0) return;
    STRATA_ASSERT(flash_rows_per_tile(head_dim, n_head / n_head_kv, small) > 0 && n_head % n_head_kv == 0);
    STRATA_ASSERT(n_tiles <= int64_t(1) << 30 && n_head_kv <= 65535 && n_split >= 1 && n_split <= 65535);
    STRATA_ASSERT(n_split == 1 || ws);
    const int group = int(n_head / n_head_kv), n_kv = int(n_head_kv);
    switch (head_dim) {
        case 64:
            return small ? launch_dim<64, true>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws,
                                                stream, q8, early)
                         : launch_dim<64, false>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws,
                                                 stream, q8, early);
        case 128:
            return small ? launch_dim<128, true>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws,
                                                 stream, q8, early)
                         : launch_dim<128, false>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws,
                                                  stream, q8, early);
        case 256:
            return small ? launch_dim<256, true>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws,
                                                 stream, q8, early)
                         : launch_dim<256, false>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws,
                                                  stream, q8, early);
        default:
            fail("CUDA attention: no tiled kernel for head size %lld", (long long)head_dim);
    }
}

}  // namespace strata::cuda
