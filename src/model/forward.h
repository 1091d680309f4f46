// One forward pass of a model over a batch of tokens from one or more sequences, on any backend. The per-
// architecture loops live in model/arch/; the blocks they share (attention, Gated DeltaNet, MoE) in blocks.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/host_floats.h"
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
    // Where `before` is given, x is its normed and not made yet: run() does that step first (the routing's launch may
    // do it: Backend::add_rms_norm_route).
    virtual void run(int64_t il, const LayerWeights &L, Act x, const MoeParams &p, Act out, const ResidualNorm *then,
                     const ResidualAdd *before = nullptr) = 0;
    // A pass of n_tokens starts (before reads_back is asked for it); traced: a tracer reads its intermediates.
    virtual void start_pass(int64_t n_tokens, bool traced) { (void)n_tokens, (void)traced; }
    // The pass started last was replayed whole by the backend (Backend::replay_pass): run() was not called for it.
    virtual void pass_replayed() {}
    // Whether run() reads intermediate results back at once in this pass (a routing observer): the pass cannot be
    // deferred.
    virtual bool reads_back() const { return false; }
    // Whether decoding passes may follow one another with no host work between them (Backend::replay_ahead):
    // nothing read back, nothing the host does with a pass's routing before the next.
    virtual bool runs_ahead() const { return !reads_back(); }
};

// The residual stream between two parts of a split model (runtime/engine.h), in host memory the writing part's
// backend gives (page-locked on a GPU, so each part's copy runs at the bus's rate): x, the residual after the part's
// last layer, and cur, x normed by the next layer's attn_norm (rows x n_embd each). Handing both over keeps the next
// part's first block on exactly the bits the whole model's pass gives it.
struct Residual {
    HostFloats x, cur;
};

// The layers a pass runs: all of them, or one participant's part [l0, l1) of a split model. A part that does not
// start at layer 0 takes the residual stream from `in` instead of embedding the tokens; one that does not end at the
// last layer leaves it in `out` instead of computing logits.
struct PassPart {
    int64_t l0 = 0, l1 = -1;  // l1 < 0: to the last layer
    const Residual *in = nullptr;
    Residual *out = nullptr;
};

struct ForwardCtx {
    const Model &m;
    Backend &be;
    ExpertRunner &moe;
    const BatchInfo &batch;
    const Tracer *tracer = nullptr;
    int64_t l0 = 0, l1 = 0;             // the layers this pass runs
    const Residual *in = nullptr;       // l0 > 0: the residual stream the part before left

    void trace(const std::string &name, const Act &a) const;
    void trace(int64_t il, const char *name, const Act &a) const;
    // Whether the tracer asks for layer il's intermediate `name` (for values computed only to be traced).
    bool wants(int64_t il, const char *name) const;
};

// Rows of logits computed at a time by forward(): backends size their scratch for this many.
constexpr int64_t k_logit_slice_rows = 256;

// Runs the model over tokens[0..batch.n_tokens) and writes the logits of rows out_rows (in that order) to
// logits[out_rows.size() * n_vocab], or, where ids is given, each of those rows' arg-max to ids[out_rows.size()]
// (Backend::download_argmax; logits unused). Where part is given and not the whole model, only its layers run (see
// PassPart; the residual streams pass through PassIo, so a backend may record and replay a part's pass too).
// ahead: PassIo::ahead (a fed pass of greedy decoding, one of the pair forward_ahead replays; needs ids).
void forward(const Model &m, Backend &be, ExpertRunner &moe, const int32_t *tokens, const BatchInfo &batch,
             const std::vector<int64_t> &out_rows, float *logits, const Tracer *tracer = nullptr,
             int32_t *ids = nullptr, const PassPart *part = nullptr, int ahead = -1);

// Greedy decoding steps replayed ahead of the host where the backend and the expert runner allow it
// (Backend::replay_ahead, ExpertRunner::runs_ahead; a whole model's pass of one token a sequence): step s decodes
// batch with its positions moved on by s, its tokens `tokens` (s = 0) or the arg-max ids of step s - 1, and
// take(s, ids) gets each step's ids (one a row of out_rows, in ids[out_rows.size()]) and says whether to go on.
// Returns the steps taken; 0 where the steps cannot run ahead now (the caller runs them with forward(), `ahead` in
// turn 0 and 1, which records the pair).
int64_t forward_ahead(Backend &be, ExpertRunner &moe, const int32_t *tokens, const BatchInfo &batch,
                      const std::vector<int64_t> &out_rows, int32_t *ids, int64_t max_steps, const AheadTake &take);

// Shared blocks; each returns the block's output (the residual is added by the caller).
Act attention_block(const ForwardCtx &c, int64_t il, Act cur);
Act gdn_block(const ForwardCtx &c, int64_t il, Act cur);
// before: the residual step that makes cur, left to the MoE block (ExpertRunner::run) where nothing traces it.
Act moe_block(const ForwardCtx &c, int64_t il, Act cur, const ResidualNorm *then, const ResidualAdd *before = nullptr);

// The start of a trunk's layers c.l0..: x, the embedded tokens, and cur, x normed by layer 0's attn_norm; or, for a
// part after the first, both as the part before left them (uploaded from c.in).
void trunk_start(const ForwardCtx &c, const int32_t *tokens, Act &x, Act &cur);

// The architecture loops over layers [c.l0, c.l1): the residual stream after them, x (before output_norm at the
// last layer) and cur (x normed by layer c.l1's attn_norm where c.l1 is not the last).
void trunk_qwen3moe(const ForwardCtx &c, const int32_t *tokens, Act &x, Act &cur);
void trunk_qwen3next(const ForwardCtx &c, const int32_t *tokens, Act &x, Act &cur);

}  // namespace strata
