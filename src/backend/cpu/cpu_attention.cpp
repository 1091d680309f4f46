// Attention on the CPU: KV cache storage and causal GQA attention of each sequence's new tokens over its cache.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_caches.h"
#include "core/error.h"
#include "core/fp16.h"
#include "format/quant.h"

namespace strata {

void kv_store_row(KvType t, const float *src, uint8_t *dst, int64_t n) {
    switch (t) {
        case KvType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
        case KvType::F16: quantize_row(DType::F16, src, dst, n); break;
        case KvType::Q8_0: quantize_row(DType::Q8_0, src, dst, n); break;
    }
}

void kv_load_row(KvType t, const uint8_t *src, float *dst, int64_t n) {
    switch (t) {
        case KvType::F32: std::memcpy(dst, src, size_t(n) * 4); break;
        case KvType::F16: dequantize_row(DType::F16, src, dst, n); break;
        case KvType::Q8_0: dequantize_row(DType::Q8_0, src, dst, n); break;
    }
}

void CpuBackend::init_caches(const CacheShape &shape) {
    caches_ = std::make_unique<Caches>();
    caches_->shape = shape;
    caches_->layers.resize(shape.layers.size());
    const size_t n = size_t(shape.n_seqs);
    for (size_t il = 0; il < shape.layers.size(); il++) {
        const CacheShape::Layer &S = shape.layers[il];
        Caches::Layer &L = caches_->layers[il];
        if (!S.attention) {
            L.conv_rows = S.conv_rows;
            L.conv_cols = S.conv_cols;
            L.conv.assign(n * size_t(L.conv_rows * L.conv_cols), 0.0f);
            L.state_floats = S.state_floats;
            L.state.assign(n * size_t(L.state_floats), 0.0f);
        } else {
            L.attn = true;
            L.kv_cols = S.kv_cols;
            L.kv_row_bytes = kv_row_bytes(shape.kv_type, L.kv_cols);
            const size_t bytes = n * size_t(shape.n_ctx) * L.kv_row_bytes;
            L.k.assign(bytes, 0);
            L.v.assign(bytes, 0);
        }
    }
}

void CpuBackend::copy_seq(int32_t src, int32_t dst, int64_t n_pos) {
    STRATA_ASSERT(caches_ && src >= 0 && dst >= 0 && src < caches_->shape.n_seqs && dst < caches_->shape.n_seqs);
    if (src == dst) return;
    for (Caches::Layer &L : caches_->layers) {
        if (L.attn) {
            std::memcpy(caches_->k_row(L, dst, 0), caches_->k_row(L, src, 0), size_t(n_pos) * L.kv_row_bytes);
            std::memcpy(caches_->v_row(L, dst, 0), caches_->v_row(L, src, 0), size_t(n_pos) * L.kv_row_bytes);
        } else {
            std::memcpy(caches_->conv(L, dst), caches_->conv(L, src), size_t(L.conv_rows * L.conv_cols) * 4);
            std::memcpy(caches_->state(L, dst), caches_->state(L, src), size_t(L.state_floats) * 4);
        }
    }
}

void CpuBackend::clear_seq(int32_t seq) {
    STRATA_ASSERT(caches_ && seq >= 0 && seq < caches_->shape.n_seqs);
    for (Caches::Layer &L : caches_->layers) {
        if (L.attn) continue;  // attention rows beyond a sequence's length are never read
        std::fill_n(caches_->conv(L, seq), L.conv_rows * L.conv_cols, 0.0f);
        std::fill_n(caches_->state(L, seq), L.state_floats, 0.0f);
    }
}

// Recurrent-state checkpoints: each GDN layer's conv state then its delta-rule state, in layer order, f32.
size_t CpuBackend::recurrent_state_bytes() const {
    if (!caches_) return 0;
    size_t n = 0;
    for (const Caches::Layer &L : caches_->layers)
        if (!L.attn) n += size_t(L.conv_rows * L.conv_cols + L.state_floats) * sizeof(float);
    return n;
}

void CpuBackend::save_recurrent_state(int32_t seq, void *dst) {
    STRATA_ASSERT(caches_ && seq >= 0 && seq < caches_->shape.n_seqs);
    auto *out = static_cast<float *>(dst);
    for (Caches::Layer &L : caches_->layers) {
        if (L.attn) continue;
        out = std::copy_n(caches_->conv(L, seq), L.conv_rows * L.conv_cols, out);
        out = std::copy_n(caches_->state(L, seq), L.state_floats, out);
    }
}

void CpuBackend::load_recurrent_state(int32_t seq, const void *src) {
    STRATA_ASSERT(caches_ && seq >= 0 && seq < caches_->shape.n_seqs);
    const auto *in = static_cast<const float *>(src);
    for (Caches::Layer &L : caches_->layers) {
        if (L.attn) continue;
        std::copy_n(in, L.conv_rows * L.conv_cols, caches_->conv(L, seq));
        in += L.conv_rows * L.conv_cols;
        std::copy_n(in, L.state_floats, caches_->state(L, seq));
        in += L.state_floats;
    }
}

void CpuBackend::attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           float scale, const BatchInfo &b, Act out) {
    STRATA_ASSERT(caches_ && il < int64_t(caches_->layers.size()));
    Caches::Layer &L = caches_->layers[size_t(il)];
    STRATA_ASSERT(L.attn && k.cols == L.kv_cols && v.cols == L.kv_cols && q.cols == n_head * head_dim);
    const KvType kt = caches_->shape.kv_type;
    const int64_t n_ctx = caches_->shape.n_ctx;

    for (const BatchSeg &s : b.segs) {
        if (s.pos0 + s.n > n_ctx)
            fail("sequence %d needs %lld positions; the context holds %lld", s.seq,
                 (long long)(s.pos0 + s.n), (long long)n_ctx);
        for (int64_t t = 0; t < s.n; t++) {
            kv_store_row(kt, k.row(s.row0 + t), caches_->k_row(L, s.seq, s.pos0 + t), L.kv_cols);
            kv_store_row(kt, v.row(s.row0 + t), caches_->v_row(L, s.seq, s.pos0 + t), L.kv_cols);
        }
    }

    const int64_t group = n_head / n_head_kv;
    for (const BatchSeg &s : b.segs) {
        const int64_t n_kv = s.pos0 + s.n;
        // Cached keys and values of this sequence back in f32: [n_kv, kv_cols] each.
        std::vector<float> kf(static_cast<size_t>(n_kv * L.kv_cols)), vf(static_cast<size_t>(n_kv * L.kv_cols));
        pool_.parallel_for(n_kv, 64, [&](int64_t p0, int64_t p1) {
            for (int64_t p = p0; p < p1; p++) {
                kv_load_row(kt, caches_->k_row(L, s.seq, p), kf.data() + p * L.kv_cols, L.kv_cols);
                kv_load_row(kt, caches_->v_row(L, s.seq, p), vf.data() + p * L.kv_cols, L.kv_cols);
            }
        });
        pool_.parallel_for(s.n * n_head, 1, [&](int64_t w0, int64_t w1) {
            std::vector<float> score(static_cast<size_t>(n_kv));
            for (int64_t w = w0; w < w1; w++) {
                const int64_t t = w / n_head, h = w % n_head, kvh = h / group;
                const int64_t n_vis = s.pos0 + t + 1;  // causal: positions 0..pos
                const float *qh = q.row(s.row0 + t) + h * head_dim;
                float mx = -INFINITY;
                for (int64_t p = 0; p < n_vis; p++) {
                    const float *kh = kf.data() + p * L.kv_cols + kvh * head_dim;
                    float d = 0;
                    for (int64_t i = 0; i < head_dim; i++) d += qh[i] * kh[i];
                    score[size_t(p)] = d * scale;
                    mx = std::max(mx, score[size_t(p)]);
                }
                float sum = 0;
                for (int64_t p = 0; p < n_vis; p++) {
                    score[size_t(p)] = std::exp(score[size_t(p)] - mx);
                    sum += score[size_t(p)];
                }
                float *oh = out.row(s.row0 + t) + h * head_dim;
                std::fill_n(oh, head_dim, 0.0f);
                for (int64_t p = 0; p < n_vis; p++) {
                    const float pw = score[size_t(p)] / sum;
                    const float *vh = vf.data() + p * L.kv_cols + kvh * head_dim;
                    for (int64_t i = 0; i < head_dim; i++) oh[i] += pw * vh[i];
                }
            }
        });
    }
}

}  // namespace strata
