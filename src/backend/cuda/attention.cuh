// KV cache writes and causal GQA attention over each sequence's cached positions, for f32, f16 and q8_0 caches.
// Cache layout per attention layer: [sequence][position][n_head_kv * head_dim] in the cache type (row_bytes a row).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/elementwise.cuh"

namespace strata::cuda {

struct KvCacheView {
    KvType type;
    uint8_t *k, *v;    // device
    size_t row_bytes;  // one position's kv_cols values
    int64_t n_ctx;     // positions per sequence
    int64_t kv_cols;
};

// seq_pos_dev: per activation row {sequence, position}. Stores rows of k and v at their positions.
void launch_kv_store(const KvCacheView &c, Rows k, Rows v, const int2 *seq_pos_dev, cudaStream_t stream);

// An attention layer's q and k in place, in one launch: per-head RMSNorm with wq / wk (head_dim floats each), then the
// NeoX rotation of the first n_rot dims at each row's position (inv_freq_dev: n_rot / 2 floats, theta^(-2i / n_rot)
// as the CPU computes them); the same results as launch_rms_norm and launch_rope_neox on each. head_dim <= 256.
// With store (qk_norm_rope_stores holding), the same launch also stores k's results and v at their positions in that
// cache, the bytes launch_kv_store of them would store. early: the positions, frequencies and weights are read before
// the kernel's programmatic wait (pdl.cuh): only where the launch just before wrote none of them (an upload of the
// positions or frequencies may be a kernel), the same bits either way.
void launch_qk_norm_rope(Rows q, Rows k, const float *wq, const float *wk, int64_t head_dim, float eps, int64_t n_rot,
                         const float *inv_freq_dev, const int2 *seq_pos_dev, cudaStream_t stream,
                         const KvCacheView *store = nullptr, Rows v = {}, bool early = false);
bool qk_norm_rope_stores(const KvCacheView &c, int64_t head_dim);

// out row r, head h = softmax over positions 0..pos(r) of sequence seq(r) of (q . k) * scale, times v; GQA: head h reads
// kv head h / (n_head / n_head_kv). head_dim <= 512.
void launch_attention(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      float scale, const int2 *seq_pos_dev, cudaStream_t stream);

// The tiled kernel (flash_attention.cu): query vectors (row, head of the GQA group) of consecutive rows of one
// sequence in tiles; a tile is rows [row0, row0 + n_rows) at positions pos0... of a sequence.
struct AttnTile {
    int32_t row0, n_rows, seq, pos0;
    int32_t pos_new = 0;  // the first position of seq the pass writes: the keys before it are older (0: none known)
};
// Rows per tile for this head size and GQA group, or 0 where the tiled kernel does not apply (head sizes 64, 128
// and 256 are covered). small: tiles of 16 query vectors (decoding), else 64 (head size <= 128) or 32.
int flash_rows_per_tile(int64_t head_dim, int64_t group, bool small);
// Workspace for n_split > 1 (keys split over blocks, each block `chunk` keys, a multiple of 32).
size_t flash_workspace_floats(int n_tiles, int64_t n_head_kv, int n_split, int64_t head_dim, bool small);
// early: each block reads its tile, and its first key tile where every key of it is before the tile's pos_new, before
// the kernel's programmatic wait (pdl.cuh): only where the launch just before wrote neither (the tiles' upload may be
// a kernel), the same bits either way.
void launch_flash_attention(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                            float scale, bool small, const AttnTile *tiles_dev, int n_tiles, int n_split, int chunk,
                            float *ws, cudaStream_t stream, const NormQ8 &q8 = {}, bool early = false);

// The decoding kernel for short contexts (flash_decode.cu): the same tiles, every key of a tile's rows in one block
// (at most k_flash_decode_keys of them, so never split), a warp per query vector; head sizes 64, 128 and 256, tiles
// of at most k_flash_decode_max_vectors query vectors (rows_per_tile times the GQA group).
// With a workspace (flash_decode_workspace_floats), the split form: each vector's keys in parts of
// k_flash_decode_part_keys positions, a block per part, then a merge (other bits than the one-block form, within the
// op tests' bound; a vector's result still depends on its own q and keys only).
constexpr int k_flash_decode_keys = 64, k_flash_decode_max_vectors = 16, k_flash_decode_part_keys = 8;
bool flash_decode_applies(int64_t head_dim, int64_t group, int rows_per_tile);
size_t flash_decode_workspace_floats(int n_tiles, int64_t n_head_kv, int64_t group, int rows_per_tile,
                                     int64_t head_dim);
// q8 (form 1 only): out's Q8_0 form made too, as launch_quantize_act of out would make it. merge_ahead: the split
// form's merge loads every part before adding any (the same bits).
void launch_flash_decode(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                         float scale, const AttnTile *tiles_dev, int n_tiles, int rows_per_tile, cudaStream_t stream,
                         float *ws = nullptr, const NormQ8 &q8 = {}, bool merge_ahead = false);

// Merges the partials of n_split > 1 (written per tile of vectors_per_tile query vectors) into out. Forms of the same
// bits: a block per KV head of a tile (Block), or a block per vector and a thread per value (Vector); Auto: Vector
// unless STRATA_CUDA_FLASH_MERGE_VEC=0 or its shared memory (8 bytes a split) is over 48 KiB.
enum class MergeForm { Auto, Block, Vector };
// q8 (form 1, the Vector form only: flash_merge_quantizes): out's Q8_0 form made too, as launch_quantize_act of out
// would make it; launch_flash_attention passes its q8 here (n_split > 1 only).
void launch_flash_merge(Rows out, int64_t head_dim, int vectors_per_tile, int group, int n_kv, const AttnTile *tiles,
                        int n_tiles, int n_split, const float *ws, cudaStream_t stream,
                        MergeForm form = MergeForm::Auto, const NormQ8 &q8 = {});
bool flash_merge_quantizes(int n_split);  // whether Auto takes the Vector form for n_split

// The tensor-core kernel (flash_attention_mma.cu) for prefill tiles: f16 caches, head sizes 64, 128, 256, GPUs of
// compute capability 8 and later; tiles of 64 query vectors; fp32 precision through fp16 hi/lo splits. heavy_first:
// the blocks of the last tiles (the most keys in a causal prompt) first; the same bits either way.
bool flash_mma_applies(KvType kv, int64_t head_dim, int64_t group, int sm_major);
int flash_mma_rows_per_tile(int64_t group);
size_t flash_mma_workspace_floats(int n_tiles, int64_t n_head_kv, int n_split, int64_t head_dim);
void launch_flash_attention_mma(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv,
                                int64_t head_dim, float scale, const AttnTile *tiles_dev, int n_tiles, int n_split,
                                int chunk, float *ws, cudaStream_t stream, bool heavy_first = false);

}  // namespace strata::cuda
