// Declarations shared by the Qwen MoE architectures: globals, attention projections, routed and shared experts.
#pragma once

#include "model/weights.h"

namespace strata {

// token_embd, output_norm, output (tied to token_embd when absent).
void declare_globals(TensorLoader &tl, Model &m);

// attn_q/k/v (or a fused attn_qkv, split into row views), attn_output, q/k norms. q_rows is the q projection's
// output size (doubled where the projection carries the output gate).
void declare_attention(TensorLoader &tl, const HParams &hp, int64_t il, int64_t q_rows, LayerWeights &L);

// Router and routed experts (separate gate/up or a fused gate_up split into views); the shared expert when
// hp.n_ff_shexp > 0.
void declare_moe(TensorLoader &tl, const HParams &hp, int64_t il, LayerWeights &L);

// Rows [row0, row0 + n_rows) of a 2-D weight, as a weight of its own.
Weight row_view(const Weight &w, int64_t row0, int64_t n_rows);

}  // namespace strata
