// The sequence mixers of the CUDA backend: attention over the KV cache and the Gated DeltaNet core.
#include "backend/cuda/cuda_backend_impl.h"
#include "core/error.h"

namespace strata::cuda {

void CudaBackend::attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                            float scale, const BatchInfo &b, Act out) {
    STRATA_ASSERT(il >= 0 && il < int64_t(caches_.size()));
    LayerCache &c = caches_[size_t(il)];
    STRATA_ASSERT(c.attn && k.cols == c.kv.kv_cols && v.cols == c.kv.kv_cols && q.cols == n_head * head_dim);
    for (const BatchSeg &s : b.segs)
        if (s.pos0 + s.n > c.kv.n_ctx)
            fail("sequence in slot %d needs %lld positions; the context holds %lld", s.slot, (long long)(s.pos0 + s.n),
                 (long long)c.kv.n_ctx);
    const int2 *sp = slot_pos(b);
    launch_kv_store(c.kv, rows_of(k), rows_of(v), sp, stream_);
    launch_attention(c.kv, rows_of(q), rows_of(out), n_head, n_head_kv, head_dim, scale, sp, stream_);
}

void CudaBackend::gdn(int64_t il, const LayerWeights &Lw, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
                      const BatchInfo &b, Act out) {
    STRATA_ASSERT(il >= 0 && il < int64_t(caches_.size()));
    LayerCache &c = caches_[size_t(il)];
    GdnShape s{p.n_k_heads, p.n_v_heads, p.head_k_dim, p.head_v_dim, p.conv_kernel, p.ba_grouped, p.vhead_tiled, p.eps};
    const int64_t C = s.conv_dim(), K = s.conv_kernel;
    STRATA_ASSERT(!c.attn && qkv.cols == C && c.conv_floats == (K - 1) * C);
    STRATA_ASSERT(z.cols == s.n_v * s.d_v && out.cols == s.n_v * s.d_v && s.n_v % s.n_k == 0);
    const float *w_conv = dev_vector(Lw.ssm_conv1d), *dt_bias = dev_vector(Lw.ssm_dt_bias);
    const float *a_neg = dev_vector(Lw.ssm_a), *norm_w = dev_vector(Lw.ssm_norm);

    for (const BatchSeg &seg : b.segs) {
        const int64_t n = seg.n;
        if (n == 0) continue;
        const Mark m = mark();
        float *xc = scratch_array<float>(n * C);
        float *state_tmp = scratch_array<float>(std::max<int64_t>((K - 1) * C, 1));
        float *g = scratch_array<float>(n * s.n_v), *beta = scratch_array<float>(n * s.n_v);
        float *conv_state = c.conv + seg.slot * c.conv_floats, *states = c.state + seg.slot * c.state_floats;
        launch_gdn_conv(s, rows_of(qkv.rows_view(seg.row0, n)), w_conv, conv_state, state_tmp, xc, stream_);
        launch_gdn_qk_norm(s, xc, n, stream_);
        launch_gdn_gates(s, rows_of(beta_in.rows_view(seg.row0, n)), rows_of(alpha_in.rows_view(seg.row0, n)), dt_bias,
                         a_neg, g, beta, n, stream_);
        // The chunked form pays off from a few tokens on; the threshold is the CPU reference's.
        const bool chunked = n >= 16;
        float *ws = chunked ? scratch_array<float>(gdn_chunk_workspace_floats(s)) : nullptr;
        const Act o = out.rows_view(seg.row0, n);
        launch_gdn_delta_rule(s, xc, g, beta, n, states, rows_of(o), ws, chunked, stream_);
        launch_gdn_gated_norm(s, rows_of(o), rows_of(z.rows_view(seg.row0, n)), norm_w, stream_);
        release(m);
    }
}

}  // namespace strata::cuda
