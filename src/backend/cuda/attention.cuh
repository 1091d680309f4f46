// KV cache writes and causal GQA attention over each sequence's cached positions, for f32, f16 and q8_0 caches.
// Cache layout per attention layer: [slot][position][n_head_kv * head_dim] in the cache type (row_bytes a row).
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
    int64_t n_ctx;     // positions per slot
    int64_t kv_cols;
};

// slot_pos_dev: per activation row {slot, position}. Stores rows of k and v at their positions.
void launch_kv_store(const KvCacheView &c, Rows k, Rows v, const int2 *slot_pos_dev, cudaStream_t stream);

// out row r, head h = softmax over positions 0..pos(r) of slot(r) of (q . k) * scale, times v; GQA: head h reads
// kv head h / (n_head / n_head_kv). head_dim <= 512.
void launch_attention(const KvCacheView &c, Rows q, Rows out, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      float scale, const int2 *slot_pos_dev, cudaStream_t stream);

}  // namespace strata::cuda
