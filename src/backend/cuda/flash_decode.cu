// Decoding attention over short contexts (at most k_flash_decode_keys positions): a block per tile and KV head, a
// warp per query vector (a row times a head of its GQA group), lanes over the head's dimensions, the scores of several
// keys summed across the warp together, and an online softmax in fp32. Split form (a workspace given; the default,
// STRATA_CUDA_FLASH_DECODE_SPLIT=0 for the one-block form): each vector's keys in parts of k_flash_decode_part_keys
// positions, a one-warp block per part, so a step of a few sequences runs on many SMs instead of one per KV head, and
// a merge. The tiled kernel (flash_attention.cu) gives such a step one warp per scheduler and long serial
// chains per thread (a 128-long dot product, the products with V); here a warp's chain is a few butterflies per group
// of keys. Warps share nothing, so a vector's result depends on its own q and keys only, never on which rows share
// its tile or block.
#include "backend/cuda/attention.cuh"

#include "backend/cuda/act_q8.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/pdl.cuh"
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
            v[r] = f16_to_f32_arith(w & 0xffffu), v[r + 1] = f16_to_f32_arith(w >> 16);
        }
    } else {
        // 34-byte blocks of 32 (an fp16 scale, then 32 int8): the R values lie in one block.
        const uint8_t *blk = row + size_t(col / 32) * 34;
        const float d = f16_to_f32_arith(ld_u16(blk));
        const uint8_t *qs = blk + 2 + col % 32;
#pragma unroll
        for (int r = 0; r < R; r++) v[r] = __fmul_rn(float(int8_t(qs[r])), d);
    }
}

// One query vector's online softmax over keys [p_begin, p_end] (inclusive; empty when p_end < p_begin), KB keys a
// step from p_begin: the running max m, the sum l and the unnormalised output o (R values a lane).
template <KvType KT, int D>
__device__ __forceinline__ void attend(const uint8_t *kb, const uint8_t *vb, size_t row_bytes, int col, const float *qv,
                                       float scale, int p_begin, int p_end, float &m, float &l, float *o) {
    constexpr int R = D / 32;
    constexpr int KB = D <= 128 ? 8 : 4;  // keys per step: their K and V rows are loaded together
    m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) o[r] = 0.0f;
    for (int p0 = p_begin; p0 <= p_end; p0 += KB) {
        float kr[KB][R], vr[KB][R];
#pragma unroll
        for (int j = 0; j < KB; j++) {
            if (p0 + j <= p_end) {
                load_row<KT, R>(kb, row_bytes, p0 + j, col, kr[j]);
                load_row<KT, R>(vb, row_bytes, p0 + j, col, vr[j]);
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
            s[j] = p0 + j <= p_end ? s[j] * scale : -INFINITY;
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
}

// Where query vector v of a tile reads and writes: its row, head, position and the lane's first column.
struct Vec {
    int64_t row, head;
    int pos, col;
};
__device__ __forceinline__ Vec vec_of(const AttnTile &t, int kvh, int v, int group, int D, int lane) {
    const int R = D / 32;
    return {t.row0 + v / group, int64_t(kvh) * group + v % group, t.pos0 + v / group, kvh * D + lane * R};
}

// Vector x of sequence seq over keys [p_begin, p_end]: its q read, then attend.
template <KvType KT, int D>
__device__ __forceinline__ void attend_vec(const KvCacheView &c, int seq, const Rows &q, const Vec &x, int lane,
                                           float scale, int p_begin, int p_end, float &m, float &l, float *o) {
    constexpr int R = D / 32;
    const uint8_t *kb = c.k + size_t(seq) * size_t(c.n_ctx) * c.row_bytes;
    const uint8_t *vb = c.v + size_t(seq) * size_t(c.n_ctx) * c.row_bytes;
    float qv[R];
    const float *qp = q.data + x.row * q.stride + x.head * D + lane * R;
#pragma unroll
    for (int r = 0; r < R; r++) qv[r] = qp[r];
    attend<KT, D>(kb, vb, c.row_bytes, x.col, qv, scale, p_begin, p_end, m, l, o);
}

// Vector x's result o / l into out, and where q8 asks for it, its Q8_0 form (the lanes' R values at their columns).
template <int R>
__device__ __forceinline__ void put_vec(const Rows &out, const Vec &x, int lane, const float *o, float l,
                                        const NormQ8 &q8) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; r++) v[r] = o[r] / l;
    const int64_t col = x.head * (R * 32) + lane * R;
    float *dst = out.data + x.row * out.stride + col;
#pragma unroll
    for (int r = 0; r < R; r++) dst[r] = v[r];
    if (q8.form) q8_0_lanes<R>(v, col, q8.q + x.row * out.cols, q8.ds + x.row * (out.cols / 32));
}

template <KvType KT, int D>
__global__ __launch_bounds__(k_flash_decode_max_vectors * 32) void k_flash_decode(KvCacheView c, Rows q, Rows out,
                                                                                  int group, float scale,
                                                                                  const AttnTile *tiles, NormQ8 q8) {
    pdl_wait();
    pdl_release();
    constexpr int R = D / 32;
    const AttnTile t = tiles[blockIdx.x];
    const int kvh = blockIdx.y, v = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (v >= t.n_rows * group) return;
    const Vec x = vec_of(t, kvh, v, group, D, lane);  // the vector sees keys 0..pos
    float o[R], m, l;
    attend_vec<KT, D>(c, t.seq, q, x, lane, scale, 0, x.pos, m, l, o);
    put_vec<R>(out, x, lane, o, l, q8);
}

// The split form: a one-warp block per (tile, KV head and vector, part); part s takes keys [s P, s P + P) of the
// vector's 0..pos (P = k_flash_decode_part_keys) and writes {m, l, o} to the workspace; k_flash_decode_merge
// combines the parts in order. The parts' bounds are fixed positions, so a vector's result depends on its q and
// keys only, never on its batch.
constexpr int k_parts = k_flash_decode_keys / k_flash_decode_part_keys;

template <int D, class F>
__device__ __forceinline__ F *part_at(F *ws, int tile, int kvh_v, int n_kvv, int s) {
    return ws + ((size_t(tile) * size_t(n_kvv) + size_t(kvh_v)) * k_parts + size_t(s)) * size_t(D + 2);
}

template <KvType KT, int D>
__global__ __launch_bounds__(32) void k_flash_decode_part(KvCacheView c, Rows q, int group, int vectors, float scale,
                                                          const AttnTile *tiles, float *ws) {
    pdl_wait();
    pdl_release();
    constexpr int R = D / 32;
    const AttnTile t = tiles[blockIdx.x];
    const int kvh = int(blockIdx.y) / vectors, v = int(blockIdx.y) % vectors, s = blockIdx.z, lane = threadIdx.x;
    if (v >= t.n_rows * group) return;
    const Vec x = vec_of(t, kvh, v, group, D, lane);
    float o[R], m, l;
    const int p_begin = s * k_flash_decode_part_keys;
    attend_vec<KT, D>(c, t.seq, q, x, lane, scale, p_begin, min(x.pos, p_begin + k_flash_decode_part_keys - 1), m, l,
                      o);
    float *w = part_at<D>(ws, blockIdx.x, blockIdx.y, gridDim.y, s);
    if (lane == 0) w[0] = m, w[1] = l;
#pragma unroll
    for (int r = 0; r < R; r++) w[2 + lane * R + r] = o[r];
}

// AHEAD: every part's max, sum and this lane's values loaded before the first is added (the parts' workspace is
// written whole: a part past the vector's position leaves -inf, 0 and zeros), then added in part order as the loop
// that loads each part after testing it does (the same bits; that loop waited for each part's loads in turn).
template <int D, bool AHEAD>
__global__ __launch_bounds__(32) void k_flash_decode_merge(Rows out, int group, int vectors, const AttnTile *tiles,
                                                           const float *ws, NormQ8 q8) {
    pdl_wait();
    pdl_release();
    constexpr int R = D / 32;
    const AttnTile t = tiles[blockIdx.x];
    const int kvh = int(blockIdx.y) / vectors, v = int(blockIdx.y) % vectors, lane = threadIdx.x;
    if (v >= t.n_rows * group) return;
    const Vec x = vec_of(t, kvh, v, group, D, lane);
    float o[R], l = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) o[r] = 0.0f;
    // part s's max m and sum sl (its values read by val(r)) added to the vector's (mx the parts' max)
    auto add = [&](float mx, float m, float sl, auto val) {
        if (m == -INFINITY) return;  // a part past the vector's position, or one that saw no finite score
        const float f = expf(m - mx);
        l = __fmaf_rn(sl, f, l);
#pragma unroll
        for (int r = 0; r < R; r++) o[r] = __fmaf_rn(val(r), f, o[r]);
    };
    float mx = -INFINITY;
    if constexpr (AHEAD) {
        float pm[k_parts], pl[k_parts], pv[k_parts][R];
#pragma unroll
        for (int s = 0; s < k_parts; s++) {
            const float *w = part_at<D>(ws, blockIdx.x, blockIdx.y, gridDim.y, s);
            pm[s] = w[0], pl[s] = w[1];
#pragma unroll
            for (int r = 0; r < R; r++) pv[s][r] = w[2 + lane * R + r];
        }
#pragma unroll
        for (int s = 0; s < k_parts; s++) mx = fmaxf(mx, pm[s]);
#pragma unroll
        for (int s = 0; s < k_parts; s++) add(mx, pm[s], pl[s], [&](int r) { return pv[s][r]; });
    } else {
        for (int s = 0; s < k_parts; s++) mx = fmaxf(mx, part_at<D>(ws, blockIdx.x, blockIdx.y, gridDim.y, s)[0]);
        for (int s = 0; s < k_parts; s++) {
            const float *w = part_at<D>(ws, blockIdx.x, blockIdx.y, gridDim.y, s);
            add(mx, w[0], w[1], [&](int r) { return w[2 + lane * R + r]; });
        }
    }
    put_vec<R>(out, x, lane, o, l, q8);
}

template <int D>
void launch_dim(const KvCacheView &c, Rows q, Rows out, int group, int n_kv, float scale, const AttnTile *tiles,
                int n_tiles, int vectors, float *ws, cudaStream_t stream, const NormQ8 &q8, bool merge_ahead) {
    if (ws) {
        const dim3 grid{unsigned(n_tiles), unsigned(n_kv * vectors), unsigned(k_parts)};
        switch (c.type) {
            case KvType::F32:
                pdl_launch(k_flash_decode_part<KvType::F32, D>, grid, 32, 0, stream, c, q, group, vectors, scale, tiles,
                           ws);
                break;
            case KvType::F16:
                pdl_launch(k_flash_decode_part<KvType::F16, D>, grid, 32, 0, stream, c, q, group, vectors, scale, tiles,
                           ws);
                break;
            case KvType::Q8_0:
                pdl_launch(k_flash_decode_part<KvType::Q8_0, D>, grid, 32, 0, stream, c, q, group, vectors, scale,
                           tiles, ws);
                break;
        }
        STRATA_CUDA_LAUNCH_CHECK("k_flash_decode_part");
        pdl_launch(merge_ahead ? k_flash_decode_merge<D, true> : k_flash_decode_merge<D, false>,
                   dim3{unsigned(n_tiles), unsigned(n_kv * vectors)}, 32, 0, stream, out, group, vectors, tiles, ws,
                   q8);
        STRATA_CUDA_LAUNCH_CHECK("k_flash_decode_merge");
        return;
    }
    const dim3 grid{unsigned(n_tiles), unsigned(n_kv)};
    const unsigned threads = unsigned(vectors) * 32;
    switch (c.type) {
        case KvType::F32:
            pdl_launch(k_flash_decode<KvType::F32, D>, grid, threads, 0, stream, c, q, out, group, scale, tiles, q8);
            break;
        case KvType::F16:
            pdl_launch(k_flash_decode<KvType::F16, D>, grid, threads, 0, stream, c, q, out, group, scale, tiles, q8);
            break;
        case KvType::Q8_0:
            pdl_launch(k_flash_decode<KvType::Q8_0, D>, grid, threads, 0, stream, c, q, out, group, scale, tiles, q8);
            break;
    }
    STRATA_CUDA_LAUNCH_CHECK("k_flash_decode");
}

}  // namespace

size_t flash_decode_workspace_floats(int n_tiles, int64_t n_head_kv, int64_t group, int rows_per_tile,
                                     int64_t head_dim) {
    return size_t(n_tiles) * size_t(n_head_kv) * size_t(group * rows_per_tile) * size_t(k_parts) *
           size_t(head_dim + 2);
}

bool flash_decode_applies(int64_t head_dim, int64_t group, int rows_per_tile) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 && rows_per_tile >= 1 &&
           group * rows_per_tile <= k_flash_decode_max_vectors;
}

void launch_flash_decode(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                         float scale, const AttnTile *tiles_dev, int n_tiles, int rows_per_tile, cudaStream_t stream,
                         float *ws, const NormQ8 &q8, bool merge_ahead) {
    if (n_tiles == 0) return;
    STRATA_ASSERT(!q8.form || (q8.form == 1 && out.cols % 32 == 0));
    STRATA_ASSERT(n_head % n_head_kv == 0 && n_head_kv <= 65535);
    const int group = int(n_head / n_head_kv), n_kv = int(n_head_kv);
    STRATA_ASSERT(flash_decode_applies(head_dim, group, rows_per_tile));
    const int vectors = group * rows_per_tile;
    switch (head_dim) {
        case 64:
            return launch_dim<64>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, vectors, ws, stream, q8,
                                  merge_ahead);
        case 128:
            return launch_dim<128>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, vectors, ws, stream, q8,
                                   merge_ahead);
        case 256:
            return launch_dim<256>(c, q, out, group, n_kv, scale, tiles_dev, n_tiles, vectors, ws, stream, q8,
                                   merge_ahead);
        default:
            fail("CUDA attention: no decode kernel for head size %lld", (long long)head_dim);
    }
}

}  // namespace strata::cuda
