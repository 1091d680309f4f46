// Blocks shared by the Qwen MoE architectures, written once against the backend's ops, plus the forward entry.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "model/forward.h"

namespace strata {

void ForwardCtx::trace(const std::string &name, const Act &a) const {
    if (!tracer || !tracer->want || !tracer->want(name)) return;
    std::vector<float> host(static_cast<size_t>(a.rows * a.cols));
    be.download(a, host.data());
    tracer->sink(name, a.rows, a.cols, host.data());
}

void ForwardCtx::trace(int64_t il, const char *name, const Act &a) const {
    if (!tracer) return;
    trace(strfmt("blk.%lld.%s", (long long)il, name), a);
}

bool ForwardCtx::wants(int64_t il, const char *name) const {
    return tracer && tracer->want && tracer->want(strfmt("blk.%lld.%s", (long long)il, name));
}

Act attention_block(const ForwardCtx &c, int64_t il, Act cur) {
    const HParams &hp = c.m.hp;
    const LayerWeights &L = c.m.layers[size_t(il)];
    const int64_t T = cur.rows, hd = hp.head_dim_k, q_cols = hp.n_head * hd, kv_cols = hp.n_head_kv * hd;
    Backend &be = c.be;

    Act q = be.alloc(T, q_cols), gate;
    Act qg = hp.attn_output_gate ? be.alloc(T, 2 * q_cols) : q;  // gated: per head [query, gate]
    Act k = be.alloc(T, kv_cols), v = be.alloc(T, kv_cols);
    be.matmuls(cur, {{&L.wq, qg}, {&L.wk, k}, {&L.wv, v}});
    if (hp.attn_output_gate) {
        gate = be.alloc(T, q_cols);
        be.deinterleave(qg, hd, q, gate);
    }
    // Text-only positions make IMRoPE's sections coincide (every section sees the same position), so it reduces
    // to NeoX rotation of the first n_rot dims.
    RopeParams rp{hd, hp.n_rot, hp.rope_theta};
    be.qk_norm_rope_store(il, q, k, v, L.q_norm, L.k_norm, hp.rms_eps, rp, c.batch);
    c.trace(il, "Qcur", q);
    c.trace(il, "Kcur", k);
    c.trace(il, "Vcur", v);

    Act attn = be.alloc(T, q_cols);
    be.attention(il, q, k, v, hp.n_head, hp.n_head_kv, hd, 1.0f / std::sqrt(float(hd)), c.batch, attn);
    if (hp.attn_output_gate) be.mul_sigmoid(attn, gate);
    c.trace(il, "attn_gated", attn);
    Act out = be.alloc(T, hp.n_embd);
    be.matmul(L.wo, attn, out);
    return out;
}

Act gdn_block(const ForwardCtx &c, int64_t il, Act cur) {
    const HParams &hp = c.m.hp;
    const LayerWeights &L = c.m.layers[size_t(il)];
    const int64_t T = cur.rows, n_v = hp.ssm_dt_rank;
    Backend &be = c.be;

    Act qkv = be.alloc(T, hp.gdn_conv_dim()), z = be.alloc(T, hp.ssm_d_inner);
    Act b, a;
    if (L.ssm_ba.present()) {
        b = be.alloc(T, 2 * n_v);
        be.matmuls(cur, {{&L.ssm_qkv, qkv}, {&L.ssm_z, z}, {&L.ssm_ba, b}});
    } else {
        b = be.alloc(T, n_v);
        a = be.alloc(T, n_v);
        be.matmuls(cur, {{&L.ssm_qkv, qkv}, {&L.ssm_z, z}, {&L.ssm_beta, b}, {&L.ssm_alpha, a}});
    }
    c.trace(il, "linear_attn_qkv_mixed", qkv);
    c.trace(il, "z", z);

    GdnParams p;
    p.n_k_heads = hp.ssm_n_group;
    p.n_v_heads = n_v;
    p.head_k_dim = hp.ssm_d_state;
    p.head_v_dim = hp.gdn_head_v_dim();
    p.conv_kernel = hp.ssm_conv_kernel;
    p.ba_grouped = L.ssm_ba.present();
    p.vhead_tiled = hp.gdn_vhead_tiled;
    p.eps = hp.rms_eps;
    Act o = be.alloc(T, hp.ssm_d_inner);
    be.gdn(il, gdn_weights(L), qkv, z, b, a, p, c.batch, o);
    c.trace(il, "attn_out_norm", o);
    Act out = be.alloc(T, hp.n_embd);
    be.matmul(L.ssm_out, o, out);
    return out;
}

Act moe_block(const ForwardCtx &c, int64_t il, Act cur, const ResidualNorm *then, const ResidualAdd *before) {
    const HParams &hp = c.m.hp;
    const LayerWeights &L = c.m.layers[size_t(il)];
    if (before && c.tracer) {  // a traced pass makes cur here, where a tracer may read it
        c.be.add_rms_norm(before->resid, before->y, *before->w, before->eps, before->normed);
        before = nullptr;
    }
    // The router runs inside the MoE schedule, which reports nothing. A tracer that asks for the router logits
    // gets them from one more matmul here (the selection is their top n_expert_used, ties to the lower id), so
    // routing can be observed on any backend while untraced passes pay nothing.
    if (c.wants(il, "ffn_moe_logits")) {
        Act logits = c.be.alloc(cur.rows, hp.n_expert);
        c.be.matmul(L.gate_inp, cur, logits);
        c.trace(il, "ffn_moe_logits", logits);
    }
    MoeParams p{hp.n_expert, hp.n_expert_used, hp.expert_weights_norm, hp.expert_weights_scale};
    Act out = c.be.alloc(cur.rows, hp.n_embd);
    c.moe.run(il, L, cur, p, out, then, before);
    return out;
}

void trunk_start(const ForwardCtx &c, const int32_t *tokens, Act &x, Act &cur) {
    const HParams &hp = c.m.hp;
    Backend &be = c.be;
    const int64_t T = c.batch.n_tokens;
    x = be.alloc(T, hp.n_embd);
    // cur: the normed input of each block. The residual adds fold into the next norm (add_rms_norm).
    cur = be.alloc(T, hp.n_embd);
    if (c.l0 > 0) {
        STRATA_ASSERT(c.in && int64_t(c.in->x.size()) == T * hp.n_embd && c.in->cur.size() == c.in->x.size());
        be.upload(c.in->x.data(), x);
        be.upload(c.in->cur.data(), cur);
        return;
    }
    be.embed(c.m.tok_embd, tokens, x);
    c.trace("inp_embd", x);
    if (hp.n_layer > 0) be.rms_norm(x, c.m.layers[0].attn_norm, hp.rms_eps, cur);
}

void forward(const Model &m, Backend &be, ExpertRunner &moe, const int32_t *tokens, const BatchInfo &batch,
             const std::vector<int64_t> &out_rows, float *logits, const Tracer *tracer, int32_t *ids,
             const PassPart *part, int ahead) {
    ForwardCtx c{m, be, moe, batch, tracer};
    c.l1 = m.hp.n_layer;
    if (part) {
        c.l0 = part->l0, c.in = part->in;
        if (part->l1 >= 0) c.l1 = part->l1;
    }
    PassIo io{tokens, &out_rows, ids ? nullptr : logits, ids};
    if (ahead >= 0) {
        STRATA_ASSERT(ids && !part && !tracer);
        io.ahead = ahead;
    }
    if (c.l0 > 0) {
        STRATA_ASSERT(c.in);  // (its sizes checked where it is uploaded, trunk_start)
        io.in_x = c.in->x.data(), io.in_cur = c.in->cur.data();
    }
    if (c.l1 < m.hp.n_layer) {  // a part before the last: the residual stream goes on to the next
        STRATA_ASSERT(part && part->out);
        const size_t n = size_t(batch.n_tokens * m.hp.n_embd);
        part->out->x.resize(n, be);
        part->out->cur.resize(n, be);
        io.out_x = part->out->x.data(), io.out_cur = part->out->cur.data();
        io.logits = nullptr, io.ids = nullptr;
    }
    moe.start_pass(batch.n_tokens, tracer != nullptr);
    // a part's pass is recorded and replayed as a whole model's is: its input and output pass through io
    // (STRATA_SPLIT_GRAPHS=0: a part's passes run op by op)
    static const bool part_graphs = env_switch("STRATA_SPLIT_GRAPHS", true);
    const bool whole = c.l0 == 0 && c.l1 == m.hp.n_layer;
    const bool traced = tracer != nullptr || moe.reads_back() || (!whole && !part_graphs);
    if (!traced && be.replay_pass(batch, io)) {
        moe.pass_replayed();
        return;
    }
    be.reset_scratch();
    // The pass's bounds for the backend; a throw on the way aborts it.
    struct PassScope {
        Backend &be;
        bool open = true;
        ~PassScope() {
            if (open) be.abort_pass();
        }
    };
    be.begin_pass(batch, io, traced);
    PassScope scope{be};
    Act h, cur;
    if (m.hp.arch == Arch::QWEN3MOE)
        trunk_qwen3moe(c, tokens, h, cur);
    else
        trunk_qwen3next(c, tokens, h, cur);
    if (c.l1 < m.hp.n_layer) {
        be.download(h, io.out_x);
        be.download(cur, io.out_cur);
        scope.open = false;
        be.end_pass();
        return;
    }

    // Only the rows whose logits are wanted go through the output norm and the vocabulary projection, in slices of
    // rows, so that a pass wanting every position's logits needs scratch for one slice (a tracer gets them whole).
    const int64_t n_out = int64_t(out_rows.size()), E = m.hp.n_embd, V = m.hp.n_vocab;
    const int64_t slice = tracer ? std::max<int64_t>(n_out, 1) : k_logit_slice_rows;
    for (int64_t r0 = 0; r0 < n_out; r0 += slice) {
        const int64_t n = std::min(slice, n_out - r0);
        const Backend::ScratchMark mk = be.scratch_mark();
        const std::vector<int64_t> rows(out_rows.begin() + r0, out_rows.begin() + r0 + n);
        Act sel = be.alloc(n, E);
        be.gather_rows(h, rows, sel);
        Act normed = be.alloc(n, E);
        be.rms_norm(sel, m.output_norm, m.hp.rms_eps, normed);
        c.trace("result_norm", normed);
        Act out = be.alloc(n, V);
        be.matmul(m.output, normed, out);
        c.trace("result_output", out);
        if (ids)
            be.download_argmax(out, ids + r0);
        else
            be.download(out, logits + r0 * V);
        be.scratch_release(mk);
    }
    scope.open = false;
    be.end_pass();
}

int64_t forward_ahead(Backend &be, ExpertRunner &moe, const int32_t *tokens, const BatchInfo &batch,
                      const std::vector<int64_t> &out_rows, int32_t *ids, int64_t max_steps, const AheadTake &take) {
    if (!moe.runs_ahead()) return 0;
    PassIo io{tokens, &out_rows, nullptr, ids};
    return be.replay_ahead(batch, io, max_steps, [&](int64_t s, const int32_t *got) {
        moe.start_pass(batch.n_tokens, false);  // each step's pass, replayed whole
        moe.pass_replayed();
        return take(s, got);
    });
}

}  // namespace strata
