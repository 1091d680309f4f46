// The MoE schedule: a layer's MoE FFN as steps on the backend (backend.h "MoE steps"), and where each routed
// expert's bytes come from. Model code calls it through ExpertRunner (model/forward.h) and never sees it.
//
// Step protocol, per MoE layer and pass:
//   1. route: router logits and top-k on the backend (ids and weights stay in its memory);
//   2. where every expert of the layer is resident, or the backend maps the layer's misses (maps_host_experts: its
//      kernels read what no slot holds from its pinned host copy, over the bus; STRATA_DECODE_MAPPED=0 off), and the
//      pass is decode-sized, the backend runs the experts from the device routing without the host
//      (experts_device_routed; where the pass does not split, see Decode mode below): then on to 6. Nothing is
//      filled during the pass; under LFU the routing goes to the host within it (Backend::ids_after_pass, no wait)
//      and at the next pass's start the misses requested far more than the weakest slot are filled for later passes
//      (admit_after_alone_pass; opt-in, STRATA_DECODE_ADMIT_ALONE=1); otherwise the cache holds what prompts and loans
//      left;
//   1b. a benchmark's routing override draws on the backend (Backend::route_draws; on the device for the CUDA
//      backend, so step 2 still applies);
//   3. the routing ids are read back and the (token, expert) pairs grouped by expert on the host (RouteGroups; a
//      big pass's in token ranges on up to 8 threads, STRATA_GROUP_THREADS=N, the same result);
//   4. the rows are gathered in that order; experts come in sets of at most n_slots: the slot table names each
//      expert's slot and the fills for those not in one (the backend copies them in, ordered before the compute
//      that reads them and after the compute that read the slot before), a backend that reads experts in place
//      (the CPU) takes them from the file;
//   5. expert FFN over each set's groups, then each token's outputs summed in expert-id order (moe_combine);
//   6. the shared expert, gated, added. Its FFN goes first, right after the readback of step 3, where the pass is a
//      prompt's grouped on the host (STRATA_PREFILL_SHARED_FIRST, on; =0: after the combine) or decode-sized under
//      the decode overlap below: the device computes it while the host groups and the first fills copy.
// Streamed (STRATA_PREFILL_STREAM_AHEAD=N, default 16 for passes of more than 64 token-expert pairs; set, for every
// pass; 0: off; while there are misses): steps 4-5 become a pipeline. The layer's
// resident experts compute first, then the missing ones in order; before each batch computes, the fills of up to
// N missing experts beyond it are issued ahead (Backend::fill_slots with ahead: a copy stream), so copies run while
// earlier experts compute. The slot table keeps every expert acquired ahead until it has computed (acquire's
// keep_since); a backend orders each fill after the compute that read the slot before and each compute after the
// fills of the slots it reads.
// Schedules of a streamed pass (STRATA_PREFILL_SCHEDULE=routed|full|predicted|auto, default auto):
//   - routed: only the experts a layer's routing names are filled, once it has routed; the copy stream idles from a
//     layer's last fill to the next layer's routing (its combine, shared expert and mixer);
//   - full: after a layer's experts are issued, the next MoE layer's experts not in a slot are filled ahead in the id
//     order its streamed schedule takes its misses in, as many as the ring allows (STRATA_PREFILL_RING=N experts,
//     default a quarter of the slots), and pinned until that layer has routed, so the copy stream works through the
//     layer's end and the next mixer instead of waiting for the next routing. An expert filled so and then not
//     routed to costs its copy, nothing else;
//   - predicted: as full, but only the experts the next MoE layer's router, applied to this layer's input, gives a
//     token (its top-k, computed and read back with this layer's routing): for chunks whose routing reaches only
//     part of the experts, where full moves experts no token needs;
//   - auto: full where the layer's routing reached at least full_share() of its experts (the next layer is taken
//     to be alike; the line from the predicted schedule's measured recall, full_share_threshold below), predicted
//     otherwise (where the next router is as wide as this one; routed where not); once the cost model has measured
//     rates (prefill_cost.h, STRATA_PREFILL_COST), by each schedule's time from them instead. Measured on
//     the H200 at 12 GiB: full is 1.15-1.18x of routed on Next-80B's 4096- and 8192-token chunks (every expert
//     routed, 6% of them cached; predicted 0.94x of full at 16384), and 0.63-0.91x of routed on the 30B-A3B's 512-
//     and 4096-token chunks (68% of a layer's experts routed, 44% cached: the experts filled ahead and not routed
//     evicted cached ones, and 1.6x the bytes crossed the bus), where predicted is 1.28x / 1.05x of routed (92% of
//     the experts it filled ahead were then routed to; bench/RESULTS.md, eleventh round).
// Scan fence (STRATA_PREFILL_SCAN_FENCE, on; =0 off): each layer fences the slot table as it starts, so the fills of
// a sweep take slots of earlier layers, whose compute is done, and the copy stream does not wait for the compute of
// the layer whose experts it is replacing (the full schedule's fills for the next layer waited for this layer's).
// Next-layer prefetch (STRATA_DECODE_PREFETCH=1, opt-in until measured; decode-sized passes): after a layer's
// experts, the next MoE layer's router is applied to this layer's input and its top-k taken as the prediction of the
// next layer's routing; the predicted experts not in a slot are filled ahead (the copies run during the shared
// expert and the next layer's mixer) and pinned until that layer has routed. How often the prediction is right is
// counted (PrefetchStats) on every backend, slots or not.
// Prompt favourites (STRATA_PROMPT_FAVOURITES, on; =0 off): every prompt pass of more than k_hybrid_max_tokens
// tokens grouped on the host adds its rows per expert to the slot table's decayed scores, and the first decode-sized
// pass after it starts by turning the cache toward the best-scored experts (ExpertSlotTable::keep_favourites; fills on
// the copy stream): a decode whose passes the device runs alone fills nothing, and the cache a prompt's passes leave
// is an arbitrary one. At most a pass's worth of experts (the MoE layers times k) is filled a pass, the best first,
// and the next decode-sized passes go on where it stopped: a pass that routes on the device waits for every fill
// issued before it, so a whole cache turned at once would hold the first decoded token back (up to ~0.1 s at 12 GiB
// of Next-80B). A prompt loan's slots are then given back empty (the favourites fill them first), whatever
// STRATA_LOAN_REFILL says.
// The results depend only on the routing and the experts' bytes: not on the set sizes, the slots, or the source.
// Decode overlap (STRATA_DECODE_OVERLAP, on; =0 the order before it; passes of at most k_hybrid_max_tokens): the
// input rows the hybrid split needs come back with the routing (one wait for the device, not two); the shared
// expert's FFN is queued right after the readback, so the device computes it while the host splits, groups and
// computes its misses; the host's threads start on its misses before the device's part is issued (this thread
// joins them after issuing it, or, with the handoff, only before the pool's next use: STRATA_DECODE_HANDOFF=1,
// opt-in until measured on a GPU, where the pool ends a call without this thread, writes the host's rows where the
// device reads them, and the device's copy of them, queued after its part, starts when the pool's last piece stores
// the signal (Backend::rows_handoff), so the layer's combine and the next layer's kernels are issued while the host
// computes; off: the rows uploaded after the join, everything after them issued then); the fills of the layer's
// misses go on the copy stream (Backend::fill_slots ahead), beside the shared expert's kernels, where the layer has
// one (STRATA_DECODE_COPY_STREAM=0: on the compute stream). Its gate and add come after the combine as always.
// Early fills (STRATA_DECODE_EARLY_FILLS=1, opt-in until measured on a GPU; with the overlap, in a split pass grouped
// on the host): the host's part starts and the device's experts are acquired and their fills issued right after the
// grouping, and the shared expert's kernels after those, so the host's threads and the copies start before this
// thread has issued the shared expert's launches and the gather (the same slots, so the same bits).
// Decode mode (STRATA_DECODE_CHOOSE, on; decode_mode.h): where the split exists and the layers are mapped, each
// decode-sized pass runs either alone (step 2: the device reads its misses in place, nothing read back, graphs
// replay; nothing is filled during it, under LFU its admissions after it, step 2) or split (the host computes some
// misses, the device copies the rest into slots as every miss was before mapped reads), chosen at the pass's start
// (start_pass) by the measured time of earlier passes of its size. =0: split wherever the split exists. With the
// split off (--cpu-share 0, STRATA_DECODE_CPU=0) every such pass runs alone.
// The split's device part reads its misses in place instead (STRATA_DECODE_SPLIT_MAPPED=1, off: the ninth round's
// default, which lost to copying on both files in the tenth round's call). Then admission (STRATA_DECODE_ADMIT, on;
// under --expert-cache-policy lfu or next, the policies with counts to judge by) fills such a miss whose requests are
// above twice those of the slot LFU would give up (next: whose expected wait is shorter than that slot's), on the
// copy stream after the layer's compute, for later passes (ExpertSlotTable::admit). Hybrid misses (decode_hybrid.h, on
// where the backend computes experts like the host, STRATA_DECODE_CPU=0 off; passes of at most k_hybrid_max_tokens
// tokens with misses): some of the misses the backend could compute exactly as the host does are computed on the host
// instead. Their rows come last in the gathered order (group_by_expert's `last`), so their outputs go up as one block
// of rows; the combine adds every token's entries in expert-id order as always.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/threads.h"
#include "model/forward.h"
#include "strata/decode_hybrid.h"
#include "strata/decode_mode.h"
#include "strata/expert_slots.h"
#include "strata/pass_timing.h"
#include "strata/prefill_cost.h"
#include "strata/route_override.h"

namespace strata {

// A layer's routing grouped by expert: rows of the gathered input sorted by expert (tokens in order within one),
// and for each token its k entries in expert-id order (the order the reference adds them in).
struct RouteGroups {
    std::vector<int32_t> used;          // experts with at least one row, ascending
    std::vector<int32_t> first, count;  // per expert: first gathered row, rows
    std::vector<int64_t> src_row;       // gathered row r = input row src_row[r]
    std::vector<int32_t> yrow, widx;    // per token t, j < k: gathered row and routing entry, by expert id
    std::vector<int32_t> entry_, next_, part_count_, part_base_;  // the grouping's scratch, kept with its capacity
};
// `last` (ascending expert ids): experts whose rows come after every other expert's, in that order. A token's k ids
// are distinct (top-k): a token reaches an expert once. The second form reuses g's memory (a prompt pass groups up
// to hundreds of thousands of pairs a layer) and, given a pool, spreads passes of at least 2 k_group_part_pairs
// pairs over its threads in token ranges: the same result.
constexpr int64_t k_group_part_pairs = 16384;
RouteGroups group_by_expert(const std::vector<int32_t> &ids, int64_t n_tokens, int64_t k, int64_t n_expert,
                            const std::vector<int32_t> &last = {});
void group_by_expert(const std::vector<int32_t> &ids, int64_t n_tokens, int64_t k, int64_t n_expert,
                     const std::vector<int32_t> &last, RouteGroups &g, ThreadPool *pool);

// Sees each MoE layer's routing as the schedule runs it, in host memory: the k expert ids of each token of the pass
// in the router's order and the weights the combine applies (the routing-trace writer, runtime/routing_trace.h).
class RoutingObserver {
  public:
    virtual ~RoutingObserver() = default;
    virtual void routed(int64_t il, int64_t n_tokens, int64_t k, const int32_t *ids, const float *weights) = 0;
};

// How the next-layer prediction did: routed (token, expert) picks of layers that had a prediction, how many of them
// were predicted, and the experts filled ahead because of it.
struct PrefetchStats {
    uint64_t picks = 0, predicted = 0, prefetched = 0;
    uint64_t streamed_next = 0;  // experts filled ahead of their layer's routing by the full schedule (prefill)
    uint64_t streamed_next_used = 0;  // of those, the ones their layer's routing then reached
    // Layers the predicted schedule filled ahead for: their routed experts that had no slot before, filled ahead
    // (predicted) or not (missed): the prediction's recall, which sets auto's line (full_share_threshold).
    uint64_t recall_predicted = 0, recall_missed = 0;
    // Layers whose fills ahead auto chose by the measured rates (prefill_cost.h): full or predicted.
    uint64_t cost_full = 0, cost_predicted = 0;
};

enum class PrefillSchedule { Routed, Full, Auto, Predicted };
// Auto's line: full where a layer's routing reached at least this share of its experts, predicted below it, from a
// cost in the bus's time with the prediction's measured recall q (the share of a layer's routed experts without a slot
// that the predicted schedule filled ahead). For a layer whose routing reaches a share r of its experts, full moves
// every missing expert of the next layer, and each one no token needs evicts a cached expert that a later layer
// needs in a share r of cases: 1 + r(1 - r) (in units of the next layer's missing experts); predicted moves the r
// routed, of which (1 - q) r only after the routing, when the copy stream waits for them and the compute for it: r
// (2 - q). Full where 1 + r - r^2 < r (2 - q), that is r above the positive root of r^2 + (1 - q) r - 1: 0.95 at q
// = 0.9, 0.96 at 0.92 (the 30B-A3B's measured precision, eleventh round), 0.90 at 0.8, 0.78 at 0.5, 1 (never) at 1.
// Both files measured so far sit far from it (the 30B-A3B's chunks route 68% of the experts: predicted won; Next-80B
// 100%: full won). STRATA_PREFILL_FULL_SHARE=x fixes the line instead (0.9: the constant before).
double full_share_threshold(double recall);
constexpr double k_recall_prior = 0.9;    // the recall assumed before any is measured,
constexpr double k_recall_prior_n = 32;  // weighted as this many experts
// STRATA_PREFILL_SCHEDULE: "routed", "full", "auto" or "predicted" (unset: auto; throws strata::Error naming the
// choices).
PrefillSchedule prefill_schedule_from_env();

class MoeSchedule final : public ExpertRunner {
  public:
    // experts: per layer index, the layer's routed tensors; routers: per layer index, its router (nullptr: none);
    // slots: the device's slot table (nullptr for a backend that reads experts in place).
    MoeSchedule(Backend &be, std::vector<ExpertWeights> experts, std::vector<const Weight *> routers,
                ExpertSlotTable *slots, const HybridOptions &hybrid = {});
    ~MoeSchedule() override;
    const PrefetchStats &prefetch_stats() const { return prefetch_; }
    // The bus rate auto's cost model prices a copy at (prefill_cost.h; 0: the recall's line alone).
    void set_bus_rate(double gbs) { cost_.set_bus_rate(gbs); }
    // STRATA_PREFILL_TIMING=1 / STRATA_DECODE_TIMING=1: prompt or decode-sized passes' time by layer and phase
    // (pass_timing.h); settles what it can first.
    const std::vector<LayerTiming> &timing(TimingKind kind = TimingKind::Prompt) {
        PassTiming &t = kind == TimingKind::Prompt ? timing_ : decode_timing_;
        t.settle();
        return t.layers();
    }
    // The hybrid misses' figures (nullptr: the split is off or does not apply to this backend and plan).
    const HybridStats *hybrid_stats() {
        settle_host();
        return hybrid_ ? &hybrid_->stats() : nullptr;
    }
    int hybrid_threads() const { return hybrid_ ? hybrid_->threads() : 0; }
    bool hybrid_pinned() const { return hybrid_ && hybrid_->pinned(); }
    void run(int64_t il, const LayerWeights &L, Act x, const MoeParams &p, Act out, const ResidualNorm *then,
             const ResidualAdd *before = nullptr) override;
    // The routing of every later layer goes to o as well (nullptr: to no one). Reading it back costs a host
    // synchronisation per layer where the routing would otherwise stay on the device; the results do not change.
    void set_observer(RoutingObserver *o) { observer_ = o; }
    // Later layers route by o's draws instead of the router's choice (benchmarks; o.kind == Model: the router). The
    // draws' passes count from here, so the same calls after the same override draw the same experts.
    void set_route_override(const RouteOverride &o) {
        override_ = o;
        last_layer_ = -1;
        be_.reset_draws();
    }
    // Chooses this pass's decode mode (decode_mode.h) where both apply.
    void start_pass(int64_t n_tokens, bool traced) override;
    void pass_replayed() override { replayed_ = true; }
    bool reads_back() const override {
        return observer_ != nullptr || (override_.active() && !be_.draws_on_device()) || prefetch_on_ ||
               (hybrid_ != nullptr && split_pass_);  // the split reads the routing back in decode-sized passes
    }
    // Nothing between decoding passes: every expert resident (no admission after a pass), no drawn routing.
    bool runs_ahead() const override {
        return !reads_back() && !override_.active() && (!slots_ || slots_->all_resident());
    }
    // Decode-sized passes run alone or split while both applied (STRATA_DECODE_CHOOSE).
    const DecodeModeStats &decode_modes() const { return chooser_.stats(); }
    // Unpins what was filled ahead for a layer not yet run (a pass that threw leaves such pins behind).
    void release_pins();
    // Per layer index, each expert's rows in the last prefill-sized pass that grouped on the host (empty: none yet).
    const std::vector<std::vector<int32_t>> &last_rows() const { return last_rows_; }
    // Misses the host-grouped path read in place (the hybrid split's device part where the layer is mapped), and
    // their bytes; the device-routed path's are the backend's (Backend::mapped_reads).
    uint64_t mapped_misses() const { return mapped_misses_; }
    uint64_t mapped_bytes() const { return mapped_bytes_; }
    uint64_t admitted() const { return admitted_; }  // mapped misses filled for later passes (ExpertSlotTable::admit)
    // Prompt favourites (STRATA_PROMPT_FAVOURITES, on where the cache is partial; the protocol above): whether on, and
    // the experts filled for them since start.
    bool favourites_on() const { return favourites_; }
    uint64_t favourite_fills() const { return favourite_fills_; }

  private:
    // Step 4-5 for one layer: the experts `used` (ascending, each with rows in `g`), in sets the slot table can hold.
    // fills_ahead: the fills go on the backend's copy stream (Backend::fill_slots).
    // mapped: the misses are read in place (Backend::mapped_expert), not filled.
    // acquired: the slots early_fills took for `used` (nullptr: acquired and filled here).
    void routed_experts(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &used,
                        int64_t n_expert, Act xs, Act ys, bool fills_ahead = false, bool mapped = false,
                        const std::vector<int32_t> *acquired = nullptr);
    // Whether a layer of n_slots slots (its class's) and `pairs` routed pairs takes the streamed schedule where some
    // of its experts miss (streamed_experts).
    bool may_stream(int64_t n_slots, int64_t pairs) const;
    // A split layer's device experts acquired and their fills issued ahead of the shared expert and the gather
    // (STRATA_DECODE_EARLY_FILLS), into early_slots_, where routed_experts would take them in one set without
    // streaming; false: left to routed_experts.
    bool early_fills(const ExpertWeights &w, const std::vector<int32_t> &dev, int64_t n_expert, int64_t pairs,
                     bool fills_ahead);
    // The same, streamed (see the protocol above); false where it does not apply (nothing missing, too few slots).
    bool streamed_experts(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &used,
                          int64_t n_expert, Act xs, Act ys);
    // The hybrid split: the misses the host takes for this layer (ascending; empty: none).
    std::vector<int32_t> host_experts(const ExpertWeights &w, const std::vector<int32_t> &ids, int64_t n_expert);
    // Steps 4-5 with `host`'s experts on the host (their rows last in g; the pass's input rows, E floats each, in
    // host_x_): host_part lays the host's part out and, with the overlap, starts it (before the device's gather);
    // hybrid_experts issues the device's part, ends tm's experts phase (where given), then hands the host's rows over
    // or joins the host and uploads them (without the overlap: computes them first).
    // dev_misses: the device's misses beside the host's part; dev: the device's experts.
    void host_part(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &host, int64_t E,
                   int64_t dev_misses);
    void hybrid_experts(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &dev, int64_t n_expert,
                        Act xs, Act ys, bool fills_ahead, bool mapped, PassTiming *tm,
                        const std::vector<int32_t> *acquired);
    // The shared expert's FFN of x into sy (its gate and the add are the caller's).
    void shared_ffn(const LayerWeights &L, Act x, Act sy);
    // Next-layer prefetch: scores the prediction made for layer il, then predicts (and prefetches) the next one.
    void score_prediction(int64_t il, const std::vector<int32_t> &ids, int64_t T, int64_t k);
    void predict_next(int64_t il, Act x, const MoeParams &p);
    // The full schedule: the next MoE layer's missing experts filled ahead after layer il's (T tokens of top-k;
    // share: of layer il's experts, those its routing reached).
    void stream_next(int64_t il, int64_t T, int64_t k, double share);
    // The slot table's fills made by the backend (ahead: Backend::fill_slots'); where that throws, the slot table
    // forgets them before the error goes on.
    void fill(const ExpertWeights &w, const std::vector<SlotFill> &fills, bool ahead);
    // Layer il's `experts` (none in a slot) acquired, filled on the copy stream and pinned (their slots into
    // `pinned`); the number of fills. scan: the eviction for a pass that sweeps the layers (ExpertSlotTable).
    uint64_t fill_ahead_pinned(int64_t il, const std::vector<int32_t> &experts, std::vector<int32_t> &pinned,
                               bool scan);

    Backend &be_;
    std::vector<ExpertWeights> experts_;
    std::vector<const Weight *> routers_;
    ExpertSlotTable *slots_;
    bool scan_evict_;
    bool scan_fence_;  // STRATA_PREFILL_SCAN_FENCE: each layer fences the slot table (expert_slots.h)
    int64_t stream_ahead_;   // STRATA_PREFILL_STREAM_AHEAD: missing experts filled ahead (0: not streamed)
    bool stream_ahead_set_;  // given: every pass streams; unset: prefill-sized passes only
    RoutingObserver *observer_ = nullptr;
    RouteOverride override_;
    int64_t last_layer_ = -1;              // the override's last layer: a pass starts where il does not rise
    bool prefetch_on_;                     // STRATA_DECODE_PREFETCH
    int64_t pred_layer_ = -1;              // the layer the prediction is for (-1: none)
    std::vector<int32_t> pred_ids_;        // its predicted top-k per token
    std::vector<int32_t> pinned_;          // slots pinned for it
    PrefillSchedule schedule_;             // STRATA_PREFILL_SCHEDULE
    double last_share_ = 0.0;  // the last layer grouped on the host: its routed experts over its experts (auto)
    int64_t ring_;                         // STRATA_PREFILL_RING: next-layer experts filled ahead (-1: default)
    std::vector<int32_t> next_pinned_;     // slots filled ahead for the next layer, pinned until it routes
    std::vector<int32_t> next_ahead_;      // the experts filled so (for streamed_next_used)
    bool next_ahead_predicted_ = false;    // by the predicted schedule (for its recall)
    double fixed_full_share_ = -1.0;       // STRATA_PREFILL_FULL_SHARE (< 0: from the recall)
    double full_share() const;             // auto's line from the recall so far
    double recall() const;                 // the prediction's recall so far (k_recall_prior before any)
    // Auto's choice for layer nl's fills ahead, this layer's routing having reached a share of its experts: full
    // (true) or predicted, by the cost model where it has measured rates, else the recall's line; count: into
    // prefetch_'s cost_full / cost_predicted.
    bool auto_full(int64_t nl, int64_t T, double share, bool count);
    PrefillCost cost_;
    double line_ = 1.0;                    // auto's line for this pass (full_share() at its start)
    int64_t next_ahead_layer_ = -1;        // their layer
    std::vector<int32_t> pred_next_ids_;   // the predicted schedule: the next MoE layer's top-k for this pass
    int64_t pred_next_layer_ = -1;         // that layer (-1: no prediction)
    int64_t next_moe_layer(int64_t il) const;  // the next layer with routed experts and a router (-1: none)
    PrefetchStats prefetch_;
    PassTiming timing_, decode_timing_;
    PassTiming *layer_timing_ = nullptr;  // the layer's timing, where on (run() sets it for its layer)
    bool decode_overlap_;    // STRATA_DECODE_OVERLAP
    bool handoff_;           // STRATA_DECODE_HANDOFF: the host's rows started by the pool's signal
    bool early_fills_;       // STRATA_DECODE_EARLY_FILLS: a split layer's fills before the shared expert
    std::vector<int32_t> early_slots_;  // the slots early_fills took
    bool host_pending_ = false;  // the host's part of a split layer started and not joined yet
    void settle_host();          // joins it
    bool slot_fills_ahead_;  // STRATA_DECODE_COPY_STREAM: decode's fills beside the shared expert
    bool shared_first_;      // STRATA_PREFILL_SHARED_FIRST: a prompt pass's shared expert before its routed experts
    std::unique_ptr<DecodeHybrid> hybrid_;  // nullptr: every miss copied in
    std::vector<float> host_x_, host_xs_, host_ys_;
    std::vector<HostExpertJob> host_jobs_;  // the host's part of the layer (its threads may still be on it)
    int64_t host_r0_ = 0, host_dev_misses_ = 0;  // its first row; the device's misses beside it
    uint64_t host_bytes_ = 0;                    // its experts' bytes
    Backend::RowsHandoff handoff_rows_;          // its rows' handoff ({}: uploaded after the join)
    RouteGroups groups_;  // the layer's grouping, its memory kept from layer to layer
    std::unique_ptr<ThreadPool> group_pool_;  // for big passes' grouping (made on the first)
    static constexpr int k_group_threads = 8;
    ThreadPool *group_pool(int64_t pairs);  // nullptr: group on this thread
    std::vector<std::vector<int32_t>> last_rows_;
    uint64_t mapped_misses_ = 0, mapped_bytes_ = 0, admitted_ = 0;
    bool admit_;  // STRATA_DECODE_ADMIT
    // Admission after passes by the device alone (STRATA_DECODE_ADMIT_ALONE): each mapped layer's routing copied to
    // the host during the pass (Backend::ids_after_pass), judged at the next pass's start. Per pass size, the layers
    // of the last such pass run here (a replay runs none of this code and refreshes the same buffers).
    struct AloneIds {
        int64_t il, n;
        const int32_t *ids;
    };
    bool admit_alone_;
    bool ran_layers_ = false;        // run() ran for the current pass
    bool replayed_ = false;          // the current pass was replayed whole (pass_replayed)
    int64_t pass_tokens_ = -1;       // the current pass's size
    std::vector<AloneIds> alone_;    // the current pass's
    std::vector<std::vector<AloneIds>> alone_by_size_;  // [pass size]: the last direct pass of that size's
    void admit_after_alone_pass();
    bool favourites_ = false;  // STRATA_PROMPT_FAVOURITES
    uint64_t favourite_fills_ = 0;
    int64_t pass_k_ = 8;  // the last pass's experts per token (k), for the favourites' fills a pass
    void keep_favourites();
    // A slot gives way to an expert in no slot only where that one's prompt score is above this many times its own:
    // the admission search on the demo model's traces found 1.5 best (bench/RESULTS.md, twentieth round).
    static constexpr double k_favourite_factor = 1.5;
    bool choose_;             // STRATA_DECODE_CHOOSE: alone or split by measured time (decode_mode.h)
    bool split_mapped_;       // STRATA_DECODE_SPLIT_MAPPED: the split's device part reads its misses in place
    bool split_pass_ = true;  // this pass may split (start_pass)
    DecodeModeChooser chooser_;
    static constexpr double k_admit_factor = 2.0;
};

}  // namespace strata
