// Hyperparameters of the architectures Strata runs, read from GGUF metadata. A missing required key or a
// contradiction is an error naming the key; an architecture we don't run is rejected by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

class GgufFile;

enum class Arch { QWEN3MOE, QWEN3NEXT, QWEN35MOE };
enum class RopeType { NEOX, IMROPE };

struct HParams {
    Arch arch = Arch::QWEN3MOE;
    std::string arch_name;  // as in the file: "qwen3moe", "qwen3next", "qwen35moe"

    int64_t n_vocab = 0;
    int64_t n_ctx_train = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;      // trunk layers that run (block_count minus MTP blocks)
    int64_t n_layer_all = 0;  // block_count: trunk plus MTP blocks
    int64_t n_nextn = 0;      // MTP blocks after the trunk (qwen35moe)

    // attention
    int64_t n_head = 0, n_head_kv = 0;
    int64_t head_dim_k = 0, head_dim_v = 0;  // key_length, value_length
    float rms_eps = 1e-6f;
    float rope_theta = 10000.0f;
    int64_t n_rot = 0;  // rotated dims per head (partial rotary)
    RopeType rope_type = RopeType::NEOX;
    int32_t rope_sections[4] = {0, 0, 0, 0};
    bool attn_output_gate = false;  // qwen3next/qwen35: q projection carries a per-head gate

    // MoE
    int64_t n_expert = 0, n_expert_used = 0;
    int64_t n_ff_exp = 0, n_ff_shexp = 0;  // n_ff_shexp 0: no shared expert
    bool expert_weights_norm = true;
    float expert_weights_scale = 0.0f;  // 0: none

    // Gated DeltaNet (qwen3next, qwen35moe)
    int64_t ssm_conv_kernel = 0;
    int64_t ssm_d_state = 0;  // head_k_dim (also head_v_dim in released models)
    int64_t ssm_n_group = 0;  // k heads
    int64_t ssm_dt_rank = 0;  // v heads
    int64_t ssm_d_inner = 0;  // v heads * head_v_dim
    std::vector<bool> recurrent;  // per layer (n_layer_all entries): a GDN layer rather than full attention
    bool gdn_vhead_tiled = false;  // qwen35moe files: v-head j uses k-head j mod n_k (else j div r)

    bool is_recurrent(int64_t il) const { return !recurrent.empty() && recurrent[size_t(il)]; }
    int64_t gdn_head_v_dim() const { return ssm_dt_rank ? ssm_d_inner / ssm_dt_rank : 0; }
    int64_t gdn_key_dim() const { return ssm_d_state * ssm_n_group; }
    int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + ssm_d_inner; }
    bool has_recurrent() const;

    // One line per group of values, for logs and `strata inspect`.
    std::string describe() const;
};

// Reads and checks the hyperparameters; n_vocab falls back to the token list's length.
HParams read_hparams(const GgufFile &f);

// Architectures this build runs, for messages: "qwen3moe, qwen3next, qwen35moe".
const char *supported_architectures();

}  // namespace strata
