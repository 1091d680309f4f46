// Model weights as views into the mapped GGUF file: every tensor an architecture needs, declared with its GGUF
// name and expected shape and checked on load, and what a backend is handed of them (weight_set, cache_shape).
// Backends attach their own copies (device memory) to these views; the model never owns device memory. Shapes are
// in ggml order: ne[0] is the row length (input features).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/weight.h"
#include "model/hparams.h"

namespace strata {

struct LayerWeights {
    bool recurrent = false;  // Gated DeltaNet mixer instead of full attention
    bool mtp = false;        // a multi-token-prediction block after the trunk (read, not run)

    Weight attn_norm;  // {n_embd}
    Weight ffn_norm;   // {n_embd}: qwen3moe ffn_norm, qwen3next/qwen35moe post_attention_norm

    // full attention
    Weight wq;       // {n_embd, n_head * head_dim} (x2 with the output gate: per head [query, gate])
    Weight wk, wv;   // {n_embd, n_head_kv * head_dim}
    Weight wo;       // {n_head * head_dim, n_embd}
    Weight q_norm, k_norm;  // {head_dim}

    // Gated DeltaNet
    Weight ssm_qkv;    // attn_qkv {n_embd, conv_dim}: q of all k-heads, k of all k-heads, v of all v-heads
    Weight ssm_z;      // attn_gate {n_embd, value_dim}
    Weight ssm_ba;     // qwen3next {n_embd, 2 n_v}: per k-head group [b x r, a x r]
    Weight ssm_beta;   // qwen35moe {n_embd, n_v}
    Weight ssm_alpha;  // qwen35moe {n_embd, n_v}
    Weight ssm_conv1d; // {conv_kernel, conv_dim}
    Weight ssm_dt_bias;  // {n_v}
    Weight ssm_a;        // {n_v}: -exp(A_log)
    Weight ssm_norm;     // {head_v_dim}
    Weight ssm_out;      // {value_dim, n_embd}

    // MoE
    Weight gate_inp;   // router {n_embd, n_expert}
    Weight gate_exps;  // {n_embd, n_ff_exp, n_expert} (may be a view into a fused gate_up tensor)
    Weight up_exps;    // {n_embd, n_ff_exp, n_expert}
    Weight down_exps;  // {n_ff_exp, n_embd, n_expert}
    Weight gate_inp_shexp;  // {n_embd}: one sigmoid gate value per token
    Weight gate_shexp, up_shexp;  // {n_embd, n_ff_shexp}
    Weight down_shexp;            // {n_ff_shexp, n_embd}

    // MTP block extras (qwen35moe)
    Weight nextn_eh_proj;  // {2 n_embd, n_embd}
    Weight nextn_enorm, nextn_hnorm;  // {n_embd}
    Weight nextn_shared_head_norm;    // {n_embd}, optional
};

struct Model {
    std::shared_ptr<GgufFile> file;  // shared with the parts of a split model (model_part)
    HParams hp;
    Weight tok_embd;     // {n_embd, n_vocab}
    Weight output_norm;  // {n_embd}
    Weight output;       // {n_embd, n_vocab}; the embedding matrix when the file ties them
    std::vector<LayerWeights> layers;  // n_layer_all entries; MTP blocks last
    uint64_t weight_bytes = 0;         // all tensors the model uses
    uint64_t expert_bytes = 0;         // routed experts alone
    std::vector<std::string> warnings; // e.g. tensors in the file that no declaration used
};

// Checks declarations against the file: presence, shape, and a type the engine can compute with.
class TensorLoader {
public:
    TensorLoader(const GgufFile &f) : f_(f) {}
    // A required tensor; throws naming the tensor, the expected and the found shape or type.
    Weight need(const std::string &name, std::vector<int64_t> ne);
    // An optional one: an absent Weight when the file doesn't have it (wrong shape is still an error).
    Weight maybe(const std::string &name, std::vector<int64_t> ne);
    // Names of tensors in the file that were never declared.
    std::vector<std::string> unused() const;

private:
    Weight view(const GgufTensor &t, const std::vector<int64_t> &ne) const;
    const GgufFile &f_;
    std::vector<std::string> used_;
};

// Opens, validates and maps a model: hyperparameters, then every tensor its architecture declares.
std::unique_ptr<Model> load_model(const std::string &path);

// One participant's share of a split model (runtime/engine.h): a copy of m whose layers outside [l0, l1) hold no
// weights, with the token embedding only where l0 == 0, the output norm and matrix only where l1 == n_layer, and
// layer l1's attn_norm (the part's last residual step computes the next part's first norm, as the whole model's
// pass does). Shares m's file; made before any backend writes device views into m's weights.
std::unique_ptr<Model> model_part(const Model &m, int64_t l0, int64_t l1);

// Per-architecture declarations (model/arch/<name>.cpp).
void declare_qwen3moe(TensorLoader &tl, Model &m);
void declare_qwen3next(TensorLoader &tl, Model &m);  // also qwen35moe, whose differences it handles

// A layer's resident weights besides its routed experts: the matrices and the f32 vectors (absent ones included).
inline constexpr Weight LayerWeights::*k_layer_matrices[] = {
    &LayerWeights::wq,        &LayerWeights::wk,       &LayerWeights::wv,        &LayerWeights::wo,
    &LayerWeights::ssm_qkv,   &LayerWeights::ssm_z,    &LayerWeights::ssm_ba,    &LayerWeights::ssm_beta,
    &LayerWeights::ssm_alpha, &LayerWeights::ssm_out,  &LayerWeights::gate_inp,  &LayerWeights::gate_shexp,
    &LayerWeights::up_shexp,  &LayerWeights::down_shexp};
inline constexpr Weight LayerWeights::*k_layer_vectors[] = {
    &LayerWeights::attn_norm,   &LayerWeights::ffn_norm, &LayerWeights::q_norm,   &LayerWeights::k_norm,
    &LayerWeights::ssm_dt_bias, &LayerWeights::ssm_a,    &LayerWeights::ssm_norm, &LayerWeights::gate_inp_shexp,
    &LayerWeights::ssm_conv1d};

// What a backend computes with: the resident matrices and f32 vectors of the trunk's layers (not the MTP blocks,
// which do not run) and each layer's routed experts.
WeightSet weight_set(Model &m);
// The weight bytes one decoded token reads: every matrix and vector once (the token embedding its one row, unless
// it is the output matrix too), and k of the n routed experts of each MoE layer. The KV rows and recurrent state
// a token reads come on top.
uint64_t decode_weight_bytes(const Model &m);
ExpertWeights expert_weights(int64_t il, const LayerWeights &L);
GdnWeights gdn_weights(const LayerWeights &L);

// The caches of n_seqs sequences of n_ctx positions for this model's layers [l0, l1) (l1 < 0: to the last; the
// others get none). Throws strata::Error naming the flag
// when the KV type does not fit the model (q8_0 rows need a head size that is a multiple of 32).
CacheShape cache_shape(const HParams &hp, int32_t n_seqs, int64_t n_ctx, KvType kv_type, int64_t l0 = 0,
                       int64_t l1 = -1);

// Layer-name helper: blk_name(3, "attn_q.weight") == "blk.3.attn_q.weight".
std::string blk_name(int64_t il, const char *suffix);

}  // namespace strata
