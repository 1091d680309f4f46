// Decoding attention over short contexts (at most k_flash_decode_keys positions, so the keys are never split over
// blocks and nothing is merged): a block per tile and KV head, a warp per query vector (a row times a head of its GQA
// group), lanes over the head's dimensions, the scores of several keys summed across the warp together, and an online
// softmax in fp32. The tiled kernel (flash_attention.cu) gives such a step one warp per scheduler and long serial
// chains per thread (a 128-long dot product, the products with V); here a warp's chain is a few butterflies per group
// of keys. Warps share nothing, so a vector's result depends on its own q and keys only, never on which rows share
// its tile or block.
#include "backend/cuda/attention.cuh"

#include "backend/cuda/device_common.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

// The R = D / 32 consecutive values from column col of position p's row in the cache, as f32 (as the tiled kernel
// converts them: f16 exactly, q8_0 as q * d).
template <KvType KT, int R>
__device__ __forceinline__ void load_row(const uint8_t *base, size_t row_bytes, int p, int col, float *v) {
    const uint8_t *row = base + size_t(p) * row_bytes;
    if constexpr (KT == KvType::F32) {
        const float *f = reinterpret_cast<const float *>(row) + col;
#pragma unroll
        for (int r = 0; r < R; r += 2) {
            const float2 x = *reinterpret_cast<const float2 *>(f + r);
            v[r] = x.x, v[r + 1] = x.y;
        }
    } else if constexpr (KT == KvType::F16) {
        const uint32_t *h = reinterpret_cast<const uint32_t *>(row + size_t(col) * 2);
#pragma unroll
        for (int r = 0; r < R; r += 2) {
            const uint32_t w = h[r / 2];
            v[r] = f16_to_f32(w & 0xffffu), v[r + 1] = f16_to_f32(w >> 16);
        }
    } else {
        // 34-byte blocks of 32 (an fp16 scale, then 32 int8): the R values lie in one block.
        const uint8_t *blk = row + size_t(col / 32) * 34;
        const float d = ld_f16(blk);
        const uint8_t *qs = blk + 2 + col % 32;
#pragma unroll
        for (int r = 0; r < R; r++) v[r] = __fmul_rn(float(int8_t(qs[r])), d);
    }
}

template <KvType KT, int D>
__global__ __launch_bounds__(k_flash_decode_max_vectors * 32) void k_flash_decode(KvCacheView c, Rows q, Rows out,
                                                                                  int group, float scale,
                                                                                  const AttnTile *tiles) {
    constexpr int R = D / 32;
    constexpr int KB = D <= 128 ? 8 : 4;  // keys per step: their K and V rows are loaded together
    const AttnTile t = tiles[blockIdx.x];
    const int kvh = blockIdx.y, v = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (v >= t.n_rows * group) return;
    const int64_t row = t.row0 + v / group, head = int64_t(kvh) * group + v % group;
    const int pos = t.pos0 + v / group;  // the vector sees keys 0..pos
    const int col = kvh * D + lane * R;
    const uint8_t *kb = c.k + size_t(t.seq) * size_t(c.n_ctx) * c.row_bytes;
    const uint8_t *vb = c.v + size_t(t.seq) * size_t(c.n_ctx) * c.row_bytes;

    float qv[R], o[R];
    const float *qp = q.data + row * q.stride + head * D + lane * R;
#pragma unroll
    for (int r = 0; r < R; r++) qv[r] = qp[r], o[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int p0 = 0; p0 <= pos; p0 += KB) {
        float kr[KB][R], vr[KB][R];
#pragma unroll
        for (int j = 0; j < KB; j++) {
            if (p0 + j <= pos) {
                load_row<KT, R>(kb, c.row_bytes, p0 + j, col, kr[j]);
                load_row<KT, R>(vb, c.row_bytes, p0 + j, col, vr[j]);
            } else {
#pragma unroll
                for (int r = 0; r < R; r++) kr[j][r] = vr[j][r] = 0.0f;
            }
        }
        float s[KB];
#pragma unroll
        for (int j = 0; j < KB; j++) {
            s[j] = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) s[j] += qv[r] * kr[j][r];
        }
        // the keys' butterflies interleaved (each lane ends with the same sums)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int j = 0; j < KB; j++) s[j] += __shfl_xor_sync(k_full_mask, s[j], off);
        float tmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < KB; j++) {
            s[j] = p0 + j <= pos ? s[j] * scale : -INFINITY;
            tmax = fmaxf(tmax, s[j]);
        }
        const float m_new = fmaxf(m, tmax);
        // A vector that has seen no finite score keeps m = -inf: its weights are 0 and nothing is rescaled.
        const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
        l *= corr;
#pragma unroll
        for (int r = 0; r < R; r++) o[r] *= corr;
#pragma unroll
        for (int j = 0; j < KB; j++) {
            const float pj = m_new == -INFINITY ? 0.0f : expf(s[j] - m_new);
            l += pj;
#pragma unroll
            for (int r = 0; r < R; r++) o[r] += pj * vr[j][r];
        }
        m = m_new;
    }
    float *dst = out.data + row * out.stride + head * D + lane * R;
#pragma unroll
    for (int r = 0; r < R; r++) dst[r] = o[r] / l;
}

template <int D>
void launch_dim(const KvCacheView &c, Rows q, Rows out, int group, int n_kv, float scale, const AttnTile *tiles,
                int n_tiles, int vectors, cudaStream_t stream) {
    const dim3 grid{unsigned(n_tiles), unsigned(n_kv)};
    const unsigned threads = unsigned(vectors) * 32;
    switch (c.type) {
        case KvType::F32:
            k_flash_decode<KvType::F32, D><<<grid, threads, 0, stream>>>(c, q, out, group, scale, tiles);
            break;
        case KvType::F16:
            k_flash_decode<KvType::F16, D><<<grid, threads, 0, stream>>>(c, q, out, group, scale, tiles);
            break;
        case KvType::Q8_0:
            k_flash_decode<KvType::Q8_0, D><<<grid, threads, 0, stream>>>(c, q, out, group, scale, tiles);
            break;
    }
    STRATA_CUDA_LAUNCH_CHECK("k_flash_decode");
}

}  // namespace

bool flash_decode_applies(int64_t head_dim, int64_t group, int rows_per_tile) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 && rows_per_tile >= 1 &&
           group * rows_per_tile <= k_flash_decode_max_vectors;
}

void launch_flash_decode(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                         float scale, const AttnTile *tiles_dev, int n_tiles, int rows_per_tile, cudaStream_t stream) {
    if (n_tiles == 0) return;
    STRATA_ASSERT(n_head % n_head_kv == 0 && n_head_kv <= 65535);
    const int group = int(n_head / n_head_kv), n_kv = int(n_head_kv);
    STRATA_ASSERT(flash_decode_applies(head_dim, group, rows_per_tile));
    const int vectors = group * rows_per_tile;
    switch (head_dim) {
        case 64:
            return launch_dim<64>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, vectors, stream);
        case 128:
            return launch_dim<128>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, vectors, stream);
        case 256:
            return launch_dim<256>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, vectors, stream);
        default:
            fail("CUDA attention: no decode kernel for head size %lld", (long long)head_dim);
    }
}

}  // namespace strata::cuda
