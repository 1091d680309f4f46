// The op vocabulary of the engine, as a device-neutral interface. Model code (model/arch/*.cpp) calls these and
// never sees a device; the CPU backend is the reference every other backend is tested against. Backends know
// tensors (format/weight.h) and shapes, never architectures: what a model is, and where its experts should live
// (the placement plan, the expert slot table, the MoE schedule: src/strata), are decided above this layer.
//
// Conventions: activations are row-major f32 matrices in the backend's memory, one row per token of the batch
// (`Act`, with a row stride so column ranges can be viewed without copies). y = matmul(W, x) means
// y[t, n] = sum_k W[n, k] x[t, k] (W has ne = {k, n}).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/placement.h"
#include "backend/route_draws.h"
#include "core/argmax.h"
#include "core/env.h"
#include "core/error.h"
#include "format/weight.h"

namespace strata {

// The streamed MoE schedule's lookahead (strata/moe_schedule.h): STRATA_PREFILL_STREAM_AHEAD, 16 when unset, 0 off.
// Read here so that the schedule and a backend that orders computes after the fills of their own slots agree.
inline long prefill_stream_ahead() { return env_count("STRATA_PREFILL_STREAM_AHEAD", 16); }

struct Act {
    float *data = nullptr;
    int64_t rows = 0, cols = 0;
    int64_t stride = 0;  // floats from one row's start to the next (>= cols)

    Act cols_view(int64_t c0, int64_t n) const { return {data + c0, rows, n, stride}; }
    Act rows_view(int64_t r0, int64_t n) const { return {data + r0 * stride, n, cols, stride}; }
    float *row(int64_t r) const { return data + r * stride; }
    bool contiguous() const { return stride == cols; }
};

// Tokens [row0, row0 + n) of a batch are positions pos0.. of sequence `seq` (its row of the caches).
struct BatchSeg {
    int32_t seq = 0;
    int64_t pos0 = 0;
    int64_t n = 0;
    int64_t row0 = 0;
};

struct BatchInfo {
    std::vector<BatchSeg> segs;  // in row order, covering every row once
    int64_t n_tokens = 0;
};

// What a forward pass reads and writes on the host: a token id per row, the rows whose logits are wanted, and
// out_rows->size() rows of logits. A pass of one part of a split model (model/forward.h, PassPart) reads the residual
// stream the part before left (in_x, in_cur: rows x n_embd each, uploaded with upload) instead of embedding the
// tokens where it does not start at the first layer, and downloads its own (out_x, out_cur) instead of logits where
// it does not end at the last.
struct PassIo {
    const int32_t *tokens = nullptr;
    const std::vector<int64_t> *out_rows = nullptr;
    float *logits = nullptr;
    int32_t *ids = nullptr;  // where set, the pass gives each out row's arg-max id here instead of logits
    const float *in_x = nullptr, *in_cur = nullptr;
    float *out_x = nullptr, *out_cur = nullptr;
    // A pass of greedy decoding that may run ahead of the host (Backend::replay_ahead): its token ids are fed on the
    // device (the pass takes `tokens`, and its arg-max ids are left where the next fed pass takes its tokens from),
    // and it is recorded as one of a pair, 0 or 1, that replay in turn. -1: an ordinary pass.
    int ahead = -1;
};

// replay_ahead's caller, given each step's arg-max ids (one an output row) in step order: whether to go on.
using AheadTake = std::function<bool(int64_t step, const int32_t *ids)>;

struct RopeParams {
    int64_t head_dim = 0;  // columns per head
    int64_t n_rot = 0;     // leading dims of each head that rotate (NeoX pairing: i with i + n_rot/2)
    float theta = 10000.0f;
};

struct MoeParams {
    int64_t n_expert = 0, n_expert_used = 0;
    bool norm_weights = true;
    float weights_scale = 0.0f;  // 0: none
};

// The residual step after a block: resid += y, then normed = rms_norm(resid) with w (Backend::add_rms_norm).
struct ResidualNorm {
    Act resid;
    const Weight *w = nullptr;
    float eps = 0.0f;
    Act normed;
};

// The residual step before a block, left to the op that first reads its result (Backend::add_rms_norm_route):
// resid += y, then normed = rms_norm(resid) with w.
struct ResidualAdd {
    Act resid, y;
    const Weight *w = nullptr;
    float eps = 0.0f;
    Act normed;
};

// What follows the combination of a decoding MoE layer's routed experts (Backend::experts_device_routed), so that a
// backend may do it in the same pass over the output: where shared_gate is set, the shared expert's gated rows
// (shared_expert_add(x, *shared_gate, shared_y, out)); then, where then.w is set, add_rms_norm(then.resid, out,
// *then.w, then.eps, then.normed).
struct MoeTail {
    const Weight *shared_gate = nullptr;
    Act shared_y;
    ResidualNorm then;
};

// The router's arithmetic, shared by the CPU's route_topk and benchmark routing (strata/route_override.h): the
// softmax over one token's logits in fp32, and the weights of its k chosen experts (ids in rank order), renormalised
// and scaled as MoeParams asks.
void router_softmax(const float *logits, int64_t n_expert, float *prob);
void chosen_weights(const float *prob, const MoeParams &p, const int32_t *ids, float *weights);
// The weights route_topk gives the experts `ids` (k = p.n_expert_used) of one token with these router logits, and
// the ids sorted into its order (highest weight first, ties to the lower id), the weights with them.
void router_weights(const float *logits, const MoeParams &p, int32_t *ids, float *weights);

struct GdnParams {
    int64_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 0;
    bool ba_grouped = false;   // qwen3next: b and a interleaved per k-head group in one projection
    bool vhead_tiled = false;  // v-head j uses k-head j mod n_k (else j div (n_v/n_k))
    float eps = 1e-6f;         // of the gated RMSNorm
};

// The small weights of a Gated DeltaNet core.
struct GdnWeights {
    const Weight *conv1d = nullptr;   // {conv_kernel, conv_dim}
    const Weight *dt_bias = nullptr;  // {n_v}
    const Weight *a = nullptr;        // {n_v}: -exp(A_log)
    const Weight *norm = nullptr;     // {head_v_dim}
};

// One expert's gate, up and down matrices where a backend reads them: device pointers into an expert slot, or host
// pointers into the mapped file for a backend that reads experts in place (the CPU).
struct ExpertSrc {
    const void *gate = nullptr, *up = nullptr, *down = nullptr;
};

// Rows [row0, row0 + n_rows) of an expert FFN's input go through one expert, read from src (in expert slot `slot`,
// or -1 where it is not in a slot).
struct ExpertGroup {
    ExpertSrc src;
    int32_t row0 = 0, n_rows = 0;
    int32_t slot = -1;
};

// An expert slot to fill with expert `expert` of the layer being filled.
struct SlotFill {
    int32_t slot = 0, expert = 0;
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;

    // ---- set-up (the strata layer drives it: plan with device_facts(), then prepare, then init_caches) ----
    // What a placement plan needs to know of this backend's memory.
    virtual DeviceFacts device_facts() { return {}; }
    // Makes the weights usable (uploads, conversions) and takes the memory the plan gives.
    virtual void prepare(WeightSet &ws, const Placement &plan) = 0;
    // What prepare() did beyond the plan, for the check line (e.g. how long pinning the host copy took).
    virtual std::string prepare_note() const { return {}; }
    virtual void init_caches(const CacheShape &shape) = 0;

    // Scratch activations, valid until reset_scratch() (called once per forward pass).
    virtual Act alloc(int64_t rows, int64_t cols) = 0;
    virtual int32_t *alloc_i32(int64_t n) = 0;  // integer scratch (routing ids), in the backend's memory
    virtual void reset_scratch() = 0;
    // Scratch allocated after a mark may be handed out again once the mark is released (ops queued before the
    // release still read it correctly: backends order reuse after them). A forward pass releases each layer's
    // temporaries, so it holds one layer's, not all of them. Backends with plenty of memory may ignore marks.
    struct ScratchMark {
        size_t a = 0, b = 0;
    };
    virtual ScratchMark scratch_mark() { return {}; }
    virtual void scratch_release(ScratchMark) {}
    virtual void download(const Act &src, float *host) = 0;     // rows x cols, packed
    // Host memory for n floats that download() and upload() move in bulk (a split model's residual stream between
    // parts), page-locked where the backend has such memory, so those copies run at the bus's rate; nullptr where it
    // has none or cannot get it (the caller then uses ordinary memory). free_host gives back what alloc_host gave.
    virtual float *alloc_host(size_t n) {
        (void)n;
        return nullptr;
    }
    virtual void free_host(float *p) { (void)p; }
    virtual void download_i32(const int32_t *src, int64_t n, int32_t *host) = 0;  // synchronous
    // Each row's arg-max (core/argmax.h's pick: NaN never larger, the lowest index among equal maxima) to host[rows],
    // as download() delivers (inside a pass: once end_pass() has returned). Backends that can take it where the rows
    // are give one index a row instead of the row.
    virtual void download_argmax(const Act &src, int32_t *host);
    // Several of those with one wait: each of `acts` as download(), then n ids as download_i32 (none where ids is
    // nullptr). A layer that needs its routing and its input rows on the host waits for the device once.
    struct ActDownload {
        Act src;
        float *host;
    };
    virtual void download_many(std::initializer_list<ActDownload> acts, const int32_t *ids, int64_t n,
                               int32_t *ids_host) {
        for (const ActDownload &a : acts) download(a.src, a.host);
        if (ids) download_i32(ids, n, ids_host);
    }
    // Ids a pass computed, for the host to read once the pass has ended (the expert cache's admission after decoding
    // passes that route on the device): n ids copied into host memory the backend keeps for `key` (>= 0; one buffer
    // a key, overwritten by the next call with it), ordered after the ops issued before, not waited for here. The
    // host reads them after the pass's end (end_pass() returned, or the pass was replayed). A recorded pass records
    // the copy, so each replay refreshes the same buffer. nullptr where the backend has no buffer for it (then
    // nothing is copied). By default a synchronous download into a vector of k_ids_kept ids a key. ids_ready()
    // waits for the copies queued so far (the host calls it before it reads them).
    static constexpr int64_t k_ids_kept = 1024;
    virtual const int32_t *ids_after_pass(int64_t key, const int32_t *src, int64_t n) {
        if (key < 0 || n <= 0 || n > k_ids_kept) return nullptr;
        if (ids_kept_.size() <= size_t(key)) ids_kept_.resize(size_t(key) + 1);
        std::vector<int32_t> &v = ids_kept_[size_t(key)];
        v.resize(size_t(k_ids_kept));  // never moves once made: its address is kept across passes
        download_i32(src, n, v.data());
        return v.data();
    }
    virtual void ids_ready() {}
    // The other way (host rows packed), ordered after the ops issued before; `host` may be reused on return.
    virtual void upload(const float *host, Act dst) = 0;
    virtual void upload_i32(const int32_t *host, int64_t n, int32_t *dst) = 0;
    // A forward pass's bounds (forward() calls these; ops outside a pass behave as always). Between begin_pass and
    // end_pass a backend may defer its work (the CUDA backend records a decoding pass as one graph), so `host` of a
    // download() inside a pass holds its rows only once end_pass() has returned. traced: the caller downloads
    // intermediate results and reads them at once. abort_pass(): the pass threw; drop what was deferred.
    virtual void begin_pass(const BatchInfo &, const PassIo &, bool traced) { (void)traced; }
    virtual void end_pass() {}
    virtual void abort_pass() {}
    // A whole untraced pass at once, where the backend can run it without the model's ops: the CUDA backend
    // replays a recorded decoding pass whose kernels and arguments are those this batch would issue (cuda_graph.cpp).
    // true: `io.logits` (or `io.ids`) holds the pass's output; false: the caller runs the pass op by op.
    virtual bool replay_pass(const BatchInfo &, const PassIo &) { return false; }
    // Greedy decoding steps replayed ahead of the host, where the backend holds the pair of recorded fed passes
    // (PassIo::ahead 0 and 1) for this batch's shape: step s decodes the batch with every segment's positions moved on
    // by s, its tokens io.tokens (s = 0) or step s - 1's arg-max ids, taken on the device; step s + 1 is under way
    // while take(s, ids) reads step s's. At most max_steps steps; returns how many take was given (it may have
    // returned false at the last). A step after the last taken may have run: it wrote cache rows past the sequences'
    // lengths (attention reads none of them; the caller does not use this where a pass updates recurrent state). 0:
    // not possible now (the caller runs its steps as passes).
    virtual int64_t replay_ahead(const BatchInfo &, const PassIo &, int64_t max_steps, const AheadTake &take) {
        (void)max_steps, (void)take;
        return 0;
    }
    // Named regions of work for profiling (the CUDA backend's STRATA_CUDA_PROFILE=1); free elsewhere.
    virtual void region_begin(const char *name) { (void)name; }
    virtual void region_end() {}

    // Sequences: copy the first n_pos positions of one sequence's caches (and its recurrent state) to another.
    virtual void copy_seq(int32_t src, int32_t dst, int64_t n_pos) = 0;
    virtual void clear_seq(int32_t seq) = 0;

    // Recurrent-state checkpoints (optional; used for prefix reuse on models with GDN layers). A sequence's recurrent
    // state is everything of it that is not indexed by position: every GDN layer's conv state and delta-rule state.
    // Attention caches can be cut back to any earlier length, recurrent states cannot, so a caller that wants to
    // rewind a sequence keeps copies of its recurrent state taken at earlier positions and loads one back.
    //   recurrent_state_bytes(): the size of one sequence's recurrent state; 0 when the caches have none, or when
    //     the backend does not implement checkpoints (callers then never rewind sequences of recurrent models).
    //   save_recurrent_state(seq, dst): copies the sequence's recurrent state into dst (host memory, that many
    //     bytes), synchronously: when it returns, dst holds the state after every op issued before the call.
    //   load_recurrent_state(seq, src): the inverse; later ops on the sequence see the loaded state.
    // The layout is the backend's own; a blob is only loaded back into a backend of the same kind with the same cache
    // shape (any sequence). Neither touches attention caches. The defaults implement "not supported".
    virtual size_t recurrent_state_bytes() const { return 0; }
    virtual void save_recurrent_state(int32_t seq, void *dst) {
        fail("the %s backend cannot save recurrent state", name().c_str());
    }
    virtual void load_recurrent_state(int32_t seq, const void *src) {
        fail("the %s backend cannot load recurrent state", name().c_str());
    }

    // Device memory of a GPU backend: what its allocations hold, what the driver counts for it (its allocations and
    // the runtime's context; 0: unknown) and its budget. Not cheap (asks the driver): not for per-token use.
    struct DeviceMemory {
        uint64_t held = 0, driver = 0, budget = 0;
    };
    virtual bool device_memory(DeviceMemory &) const { return false; }
    // What a device-to-device copy moves in GB/s (bytes read plus bytes written), timed on the backend's own scratch
    // the first time it is asked, between passes: the ceiling decoding's weight reads are quoted against. 0 where the
    // backend has no device memory.
    virtual double copy_rate_gbs() { return 0.0; }
    // What a copy from pinned host memory to the device moves in GB/s, timed once between passes into the backend's
    // own scratch: the bus a streamed prefill's bytes are quoted against. 0 where the backend has no device memory.
    virtual double upload_rate_gbs() { return 0.0; }
    // Both rates timed at start, before prepare(), on buffers of the backend's own that it frees after: what a
    // split model weighs its participants by (strata/split_plan.h) and auto's prefill cost prices a copy at
    // (strata/prefill_cost.h); measured on the first call, later calls give the same. {0, 0} where the backend has
    // no device memory.
    virtual std::pair<double, double> start_rates_gbs() { return {0.0, 0.0}; }
    // Makes the calling thread able to drive this backend (a split model's pipeline runs each part on a thread of its
    // own; the CUDA backend makes its device current).
    virtual void bind_thread() {}

    // ---- ops ----
    virtual void embed(const Weight &tok_embd, const int32_t *ids, Act out) = 0;
    // out = x / rms(x) * w over groups of w.ne[0] columns (a whole row, or each head for q/k norms).
    virtual void rms_norm(Act x, const Weight &w, float eps, Act out) = 0;
    virtual void matmul(const Weight &w, Act x, Act out) = 0;
    // Products of one input with several matrices (q, k and v; a GDN layer's input projections): each out = x W^T.
    // A backend may prepare x once for all of them; the default runs matmul for each, in order.
    struct MatmulOut {
        const Weight *w;
        Act out;
    };
    virtual void matmuls(Act x, const std::vector<MatmulOut> &outs) {
        for (const MatmulOut &o : outs) matmul(*o.w, x, o.out);
    }
    virtual void add(Act a, Act b, Act out) = 0;
    // The residual step between blocks: x += y, then out = rms_norm(x) with w. The default runs the two ops; a
    // backend may do it in one pass, with the same results.
    virtual void add_rms_norm(Act x, Act y, const Weight &w, float eps, Act out) {
        add(x, y, x);
        rms_norm(x, w, eps, out);
    }
    virtual void mul_sigmoid(Act x, Act gate) = 0;  // x *= sigmoid(gate), elementwise
    virtual void silu_mul(Act g, Act u) = 0;        // g = silu(g) * u, elementwise
    // dst row i = src row rows[i].
    virtual void gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) = 0;
    // src columns are pairs of `width`-wide blocks [a0 b0 a1 b1 ...]: a gets the first of each pair, b the second.
    virtual void deinterleave(Act src, int64_t width, Act a, Act b) = 0;
    // Rotates each head of x in place at its token's position.
    virtual void rope(Act x, const RopeParams &rp, const BatchInfo &b) = 0;
    // An attention layer's q and k in place: per-head RMSNorm (q_norm, k_norm: head_dim weights each), then rope.
    // The default runs rms_norm and rope on each; a backend may do it in fewer passes over the data.
    virtual void qk_norm_rope(Act q, Act k, const Weight &q_norm, const Weight &k_norm, float eps, const RopeParams &rp,
                              const BatchInfo &b) {
        rms_norm(q, q_norm, eps, q);
        rms_norm(k, k_norm, eps, k);
        rope(q, rp, b);
        rope(k, rp, b);
    }
    // qk_norm_rope, then (a backend may) k and v stored at their positions in layer il's cache as attention() stores
    // them first; the attention() call after it over the same k and v then does not store them again. The default
    // runs qk_norm_rope and leaves the stores to attention().
    virtual void qk_norm_rope_store(int64_t il, Act q, Act k, Act v, const Weight &q_norm, const Weight &k_norm,
                                    float eps, const RopeParams &rp, const BatchInfo &b) {
        (void)il, (void)v;
        qk_norm_rope(q, k, q_norm, k_norm, eps, rp, b);
    }
    // Stores k, v (rows per token, n_head_kv heads) at their positions in layer il's cache, then causal GQA
    // attention of q over each sequence's cache; out has n_head * head_dim columns.
    virtual void attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           float scale, const BatchInfo &b, Act out) = 0;
    // Gated DeltaNet core of layer il: causal conv (with the sequence's conv state) and SiLU over qkv, per-head L2
    // norms, the gated delta rule (with the sequence's recurrent state), gated RMSNorm with z. out: value_dim cols.
    virtual void gdn(int64_t il, const GdnWeights &w, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
                     const BatchInfo &b, Act out) = 0;

    // ---- MoE steps (the order and where experts come from: strata/moe_schedule.h) ----
    // Softmax over router logits, the top n_expert_used per token (ties to the lower id), renormalised and scaled:
    // ids and weights (logits.rows x k, rank order) in this backend's memory (alloc_i32, alloc).
    virtual void route_topk(Act logits, const MoeParams &p, int32_t *ids, float *weights) = 0;
    // A layer's routing: logits = x times the router matrix, then route_topk. The default runs the two ops; a backend
    // may do both in one pass, with the same results (logits included).
    virtual void route(const Weight &router, Act x, const MoeParams &p, Act logits, int32_t *ids, float *weights) {
        matmul(router, x, logits);
        route_topk(logits, p, ids, weights);
    }
    // route() for a layer whose experts w then run through experts_device_routed with these ids and nothing in
    // between writes them: a backend may make that call's tables from the routing in the same pass.
    virtual void route_for_device(const Weight &router, const ExpertWeights &w, Act x, const MoeParams &p, Act logits,
                                  int32_t *ids, float *weights) {
        (void)w;
        route(router, x, p, logits, ids, weights);
    }
    // add_rms_norm(resid, y, norm_w, eps, normed), then route_for_device over normed: a backend may do the residual
    // step in the routing's own pass, with the same results (resid, normed and the logits included).
    virtual void add_rms_norm_route(Act resid, Act y, const Weight &norm_w, float eps, Act normed, const Weight &router,
                                    const ExpertWeights &w, const MoeParams &p, Act logits, int32_t *ids,
                                    float *weights) {
        add_rms_norm(resid, y, norm_w, eps, normed);
        route_for_device(router, w, normed, p, logits, ids, weights);
    }
    // Benchmark routing (route_draws.h): ids = k distinct experts per token drawn for this pass at layer il instead
    // of route_topk's choice, weights the router's for them by these logits (router_weights, in the backend's own
    // arithmetic), ids in its order; both in this backend's memory. new_pass: the pass count goes up by one first
    // (a pass's first MoE layer); after reset_draws() the next new pass is pass 0. The default draws on the host
    // (the logits come back, a synchronisation); draws_on_device(): the backend draws without the host, the same
    // experts, and its pass count lives in its memory (a recorded pass replayed counts too).
    virtual void route_draws(Act logits, const MoeParams &p, const RouteDraws &d, int64_t il, bool new_pass,
                             int32_t *ids, Act weights);
    virtual void reset_draws() { draw_pass_ = -1; }
    virtual bool draws_on_device() const { return false; }
    // Where a backend that reads experts in place (experts_in_place()) reads expert e of a layer.
    virtual bool experts_in_place() const { return false; }
    virtual ExpertSrc expert_in_place(const ExpertWeights &w, int32_t e) const {
        fail("the %s backend reads experts from slots, not in place", name().c_str());
    }
    // Expert slots, the plan's memory for n_slots experts: where slot s holds layer w.il's expert, and copying
    // experts into slots from host memory. A fill is ordered after every expert_ffn issued before it that read the
    // slot, and before every expert_ffn issued after it (the protocol: the backend's own, e.g. cuda_slots.cpp).
    // ahead: the fills are made ahead of the compute that needs them (start-up, prefetch, a staging ring), so a
    // backend may run them beside its compute; otherwise the next expert_ffn reads them at once, and a backend
    // orders them with its compute directly.
    virtual ExpertSrc expert_slot(const ExpertWeights &w, int32_t slot) const {
        fail("the %s backend has no expert slots", name().c_str());
    }
    virtual void fill_slots(const ExpertWeights &w, const std::vector<SlotFill> &fills, bool ahead) {
        fail("the %s backend has no expert slots", name().c_str());
    }
    // These experts of a layer stay in these slots for good (slot_of[e]): a backend may then route decode-sized
    // passes over them without the host (experts_device_routed).
    virtual void set_resident_experts(const ExpertWeights &w, const std::vector<int32_t> &slot_of) {}
    // The experts' input rows of layer w.il, in scratch: row i = x row rows[i] (the pass's rows in expert order). A
    // backend may keep them in the form its expert kernels read instead (the CUDA backend: quantized once per
    // token, the int8 rows gathered, and no float rows at all); the Act returned is then only for expert_ffn of
    // the same layer, until the scratch is released. The default allocates and gathers them.
    virtual Act gather_expert_input(const ExpertWeights &w, Act x, const std::vector<int64_t> &rows) {
        (void)w;
        Act xs = alloc(int64_t(rows.size()), x.cols);
        gather_rows(x, rows, xs);
        return xs;
    }
    // A prompt loan (placement.h): the memory of these expert slots (one range of memory, the plan's loan allocation's
    // tail) serves as scratch, before the backend's own, from the next pass until end_loan(); the slot table has
    // taken those slots out of the cache. The backend orders the loan after every fill and read of those slots so
    // far, and the fills after end_loan() after every pass that used them. A backend without slot memory ignores
    // both.
    virtual void begin_loan(const std::vector<int32_t> &slots) { (void)slots; }
    virtual void end_loan() {}
    // How many times a pass's scratch outgrew what the plan gave (each time an allocation at run time).
    virtual uint64_t scratch_overflows() const { return 0; }
    // How many device allocations the backend has made since it was created (its planned memory at start included):
    // unchanged across a prompt or a decoding step on a backend whose passes take all they need from its plan.
    virtual uint64_t device_allocations() const { return 0; }
    // ys rows of each group = down(silu(gate(xs rows)) * up(xs rows)) with the group's expert. Every group's result
    // depends only on its rows and its expert's bytes.
    virtual void expert_ffn(const ExpertWeights &w, Act xs, const std::vector<ExpertGroup> &groups, Act ys) = 0;
    // The compute issued next waits for the fills of these groups' slots, as expert_ffn does first itself: a schedule
    // that times the wait (STRATA_PREFILL_TIMING, copy_wait) asks for it apart, between two marks.
    virtual void wait_slot_fills(const std::vector<ExpertGroup> &groups) { (void)groups; }
    // The routed experts of a pass of n_tokens straight from the device routing, without the host: where the
    // layer's experts are all resident (set_resident_experts) or mapped (maps_host_experts), the pass is
    // decode-sized and the kernels allow it. The same function as expert_ffn and moe_combine over the host's
    // grouping, bit for bit.
    virtual bool device_routing_applies(const ExpertWeights &w, int64_t n_tokens) const { return false; }
    // Mapped misses: the backend's kernels read layer w's experts that are in no slot in place from its pinned host
    // copy, over the bus, so decode-sized passes route on the device whatever the cache holds (the backend keeps
    // the table of where each expert is from its own fills and loans; nothing is filled for such a pass).
    virtual bool maps_host_experts(const ExpertWeights &w) const { return false; }
    // Where the device reads expert e of a mapped layer in place (an ExpertGroup's source for expert_ffn).
    virtual ExpertSrc mapped_expert(const ExpertWeights &w, int32_t e) const {
        fail("the %s backend does not map host experts", name().c_str());
    }
    // What mapped passes read so far: (token, expert) pairs served from slots and from the host copy, and the bytes
    // the latter crossed the bus with (may wait for the device).
    struct MappedReads {
        uint64_t from_slots = 0, from_host = 0, host_bytes = 0;
    };
    virtual MappedReads mapped_reads() const { return {}; }
    // The tail's steps follow (MoeTail), in that order.
    virtual void experts_device_routed(const ExpertWeights &w, Act x, int64_t k, const int32_t *ids,
                                       const float *weights, Act out, const MoeTail &tail) {
        fail("the %s backend does not route experts on the device", name().c_str());
    }
    // out[t] = sum over j < k of weights[widx[t k + j]] * ys[yrow[t k + j]], the entries added in the order given
    // (expert-id order), starting from zero; weights in this backend's memory.
    virtual void moe_combine(Act ys, const std::vector<int32_t> &yrow, const std::vector<int32_t> &widx,
                             const float *weights, int64_t k, Act out) = 0;
    // out[t] += sigmoid(gate . x[t]) * y[t] (gate: x.cols weights): the shared expert's gated contribution.
    virtual void shared_expert_add(Act x, const Weight &gate, Act y, Act out) = 0;
    // A MoeTail's steps as separate ops, after out holds the combination (x: the MoE layer's input).
    void moe_tail(Act x, Act out, const MoeTail &t) {
        if (t.shared_gate) shared_expert_add(x, *t.shared_gate, t.shared_y, out);
        if (t.then.w) add_rms_norm(t.then.resid, out, *t.then.w, t.then.eps, t.then.normed);
    }

    // ---- decode misses computed on the host (strata/decode_hybrid.h) ----
    // Whether expert_ffn computes each row of a group of n_rows rows of w exactly as expert_ffn_host
    // (backend/host/mmvq_host.h) does, so that the host may compute the group instead with the same bits.
    virtual bool host_computes_like(const ExpertWeights &w, int64_t n_rows) const { return false; }
    // Expert e's packed matrices in host memory: the backend's pinned host copy where it keeps one, else the file.
    virtual ExpertSrc expert_host_bytes(const ExpertWeights &w, int32_t e) const {
        return {w.gate->expert_host(e), w.up->expert_host(e), w.down->expert_host(e)};
    }
    // dst rows from host floats (packed), ordered after the ops issued before and before those issued after, without
    // waiting for the device where the backend can; `host` may be reused on return.
    virtual void upload_rows(const float *host, Act dst) { upload(host, dst); }
    // Rows the host writes after the call, handed to the device without the caller (decode's hybrid misses,
    // STRATA_DECODE_HANDOFF): rows_handoff(bytes) gives a buffer of at least `bytes` that the device reads in place
    // and a signal word with the ticket it will hold once the rows are written; handoff_rows(h, dst) queues, ordered
    // like upload_rows, the copy of h.host's packed rows into dst, which the device starts once the word holds the
    // ticket (stored with release by whoever writes the last of the rows: HostExperts). A buffer stays the
    // caller's until the copy is queued and the next rows_handoff. {} (host null) where the backend has none. Once a
    // copy is queued its ticket must be stored, or the device waits for ever.
    struct RowsHandoff {
        float *host = nullptr;
        uint32_t *signal = nullptr;
        uint32_t ticket = 0;
    };
    virtual RowsHandoff rows_handoff(size_t bytes) {
        (void)bytes;
        return {};
    }
    virtual void handoff_rows(const RowsHandoff &h, Act dst) {
        (void)h, (void)dst;
        fail("internal: the %s backend hands no rows over", name().c_str());
    }
    // Device timestamps: mark_device() stands for the point in the backend's stream where it is issued;
    // device_ms(a, b) is the device time between two marks, or a negative value while either is still ahead of the
    // device (never waits). 0 and -1 where the backend has no device.
    virtual uint64_t mark_device() { return 0; }
    virtual double device_ms(uint64_t a, uint64_t b) {
        (void)a, (void)b;
        return -1.0;
    }

  protected:
    int64_t draw_pass_ = -1;  // the default route_draws' pass count
    std::vector<std::vector<int32_t>> ids_kept_;  // the default ids_after_pass's buffers
};

// The rows to the host and the pick made there at once: right for backends whose download() does not defer.
inline void Backend::download_argmax(const Act &src, int32_t *host) {
    std::vector<float> rows(size_t(src.rows * src.cols));
    download(src, rows.data());
    for (int64_t r = 0; r < src.rows; r++) host[r] = argmax(rows.data() + r * src.cols, src.cols);
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace strata
