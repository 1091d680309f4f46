// Prefill attention on the tensor cores (mma.sync m16n8k16, fp16 inputs, fp32 accumulation: sm_80 and later). A block
// of four warps takes 64 query vectors that share one KV head (rows of one sequence times the heads of their GQA
// group, as in flash_attention.cu); each warp owns 16 of them. Per tile of N keys, S = Q K^T comes out of the MMAs in
// fp32, the online softmax runs on the accumulator fragments (each thread holds two rows), and P is the A operand of
// O += P V. fp16 inputs without losing fp32's precision: q (pre-scaled) and the softmax weights are each split into
// an fp16 part and an fp16 remainder (x = hi + lo to about 2^-22) and both parts go through the MMA, so the result
// is the fp32 kernel's to within accumulation order. Splits over keys write the same partials as
// flash_attention.cu and are merged there.
// Order of the blocks (heavy_first): a causal prompt's last tiles see the most keys. In order, the block of tile i and
// KV head h is block i + h * n_tiles, so the heaviest tiles of the last head start last and run on with the GPU
// nearly idle; heavy first, block b takes head b % n_kv of tile n_tiles - 1 - b / n_kv. A block computes the same
// outputs in the same way either way: the same bits.
//
// Memory protocol of a block (one K and one V buffer in shared memory, both filled by cp.async, row-major as the
// cache holds them; the MMAs' operands come out of them through ldmatrix, V's transposed on the way):
//   K(0) in flight; then per tile t:
//     wait for K(t), barrier (K(t) visible; every warp is past O += P V(t-1), so V's buffer is free)
//     V(t) in flight;  S = Q K(t)^T
//     barrier (every warp is past reading K(t)); K(t+1) in flight
//     mask, online softmax;  wait for V(t), barrier;  O += P V(t)
// so V(t) arrives while S is computed and K(t+1) while the softmax and P V(t) run.
#include <cuda_fp16.h>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/device_common.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int k_warps = 4, k_threads = 32 * k_warps, M = 16 * k_warps;

template <int D>
struct MmaCfg {
    static constexpr int N = D <= 128 ? 64 : 16;  // keys per tile (within 99 KiB of shared memory for sm_86..120)
    static constexpr int P = D + 8;               // pitch in halves of every tile (rows 4 banks apart)
    static constexpr size_t smem = sizeof(__half) * size_t(2 * M * P + 2 * N * P);
};

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two accumulators' products with an fp16 hi/lo A operand: B fragments b[0..1] for c0, b[2..3] for c1 (one ldmatrix.x4);
// the remainder first, then the fp16 part, as every accumulator sums.
__device__ __forceinline__ void mma_hi_lo_x2(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                             const uint32_t (&al)[4], const uint32_t (&b)[4]) {
    mma16816(c0, al, b[0], b[1]);
    mma16816(c0, a, b[0], b[1]);
    mma16816(c1, al, b[2], b[3]);
    mma16816(c1, a, b[2], b[3]);
}

// Four 8x8 matrices of halves; lane i names row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

// hi = fp16(a, b) and lo = fp16 of what hi left out.
__device__ __forceinline__ void split_half2(float a, float b, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const __half2 r = __floats2half2_rn(a - __low2float(h), b - __high2float(h));
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&r);
}

// Rows [k0, k0 + N) of one head's columns of an f16 cache into a tile (row-major), zeros past k_hi; asynchronous.
template <int D>
__device__ __forceinline__ void stage_rows(const uint8_t *base, size_t row_bytes, int col0, int k0, int k_hi,
                                           __half *tile, int tid) {
    using C = MmaCfg<D>;
    constexpr int CPR = D / 8, NC = C::N * CPR;  // 16-byte pieces of 8 halves
#pragma unroll
    for (int i = tid; i < NC; i += k_threads) {
        const int kk = i / CPR, ch = i % CPR, p = k0 + kk;
        const bool valid = p < k_hi;
        const uint8_t *src = base + size_t(valid ? p : k0) * row_bytes + size_t(col0 + ch * 8) * 2;
        cp_async16(tile + kk * C::P + ch * 8, src, valid);
    }
}

template <int D>
__global__ __launch_bounds__(k_threads) void k_flash_mma(KvCacheView c, Rows q, Rows out, int group, int n_kv,
                                                         float scale, const AttnTile *tiles, int n_tiles, int n_split,
                                                         int chunk, float *ws, bool heavy_first) {
    using C = MmaCfg<D>;
    constexpr int N = C::N, P = C::P, NT = N / 8, DT = D / 8;
    extern __shared__ uint4 smem_u4[];
    __half *Qs = reinterpret_cast<__half *>(smem_u4), *Ql = Qs + M * P, *Ks = Ql + M * P, *Vs = Ks + N * P;

    const int tile = heavy_first ? n_tiles - 1 - int(blockIdx.x) / n_kv : int(blockIdx.x);
    const int kvh = heavy_first ? int(blockIdx.x) % n_kv : int(blockIdx.y), split = blockIdx.z;
    const AttnTile t = tiles[tile];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, quad = lane % 4, qr = lane / 4;
    const int n_vec = t.n_rows * group;
    const int key_end = t.pos0 + t.n_rows;
    const int k_lo = split * chunk, k_hi = min(key_end, k_lo + chunk);
    const uint8_t *kb = c.k + (size_t(t.seq) * size_t(c.n_ctx)) * c.row_bytes;
    const uint8_t *vb = c.v + (size_t(t.seq) * size_t(c.n_ctx)) * c.row_bytes;
    const int col0 = kvh * D;

    if (k_lo < k_hi) stage_rows<D>(kb, c.row_bytes, col0, k_lo, k_hi, Ks, tid);
    cp_async_commit();
    for (int i = tid; i < M * D; i += k_threads) {
        const int v = i / D, d = i % D;
        float val = 0.0f;
        if (v < n_vec)
            val = scale * q.data[int64_t(t.row0 + v / group) * q.stride + int64_t(kvh * group + v % group) * D + d];
        const __half h = __float2half_rn(val);
        Qs[v * P + d] = h;
        Ql[v * P + d] = __float2half_rn(val - __half2float(h));
    }

    // This thread's two rows of the warp's 16: vectors warp*16 + qr and + 8.
    int pos[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = warp * 16 + qr + 8 * h;
        pos[h] = v < n_vec ? t.pos0 + v / group : -1;
    }
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    // ldmatrix row addresses of this lane: the A operand (rows of the warp's 16, k halves 0-7 / 8-15), K as the B
    // operand of S (keys j*8.., dims kk*16 / +8, two j at a time) and V transposed as the B operand of P V (keys
    // kk*16 / +8, dims j*8.., two j at a time).
    const int mi = lane / 8, ri = lane % 8;
    const __half *qa = Qs + (warp * 16 + ri + 8 * (mi % 2)) * P + 8 * (mi / 2);
    const __half *qla = qa + M * P;
    const __half *ka = Ks + (ri + 8 * (mi / 2)) * P + 8 * (mi % 2);
    const __half *va = Vs + (ri + 8 * (mi % 2)) * P + 8 * (mi / 2);

    for (int k0 = k_lo; k0 < k_hi; k0 += N) {
        cp_async_wait<0>();
        __syncthreads();
        stage_rows<D>(vb, c.row_bytes, col0, k0, k_hi, Vs, tid);
        cp_async_commit();

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a[4], al[4];
            ldmatrix_x4(a, qa + kk * 16);
            ldmatrix_x4(al, qla + kk * 16);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                uint32_t b[4];
                ldmatrix_x4(b, ka + j * 8 * P + kk * 16);
                mma_hi_lo_x2(s[j], s[j + 1], a, al, b);
            }
        }
        __syncthreads();  // every warp is past K(t)
        if (k0 + N < k_hi) stage_rows<D>(kb, c.row_bytes, col0, k0 + N, k_hi, Ks, tid);
        cp_async_commit();

        float tmax[2] = {-INFINITY, -INFINITY};
        if (k0 + N <= t.pos0 + 1 && k0 + N <= k_hi) {  // every key of the tile is visible to every row
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) tmax[e / 2] = fmaxf(tmax[e / 2], pos[e / 2] >= 0 ? s[j][e] : -INFINITY);
        } else {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e / 2, p = k0 + j * 8 + 2 * quad + (e & 1);
                    s[j][e] = p < k_hi && p <= pos[h] ? s[j][e] : -INFINITY;
                    tmax[h] = fmaxf(tmax[h], s[j][e]);
                }
        }
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(k_full_mask, tmax[h], 1));
            tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(k_full_mask, tmax[h], 2));
            const float m_new = fmaxf(m[h], tmax[h]);
            // A row that has seen no key yet keeps m = -inf: its weights are 0 and nothing is rescaled.
            corr[h] = m_new == -INFINITY ? 1.0f : expf(m[h] - m_new);
            m[h] = m_new;
            l[h] *= corr[h];
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e / 2;
                const float p = m[h] == -INFINITY ? 0.0f : expf(s[j][e] - m[h]);
                s[j][e] = p;
                l[h] += p;
            }
#pragma unroll
        for (int j = 0; j < DT; j++) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        cp_async_wait<1>();  // V(t); K(t+1) may still be in flight
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++) {
            uint32_t a[4], al[4];
            split_half2(s[2 * kk][0], s[2 * kk][1], a[0], al[0]);
            split_half2(s[2 * kk][2], s[2 * kk][3], a[1], al[1]);
            split_half2(s[2 * kk + 1][0], s[2 * kk + 1][1], a[2], al[2]);
            split_half2(s[2 * kk + 1][2], s[2 * kk + 1][3], a[3], al[3]);
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, va + kk * 16 * P + j * 8);
                mma_hi_lo_x2(o[j], o[j + 1], a, al, b);
            }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(k_full_mask, l[h], 1);
        l[h] += __shfl_xor_sync(k_full_mask, l[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = warp * 16 + qr + 8 * h;
        if (v >= n_vec) continue;
        if (n_split == 1) {
            float *dst = out.data + int64_t(t.row0 + v / group) * out.stride + int64_t(kvh * group + v % group) * D;
            const float inv = 1.0f / l[h];
#pragma unroll
            for (int j = 0; j < DT; j++) {
                dst[j * 8 + 2 * quad] = o[j][2 * h] * inv;
                dst[j * 8 + 2 * quad + 1] = o[j][2 * h + 1] * inv;
            }
        } else {
            const int64_t base = ((int64_t(tile) * n_kv + kvh) * n_split + split) * M + v;
            float *dst = ws + base * (D + 2);
#pragma unroll
            for (int j = 0; j < DT; j++) {
                dst[j * 8 + 2 * quad] = o[j][2 * h];
                dst[j * 8 + 2 * quad + 1] = o[j][2 * h + 1];
            }
            if (quad == 0) dst[D] = m[h], dst[D + 1] = l[h];
        }
    }
}

template <int D>
void launch_typed(const KvCacheView &c, Rows q, Rows out, int group, int n_kv, float scale, const AttnTile *tiles,
                  int n_tiles, int n_split, int chunk, float *ws, bool heavy_first, cudaStream_t stream) {
    if (!allow_dynamic_smem(reinterpret_cast<const void *>(k_flash_mma<D>), MmaCfg<D>::smem))
        fail("CUDA attention: %zu bytes of shared memory per block are not available", MmaCfg<D>::smem);
    const dim3 grid = heavy_first ? dim3{unsigned(n_tiles * n_kv), 1u, unsigned(n_split)}
                                  : dim3{unsigned(n_tiles), unsigned(n_kv), unsigned(n_split)};
    k_flash_mma<D><<<grid, k_threads, MmaCfg<D>::smem, stream>>>(c, q, out, group, n_kv, scale, tiles, n_tiles, n_split,
                                                                 chunk, ws, heavy_first);
    STRATA_CUDA_LAUNCH_CHECK("k_flash_mma");
    if (n_split > 1) launch_flash_merge(out, D, M, group, n_kv, tiles, n_tiles, n_split, ws, stream);
}

}  // namespace

bool flash_mma_applies(KvType kv, int64_t head_dim, int64_t group, int sm_major) {
    return sm_major >= 8 && kv == KvType::F16 &&
           (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 && group <= M;
}

int flash_mma_rows_per_tile(int64_t group) {
    return group >= 1 && group <= M ? int(M / group) : 0;
}

size_t flash_mma_workspace_floats(int n_tiles, int64_t n_head_kv, int n_split, int64_t head_dim) {
    if (n_split <= 1) return 0;
    return size_t(n_tiles) * size_t(n_head_kv) * size_t(n_split) * size_t(M) * size_t(head_dim + 2);
}

void launch_flash_attention_mma(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv,
                                int64_t head_dim, float scale, const AttnTile *tiles_dev, int n_tiles, int n_split,
                                int chunk, float *ws, cudaStream_t stream, bool heavy_first) {
    if (n_tiles == 0) return;
    STRATA_ASSERT(n_head % n_head_kv == 0 && flash_mma_rows_per_tile(n_head / n_head_kv) > 0);
    STRATA_ASSERT(n_tiles <= int64_t(1) << 30 && n_head_kv <= 65535 && n_split >= 1 && n_split <= 65535);
    STRATA_ASSERT(!heavy_first || int64_t(n_tiles) * n_head_kv < int64_t(1) << 31);
    STRATA_ASSERT(n_split == 1 || ws);
    STRATA_ASSERT(c.type == KvType::F16);
    const int group = int(n_head / n_head_kv), n_kv = int(n_head_kv);
    switch (head_dim) {
        case 64:
            return launch_typed<64>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws, heavy_first,
                                    stream);
        case 128:
            return launch_typed<128>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws, heavy_first,
                                     stream);
        case 256:
            return launch_typed<256>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, n_split, chunk, ws, heavy_first,
                                     stream);
        default:
            fail("CUDA attention: no tensor-core kernel for head size %lld", (long long)head_dim);
    }
}

}  // namespace strata::cuda
