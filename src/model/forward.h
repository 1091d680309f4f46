// One forward pass of a model over a batch of tokens from one or more sequences, on any backend. The per-
// architecture loops live in model/arch/; the blocks they share (attention, Gated DeltaNet, MoE) in blocks.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace strata {

// Named intermediates ("blk.3.ffn_moe_out"): when `want` says yes for a name, `sink` receives its values
// (rows x cols, packed) so two runs or two backends can be diffed to the first divergence.
struct Tracer {
    std::function<bool(const std::string &name)> want;
    std::function<void(const std::string &name, int64_t rows, int64_t cols, const float *data)> sink;
};

// A layer's MoE FFN (router, routed experts, shared expert) on the backend. The MoE schedule of the strata layer
// (strata/moe_schedule.h) implements it and decides where each expert's bytes come from; model code calls it as one
// block and never sees the schedule.
class ExpertRunner {
  public:
    virtual ~ExpertRunner() = default;
    // out = the layer's MoE FFN of x; then, where `then` is given, the residual step after it (then->resid += out,
    // then->normed = rms_norm(then->resid)), which may be done in the same pass over out. then->normed may be x.
    virtual void run(int64_t il, const LayerWeights &L, Act x, const MoeParams &p, Act out,
                     const ResidualNorm *then) = 0;
    // A pass of n_tokens starts (before reads_back is asked for it); traced: a tracer reads its intermediates.
    virtual void start_pass(int64_t n_tokens, bool traced) { (void)n_tokens, (void)traced; }
    // Whether run() reads intermediate results back at once in this pass (a routing observer): the pass cannot be
    // deferred.
    virtual bool reads_back() const { return false; }
};

struct ForwardCtx {
    const Model &m;
    Backend &be;
    ExpertRunner &moe;
    const BatchInfo &batch;
    const Tracer *tracer = nullptr;

    void trace(const std::string &name, const Act &a) const;
    void trace(int64_t il, const char *name, const Act &a) const;
    // Whether the tracer asks for layer il's intermediate `name` (for values computed only to be traced).
    bool wants(int64_t il, const char *name) const;
};

// Rows of logits computed at a time by forward(): backends size their scratch for this many.
constexpr int64_t k_logit_slice_rows = 256;

// Runs the model over tokens[0..batch.n_tokens) and writes the logits of rows out_rows (in that order) to
// logits[out_rows.size() * n_vocab], or, where ids is given, each of those rows' arg-max to ids[out_rows.size()]
// (Backend::download_argmax; logits unused).
void forward(const Model &m, Backend &be, ExpertRunner &moe, const int32_t *tokens, const BatchInfo &batch,
             const std::vector<int64_t> &out_rows, float *logits, const Tracer *tracer = nullptr,
             int32_t *ids = nullptr);

// Shared blocks; each returns the block's output (the residual is added by the caller).
Act attention_block(const ForwardCtx &c, int64_t il, Act cur);
Act gdn_block(const ForwardCtx &c, int64_t il, Act cur);
Act moe_block(const ForwardCtx &c, int64_t il, Act cur, const ResidualNorm *then);

// The architecture loops: embeddings to the final hidden state (before output_norm).
Act trunk_qwen3moe(const ForwardCtx &c, const int32_t *tokens);
Act trunk_qwen3next(const ForwardCtx &c, const int32_t *tokens);

}  // namespace strata
