// Shared tensor declarations for the Qwen MoE family.
#include "model/arch/common.h"

#include "core/error.h"

namespace strata {

Weight row_view(const Weight &w, int64_t row0, int64_t n_rows) {
    STRATA_ASSERT(row0 >= 0 && row0 + n_rows <= w.ne[1]);
    Weight v = w;
    v.host = w.host + size_t(row0) * w.row_bytes;
    v.ne[1] = n_rows;
    return v;
}

void declare_globals(TensorLoader &tl, Model &m) {
    const HParams &hp = m.hp;
    m.tok_embd = tl.need("token_embd.weight", {hp.n_embd, hp.n_vocab});
    m.output_norm = tl.need("output_norm.weight", {hp.n_embd});
    m.output = tl.maybe("output.weight", {hp.n_embd, hp.n_vocab});
    if (!m.output.present()) m.output = m.tok_embd;
}

void declare_attention(TensorLoader &tl, const HParams &hp, int64_t il, int64_t q_rows, LayerWeights &L) {
    const int64_t kv_rows = hp.n_head_kv * hp.head_dim_k;
    Weight qkv = tl.maybe(blk_name(il, "attn_qkv.weight"), {hp.n_embd, q_rows + 2 * kv_rows});
    if (qkv.present()) {
        L.wq = row_view(qkv, 0, q_rows);
        L.wk = row_view(qkv, q_rows, kv_rows);
        L.wv = row_view(qkv, q_rows + kv_rows, kv_rows);
    } else {
        L.wq = tl.need(blk_name(il, "attn_q.weight"), {hp.n_embd, q_rows});
        L.wk = tl.need(blk_name(il, "attn_k.weight"), {hp.n_embd, kv_rows});
        L.wv = tl.need(blk_name(il, "attn_v.weight"), {hp.n_embd, kv_rows});
    }
    L.wo = tl.need(blk_name(il, "attn_output.weight"), {hp.n_head * hp.head_dim_v, hp.n_embd});
    L.q_norm = tl.need(blk_name(il, "attn_q_norm.weight"), {hp.head_dim_k});
    L.k_norm = tl.need(blk_name(il, "attn_k_norm.weight"), {hp.head_dim_k});
}

void declare_moe(TensorLoader &tl, const HParams &hp, int64_t il, LayerWeights &L) {
    L.gate_inp = tl.need(blk_name(il, "ffn_gate_inp.weight"), {hp.n_embd, hp.n_expert});
    Weight gate_up = tl.maybe(blk_name(il, "ffn_gate_up_exps.weight"), {hp.n_embd, 2 * hp.n_ff_exp, hp.n_expert});
    if (gate_up.present()) {
        L.gate_exps = gate_up;
        L.gate_exps.ne[1] = hp.n_ff_exp;
        L.up_exps = L.gate_exps;
        L.up_exps.host = gate_up.host + size_t(hp.n_ff_exp) * gate_up.row_bytes;
    } else {
        L.gate_exps = tl.need(blk_name(il, "ffn_gate_exps.weight"), {hp.n_embd, hp.n_ff_exp, hp.n_expert});
        L.up_exps = tl.need(blk_name(il, "ffn_up_exps.weight"), {hp.n_embd, hp.n_ff_exp, hp.n_expert});
    }
    L.down_exps = tl.need(blk_name(il, "ffn_down_exps.weight"), {hp.n_ff_exp, hp.n_embd, hp.n_expert});
    if (hp.n_ff_shexp > 0) {
        L.gate_inp_shexp = tl.need(blk_name(il, "ffn_gate_inp_shexp.weight"), {hp.n_embd});
        L.gate_shexp = tl.need(blk_name(il, "ffn_gate_shexp.weight"), {hp.n_embd, hp.n_ff_shexp});
        L.up_shexp = tl.need(blk_name(il, "ffn_up_shexp.weight"), {hp.n_embd, hp.n_ff_shexp});
        L.down_shexp = tl.need(blk_name(il, "ffn_down_shexp.weight"), {hp.n_ff_shexp, hp.n_embd});
    }
}

}  // namespace strata
