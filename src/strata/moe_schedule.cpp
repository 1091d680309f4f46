// The MoE schedule (protocol in moe_schedule.h): routing, grouping, expert sets through the slot table, combine and
// the shared expert, as steps on the backend.
#include "strata/moe_schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "core/env.h"
#include "core/error.h"

namespace strata {

namespace {

// A named profiling region of the backend for the lifetime of the scope.
struct Region {
    Backend &be;
    Region(Backend &b, const char *name) : be(b) { be.region_begin(name); }
    ~Region() { be.region_end(); }
    Region(const Region &) = delete;
    Region &operator=(const Region &) = delete;
};

}  // namespace

void group_by_expert(const std::vector<int32_t> &ids, int64_t T, int64_t k, int64_t n_exp,
                     const std::vector<int32_t> &last, RouteGroups &g, ThreadPool *pool) {
    STRATA_ASSERT(int64_t(ids.size()) == T * k && k >= 1 && k < (int64_t(1) << 31));
    const int64_t M = T * k;
    // Parts: contiguous token ranges, one per thread (one where there is no pool or few pairs). Each part counts its
    // pairs per expert; an expert's rows are then part 0's tokens, then part 1's, ..., so in token order whatever
    // the parts, and each part places its own rows and fills in its own tokens' entries: the same result as one.
    const int64_t parts =
        pool && M >= 2 * k_group_part_pairs ? std::clamp<int64_t>(M / k_group_part_pairs, 1, pool->size()) : 1;
    auto token_range = [&](int64_t part, int64_t &t0, int64_t &t1) {
        t0 = T * part / parts;
        t1 = T * (part + 1) / parts;
    };
    std::vector<int32_t> &cnt = g.part_count_;  // [part][expert]
    cnt.assign(size_t(parts * n_exp), 0);
    auto in_parts = [&](const std::function<void(int64_t)> &fn) {
        if (parts == 1) {
            fn(0);
            return;
        }
        pool->run([&](int ith, int nth) {
            for (int64_t part = ith; part < parts; part += nth) fn(part);
        });
    };
    in_parts([&](int64_t part) {
        int64_t t0, t1;
        token_range(part, t0, t1);
        int32_t *c = cnt.data() + part * n_exp;
        for (int64_t i = t0 * k; i < t1 * k; i++) {
            const int32_t e = ids[size_t(i)];
            STRATA_ASSERT(e >= 0 && e < n_exp);  // a pool's run() rethrows it here
            c[e]++;
        }
    });
    g.used.clear();
    g.count.assign(size_t(n_exp), 0);
    g.first.assign(size_t(n_exp), 0);
    for (int64_t part = 0; part < parts; part++)
        for (int64_t e = 0; e < n_exp; e++) g.count[size_t(e)] += cnt[size_t(part * n_exp + e)];
    // first[]: last's experts after every other one
    int32_t off = 0;
    size_t li = 0;
    for (int32_t e = 0; e < n_exp; e++) {
        if (g.count[size_t(e)]) g.used.push_back(e);
        if (li < last.size() && last[li] == e) {
            li++;
            continue;
        }
        g.first[size_t(e)] = off;
        off += g.count[size_t(e)];
    }
    STRATA_ASSERT(li == last.size());  // ascending, each an expert id
    for (int32_t e : last) {
        g.first[size_t(e)] = off;
        off += g.count[size_t(e)];
    }
    // each part's first row of each expert, in place of its count
    std::vector<int32_t> &base = g.part_base_;
    base.resize(size_t(parts * n_exp));
    for (int64_t e = 0; e < n_exp; e++) {
        int32_t at = g.first[size_t(e)];
        for (int64_t part = 0; part < parts; part++) {
            base[size_t(part * n_exp + e)] = at;
            at += cnt[size_t(part * n_exp + e)];
        }
    }
    g.src_row.resize(size_t(M));
    g.yrow.resize(size_t(M));
    g.widx.resize(size_t(M));
    g.entry_.resize(size_t(M));
    g.next_.assign(size_t(T), 0);
    // Rows placed in token order, each row's routing entry kept; then the experts in id order hand each of the
    // part's tokens its next entry, which gives every token its k entries by expert id without sorting.
    in_parts([&](int64_t part) {
        int64_t t0, t1;
        token_range(part, t0, t1);
        const int32_t *b = base.data() + part * n_exp;
        int32_t *cursor = cnt.data() + part * n_exp;  // the part's counts, turned into its cursors
        for (int64_t e = 0; e < n_exp; e++) cursor[e] = b[e];
        for (int64_t t = t0; t < t1; t++)
            for (int64_t j = 0; j < k; j++) {
                const int32_t r = cursor[ids[size_t(t * k + j)]]++;
                g.src_row[size_t(r)] = t;
                g.entry_[size_t(r)] = int32_t(t * k + j);
            }
        for (int32_t e : g.used) {
            const int32_t r0 = b[e], r1 = cursor[e];
            for (int32_t r = r0; r < r1; r++) {
                const int64_t t = g.src_row[size_t(r)];
                const int64_t at = t * k + g.next_[size_t(t)]++;
                g.yrow[size_t(at)] = r;
                g.widx[size_t(at)] = g.entry_[size_t(r)];
            }
        }
    });
}

RouteGroups group_by_expert(const std::vector<int32_t> &ids, int64_t T, int64_t k, int64_t n_exp,
                            const std::vector<int32_t> &last) {
    RouteGroups g;
    group_by_expert(ids, T, k, n_exp, last, g, nullptr);
    return g;
}

// STRATA_GROUP_THREADS=N: the threads a big pass's grouping takes (unset: the cores, at most 8; 0 or 1: this one).
ThreadPool *MoeSchedule::group_pool(int64_t pairs) {
    static const int64_t asked = env_count("STRATA_GROUP_THREADS", -1);
    const int64_t n = asked >= 0 ? asked : std::min(k_group_threads, physical_cores());
    if (pairs < 2 * k_group_part_pairs || n < 2) return nullptr;
    if (!group_pool_) group_pool_ = std::make_unique<ThreadPool>(int(std::min<int64_t>(n, 64)));
    return group_pool_.get();
}

PrefillSchedule prefill_schedule_from_env() {
    const char *e = std::getenv("STRATA_PREFILL_SCHEDULE");
    if (!e || !*e || std::strcmp(e, "auto") == 0) return PrefillSchedule::Auto;
    if (std::strcmp(e, "routed") == 0 || std::strcmp(e, "0") == 0) return PrefillSchedule::Routed;
    if (std::strcmp(e, "full") == 0) return PrefillSchedule::Full;
    if (std::strcmp(e, "predicted") == 0) return PrefillSchedule::Predicted;
    fail("STRATA_PREFILL_SCHEDULE=%s: expected routed, full, auto or predicted", e);
}

// The passes the streamed schedule leaves alone unless its switch is set (decode-sized: up to 8 tokens of top-8).
constexpr int64_t k_decode_max_pairs = 64;

MoeSchedule::MoeSchedule(Backend &be, std::vector<ExpertWeights> experts, std::vector<const Weight *> routers,
                         ExpertSlotTable *slots, const HybridOptions &hybrid)
    : be_(be),
      experts_(std::move(experts)),
      routers_(std::move(routers)),
      slots_(slots),
      cost_(be),
      timing_(be, TimingKind::Prompt),
      decode_timing_(be, TimingKind::Decode) {
    STRATA_ASSERT(slots_ || be_.experts_in_place());
    // STRATA_CUDA_SCAN_EVICT=0 keeps least-recently-used eviction for chunks that sweep most experts.
    scan_evict_ = env_switch("STRATA_CUDA_SCAN_EVICT", true);
    // STRATA_PREFILL_SCAN_FENCE=0: a scan's victims may be slots the current layer reads (expert_slots.h); on:
    // 1.11x on Next-80B's pp4096 at 12 GiB (bench/RESULTS.md, seventh round).
    scan_fence_ = env_switch("STRATA_PREFILL_SCAN_FENCE", true);
    // Unset: 16 ahead for prefill-sized passes (measured on the H200, bench/RESULTS.md), decode as before; set: N
    // ahead for every pass (0: off).
    stream_ahead_set_ = std::getenv("STRATA_PREFILL_STREAM_AHEAD") != nullptr;
    stream_ahead_ = prefill_stream_ahead();
    prefetch_on_ = env_switch("STRATA_DECODE_PREFETCH", false);
    schedule_ = prefill_schedule_from_env();
    ring_ = env_count("STRATA_PREFILL_RING", -1);
    // STRATA_DECODE_OVERLAP=0: decode-sized passes read x back apart from the routing, queue the shared expert
    // after the experts, and fill slots on the compute stream (the order before it).
    decode_overlap_ = env_switch("STRATA_DECODE_OVERLAP", true);
    // STRATA_DECODE_HANDOFF=1 (opt-in until measured on a GPU): with the overlap on, the device starts the copy of
    // the host's rows at the pool's signal, the layer's later kernels issued meanwhile, instead of the rows going up
    // after this thread joins the pool and the rest of the layer issued after that.
    handoff_ = decode_overlap_ && env_switch("STRATA_DECODE_HANDOFF", false);
    // STRATA_DECODE_EARLY_FILLS=1 (opt-in until measured on a GPU): with the overlap on, a split layer issues the
    // host's part and the device's fills before the shared expert's kernels and the gather, instead of after them.
    early_fills_ = decode_overlap_ && env_switch("STRATA_DECODE_EARLY_FILLS", false);
    // STRATA_DECODE_COPY_STREAM=0: with the overlap on, decode's fills stay on the compute stream.
    slot_fills_ahead_ = decode_overlap_ && env_switch("STRATA_DECODE_COPY_STREAM", true);
    // STRATA_PREFILL_SHARED_FIRST=0: a prompt pass queues its shared expert after the routed experts' combine.
    shared_first_ = env_switch("STRATA_PREFILL_SHARED_FIRST", true);
    // STRATA_DECODE_ADMIT=0: mapped misses never enter the cache (it holds what the prompts left).
    admit_ = env_switch("STRATA_DECODE_ADMIT", true);
    // Opt-in: on the 30B-A3B at 12 GiB under zipf:1.0 and LFU it held the hit rate (86.8% against 86.4%) and cost
    // decoding speed (94.6 against 108.9 tok/s; bench/RESULTS.md, eighteenth round): the next pass waits for its fills.
    admit_alone_ = admit_ && env_switch("STRATA_DECODE_ADMIT_ALONE", false);
    // STRATA_PROMPT_FAVOURITES=0: decoding starts on the cache the prompt's passes left (and a loan's slots refilled
    // as STRATA_LOAN_REFILL says).
    favourites_ = slots_ && !slots_->all_resident() && env_switch("STRATA_PROMPT_FAVOURITES", true);
    if (const char *e = std::getenv("STRATA_PREFILL_FULL_SHARE"); e && *e) {
        char *end = nullptr;
        const double v = std::strtod(e, &end);
        if (*end != '\0' || !(v >= 0.0 && v <= 1.0))
            fail("STRATA_PREFILL_FULL_SHARE=%s: expected a share of a layer's experts from 0 to 1", e);
        fixed_full_share_ = v;
    }
    line_ = full_share();
    alone_by_size_.resize(65);  // decode-sized passes: the device routes up to a few tokens
    // STRATA_DECODE_CHOOSE=0: where the split exists it takes every decode-sized pass, mapped layers or not.
    choose_ = env_switch("STRATA_DECODE_CHOOSE", true);
    // STRATA_DECODE_SPLIT_MAPPED=1: the split's device part reads its misses from the host copy in place (the ninth
    // round's default) instead of copying them into slots; off, it lost on both files in the tenth round's call.
    split_mapped_ = env_switch("STRATA_DECODE_SPLIT_MAPPED", false);
    routers_.resize(experts_.size(), nullptr);
    // The split needs misses (a partial cache) and a backend that computes experts as the host does.
    bool host_like = false;
    for (const ExpertWeights &w : experts_) host_like = host_like || (w.present() && be_.host_computes_like(w, 1));
    if (hybrid.on && hybrid.share != 0.0 && slots_ && !slots_->all_resident() && host_like)
        hybrid_ = std::make_unique<DecodeHybrid>(be_, hybrid);
}

// Passes the hybrid split takes (decode-sized: parallel sequences included).
constexpr int64_t k_hybrid_max_tokens = 16;
static_assert(k_hybrid_max_tokens <= DecodeModeChooser::k_max_tokens);

// The host's part of a split layer, started and not joined yet, is joined: before the pool or the schedule's buffers
// serve anything else (the next MoE layer, the next pass, the statistics, the schedule's end).
void MoeSchedule::settle_host() {
    if (!host_pending_) return;
    host_pending_ = false;
    hybrid_->finish();
}

MoeSchedule::~MoeSchedule() {
    settle_host();
}

// The device alone is a choice where some layer of the pass maps its misses and routes on the device; a traced pass
// (its intermediates read back) splits as before and gives no sample.
void MoeSchedule::start_pass(int64_t T, bool traced) {
    settle_host();
    admit_after_alone_pass();
    if (slots_) slots_->begin_pass();  // after the last pass's requests, judged just above
    if (favourites_ && T >= 1 && T <= k_hybrid_max_tokens && slots_->favourites_pending()) keep_favourites();
    pass_tokens_ = T;
    line_ = full_share();
    if (schedule_ == PrefillSchedule::Auto && slots_ && !slots_->all_resident()) cost_.start_pass(T, timing_);
    split_pass_ = true;
    bool alone = false;
    if (hybrid_ && choose_ && !traced && T >= 1 && T <= k_hybrid_max_tokens)
        for (const ExpertWeights &w : experts_)
            if (w.present() && be_.maps_host_experts(w) && be_.device_routing_applies(w, T)) {
                alone = true;
                break;
            }
    if (!alone) {
        chooser_.other_pass();
        return;
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
    split_pass_ = chooser_.next(T, us) == DecodeMode::Split;
}

// Decoding begins (a decode-sized pass after prompt passes): the cache turned toward the prompts' favourites
// (ExpertSlotTable::keep_favourites), filled on the copy stream; the backend makes the pass read each new slot only
// once it is filled.
void MoeSchedule::keep_favourites() {
    release_pins();
    int64_t n_moe = 0;
    for (const ExpertWeights &w : experts_) n_moe += w.present();
    const std::vector<std::vector<SlotFill>> fills = slots_->keep_favourites(k_favourite_factor, n_moe * pass_k_);
    for (size_t il = 0; il < fills.size(); il++) {
        if (fills[il].empty()) continue;
        fill(experts_[il], fills[il], /*ahead=*/true);
        favourite_fills_ += fills[il].size();
    }
}

// The pass before this one ran some layers by the device alone, their misses read in place and nothing filled: under
// LFU, those of its misses requested far more often than what the cache would give up are filled now, for later
// passes, as the split's mapped misses are after their compute (ExpertSlotTable::admit); its hits are counted. The
// fills go on the copy stream; the backend makes the next pass read each new slot only once it is filled.
void MoeSchedule::admit_after_alone_pass() {
    const std::vector<AloneIds> ran = std::move(alone_);
    alone_.clear();
    const bool ran_layers = ran_layers_, replayed = replayed_;
    ran_layers_ = replayed_ = false;
    const int64_t T = pass_tokens_;
    const bool sized = T > 0 && size_t(T) < alone_by_size_.size();
    // a direct pass of a size keeps its list for that size's replays (not one that ran none alone: a split pass)
    if (ran_layers && sized && !ran.empty()) alone_by_size_[size_t(T)] = ran;
    // replayed: the layers its recording ran; neither run nor replayed (it failed first): nothing new to judge
    const std::vector<AloneIds> *done = ran_layers ? &ran : replayed && sized ? &alone_by_size_[size_t(T)] : nullptr;
    if (!done || done->empty() || !slots_ || slots_->all_resident()) return;
    be_.ids_ready();
    for (const AloneIds &a : *done) {
        const ExpertWeights &w = experts_[size_t(a.il)];
        const int64_t n_exp = w.gate->ne[2];
        std::vector<int32_t> hits, misses;
        for (int64_t i = 0; i < a.n; i++) {
            const int32_t e = a.ids[i];
            if (e < 0 || e >= n_exp) continue;  // never expected; the ids only steer the cache
            std::vector<int32_t> &to = slots_->slot_of(a.il, e) >= 0 ? hits : misses;
            if (std::find(to.begin(), to.end(), e) == to.end()) to.push_back(e);
        }
        slots_->note_requests(a.il, hits.data(), int64_t(hits.size()));
        std::vector<SlotFill> fills;
        for (int32_t e : misses) slots_->admit(a.il, e, k_admit_factor, fills);
        try {
            fill(w, fills, /*ahead=*/true);
        } catch (...) {
            slots_->forget(a.il, fills);  // those slots hold nothing now
            throw;
        }
        admitted_ += fills.size();
    }
}

double full_share_threshold(double q) {
    q = std::clamp(q, 0.0, 1.0);
    const double b = 1.0 - q;
    return (std::sqrt(b * b + 4.0) - b) / 2.0;
}

double MoeSchedule::recall() const {
    const double n = double(prefetch_.recall_predicted + prefetch_.recall_missed);
    return (double(prefetch_.recall_predicted) + k_recall_prior * k_recall_prior_n) / (n + k_recall_prior_n);
}

double MoeSchedule::full_share() const {
    return fixed_full_share_ >= 0.0 ? fixed_full_share_ : full_share_threshold(recall());
}

bool MoeSchedule::auto_full(int64_t nl, int64_t T, double share, bool count) {
    double W = 0, C = 0;
    if (nl < 0 || !slots_ || fixed_full_share_ >= 0.0 || !cost_.rates(nl, T, W, C)) return share >= line_;
    const ExpertWeights &w = experts_[size_t(nl)];
    const int64_t n_next = w.gate->ne[2], n_slots = slots_->n_slots_for(nl);
    NextLayerCost c;
    for (int32_t e = 0; e < n_next; e++) c.missing += slots_->slot_of(nl, e) < 0;
    c.expert_s = cost_.expert_seconds(w.expert_bytes());
    c.window_s = W, c.compute_s = C;
    c.ahead = std::min<int64_t>(ring_ >= 0 ? ring_ : n_slots / 4, n_slots - 1);
    c.share = share;
    c.recall = recall();
    const bool full = next_layer_cost(c).full();
    if (count) (full ? prefetch_.cost_full : prefetch_.cost_predicted)++;
    return full;
}

// Decode-sized passes only: a prefill chunk routes to most experts anyway.
constexpr int64_t k_prefetch_max_tokens = 8;

void MoeSchedule::score_prediction(int64_t il, const std::vector<int32_t> &ids, int64_t T, int64_t k) {
    if (slots_)
        for (int32_t s : pinned_) slots_->pin(s, false);
    pinned_.clear();
    if (pred_layer_ != il || int64_t(pred_ids_.size()) != T * k) {
        pred_layer_ = -1;
        return;
    }
    for (int64_t t = 0; t < T; t++) {
        const int32_t *a = ids.data() + t * k, *p = pred_ids_.data() + t * k;
        for (int64_t j = 0; j < k; j++) prefetch_.predicted += std::find(p, p + k, a[j]) != p + k;
    }
    prefetch_.picks += uint64_t(T * k);
    pred_layer_ = -1;
}

void MoeSchedule::release_pins() {
    if (!slots_) return;
    for (int32_t s : next_pinned_) slots_->pin(s, false);
    for (int32_t s : pinned_) slots_->pin(s, false);
    next_pinned_.clear();
    pinned_.clear();
    pred_layer_ = -1;
    next_ahead_layer_ = pred_next_layer_ = -1;
}

int64_t MoeSchedule::next_moe_layer(int64_t il) const {
    int64_t nl = il + 1;
    while (nl < int64_t(routers_.size()) && !(routers_[size_t(nl)] && experts_[size_t(nl)].present())) nl++;
    return nl < int64_t(routers_.size()) ? nl : -1;
}

void MoeSchedule::predict_next(int64_t il, Act x, const MoeParams &p) {
    const int64_t T = x.rows, k = p.n_expert_used;
    const int64_t nl = next_moe_layer(il);
    if (nl < 0 || T > k_prefetch_max_tokens) return;
    Region r(be_, "prefetch");
    const Backend::ScratchMark mark = be_.scratch_mark();
    Act logits = be_.alloc(T, p.n_expert);
    int32_t *ids_be = be_.alloc_i32(T * k);
    float *wts_be = be_.alloc(1, T * k).data;
    be_.matmul(*routers_[size_t(nl)], x, logits);
    be_.route_topk(logits, p, ids_be, wts_be);
    pred_ids_.resize(size_t(T * k));
    be_.download_i32(ids_be, T * k, pred_ids_.data());
    be_.scratch_release(mark);
    pred_layer_ = nl;
    if (!slots_ || slots_->all_resident()) return;
    // The predicted experts not in a slot, filled ahead and pinned; at most half the slots, the rest for the layer.
    std::vector<int32_t> want;
    for (int32_t e : pred_ids_)
        if (slots_->slot_of(nl, e) < 0 && std::find(want.begin(), want.end(), e) == want.end()) want.push_back(e);
    want.resize(std::min<size_t>(want.size(), size_t(slots_->n_slots_for(nl) / 2)));
    if (want.empty()) return;
    prefetch_.prefetched += fill_ahead_pinned(nl, want, pinned_, false);
}

void MoeSchedule::fill(const ExpertWeights &w, const std::vector<SlotFill> &fills, bool ahead) {
    if (fills.empty()) return;
    try {
        be_.fill_slots(w, fills, ahead);
    } catch (...) {
        slots_->forget(w.il, fills);  // the slots must not claim bytes that never arrived
        throw;
    }
}

uint64_t MoeSchedule::fill_ahead_pinned(int64_t il, const std::vector<int32_t> &experts, std::vector<int32_t> &pinned,
                                        bool scan) {
    std::vector<int32_t> slot(experts.size());
    std::vector<SlotFill> fills;
    slots_->acquire(il, experts.data(), int64_t(experts.size()), slot.data(), scan, fills);
    fill(experts_[size_t(il)], fills, /*ahead=*/true);
    for (int32_t s : slot) slots_->pin(s, true);
    pinned = std::move(slot);
    return fills.size();
}

void MoeSchedule::stream_next(int64_t il, int64_t T, int64_t k, double share) {
    if (schedule_ == PrefillSchedule::Routed || !slots_ || slots_->all_resident() || stream_ahead_ <= 0) return;
    if (!stream_ahead_set_ && T * k <= k_decode_max_pairs) return;
    int64_t nl = il + 1;
    while (nl < int64_t(experts_.size()) && !experts_[size_t(nl)].present()) nl++;
    if (nl >= int64_t(experts_.size())) return;
    const int64_t n_slots = slots_->n_slots_for(nl);  // the slots of the next layer's class
    if (n_slots < 4) return;
    const int64_t n_next = experts_[size_t(nl)].gate->ne[2];
    // auto: full or predicted by the measured rates (prefill_cost.h), else by the recall's line (the next layer is
    // taken to route like this one)
    const bool predicted = schedule_ == PrefillSchedule::Predicted ||
                           (schedule_ == PrefillSchedule::Auto && !auto_full(nl, T, share, true));
    if (predicted && pred_next_layer_ != nl) return;
    std::vector<int32_t> tokens;  // predicted: the next layer's tokens per expert
    if (predicted) {
        tokens.assign(size_t(n_next), 0);
        for (int32_t e : pred_next_ids_) tokens[size_t(e)]++;
    }
    const int64_t n = std::min<int64_t>(ring_ >= 0 ? ring_ : n_slots / 4, n_slots - 1);
    std::vector<int32_t> want;
    for (int32_t e = 0; e < n_next && int64_t(want.size()) < n; e++)
        if (slots_->slot_of(nl, e) < 0 && (!predicted || tokens[size_t(e)] > 0)) want.push_back(e);
    if (want.empty()) return;
    Region r(be_, "stream_next");
    const bool scan = scan_evict_ && 2.0 * share >= 1.0;
    prefetch_.streamed_next += fill_ahead_pinned(nl, want, next_pinned_, scan);
    next_ahead_ = std::move(want);
    next_ahead_predicted_ = predicted;
    next_ahead_layer_ = nl;
}

bool MoeSchedule::may_stream(int64_t n_slots, int64_t pairs) const {
    return stream_ahead_ > 0 && n_slots >= 2 && (stream_ahead_set_ || pairs > k_decode_max_pairs);
}

bool MoeSchedule::streamed_experts(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &used,
                                   int64_t n_exp, Act xs, Act ys) {
    const int64_t n_slots = slots_->n_slots_for(w.il), m = int64_t(used.size());
    if (!may_stream(n_slots, int64_t(g.src_row.size()))) return false;
    // resident experts first (they compute while the first fills run), then the missing ones, each in id order
    std::vector<int32_t> order;
    for (int32_t e : used)
        if (slots_->slot_of(w.il, e) >= 0) order.push_back(e);
    const int64_t n_hits = int64_t(order.size());
    if (n_hits == m) return false;  // nothing to stream
    for (int32_t e : used)
        if (slots_->slot_of(w.il, e) < 0) order.push_back(e);
    const bool scan = scan_evict_ && 2 * m >= n_exp;
    // Misses compute in batches of half the lookahead (at least one): fewer launches, fills still ahead.
    const int64_t batch = std::clamp<int64_t>(stream_ahead_ / 2, 1, n_slots);
    std::vector<int32_t> slot(size_t(m), -1);
    std::vector<SlotFill> fills;
    int64_t issued = 0, done = 0;
    // Experts acquired and not yet computed stay pinned; a throw unpins them.
    struct Unpin {
        ExpertSlotTable &t;
        const std::vector<int32_t> &slot;
        const int64_t &from, &to;
        ~Unpin() {
            for (int64_t i = from; i < to; i++) t.pin(slot[size_t(i)], false);
        }
    } unpin{*slots_, slot, done, issued};
    // Acquires experts [issued, upto) of `order` (at most n_slots pinned at once) and issues their fills ahead.
    auto issue = [&](int64_t upto) {
        upto = std::min({upto, m, done + n_slots});
        if (upto <= issued) return;
        Region r(be_, "acquire");
        fills.clear();
        slots_->acquire(w.il, order.data() + issued, upto - issued, slot.data() + issued, scan, fills);
        for (int64_t i = issued; i < upto; i++) slots_->pin(slot[size_t(i)], true);
        issued = upto;
        fill(w, fills, /*ahead=*/true);
    };
    std::vector<ExpertGroup> groups;
    PassTiming *tm = layer_timing_;
    if (tm) tm->phase_end(TimingPhase::Experts);  // the rows gathered
    for (int64_t i = 0; i < m;) {
        // this batch: every resident expert at once (as many as slots), then `batch` missing ones at a time
        const int64_t j = i < n_hits ? std::min(n_hits, i + n_slots) : std::min(m, i + batch);
        // this batch's experts and up to stream_ahead_ missing ones beyond
        issue(std::max(j, n_hits) + stream_ahead_);
        STRATA_ASSERT(issued >= j);
        if (tm) tm->phase_end(TimingPhase::Upload);
        Region r(be_, "experts");
        groups.clear();
        for (int64_t x = i; x < j; x++) {
            const int32_t e = order[size_t(x)];
            groups.push_back(
                {be_.expert_slot(w, slot[size_t(x)]), g.first[size_t(e)], g.count[size_t(e)], slot[size_t(x)]});
        }
        if (tm) {  // the wait apart (expert_ffn's own is then done), between two marks
            be_.wait_slot_fills(groups);
            tm->phase_end(TimingPhase::CopyWait);
        }
        be_.expert_ffn(w, xs, groups, ys);
        if (tm) tm->phase_end(TimingPhase::Experts);
        for (int64_t x = i; x < j; x++) slots_->pin(slot[size_t(x)], false);
        i = done = j;
    }
    return true;
}

void MoeSchedule::routed_experts(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &used,
                                 int64_t n_exp, Act xs, Act ys, bool fills_ahead, bool mapped,
                                 const std::vector<int32_t> *acquired) {
    std::vector<ExpertGroup> groups;
    auto group = [&](int32_t e, const ExpertSrc &src, int32_t slot) {
        groups.push_back({src, g.first[size_t(e)], g.count[size_t(e)], slot});
    };
    if (!slots_) {
        Region r(be_, "experts");
        for (int32_t e : used) group(e, be_.expert_in_place(w, e), -1);
        be_.expert_ffn(w, xs, groups, ys);
        return;
    }
    if (mapped) {
        // the hits from their slots (acquired: counted and made recent), the misses read in place, nothing filled
        std::vector<int32_t> hit, slot;
        for (int32_t e : used)
            if (slots_->slot_of(w.il, e) >= 0) hit.push_back(e);
        slot.resize(hit.size());
        std::vector<SlotFill> fills;
        if (!hit.empty()) slots_->acquire(w.il, hit.data(), int64_t(hit.size()), slot.data(), false, fills);
        STRATA_ASSERT(fills.empty());
        Region r(be_, "experts");
        size_t h = 0;
        std::vector<int32_t> misses;
        for (int32_t e : used) {
            if (h < hit.size() && hit[h] == e) {
                group(e, be_.expert_slot(w, slot[h]), slot[h]);
                h++;
            } else {
                group(e, be_.mapped_expert(w, e), -1);
                misses.push_back(e);
                mapped_misses_++;
                mapped_bytes_ += w.expert_bytes();
            }
        }
        be_.expert_ffn(w, xs, groups, ys);
        // Admission: the misses whose requests far outnumber the weakest slot's are filled for later passes, on the
        // copy stream after this compute (a victim still being read is the backend's to wait for).
        if (admit_) {
            for (int32_t e : misses) slots_->admit(w.il, e, k_admit_factor, fills);
            fill(w, fills, /*ahead=*/true);
            admitted_ += fills.size();
        }
        return;
    }
    if (acquired) {  // early_fills: acquired and filled already, one set
        STRATA_ASSERT(acquired->size() == used.size());
        Region r(be_, "experts");
        for (size_t i = 0; i < used.size(); i++) group(used[i], be_.expert_slot(w, (*acquired)[i]), (*acquired)[i]);
        if (!used.empty()) be_.expert_ffn(w, xs, groups, ys);
        return;
    }
    if (used.empty() || streamed_experts(w, g, used, n_exp, xs, ys)) return;
    // As many experts at a time as there are slots: with a small cache a layer's experts come in several sets.
    const size_t per_set = size_t(std::max<int64_t>(1, slots_->n_slots_for(w.il)));
    const bool scan = scan_evict_ && 2 * int64_t(used.size()) >= n_exp;
    std::vector<int32_t> slot(per_set);
    std::vector<SlotFill> fills;
    for (size_t s0 = 0; s0 < used.size(); s0 += per_set) {
        const size_t s1 = std::min(used.size(), s0 + per_set);
        {
            Region r(be_, "acquire");
            fills.clear();
            slots_->acquire(w.il, used.data() + s0, int64_t(s1 - s0), slot.data(), scan, fills);
            fill(w, fills, fills_ahead);
        }
        Region r(be_, "experts");
        groups.clear();
        for (size_t i = s0; i < s1; i++) group(used[i], be_.expert_slot(w, slot[i - s0]), slot[i - s0]);
        be_.expert_ffn(w, xs, groups, ys);
    }
}

std::vector<int32_t> MoeSchedule::host_experts(const ExpertWeights &w, const std::vector<int32_t> &ids, int64_t n_exp) {
    std::vector<int32_t> count(static_cast<size_t>(n_exp), 0);
    for (int32_t e : ids) count[size_t(e)]++;
    std::vector<int32_t> misses;  // those the host could take
    for (int32_t e = 0; e < n_exp; e++)
        if (count[size_t(e)] > 0 && slots_->slot_of(w.il, e) < 0 && be_.host_computes_like(w, count[size_t(e)]))
            misses.push_back(e);
    const int64_t n = hybrid_->split(int64_t(misses.size()));
    // The host's cost grows with an expert's rows, the bus's does not: the host takes those with the fewest.
    std::stable_sort(misses.begin(), misses.end(),
                     [&](int32_t a, int32_t b) { return count[size_t(a)] < count[size_t(b)]; });
    misses.resize(size_t(n));
    std::sort(misses.begin(), misses.end());
    return misses;
}

bool MoeSchedule::early_fills(const ExpertWeights &w, const std::vector<int32_t> &dev, int64_t n_exp, int64_t pairs,
                              bool fills_ahead) {
    // as routed_experts would: one set, not the streamed schedule (streamed_experts' conditions)
    const int64_t n_slots = slots_->n_slots_for(w.il);
    if (dev.empty() || int64_t(dev.size()) > n_slots) return false;
    if (may_stream(n_slots, pairs)) return false;
    Region r(be_, "acquire");
    early_slots_.resize(dev.size());
    std::vector<SlotFill> fills;
    slots_->acquire(w.il, dev.data(), int64_t(dev.size()), early_slots_.data(),
                    scan_evict_ && 2 * int64_t(dev.size()) >= n_exp, fills);
    fill(w, fills, fills_ahead);
    hybrid_->note_early_fills();
    return true;
}

void MoeSchedule::host_part(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &host, int64_t E,
                            int64_t dev_misses) {
    const int64_t M = int64_t(g.src_row.size());
    const int64_t r0 = g.first[size_t(host.front())];  // the host's rows: [r0, M)
    host_r0_ = r0;
    host_dev_misses_ = dev_misses;
    // The host's rows: its experts' inputs gathered (x read back with the routing), outputs in the same order.
    host_xs_.resize(size_t((M - r0) * E));
    host_ys_.resize(size_t((M - r0) * E));
    for (int64_t i = r0; i < M; i++)
        std::copy_n(host_x_.data() + g.src_row[size_t(i)] * E, E, host_xs_.data() + (i - r0) * E);
    host_jobs_.clear();
    host_bytes_ = 0;
    for (int32_t e : host) {
        const ExpertSrc src = be_.expert_host_bytes(w, e);
        const int64_t n_ff = w.gate->ne[1];
        auto mat = [](const Weight &m, const void *data, int64_t k, int64_t n) {
            return HostMatrix{m.type, static_cast<const uint8_t *>(data), m.row_bytes, k, n};
        };
        const int64_t at = g.first[size_t(e)] - r0;
        host_jobs_.push_back({mat(*w.gate, src.gate, E, n_ff), mat(*w.up, src.up, E, n_ff),
                              mat(*w.down, src.down, n_ff, E), host_xs_.data() + at * E, host_ys_.data() + at * E,
                              g.count[size_t(e)]});
        host_bytes_ += w.expert_bytes();
    }
    // The handoff: the host's outputs written where the device reads them, their copy queued after the device's
    // part and started by the pool's last piece. Only where the pool ends the call without this thread: the device
    // waits for the signal.
    handoff_rows_ = {};
    if (decode_overlap_ && handoff_ && hybrid_->runs_alone(host_jobs_)) {
        handoff_rows_ = be_.rows_handoff(size_t((M - r0) * E) * sizeof(float));
        if (handoff_rows_.host)
            for (HostExpertJob &j : host_jobs_) j.y = handoff_rows_.host + (j.y - host_ys_.data());
    }
    // Overlapped: the host's threads begin before the device's gather and part are issued; this thread joins them
    // after issuing those (settle_host), or with the handoff only before the pool's next use.
    if (decode_overlap_) {
        const Backend::RowsHandoff &h = handoff_rows_;
        hybrid_->start(host_jobs_, host_bytes_, host_dev_misses_,
                       h.host ? HostSignal{h.signal, h.ticket} : HostSignal{});
        host_pending_ = true;  // joined by settle_host, whatever is thrown before
    }
}

void MoeSchedule::hybrid_experts(const ExpertWeights &w, const RouteGroups &g, const std::vector<int32_t> &dev,
                                 int64_t n_exp, Act xs, Act ys, bool fills_ahead, bool mapped, PassTiming *tm,
                                 const std::vector<int32_t> *acquired) {
    const int64_t M = int64_t(g.src_row.size()), r0 = host_r0_;
    const uint64_t a = be_.mark_device();
    routed_experts(w, g, dev, n_exp, xs, ys, fills_ahead, mapped, acquired);
    hybrid_->device_part(host_dev_misses_, a, be_.mark_device());
    if (tm) tm->phase_end(TimingPhase::Experts);
    if (handoff_rows_.host) {  // the pool stores the signal whatever follows, and is joined at its next use
        be_.handoff_rows(handoff_rows_, ys.rows_view(r0, M - r0));
        return;
    }
    Region r(be_, "hybrid/host");
    if (decode_overlap_)
        settle_host();
    else
        hybrid_->compute(host_jobs_, host_bytes_, host_dev_misses_);
    be_.upload_rows(host_ys_.data(), ys.rows_view(r0, M - r0));
}

void MoeSchedule::shared_ffn(const LayerWeights &L, Act x, Act sy) {
    Region r(be_, "shared_expert");
    const int64_t T = x.rows, n_sh = L.gate_shexp.ne[1];
    const Backend::ScratchMark mark = be_.scratch_mark();
    Act sg = be_.alloc(T, n_sh), su = be_.alloc(T, n_sh);
    be_.matmuls(x, {{&L.gate_shexp, sg}, {&L.up_shexp, su}});
    be_.silu_mul(sg, su);
    be_.matmul(L.down_shexp, sg, sy);
    be_.scratch_release(mark);
}

void MoeSchedule::run(int64_t il, const LayerWeights &L, Act x, const MoeParams &p, Act out, const ResidualNorm *then,
                      const ResidualAdd *before) {
    ran_layers_ = true;
    settle_host();  // the last layer's handoff: its pool and buffers serve this one
    STRATA_ASSERT(il >= 0 && size_t(il) < experts_.size() && experts_[size_t(il)].present());
    const ExpertWeights &w = experts_[size_t(il)];
    const int64_t T = x.rows, E = x.cols, k = p.n_expert_used, n_exp = p.n_expert;
    pass_k_ = k;
    STRATA_ASSERT(out.rows == T && out.cols == E && w.down->ne[1] == E && k >= 1 && k <= n_exp);
    if (T == 0) return;
    Region moe(be_, "moe");
    PassTiming &timing = T >= k_timing_min_tokens ? timing_ : decode_timing_;
    const bool timed = timing.layer_begin(il, T);
    PassTiming *tm = timed ? &timing : nullptr;
    if (!tm)  // the cost model's sampled passes (prefill_cost.h)
        if (PassTiming *s = cost_.sampling(); s && s->layer_begin(il, T)) tm = s;
    layer_timing_ = tm;
    const Backend::ScratchMark mark = be_.scratch_mark();
    if (slots_) {  // what the previous layer streamed ahead for this one is an ordinary slot from here on
        for (int32_t s : next_pinned_) slots_->pin(s, false);
        if (scan_fence_) slots_->fence();  // the earlier layers' slots go first in a scan
    }
    next_pinned_.clear();

    // 1-2. Routing, and the device-routed path where it applies.
    Act logits = be_.alloc(T, n_exp);
    int32_t *ids_be = be_.alloc_i32(T * k);
    const Act wts = be_.alloc(1, T * k);
    float *wts_be = wts.data;
    std::vector<int32_t> ids(size_t(T * k));
    // Mapped misses (Backend::maps_host_experts): the device reads what no slot holds from the host copy itself.
    // With the hybrid split the host needs the routing, and the device's part reads its misses in place instead.
    const bool hybrid = hybrid_ && split_pass_ && T <= k_hybrid_max_tokens;
    const bool mapped = slots_ && be_.maps_host_experts(w) && be_.device_routing_applies(w, T);
    const bool on_device =
        slots_ && (slots_->all_resident() || (mapped && !hybrid)) && be_.device_routing_applies(w, T);
    // Decode overlap: the hybrid's input rows come back with the routing (one wait), and the shared expert is
    // queued before the host's part of the layer, the fills beside it on the copy stream.
    const bool decode = T <= k_hybrid_max_tokens && decode_overlap_;
    if (hybrid) host_x_.resize(size_t(T * E));
    {
        Region r(be_, "route");
        // the residual step that makes x, where the pass left it here: in the router's launch where the backend can
        if (before) STRATA_ASSERT(before->normed.data == x.data && before->normed.rows == T);
        if (on_device && !override_.active() && before) {
            be_.add_rms_norm_route(before->resid, before->y, *before->w, before->eps, x, L.gate_inp, w, p, logits,
                                   ids_be, wts_be);
        } else {
            if (before) be_.add_rms_norm(before->resid, before->y, *before->w, before->eps, x);
            if (on_device && !override_.active())
                be_.route_for_device(L.gate_inp, w, x, p, logits, ids_be, wts_be);
            else
                be_.route(L.gate_inp, x, p, logits, ids_be, wts_be);
        }
        if (tm) tm->phase_end(TimingPhase::Route);
        if (override_.active()) {
            // the draws, with the weights the router gives them, in place of the router's choice
            Region ro(be_, "route_override");
            const bool new_pass = last_layer_ < 0 || il <= last_layer_;
            last_layer_ = il;
            be_.route_draws(logits, p, draws_of(override_), il, new_pass, ids_be, wts);
        }
        // The predicted schedule (and auto, which may take it): the next MoE layer's router on this layer's input
        // (the logits buffer is done with, where the next router is as wide), its top-k read back right after this
        // layer's routing (the first download waits for both).
        // Auto predicts only after a layer that took the predicted schedule (the layers of a pass route alike):
        // where every expert is routed, the next router's product is work for nothing.
        int64_t pred_layer = slots_ && !slots_->all_resident() && !on_device && !override_.active() &&
                                     (stream_ahead_set_ || T * k > k_decode_max_pairs) && stream_ahead_ > 0
                                 ? next_moe_layer(il)
                                 : -1;
        if (pred_layer >= 0 && schedule_ != PrefillSchedule::Predicted &&
            (schedule_ != PrefillSchedule::Auto || auto_full(pred_layer, T, last_share_, false)))
            pred_layer = -1;
        if (pred_layer >= 0 && routers_[size_t(pred_layer)]->ne[1] != n_exp) pred_layer = -1;
        pred_next_layer_ = -1;
        const Backend::ScratchMark pred_mark = be_.scratch_mark();
        int32_t *pred_be = nullptr;
        if (pred_layer >= 0) {
            Region rp(be_, "route_next");
            pred_be = be_.alloc_i32(T * k);
            float *pred_wts = be_.alloc(1, T * k).data;
            be_.matmul(*routers_[size_t(pred_layer)], x, logits);
            be_.route_topk(logits, p, pred_be, pred_wts);
        }
        if (!on_device || observer_) {
            if (hybrid && decode)
                be_.download_many({{x, host_x_.data()}}, ids_be, T * k, ids.data());
            else
                be_.download_i32(ids_be, T * k, ids.data());
        }
        if (pred_layer >= 0) {
            pred_next_ids_.resize(size_t(T * k));
            be_.download_i32(pred_be, T * k, pred_next_ids_.data());
            pred_next_layer_ = pred_layer;
        }
        be_.scratch_release(pred_mark);
        // How many of the experts filled ahead for this layer its routing reached.
        if (next_ahead_layer_ == il && !(on_device && !observer_)) {
            std::vector<char> routed(size_t(n_exp), 0);
            for (int32_t e : ids) routed[size_t(e)] = 1;
            for (int32_t e : next_ahead_) prefetch_.streamed_next_used += routed[size_t(e)];
            if (next_ahead_predicted_) {  // the recall: routed experts without a slot before, filled ahead or not
                std::vector<char> ahead(size_t(n_exp), 0);
                for (int32_t e : next_ahead_) ahead[size_t(e)] = 1;
                for (int32_t e = 0; e < int32_t(n_exp); e++) {
                    if (!routed[size_t(e)]) continue;
                    if (ahead[size_t(e)])
                        prefetch_.recall_predicted++;
                    else if (slots_->slot_of(il, e) < 0)
                        prefetch_.recall_missed++;
                }
            }
        }
        if (next_ahead_layer_ == il) next_ahead_layer_ = -1;
    }
    if (prefetch_on_) {
        if (on_device && !observer_) be_.download_i32(ids_be, T * k, ids.data());
        score_prediction(il, ids, T, k);
    }
    if (observer_) {
        std::vector<float> wh(size_t(T * k));
        be_.download(wts, wh.data());
        observer_->routed(il, T, k, ids.data(), wh.data());
    }
    // 6a. The shared expert's FFN now, so the device runs it while the host groups and computes and the first fills
    // copy (timed with the readback): decode-sized passes with the overlap, prompt passes grouped on the host with
    // shared-first on (its output rows then live through the routed experts: scratch_estimate counts them).
    Act sy{};
    const bool shared = L.gate_shexp.present();
    const bool shared_first = shared && (decode || (shared_first_ && !on_device && T > k_hybrid_max_tokens));
    // Early fills (a split pass grouped on the host): the host's part and the device's fills are issued first, the
    // shared expert's kernels after them.
    const bool early = early_fills_ && hybrid && decode && !on_device && !(mapped && split_mapped_);
    if (shared_first && !early) {
        sy = be_.alloc(T, E);
        shared_ffn(L, x, sy);
    }
    bool shared_done = false, then_done = false;
    if (on_device) {
        // Admission after the pass (admit_after_alone_pass): the routing comes to the host without a wait.
        if (mapped && admit_alone_ && !observer_ && slots_->policy() != SlotPolicy::Lru)
            if (const int32_t *h = be_.ids_after_pass(il, ids_be, T * k)) alone_.push_back({il, T * k, h});
        // The shared expert's rows and the residual step go with the experts' combination (the backend may take
        // them in one pass), unless something below still reads x (the next-layer prediction), which the residual
        // step may overwrite.
        MoeTail tail;
        if (!prefetch_on_) {
            if (shared && sy.data) tail.shared_gate = &L.gate_inp_shexp, tail.shared_y = sy, shared_done = true;
            if (then && (!shared || shared_done)) tail.then = *then, then_done = true;
        }
        be_.experts_device_routed(w, x, k, ids_be, wts_be, out, tail);
    } else {
        // 3-5. Grouped on the host, experts in sets, combined in expert-id order.
        const std::vector<int32_t> host = hybrid ? host_experts(w, ids, n_exp) : std::vector<int32_t>{};
        if (tm) tm->phase_end(TimingPhase::Readback);  // with the override's and the split's work
        RouteGroups &g = groups_;
        group_by_expert(ids, T, k, n_exp, host, g, group_pool(T * k));
        if (tm) tm->phase_end(TimingPhase::Group);
        const int64_t M = T * k;
        if (M > k_decode_max_pairs) {
            last_rows_.resize(experts_.size());
            last_rows_[size_t(il)] = g.count;
        }
        if (favourites_ && T > k_hybrid_max_tokens) slots_->note_prompt_rows(il, g.count, T);
        if (!host.empty() && !decode) {  // the order before the overlap: x read back only where the host takes part
            Region rx(be_, "hybrid/read_x");
            be_.download(x, host_x_.data());
        }
        // the device's experts and, in a split layer, its misses (the cost model's count, before any acquire)
        std::vector<int32_t> dev;
        int64_t dev_misses = 0;
        for (int32_t e : g.used)
            if (!std::binary_search(host.begin(), host.end(), e)) {
                dev.push_back(e);
                if (hybrid) dev_misses += slots_->slot_of(w.il, e) < 0;
            }
        if (!host.empty()) host_part(w, g, host, E, dev_misses);  // with the overlap, started before the gather
        // the fills beside the shared expert's kernels where those went first
        const bool fills_ahead = shared && decode && slot_fills_ahead_;
        const bool acquired = early && early_fills(w, dev, n_exp, M, fills_ahead);
        if (shared_first && early) {
            sy = be_.alloc(T, E);
            shared_ffn(L, x, sy);
        }
        const Act xs = be_.gather_expert_input(w, x, g.src_row), ys = be_.alloc(M, E);
        const double share = double(g.used.size()) / double(n_exp);
        last_share_ = share;
        if (host.empty()) {
            // a layer of the split that gives the host nothing still tells the model what the device's part costs
            const uint64_t a = hybrid ? be_.mark_device() : 0;
            routed_experts(w, g, dev, n_exp, xs, ys, fills_ahead, mapped && hybrid && split_mapped_,
                           acquired ? &early_slots_ : nullptr);
            if (hybrid) hybrid_->device_part(dev_misses, a, be_.mark_device());
            stream_next(il, T, k, share);
            if (tm) tm->phase_end(TimingPhase::Experts);
        } else {
            hybrid_experts(w, g, dev, n_exp, xs, ys, fills_ahead, mapped && split_mapped_, tm,
                           acquired ? &early_slots_ : nullptr);
            stream_next(il, T, k, share);
        }
        if (tm) tm->phase_end(TimingPhase::Host);
        be_.moe_combine(ys, g.yrow, g.widx, wts_be, k, out);
        if (tm) tm->phase_end(TimingPhase::Combine);
    }
    if (prefetch_on_) predict_next(il, x, p);

    // 6. The shared expert (its FFN here unless it went first), gated, added.
    if (shared && !shared_done) {
        if (!shared_first) {  // after the experts: their scratch and the shared expert's never meet
            sy = be_.alloc(T, E);
            shared_ffn(L, x, sy);
        }
        Region r(be_, "shared_expert");
        be_.shared_expert_add(x, L.gate_inp_shexp, sy, out);
    }
    if (then && !then_done) be_.add_rms_norm(then->resid, out, *then->w, then->eps, then->normed);
    if (tm) {
        tm->phase_end(TimingPhase::Shared);
        tm->layer_end();
    }
    layer_timing_ = nullptr;
    be_.scratch_release(mark);
}

}  // namespace strata
