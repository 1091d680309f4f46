// Tensor roles from llama.cpp tensor names. The name's first component after "blk.N." decides, except where the
// file says more: blocks past the trunk are MTP whatever they contain, and attn_qkv is GDN's projection only in
// layers that also have ssm_* tensors (qwen3moe may fuse attention's q/k/v under the same name).
#include "model/tensor_role.h"

#include <string>

#include "format/gguf.h"

namespace strata {

const char *tensor_role_name(TensorRole r) {
    switch (r) {
        case TensorRole::Embedding:
            return "embedding";
        case TensorRole::Output:
            return "output";
        case TensorRole::Attention:
            return "attention";
        case TensorRole::Gdn:
            return "gdn";
        case TensorRole::Router:
            return "router";
        case TensorRole::RoutedExpert:
            return "routed_expert";
        case TensorRole::SharedExpert:
            return "shared_expert";
        case TensorRole::Norm:
            return "norm";
        case TensorRole::Mtp:
            return "mtp";
        case TensorRole::DenseFfn:
            return "dense_ffn";
        case TensorRole::Other:
            return "other";
    }
    return "other";
}

int tensor_layer(std::string_view name, std::string_view *rest) {
    if (rest) *rest = name;
    if (name.substr(0, 4) != "blk.") return -1;
    size_t k = 4;
    long il = 0;
    while (k < name.size() && name[k] >= '0' && name[k] <= '9' && il < 1000000) il = il * 10 + (name[k++] - '0');
    if (k == 4 || k >= name.size() || name[k] != '.' || il >= 1000000) return -1;
    if (rest) *rest = name.substr(k + 1);
    return int(il);
}

namespace {

bool starts_with(std::string_view s, std::string_view p) {
    return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// The first dot-separated component: "ffn_gate_exps" of "ffn_gate_exps.weight".
std::string_view base_of(std::string_view rest) {
    return rest.substr(0, rest.find('.'));
}

TensorRole global_role(std::string_view base) {
    if (base == "token_embd") return TensorRole::Embedding;
    if (base == "output") return TensorRole::Output;
    if (base == "output_norm" || base == "token_embd_norm") return TensorRole::Norm;
    return TensorRole::Other;
}

TensorRole block_role(std::string_view base, bool ssm_layer) {
    if (base == "nextn") return TensorRole::Mtp;
    if (ends_with(base, "_shexp")) return TensorRole::SharedExpert;  // before ffn_gate_inp: ffn_gate_inp_shexp
    if (ends_with(base, "_exps")) return TensorRole::RoutedExpert;
    if (base == "ffn_gate_inp" || base == "exp_probs_b") return TensorRole::Router;
    if (starts_with(base, "ssm_") || base == "attn_gate") return TensorRole::Gdn;
    if (base == "attn_qkv") return ssm_layer ? TensorRole::Gdn : TensorRole::Attention;
    // Norms inside attention (on q, k, or MLA's compressed q/kv) belong to attention.
    if (base == "attn_q_norm" || base == "attn_k_norm" || base == "attn_q_a_norm" || base == "attn_kv_a_norm")
        return TensorRole::Attention;
    if (ends_with(base, "_norm") || base == "attn_norm_2") return TensorRole::Norm;
    if (starts_with(base, "attn_")) return TensorRole::Attention;
    if (base == "ffn_gate" || base == "ffn_up" || base == "ffn_down" || base == "ffn_gate_up")
        return TensorRole::DenseFfn;
    return TensorRole::Other;
}

}  // namespace

TensorClass classify_tensor(std::string_view name, const TensorRoleContext &ctx) {
    TensorClass c;
    std::string_view rest;
    c.layer = tensor_layer(name, &rest);
    if (c.layer < 0) {
        c.role = global_role(base_of(name));
        return c;
    }
    if (ctx.n_trunk_layers >= 0 && c.layer >= ctx.n_trunk_layers) {
        c.role = TensorRole::Mtp;
        return c;
    }
    bool ssm = size_t(c.layer) < ctx.ssm_layers.size() && ctx.ssm_layers[size_t(c.layer)];
    c.role = block_role(base_of(rest), ssm);
    return c;
}

TensorRoleContext tensor_role_context(const GgufFile &f) {
    TensorRoleContext ctx;
    std::string arch(f.architecture());
    const GgufValue *blocks = f.find(arch + ".block_count");
    const GgufValue *nextn = f.find(arch + ".nextn_predict_layers");
    if (blocks && nextn) {
        uint64_t n_blocks = blocks->as_uint(arch + ".block_count");
        uint64_t n_mtp = nextn->as_uint(arch + ".nextn_predict_layers");
        if (n_mtp > 0 && n_mtp <= n_blocks) ctx.n_trunk_layers = int(n_blocks - n_mtp);
    }
    for (const GgufTensor &t : f.tensors()) {
        std::string_view rest;
        int il = tensor_layer(t.name, &rest);
        if (il < 0 || !starts_with(rest, "ssm_")) continue;
        if (ctx.ssm_layers.size() <= size_t(il)) ctx.ssm_layers.resize(size_t(il) + 1, false);
        ctx.ssm_layers[size_t(il)] = true;
    }
    return ctx;
}

}  // namespace strata
