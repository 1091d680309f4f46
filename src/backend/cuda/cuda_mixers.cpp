// The sequence mixers of the CUDA backend: attention over the KV cache and the Gated DeltaNet core.
#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

// STRATA_CUDA_FLASH=0 keeps attention on the one-block-per-row-and-head kernel (A/B checks of the tiled one).
bool flash_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FLASH", true);
    return on;
}

// STRATA_CUDA_FLASH_MMA=0 keeps prefill attention on the fp32 tiled kernel (A/B checks of the tensor-core one).
bool flash_mma_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FLASH_MMA", true);
    return on;
}

// A prompt's tensor-core attention starts with the tiles that see the most keys (flash_attention_mma.cu; the same
// bits; 1.02x the 30B's pp4096 on an H100); STRATA_CUDA_ATTN_HEAVY_FIRST=0 takes them in tile order.
bool attn_heavy_first_enabled() {
    static const bool on = env_switch("STRATA_CUDA_ATTN_HEAVY_FIRST", true);
    return on;
}

// STRATA_CUDA_FLASH_DECODE=0 keeps decoding over short contexts on the tiled kernel (A/B checks of the decode one;
// the two round differently).
bool flash_decode_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FLASH_DECODE", true);
    return on;
}
// STRATA_CUDA_FLASH_DECODE_SPLIT=0 runs the short-context decode kernel in its one-block form (the split form: 1.16x
// on the 30B-A3B's resident tg128, bench/RESULTS.md).
bool flash_decode_split_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FLASH_DECODE_SPLIT", true);
    return on;
}

// STRATA_CUDA_MERGE_AHEAD=0: the split decoding attention's merge loads each part after testing it instead of every
// part before adding any (the same bits; on: 1.01-1.02x the 30B's resident tg128, bench/RESULTS.md).
bool merge_ahead_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MERGE_AHEAD", true);
    return on;
}

// STRATA_CUDA_GDN_PARALLEL=0 keeps long runs on the one-block-per-head chunked kernel.
bool gdn_parallel_enabled() {
    static const bool on = env_switch("STRATA_CUDA_GDN_PARALLEL", true);
    return on;
}

// An attention layer's k and v stored by the q/k norm's launch instead of one of attention()'s own (the same bytes in
// the cache; 1.005-1.008x the 30B's resident tg128 on an H100). STRATA_CUDA_KV_FUSE=0 stores them in attention().
bool kv_fuse_enabled() {
    static const bool on = env_switch("STRATA_CUDA_KV_FUSE", true);
    return on;
}

}  // namespace

void CudaBackend::check_positions(const LayerCache &c, const BatchInfo &b) const {
    for (const BatchSeg &s : b.segs)
        if (s.pos0 + s.n > c.kv.n_ctx)
            fail("sequence %d needs %lld positions; the context holds %lld", s.seq, (long long)(s.pos0 + s.n),
                 (long long)c.kv.n_ctx);
}

void CudaBackend::qk_norm_rope_store(int64_t il, Act q, Act k, Act v, const Weight &q_norm, const Weight &k_norm,
                                     float eps, const RopeParams &rp, const BatchInfo &b) {
    STRATA_ASSERT(il >= 0 && il < int64_t(caches_.size()));
    kv_stored_ = {};
    const LayerCache &c = caches_[size_t(il)];
    if (!kv_fuse_enabled() || !c.attn || !fits_qk_norm_rope(q, k, q_norm, k_norm, rp) || v.rows != k.rows ||
        k.cols != c.kv.kv_cols || v.cols != c.kv.kv_cols || !qk_norm_rope_stores(c.kv, rp.head_dim))
        return qk_norm_rope(q, k, q_norm, k_norm, eps, rp, b);
    STRATA_CUDA_OP("qk_norm_rope");
    check_positions(c, b);
    wrote(q), wrote(k);
    const uint64_t u0 = uploads_;
    const float *freq = inv_freq(rp);
    const int2 *sp = seq_pos(b);
    launch_qk_norm_rope(rows_of(q), rows_of(k), dev_vector(q_norm), dev_vector(k_norm), rp.head_dim, eps, rp.n_rot,
                        freq, sp, stream_, &c.kv, rows_of(v), early_reads_enabled() && uploads_ == u0);
    kv_stored_ = {il, k, v};
}

void CudaBackend::attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                            float scale, const BatchInfo &b, Act out) {
    STRATA_CUDA_OP("attention");
    wrote(out);
    STRATA_ASSERT(il >= 0 && il < int64_t(caches_.size()));
    LayerCache &c = caches_[size_t(il)];
    STRATA_ASSERT(c.attn && k.cols == c.kv.kv_cols && v.cols == c.kv.kv_cols && q.cols == n_head * head_dim);
    check_positions(c, b);
    const uint64_t u0 = uploads_;  // the tiles' upload below, in the first layer of a pass: no early reads there
    const int2 *sp = seq_pos(b);
    const KvStored st = kv_stored_;
    kv_stored_ = {};
    if (st.il != il || st.k.data != k.data || st.v.data != v.data || st.k.rows != k.rows || st.v.rows != v.rows)
        launch_kv_store(c.kv, rows_of(k), rows_of(v), sp, stream_);
    const int64_t group = n_head / n_head_kv;
    // Decoding batches (every sequence a row or two) take the tiles of 16 query vectors.
    bool small = std::all_of(b.segs.begin(), b.segs.end(), [&](const BatchSeg &s) { return s.n * group <= 16; });
    int rpt = flash_enabled() ? flash_rows_per_tile(head_dim, group, small) : 0;
    if (rpt == 0 && small && flash_enabled()) small = false, rpt = flash_rows_per_tile(head_dim, group, false);
    const bool mma = rpt > 0 && !small && flash_mma_enabled() && flash_mma_applies(c.kv.type, head_dim, group, prop_.major);
    if (mma) rpt = flash_mma_rows_per_tile(group);
    if (rpt == 0) {
        if (capturing_) rec_ok_ = false;  // the simple kernel is not checked for replays
        launch_attention(c.kv, rows_of(q), rows_of(out), n_head, n_head_kv, head_dim, scale, sp, stream_);
        return;
    }
    const std::vector<AttnTile> tiles = attention_tiles(b, rpt);
    if (tiles.empty()) return;
    int64_t max_end = 0;
    for (const BatchSeg &s : b.segs) max_end = std::max(max_end, s.pos0 + s.n);
    int64_t n_split = 1, chunk = 0;
    attention_split(int64_t(tiles.size()), n_head_kv, max_end, !small, n_split, chunk);
    if (capturing_) {
        // A replay checks that its batch gets the same split (cuda_graph.cpp).
        const AttnRecord r{true, !small, rpt, n_head_kv, n_split, chunk, c.kv.n_ctx};
        const AttnRecord &o = rec_attn_;
        if (o.present && (o.prompt != r.prompt || o.rpt != r.rpt || o.n_head_kv != r.n_head_kv ||
                          o.n_split != r.n_split || o.chunk != r.chunk || o.n_ctx != r.n_ctx))
            rec_ok_ = false;
        rec_attn_ = r;
    }
    // Decoding over short contexts: a warp per query vector, one launch. The choice follows the split (n_split and
    // chunk), which a replay recomputes and compares, so a recorded pass never replays with the other kernel.
    if (small && !mma && n_split == 1 && chunk <= k_flash_decode_keys && flash_decode_enabled() &&
        flash_decode_applies(head_dim, group, rpt)) {
        const Mark m = mark();
        float *ws = flash_decode_split_enabled()
                        ? scratch_array<float>(int64_t(
                              flash_decode_workspace_floats(int(tiles.size()), n_head_kv, group, rpt, head_dim)))
                        : nullptr;
        const NormQ8 q8 = act_quant_begin(c.kv.k, out, true);
        launch_flash_decode(c.kv, rows_of(q), rows_of(out), n_head, n_head_kv, head_dim, scale, attn_tiles(tiles),
                            int(tiles.size()), rpt, stream_, ws, q8, merge_ahead_enabled());
        norm_quant_made(q8, out);
        release(m);
        return;
    }
    const Mark m = mark();
    const size_t ws_floats =
        mma ? flash_mma_workspace_floats(int(tiles.size()), n_head_kv, int(n_split), head_dim)
            : flash_workspace_floats(int(tiles.size()), n_head_kv, int(n_split), head_dim, small);
    float *ws = n_split > 1 ? scratch_array<float>(int64_t(ws_floats)) : nullptr;
    if (mma)
        launch_flash_attention_mma(c.kv, rows_of(q), rows_of(out), n_head, n_head_kv, head_dim, scale,
                                   attn_tiles(tiles), int(tiles.size()), int(n_split), int(chunk), ws, stream_,
                                   attn_heavy_first_enabled());
    else {
        // a decoding batch split over blocks ends with the merge, which can make the o matrix's Q8_0 input
        const NormQ8 q8 = act_quant_begin(c.kv.k, out, small && n_split > 1 && flash_merge_quantizes(int(n_split)));
        const AttnTile *td = attn_tiles(tiles);
        launch_flash_attention(c.kv, rows_of(q), rows_of(out), n_head, n_head_kv, head_dim, scale, small, td,
                               int(tiles.size()), int(n_split), int(chunk), ws, stream_, q8,
                               early_reads_enabled() && uploads_ == u0);
        norm_quant_made(q8, out);
    }
    release(m);
}

std::vector<AttnTile> CudaBackend::attention_tiles(const BatchInfo &b, int rpt) {
    std::vector<AttnTile> tiles;
    for (const BatchSeg &s : b.segs)
        for (int64_t r = 0; r < s.n; r += rpt)
            tiles.push_back({int32_t(s.row0 + r), int32_t(std::min<int64_t>(rpt, s.n - r)), s.seq, int32_t(s.pos0 + r),
                             int32_t(s.pos0)});
    return tiles;
}

// Too few blocks to fill the GPU (decoding a few sequences): split long key ranges over blocks. Unsplit, the one
// range is every key of every tile (a fixed bound, not the batch's end, so that the kernels' arguments stay the same
// from one decoding step to the next and a recorded pass can be replayed): k_flash_decode_keys while no tile sees
// more keys (the bound under which decoding takes its own kernel), else 2^30.
// Split ranges are whole multiples of G keys: 32 (a tile of the tiled kernel's largest form), or 64 with
// STRATA_CUDA_ATTN_FINE_SPLIT=0 (the form before, whose blocks walk twice the keys one tile after another: at a
// 4096-token context a decoding layer's split attention took 23.6 us with 33 ranges of 128 keys).
// The line is STRATA_CUDA_ATTN_SPLIT_WAVES blocks an SM: by default 1 for a prompt (a batch not of decoding's small
// tiles) and 2 for decoding. A 512-token prompt of the 30B-A3B has 256 blocks on an H200's 132 SMs, just under two
// waves: with the line at 2 it split in two and merged (59 us a layer for the merge alone, 4% of the pass); at 1 it
// stays whole, 1.05-1.07x on the pass (bench/RESULTS.md, twenty-fourth round). Other bits than the line at 2: the
// choice follows the batch's shape only, as before.
void CudaBackend::attention_split(int64_t n_tiles, int64_t n_head_kv, int64_t max_end, bool prompt, int64_t &n_split,
                                  int64_t &chunk) const {
    static const int64_t G = env_switch("STRATA_CUDA_ATTN_FINE_SPLIT", true) ? 32 : 64;
    static const int64_t set = env_count("STRATA_CUDA_ATTN_SPLIT_WAVES", 0);
    const int64_t waves = set > 0 ? set : prompt ? 1 : 2;
    const int64_t blocks = n_tiles * n_head_kv, target = waves * int64_t(prop_.multiProcessorCount);
    n_split = 1, chunk = max_end <= k_flash_decode_keys ? k_flash_decode_keys : int64_t(1) << 30;
    if (blocks < target && max_end > 64) {
        n_split = std::min((target + blocks - 1) / blocks, (max_end + G - 1) / G);
        chunk = ((max_end + n_split - 1) / n_split + G - 1) / G * G;
        n_split = (max_end + chunk - 1) / chunk;
    }
}

void CudaBackend::gdn(int64_t il, const GdnWeights &Lw, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
                      const BatchInfo &b, Act out) {
    STRATA_CUDA_OP("gdn");
    wrote(out);
    STRATA_ASSERT(il >= 0 && il < int64_t(caches_.size()));
    LayerCache &c = caches_[size_t(il)];
    GdnShape s{p.n_k_heads, p.n_v_heads, p.head_k_dim, p.head_v_dim, p.conv_kernel, p.ba_grouped, p.vhead_tiled, p.eps};
    const int64_t C = s.conv_dim(), K = s.conv_kernel;
    STRATA_ASSERT(!c.attn && qkv.cols == C && c.conv_floats == (K - 1) * C);
    STRATA_ASSERT(z.cols == s.n_v * s.d_v && out.cols == s.n_v * s.d_v && s.n_v % s.n_k == 0);
    const float *w_conv = dev_vector(*Lw.conv1d), *dt_bias = dev_vector(*Lw.dt_bias);
    const float *a_neg = dev_vector(*Lw.a), *norm_w = dev_vector(*Lw.norm);

    for (const BatchSeg &seg : b.segs) {
        const int64_t n = seg.n;
        if (n == 0) continue;
        const Mark m = mark();
        float *xc = scratch_array<float>(n * C);
        float *state_tmp = scratch_array<float>(std::max<int64_t>((K - 1) * C, 1));
        float *g = scratch_array<float>(n * s.n_v), *beta = scratch_array<float>(n * s.n_v);
        float *conv_state = c.conv + seg.seq * c.conv_floats, *states = c.state + seg.seq * c.state_floats;
        launch_gdn_conv(s, rows_of(qkv.rows_view(seg.row0, n)), w_conv, conv_state, state_tmp, xc, stream_);
        launch_gdn_qk_norm(s, xc, n, stream_);
        launch_gdn_gates(s, rows_of(beta_in.rows_view(seg.row0, n)), rows_of(alpha_in.rows_view(seg.row0, n)), dt_bias,
                         a_neg, g, beta, n, stream_);
        // The chunked form pays off from a few tokens on; the threshold is the CPU reference's.
        const bool chunked = n >= 16;
        const Act o = out.rows_view(seg.row0, n);
        if (chunked && gdn_parallel_enabled() && gdn_parallel_supports(s)) {
            float *ws = scratch_array<float>(gdn_parallel_workspace_floats(s));
            launch_gdn_delta_rule_parallel(s, xc, g, beta, n, states, rows_of(o), ws, stream_);
        } else {
            float *ws = chunked ? scratch_array<float>(gdn_chunk_workspace_floats(s)) : nullptr;
            launch_gdn_delta_rule(s, xc, g, beta, n, states, rows_of(o), ws, chunked, stream_);
        }
        launch_gdn_gated_norm(s, rows_of(o), rows_of(z.rows_view(seg.row0, n)), norm_w, stream_);
        release(m);
    }
}

}  // namespace strata::cuda
