// Loading weights: shape and type checks of every declared tensor against the file.
#include "model/weights.h"

#include <algorithm>

#include "core/error.h"
#include "format/quant.h"

namespace strata {

std::string blk_name(int64_t il, const char *suffix) { return strfmt("blk.%lld.%s", (long long)il, suffix); }

WeightSet weight_set(Model &m) {
    WeightSet ws;
    auto add = [](std::vector<Weight *> &v, Weight &w) {
        if (w.present()) v.push_back(&w);
    };
    add(ws.matrices, m.tok_embd);
    add(ws.matrices, m.output);
    add(ws.vectors, m.output_norm);
    ws.experts.resize(size_t(m.hp.n_layer));
    for (int64_t il = 0; il < m.hp.n_layer; il++) {
        LayerWeights &L = m.layers[size_t(il)];
        for (Weight LayerWeights::*w : k_layer_matrices) add(ws.matrices, L.*w);
        for (Weight LayerWeights::*w : k_layer_vectors) add(ws.vectors, L.*w);
        ws.experts[size_t(il)] = expert_weights(il, L);
    }
    if (m.file) {
        ws.file_bytes = m.file->bytes();
        ws.file_size = m.file->file_size();
    }
    return ws;
}

uint64_t decode_weight_bytes(const Model &m) {
    // weight_set only collects pointers; it takes a mutable model because backends write device views into it
    const WeightSet ws = weight_set(const_cast<Model &>(m));
    auto bytes = [](const Weight &w) { return uint64_t(w.matrix_bytes()) * uint64_t(std::max<int64_t>(w.ne[2], 1)); };
    uint64_t total = 0;
    for (const Weight *w : ws.matrices)
        total += w == &m.tok_embd && m.output.present() ? uint64_t(w->row_bytes) : bytes(*w);
    for (const Weight *w : ws.vectors) total += bytes(*w);
    for (const ExpertWeights &e : ws.experts)
        if (e.present()) total += uint64_t(m.hp.n_expert_used) * e.expert_bytes();
    return total;
}

std::unique_ptr<Model> model_part(const Model &m, int64_t l0, int64_t l1) {
    const int64_t n = m.hp.n_layer;
    if (l0 < 0 || l1 <= l0 || l1 > n)
        fail("a model part needs layers [l0, l1) within 0..%lld, got [%lld, %lld)", (long long)n, (long long)l0,
             (long long)l1);
    auto p = std::make_unique<Model>();
    p->file = m.file;
    p->hp = m.hp;
    p->weight_bytes = m.weight_bytes;
    p->expert_bytes = m.expert_bytes;
    p->layers.resize(m.layers.size());
    for (int64_t il = 0; il < int64_t(m.layers.size()); il++) {
        LayerWeights &L = p->layers[size_t(il)];
        L.recurrent = m.layers[size_t(il)].recurrent;
        L.mtp = m.layers[size_t(il)].mtp;
        if (il >= l0 && il < l1) L = m.layers[size_t(il)];
    }
    if (l1 < n) p->layers[size_t(l1)].attn_norm = m.layers[size_t(l1)].attn_norm;
    if (l0 == 0) p->tok_embd = m.tok_embd;
    if (l1 == n) p->output_norm = m.output_norm, p->output = m.output;
    return p;
}

ExpertWeights expert_weights(int64_t il, const LayerWeights &L) {
    ExpertWeights e;
    e.il = il;
    if (L.gate_exps.present()) e.gate = &L.gate_exps, e.up = &L.up_exps, e.down = &L.down_exps;
    return e;
}

GdnWeights gdn_weights(const LayerWeights &L) { return {&L.ssm_conv1d, &L.ssm_dt_bias, &L.ssm_a, &L.ssm_norm}; }

CacheShape cache_shape(const HParams &hp, int32_t n_seqs, int64_t n_ctx, KvType kv_type, int64_t l0, int64_t l1) {
    if (n_seqs <= 0 || n_ctx <= 0) fail("cache: need at least one sequence and one position");
    if (kv_type == KvType::Q8_0 && hp.head_dim_k % 32 != 0)
        fail("--kv-type q8_0 needs a head size that is a multiple of 32 (this model: %lld)", (long long)hp.head_dim_k);
    CacheShape s;
    s.n_seqs = n_seqs;
    s.n_ctx = n_ctx;
    s.kv_type = kv_type;
    s.layers.resize(size_t(hp.n_layer));
    if (l1 < 0) l1 = hp.n_layer;
    for (int64_t il = std::max<int64_t>(l0, 0); il < std::min(l1, hp.n_layer); il++) {
        CacheShape::Layer &L = s.layers[size_t(il)];
        if (hp.is_recurrent(il)) {
            L.conv_rows = hp.ssm_conv_kernel - 1;
            L.conv_cols = hp.gdn_conv_dim();
            L.state_floats = hp.ssm_dt_rank * hp.ssm_d_state * hp.gdn_head_v_dim();
        } else {
            L.attention = true;
            L.kv_cols = hp.n_head_kv * hp.head_dim_k;
            L.head_dim = hp.head_dim_k;
        }
    }
    return s;
}

namespace {

std::string shape_str(const std::vector<int64_t> &ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); i++) s += strfmt(i ? ", %lld" : "%lld", (long long)ne[i]);
    return s + "]";
}

}  // namespace

Weight TensorLoader::view(const GgufTensor &t, const std::vector<int64_t> &ne) const {
    Weight w;
    w.name = t.name;
    w.type = t.type;
    w.ne[0] = t.ne[0];
    w.ne[1] = t.ne[1];
    w.ne[2] = t.ne[2];
    w.host = t.data;
    w.row_bytes = row_bytes(t.type, t.ne[0]);
    w.expert_stride = w.row_bytes * size_t(t.ne[1]);
    return w;
}

Weight TensorLoader::maybe(const std::string &name, std::vector<int64_t> ne) {
    const GgufTensor *t = f_.find_tensor(name);
    if (!t) return Weight{};
    // Trailing dimensions of 1 don't count: a gate vector may be stored as {n_embd} or {n_embd, 1}.
    bool same = ne.size() <= 4;
    for (size_t i = 0; i < 4 && same; i++) {
        int64_t want = i < ne.size() ? ne[i] : 1;
        same = t->ne[i] == want;
    }
    if (!same)
        fail("%s: tensor '%s' has shape %s, expected %s", f_.path().c_str(), name.c_str(), t->shape_str().c_str(),
             shape_str(ne).c_str());
    if (!can_dequantize(t->type))
        fail("%s: tensor '%s' has type %s, which the engine cannot compute with", f_.path().c_str(), name.c_str(),
             dtype_name(t->type));
    used_.push_back(name);
    return view(*t, ne);
}

Weight TensorLoader::need(const std::string &name, std::vector<int64_t> ne) {
    Weight w = maybe(name, ne);
    if (!w.present())
        fail("%s: required tensor '%s' %s is missing", f_.path().c_str(), name.c_str(), shape_str(ne).c_str());
    return w;
}

std::vector<std::string> TensorLoader::unused() const {
    std::vector<std::string> out;
    for (const GgufTensor &t : f_.tensors())
        if (std::find(used_.begin(), used_.end(), t.name) == used_.end()) out.emplace_back(t.name);
    return out;
}

std::unique_ptr<Model> load_model(const std::string &path) {
    auto m = std::make_unique<Model>();
    m->file = GgufFile::open(path);
    m->hp = read_hparams(*m->file);
    TensorLoader tl(*m->file);
    if (m->hp.arch == Arch::QWEN3MOE) declare_qwen3moe(tl, *m);
    else declare_qwen3next(tl, *m);
    for (const std::string &name : tl.unused())
        m->warnings.push_back(strfmt("tensor '%s' is not used by %s", name.c_str(), m->hp.arch_name.c_str()));

    auto count = [&](const Weight &w, bool expert) {
        if (!w.present()) return;
        uint64_t b = w.matrix_bytes() * uint64_t(std::max<int64_t>(1, w.ne[2]));
        m->weight_bytes += b;
        if (expert) m->expert_bytes += b;
    };
    count(m->tok_embd, false);
    count(m->output_norm, false);
    if (m->output.host != m->tok_embd.host) count(m->output, false);
    for (const LayerWeights &L : m->layers) {
        for (const Weight *w : {&L.attn_norm, &L.ffn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.q_norm, &L.k_norm,
                                &L.ssm_qkv, &L.ssm_z, &L.ssm_ba, &L.ssm_beta, &L.ssm_alpha, &L.ssm_conv1d,
                                &L.ssm_dt_bias, &L.ssm_a, &L.ssm_norm, &L.ssm_out, &L.gate_inp, &L.gate_inp_shexp,
                                &L.gate_shexp, &L.up_shexp, &L.down_shexp, &L.nextn_eh_proj, &L.nextn_enorm,
                                &L.nextn_hnorm, &L.nextn_shared_head_norm})
            count(*w, false);
        // a fused gate_up tensor is counted once through its two views
        count(L.gate_exps, true);
        count(L.up_exps, true);
        count(L.down_exps, true);
    }
    return m;
}

}  // namespace strata
