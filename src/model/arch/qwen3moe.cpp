// qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B): every layer GQA attention with q/k norms, then a routed MoE.
#include "model/arch/common.h"
#include "model/forward.h"

namespace strata {

void declare_qwen3moe(TensorLoader &tl, Model &m) {
    const HParams &hp = m.hp;
    declare_globals(tl, m);
    m.layers.resize(size_t(hp.n_layer_all));
    for (int64_t il = 0; il < hp.n_layer_all; il++) {
        LayerWeights &L = m.layers[size_t(il)];
        L.attn_norm = tl.need(blk_name(il, "attn_norm.weight"), {hp.n_embd});
        declare_attention(tl, hp, il, hp.n_head * hp.head_dim_k, L);
        L.ffn_norm = tl.need(blk_name(il, "ffn_norm.weight"), {hp.n_embd});
        declare_moe(tl, hp, il, L);
    }
}

}  // namespace strata

namespace strata {

void trunk_qwen3moe(const ForwardCtx &c, const int32_t *tokens, Act &x, Act &cur) {
    const HParams &hp = c.m.hp;
    Backend &be = c.be;
    trunk_start(c, tokens, x, cur);
    for (int64_t il = c.l0; il < c.l1; il++) {
        const LayerWeights &L = c.m.layers[size_t(il)];
        const Backend::ScratchMark layer_mark = be.scratch_mark();
        Act attn = attention_block(c, il, cur);
        c.trace(il, "attn_out", attn);
        // the residual step into this block's norm, which the MoE block's routing may take (a decoding pass's router
        // launch), and the one into the next block's norm, which the MoE block may take in its last pass
        const ResidualAdd before{x, attn, &L.ffn_norm, hp.rms_eps, cur};
        const bool last = il + 1 == hp.n_layer;
        const ResidualNorm next{x, last ? nullptr : &c.m.layers[size_t(il + 1)].attn_norm, hp.rms_eps, cur};
        Act moe = moe_block(c, il, cur, last ? nullptr : &next, &before);
        c.trace(il, "ffn_moe_out", moe);
        if (last) be.add(x, moe, x);
        c.trace(il, "l_out", x);
        be.scratch_release(layer_mark);
    }
}

}  // namespace strata
