// Host-memory caches of the CPU backend: per attention layer a K and a V cache ([seq][position][kv heads x
// head_dim] in the KV type), per Gated DeltaNet layer a conv state ([seq][kernel-1][conv_dim] f32) and a
// recurrent state ([seq][v-head][d_k][d_v] f32).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace strata {

struct CpuBackend::Caches {
    CacheShape shape;
    struct Layer {
        bool attn = false;
        int64_t kv_cols = 0;    // n_head_kv * head_dim
        size_t kv_row_bytes = 0;
        std::vector<uint8_t> k, v;  // n_seqs * n_ctx rows
        int64_t conv_rows = 0, conv_cols = 0;
        std::vector<float> conv;   // n_seqs * conv_rows * conv_cols
        int64_t state_floats = 0;  // per seq
        std::vector<float> state;  // n_seqs * state_floats
    };
    std::vector<Layer> layers;

    uint8_t *k_row(Layer &L, int32_t seq, int64_t pos) {
        return L.k.data() + (size_t(seq) * size_t(shape.n_ctx) + size_t(pos)) * L.kv_row_bytes;
    }
    uint8_t *v_row(Layer &L, int32_t seq, int64_t pos) {
        return L.v.data() + (size_t(seq) * size_t(shape.n_ctx) + size_t(pos)) * L.kv_row_bytes;
    }
    float *conv(Layer &L, int32_t seq) { return L.conv.data() + size_t(seq) * size_t(L.conv_rows * L.conv_cols); }
    float *state(Layer &L, int32_t seq) { return L.state.data() + size_t(seq) * size_t(L.state_floats); }
};

// KV rows in the cache's type: store from f32, read back to f32.
void kv_store_row(KvType t, const float *src, uint8_t *dst, int64_t n);
void kv_load_row(KvType t, const uint8_t *src, float *dst, int64_t n);

}  // namespace strata
