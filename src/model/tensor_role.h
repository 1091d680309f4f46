// What a tensor is for, from its llama.cpp name (REFERENCE.md §3): used to total bytes by role, to find the routed
// experts that the runtime streams, and to tell MTP blocks from the trunk. Names only; shapes are not checked here.
#pragma once

#include <string_view>
#include <vector>

namespace strata {

class GgufFile;

enum class TensorRole {
    Embedding,     // token_embd
    Output,        // output (the LM head; absent when tied to token_embd)
    Attention,     // attn_q/k/v/output, fused attn_qkv, MLA projections, q/k norms, sinks
    Gdn,           // Gated DeltaNet / SSM: ssm_*, attn_gate, and attn_qkv in layers that have ssm_* tensors
    Router,        // ffn_gate_inp (+bias), exp_probs_b
    RoutedExpert,  // *_exps: one slice per expert, expert index slowest
    SharedExpert,  // *_shexp, ffn_gate_inp_shexp
    Norm,          // attn_norm, ffn_norm, post_attention_norm, output_norm, ...
    Mtp,           // nextn.* and every tensor of a block past the trunk
    DenseFfn,      // ffn_gate/up/down of dense (non-MoE) blocks
    Other,
};
constexpr int k_tensor_role_count = int(TensorRole::Other) + 1;

const char *tensor_role_name(TensorRole r);  // "embedding", "routed_expert", ...

struct TensorClass {
    TensorRole role = TensorRole::Other;
    int layer = -1;  // the N of "blk.N.", -1 for tensors outside the blocks
};

// What the name alone cannot say, taken from the file.
struct TensorRoleContext {
    int n_trunk_layers = -1;       // blocks with an index >= this are MTP blocks; -1 when the file has none
    std::vector<bool> ssm_layers;  // [il]: block il has ssm_* tensors (a GDN layer), so its attn_qkv is GDN's
};

// {arch}.block_count - {arch}.nextn_predict_layers, and which blocks carry ssm_* tensors.
TensorRoleContext tensor_role_context(const GgufFile &f);

TensorClass classify_tensor(std::string_view name, const TensorRoleContext &ctx = {});

// Block index of "blk.N.<rest>", with <rest> stored in *rest; -1 (and the whole name in *rest) otherwise.
int tensor_layer(std::string_view name, std::string_view *rest = nullptr);

}  // namespace strata
