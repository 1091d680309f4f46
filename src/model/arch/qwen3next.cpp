// qwen3next (Qwen3-Next-80B-A3B, Qwen3-Coder-Next) and qwen35moe (Qwen3.5 MoE): three Gated DeltaNet layers to one
// gated-attention layer, each followed by routed experts plus a gated shared expert. qwen35moe differs in its
// separate beta/alpha projections, IMRoPE and MTP blocks after the trunk.
#include "core/error.h"
#include "model/arch/common.h"
#include "model/forward.h"

namespace strata {

namespace {

void declare_gdn(TensorLoader &tl, const HParams &hp, int64_t il, LayerWeights &L) {
    const int64_t n_v = hp.ssm_dt_rank;
    L.ssm_qkv = tl.maybe(blk_name(il, "attn_qkv.weight"), {hp.n_embd, hp.gdn_conv_dim()});
    L.ssm_z = tl.maybe(blk_name(il, "attn_gate.weight"), {hp.n_embd, hp.ssm_d_inner});
    if (!L.ssm_qkv.present() || !L.ssm_z.present()) {
        if (tl.maybe(blk_name(il, "ssm_in.weight"), {hp.n_embd, hp.gdn_conv_dim() + hp.ssm_d_inner}).present())
            fail(
                "layer %lld stores the Gated DeltaNet input projection in the legacy fused 'ssm_in' layout; "
                "reconvert the model with a current converter (attn_qkv + attn_gate)",
                (long long)il);
        tl.need(blk_name(il, L.ssm_qkv.present() ? "attn_gate.weight" : "attn_qkv.weight"),
                L.ssm_qkv.present() ? std::vector<int64_t>{hp.n_embd, hp.ssm_d_inner}
                                    : std::vector<int64_t>{hp.n_embd, hp.gdn_conv_dim()});
    }
    if (hp.arch == Arch::QWEN35MOE) {
        L.ssm_beta = tl.need(blk_name(il, "ssm_beta.weight"), {hp.n_embd, n_v});
        L.ssm_alpha = tl.need(blk_name(il, "ssm_alpha.weight"), {hp.n_embd, n_v});
    } else {
        L.ssm_ba = tl.need(blk_name(il, "ssm_ba.weight"), {hp.n_embd, 2 * n_v});
    }
    L.ssm_conv1d = tl.need(blk_name(il, "ssm_conv1d.weight"), {hp.ssm_conv_kernel, hp.gdn_conv_dim()});
    L.ssm_dt_bias = tl.need(blk_name(il, "ssm_dt.bias"), {n_v});
    L.ssm_a = tl.need(blk_name(il, "ssm_a"), {n_v});
    L.ssm_norm = tl.need(blk_name(il, "ssm_norm.weight"), {hp.gdn_head_v_dim()});
    L.ssm_out = tl.need(blk_name(il, "ssm_out.weight"), {hp.ssm_d_inner, hp.n_embd});
}

}  // namespace

void declare_qwen3next(TensorLoader &tl, Model &m) {
    const HParams &hp = m.hp;
    declare_globals(tl, m);
    m.layers.resize(size_t(hp.n_layer_all));
    for (int64_t il = 0; il < hp.n_layer_all; il++) {
        LayerWeights &L = m.layers[size_t(il)];
        L.recurrent = hp.is_recurrent(il);
        L.mtp = il >= hp.n_layer;
        L.attn_norm = tl.need(blk_name(il, "attn_norm.weight"), {hp.n_embd});
        L.ffn_norm = tl.need(blk_name(il, "post_attention_norm.weight"), {hp.n_embd});
        if (L.recurrent)
            declare_gdn(tl, hp, il, L);
        else
            declare_attention(tl, hp, il, 2 * hp.n_head * hp.head_dim_k, L);
        declare_moe(tl, hp, il, L);
        if (L.mtp) {
            L.nextn_eh_proj = tl.need(blk_name(il, "nextn.eh_proj.weight"), {2 * hp.n_embd, hp.n_embd});
            L.nextn_enorm = tl.need(blk_name(il, "nextn.enorm.weight"), {hp.n_embd});
            L.nextn_hnorm = tl.need(blk_name(il, "nextn.hnorm.weight"), {hp.n_embd});
            L.nextn_shared_head_norm = tl.maybe(blk_name(il, "nextn.shared_head_norm.weight"), {hp.n_embd});
            tl.maybe(blk_name(il, "nextn.embed_tokens.weight"), {hp.n_embd, hp.n_vocab});
            tl.maybe(blk_name(il, "nextn.shared_head_head.weight"), {hp.n_embd, hp.n_vocab});
        }
    }
}

}  // namespace strata

namespace strata {

void trunk_qwen3next(const ForwardCtx &c, const int32_t *tokens, Act &x, Act &cur) {
    const HParams &hp = c.m.hp;
    Backend &be = c.be;
    trunk_start(c, tokens, x, cur);
    for (int64_t il = c.l0; il < c.l1; il++) {
        const LayerWeights &L = c.m.layers[size_t(il)];
        const Backend::ScratchMark layer_mark = be.scratch_mark();
        Act mix = L.recurrent ? gdn_block(c, il, cur) : attention_block(c, il, cur);
        c.trace(il, L.recurrent ? "linear_attn_out" : "attn_out", mix);
        // the residual step into this block's norm, which the MoE block's routing may take (a decoding pass's router
        // launch), and the one into the next block's norm, which the MoE block may take in its last pass
        const ResidualAdd before{x, mix, &L.ffn_norm, hp.rms_eps, cur};
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
