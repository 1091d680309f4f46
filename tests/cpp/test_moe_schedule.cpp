// The MoE schedule through expert slots, on the CPU: a backend that computes as the CPU backend does but keeps its
// experts in slots of host memory (filled by copying from the mapped file, as a device backend fills device slots)
// must give bit-identical logits to the CPU backend reading every expert in place, whatever the number of slots: one
// per expert, the fewest a layer needs, or so few that a layer's experts come in several sets. This exercises the
// slot table, the set splitting, the fills and the eviction policies without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/host/mmvq_host.h"
#include "core/env.h"
#include "core/error.h"
#include "core/threads.h"
#include "runtime/engine.h"
#include "strata/placement_plan.h"
#include "synth_cache.h"

using namespace strata;

namespace {

// The CPU backend's ops, with experts read from host-memory slots the plan sizes instead of in place.
class HostSlotBackend final : public Backend {
  public:
    explicit HostSlotBackend(uint64_t budget) : cpu_(make_cpu_backend(2)), budget_(budget) {}
    std::string name() const override { return "host slots"; }
    DeviceFacts device_facts() override {
        DeviceFacts d;
        d.has_device_memory = true;
        d.name = "HOST0";
        d.free_bytes = d.total_bytes = budget_ * 2;
        d.runtime_bytes = 0;
        d.host_available_bytes = uint64_t(1) << 40;
        return d;
    }
    void prepare(WeightSet &ws, const Placement &plan) override {
        Placement none;
        cpu_->prepare(ws, none);
        layouts_ = plan.layouts;
        slot_bytes_ = plan.slot_bytes;
        memory_.assign(size_t(plan.n_slots) * plan.slot_bytes, 0);
        owner_.assign(size_t(plan.n_slots), {-1, -1});
    }
    void init_caches(const CacheShape &shape) override { cpu_->init_caches(shape); }
    Act alloc(int64_t rows, int64_t cols) override { return cpu_->alloc(rows, cols); }
    int32_t *alloc_i32(int64_t n) override { return cpu_->alloc_i32(n); }
    void reset_scratch() override { cpu_->reset_scratch(); }
    ScratchMark scratch_mark() override { return cpu_->scratch_mark(); }
    void scratch_release(ScratchMark m) override { cpu_->scratch_release(m); }
    void download(const Act &src, float *host) override { cpu_->download(src, host); }
    void download_i32(const int32_t *src, int64_t n, int32_t *host) override { cpu_->download_i32(src, n, host); }
    void upload(const float *host, Act dst) override { cpu_->upload(host, dst); }
    void upload_i32(const int32_t *host, int64_t n, int32_t *dst) override { cpu_->upload_i32(host, n, dst); }
    void copy_seq(int32_t src, int32_t dst, int64_t n_pos) override { cpu_->copy_seq(src, dst, n_pos); }
    void clear_seq(int32_t seq) override { cpu_->clear_seq(seq); }
    size_t recurrent_state_bytes() const override { return cpu_->recurrent_state_bytes(); }
    void save_recurrent_state(int32_t seq, void *dst) override { cpu_->save_recurrent_state(seq, dst); }
    void load_recurrent_state(int32_t seq, const void *src) override { cpu_->load_recurrent_state(seq, src); }
    void embed(const Weight &w, const int32_t *ids, Act out) override { cpu_->embed(w, ids, out); }
    void rms_norm(Act x, const Weight &w, float eps, Act out) override { cpu_->rms_norm(x, w, eps, out); }
    void matmul(const Weight &w, Act x, Act out) override { cpu_->matmul(w, x, out); }
    void add(Act a, Act b, Act out) override { cpu_->add(a, b, out); }
    void mul_sigmoid(Act x, Act gate) override { cpu_->mul_sigmoid(x, gate); }
    void silu_mul(Act g, Act u) override { cpu_->silu_mul(g, u); }
    void gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) override { cpu_->gather_rows(src, rows, dst); }
    void deinterleave(Act src, int64_t width, Act a, Act b) override { cpu_->deinterleave(src, width, a, b); }
    void rope(Act x, const RopeParams &rp, const BatchInfo &b) override { cpu_->rope(x, rp, b); }
    void attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale,
                   const BatchInfo &b, Act out) override {
        cpu_->attention(il, q, k, v, n_head, n_head_kv, head_dim, scale, b, out);
    }
    void gdn(int64_t il, const GdnWeights &w, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
             const BatchInfo &b, Act out) override {
        cpu_->gdn(il, w, qkv, z, beta_in, alpha_in, p, b, out);
    }
    void route_topk(Act logits, const MoeParams &p, int32_t *ids, float *weights) override {
        cpu_->route_topk(logits, p, ids, weights);
    }
    ExpertSrc expert_slot(const ExpertWeights &w, int32_t slot) const override {
        const ExpertSlotLayout &L = layouts_[size_t(w.il)];
        const uint8_t *s = memory_.data() + size_t(slot) * slot_bytes_;
        return {s + L.gate_off, s + L.up_off, s + L.down_off};
    }
    void fill_slots(const ExpertWeights &w, const std::vector<SlotFill> &fills, bool ahead) override {
        const ExpertSlotLayout &L = layouts_[size_t(w.il)];
        for (const SlotFill &f : fills) {
            unown(f.slot);
            owner_[size_t(f.slot)] = {w.il, f.expert};
            where_[{w.il, f.expert}] = f.slot;
            uint8_t *s = memory_.data() + size_t(f.slot) * slot_bytes_;
            // The slot's previous bytes are overwritten whole: a stale expert would show in the logits.
            std::memset(s, 0xa5, slot_bytes_);
            std::memcpy(s + L.gate_off, w.gate->expert_host(f.expert), w.gate->matrix_bytes());
            std::memcpy(s + L.up_off, w.up->expert_host(f.expert), w.up->matrix_bytes());
            std::memcpy(s + L.down_off, w.down->expert_host(f.expert), w.down->matrix_bytes());
            filled_++;
            ahead_fills_ += ahead;
        }
    }
    void expert_ffn(const ExpertWeights &w, Act xs, const std::vector<ExpertGroup> &groups, Act ys) override {
        for (const ExpertGroup &g : groups) {
            if (g.slot < 0) {  // only a mapped miss is read from anywhere but a slot
                EXPECT_TRUE(mapped_);
                grouped_mapped_++;
            }
            if (!lent_.empty()) {
                EXPECT_EQ(lent_.count(g.slot), 0u) << "lent slot " << g.slot;
            }
        }
        if (!gpu_arith_) {
            cpu_->expert_ffn(w, xs, groups, ys);
            return;
        }
        // every row as the GPU's decode kernels compute it (mmvq_host.h), from the slot's bytes
        const int64_t E = xs.cols, n_ff = w.gate->ne[1];
        auto mat = [](const Weight &m, const void *data, int64_t k, int64_t n) {
            return HostMatrix{m.type, static_cast<const uint8_t *>(data), m.row_bytes, k, n};
        };
        for (const ExpertGroup &g : groups)
            for (int64_t r = g.row0; r < g.row0 + g.n_rows; r++)
                expert_ffn_host(mat(*w.gate, g.src.gate, E, n_ff), mat(*w.up, g.src.up, E, n_ff),
                                mat(*w.down, g.src.down, n_ff, E), xs.row(r), ys.row(r));
    }
    // Handoffs (Backend::rows_handoff) as a device takes them, only in order: handoff_rows waits for the signal the
    // host's pool stores, then copies the rows.
    void hand_off() { handoff_on_ = true; }
    RowsHandoff rows_handoff(size_t bytes) override {
        if (!handoff_on_) return {};
        handoff_buf_.assign(bytes / sizeof(float) + 1, std::nanf(""));  // the host writes every value it hands over
        return {handoff_buf_.data(), &handoff_word_, ++handoff_tickets_};
    }
    void handoff_rows(const RowsHandoff &h, Act dst) override {
        EXPECT_TRUE(handoff_on_);
        EXPECT_EQ(h.signal, &handoff_word_);
        while (int32_t(std::atomic_ref<uint32_t>(handoff_word_).load(std::memory_order_acquire) - h.ticket) < 0)
            std::this_thread::yield();
        upload(h.host, dst);
    }
    // GPU arithmetic: expert_ffn computes as expert_ffn_host does, so the hybrid split (decode_hybrid.h) applies.
    void gpu_arithmetic() { gpu_arith_ = true; }
    bool host_computes_like(const ExpertWeights &w, int64_t) const override {
        return gpu_arith_ && mmvq_host_supported(w.gate->type) && mmvq_host_supported(w.up->type) &&
               mmvq_host_supported(w.down->type);
    }
    // Mapped misses (Backend::maps_host_experts, with GPU arithmetic): decode-sized passes route here without the
    // strata layer's grouping, each (token, expert) pair from the slot this backend's own fills put the expert in, or
    // from the file, as the CUDA backend's table does; the combine as the CPU's.
    void map_misses() { mapped_ = true; }
    bool maps_host_experts(const ExpertWeights &) const override { return mapped_; }
    ExpertSrc mapped_expert(const ExpertWeights &w, int32_t e) const override {
        EXPECT_TRUE(mapped_);
        return {w.gate->expert_host(e), w.up->expert_host(e), w.down->expert_host(e)};
    }
    bool device_routing_applies(const ExpertWeights &w, int64_t n_tokens) const override {
        return mapped_ && n_tokens <= 8 && host_computes_like(w, 1);
    }
    void experts_device_routed(const ExpertWeights &w, Act x, int64_t k, const int32_t *ids, const float *weights,
                               Act out, const MoeTail &tail) override {
        const int64_t T = x.rows, E = x.cols, n_ff = w.gate->ne[1], M = T * k;
        Act ys = cpu_->alloc(M, E);
        std::vector<int32_t> yrow(static_cast<size_t>(M)), widx(static_cast<size_t>(M));
        auto mat = [](const Weight &m, const void *data, int64_t kk, int64_t n) {
            return HostMatrix{m.type, static_cast<const uint8_t *>(data), m.row_bytes, kk, n};
        };
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++) {
                const int64_t i = t * k + j;
                const int32_t e = ids[i];
                const auto at = where_.find({w.il, e});
                ExpertSrc src;
                if (at != where_.end()) {
                    EXPECT_EQ(lent_.count(at->second), 0u);
                    src = expert_slot(w, at->second);
                    reads_.from_slots++;
                } else {
                    src = mapped_expert(w, e);
                    reads_.from_host++;
                    reads_.host_bytes += w.expert_bytes();
                }
                expert_ffn_host(mat(*w.gate, src.gate, E, n_ff), mat(*w.up, src.up, E, n_ff),
                                mat(*w.down, src.down, n_ff, E), x.row(t), ys.row(i));
                int64_t r = 0;  // the pair's rank among the token's by expert id
                for (int64_t j2 = 0; j2 < k; j2++) r += ids[t * k + j2] < e;
                yrow[size_t(t * k + r)] = int32_t(i);
                widx[size_t(t * k + r)] = int32_t(i);
            }
        cpu_->moe_combine(ys, yrow, widx, weights, k, out);
        moe_tail(x, out, tail);
    }
    MappedReads mapped_reads() const override { return reads_; }
    uint64_t grouped_mapped() const { return grouped_mapped_; }
    // A loan's slots are scribbled over, as a pass's scratch would: an expert read from one would show in the logits.
    void begin_loan(const std::vector<int32_t> &slots) override {
        EXPECT_TRUE(lent_.empty());
        for (const int32_t s : slots) {
            unown(s);
            lent_.insert(s);
            std::memset(memory_.data() + size_t(s) * slot_bytes_, 0x5a, slot_bytes_);
        }
        loans_++;
    }
    void end_loan() override { lent_.clear(); }
    uint64_t loans() const { return loans_; }
    void moe_combine(Act ys, const std::vector<int32_t> &yrow, const std::vector<int32_t> &widx, const float *weights,
                     int64_t k, Act out) override {
        cpu_->moe_combine(ys, yrow, widx, weights, k, out);
    }
    void shared_expert_add(Act x, const Weight &gate, Act y, Act out) override {
        cpu_->shared_expert_add(x, gate, y, out);
    }
    uint64_t filled() const { return filled_; }
    uint64_t ahead_fills() const { return ahead_fills_; }
    // Where each MoE layer's shared expert began, by the schedule's regions: before the layer's routed experts
    // (after its routing) or after them.
    void region_begin(const char *name) override {
        const std::string n = name;
        if (n == "route") {
            layer_experts_ = false, layer_shared_ = false;
        } else if (n == "experts") {
            layer_experts_ = true;
        } else if (n == "shared_expert" && !layer_shared_) {
            layer_shared_ = true;
            (layer_experts_ ? shared_after_ : shared_before_)++;
        }
    }
    uint64_t shared_before() const { return shared_before_; }
    uint64_t shared_after() const { return shared_after_; }
    // Device marks as a counter, one millisecond from each to the next (off unless asked for: the hybrid split
    // would time its paths by them).
    void fake_marks() { fake_marks_ = true; }
    // start_rates_gbs reports this bus rate (0: not measured, as the CPU's)
    void set_bus_rate(double gbs) { bus_gbs_ = gbs; }
    std::pair<double, double> start_rates_gbs() override { return {0.0, bus_gbs_}; }
    uint64_t mark_device() override { return fake_marks_ ? ++marks_ : 0; }
    double device_ms(uint64_t a, uint64_t b) override {
        return fake_marks_ && a && b && a <= b && b <= marks_ ? double(b - a) : -1.0;
    }

  private:
    void unown(int32_t slot) {
        if (owner_[size_t(slot)].first >= 0) where_.erase(owner_[size_t(slot)]);
        owner_[size_t(slot)] = {-1, -1};
    }
    bool mapped_ = false;
    std::vector<std::pair<int64_t, int32_t>> owner_;  // per slot: (layer, expert), -1: none
    std::map<std::pair<int64_t, int32_t>, int32_t> where_;
    MappedReads reads_;
    uint64_t grouped_mapped_ = 0;
    bool gpu_arith_ = false;
    bool handoff_on_ = false;
    std::vector<float> handoff_buf_;
    alignas(64) uint32_t handoff_word_ = 0;
    uint32_t handoff_tickets_ = 0;
    bool fake_marks_ = false;
    uint64_t marks_ = 0;
    double bus_gbs_ = 0;
    std::unique_ptr<Backend> cpu_;
    uint64_t budget_;
    std::vector<ExpertSlotLayout> layouts_;
    size_t slot_bytes_ = 0;
    std::vector<uint8_t> memory_;
    uint64_t filled_ = 0, ahead_fills_ = 0;
    bool layer_experts_ = false, layer_shared_ = false;
    uint64_t shared_before_ = 0, shared_after_ = 0;
    std::set<int32_t> lent_;
    uint64_t loans_ = 0;
};

// A preset's name, or with "-mixed" after it: the experts' down matrices of some layers Q6_K (two expert sizes, so
// two slot classes: placement.h).
std::string model_path(const std::string &name) {
    const std::string mixed = "-mixed";
    const bool is_mixed =
        name.size() > mixed.size() && name.compare(name.size() - mixed.size(), mixed.size(), mixed) == 0;
    SynthOptions o;
    o.preset = is_mixed ? name.substr(0, name.size() - mixed.size()) : name;
    if (is_mixed) o.mixed_down_type = DType::Q6_K;
    return test::cached_synth_model("sched-" + name, o);
}

// Logits of a prompt read in chunks of 7 tokens, then four decoded tokens, concatenated.
std::vector<float> run(Engine &e) {
    const int32_t s = e.new_sequence();
    std::vector<int32_t> prompt;
    for (int i = 0; i < 23; i++) prompt.push_back(int32_t((i * 37 + 11) % e.n_vocab()));
    std::vector<std::vector<float>> lg;
    e.decode({{s, prompt, true}}, lg);
    std::vector<float> all = lg[0];
    for (int t = 0; t < 4; t++) {
        e.decode({{s, {int32_t((t * 53 + 5) % e.n_vocab())}, false}}, lg);
        all.insert(all.end(), lg[0].begin(), lg[0].end());
    }
    return all;
}

EngineConfig config(int64_t expert_slots) {
    EngineConfig c;
    c.n_batch = 7;
    c.n_ctx = 64;
    c.expert_slots = expert_slots;
    return c;
}

// run() on host-memory slots: the logits, the engine's counters, and the backend's fills (all, and made ahead).
struct SlotRun {
    std::vector<float> logits;
    ExpertCacheStats stats;
    uint64_t filled = 0, ahead_fills = 0;
    int64_t n_layer = 0;
};
SlotRun run_on_slots(const std::string &path, int64_t slots, SlotPolicy policy = SlotPolicy::Lru) {
    auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
    HostSlotBackend *hb = be.get();
    EngineConfig cfg = config(slots);
    cfg.expert_cache_policy = policy;
    auto e = std::make_unique<Engine>(load_model(path), std::move(be), cfg);
    SlotRun r;
    r.logits = run(*e);
    r.stats = e->expert_stats();
    r.filled = hb->filled();
    r.ahead_fills = hb->ahead_fills();
    r.n_layer = e->hparams().n_layer;
    return r;
}

class MoeScheduleSlots : public ::testing::TestWithParam<const char *> {};

}  // namespace

TEST_P(MoeScheduleSlots, SlotsGiveTheBitsOfExpertsReadInPlace) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    EXPECT_EQ(in_place->expert_stats().expert_cache_misses, 0u);
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    // Every expert in a slot; the fewest a layer needs (k); fewer than a chunk's experts, so they come in sets.
    for (int64_t slots : {int64_t(0), k, int64_t(1), int64_t(2), n_expert / 2}) {
        auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
        HostSlotBackend *hb = be.get();
        auto e = std::make_unique<Engine>(load_model(path), std::move(be), config(slots));
        const std::vector<float> got = run(*e);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << slots << " slots";
        const ExpertCacheStats st = e->expert_stats();
        if (slots == 0) {
            EXPECT_EQ(st.n_slots, st.n_experts);  // all resident: filled once at start
            EXPECT_EQ(st.expert_cache_misses, 0u);
            EXPECT_EQ(hb->filled(), uint64_t(st.n_experts));
        } else {
            EXPECT_EQ(st.n_slots, slots);
            EXPECT_GT(st.expert_cache_misses, 0u);
            EXPECT_EQ(hb->filled(), st.expert_cache_misses);
            EXPECT_GT(st.bytes_streamed, 0u);
        }
    }
}

// The streamed schedule (misses filled ahead while resident and earlier experts compute, STRATA_PREFILL_STREAM_AHEAD)
// gives the bits of experts read in place, for every lookahead and slot count, and fills each miss once.
TEST_P(MoeScheduleSlots, StreamedScheduleGivesTheSameBits) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    for (const char *ahead : {"1", "2", "3", "8", "64"}) {
        ::setenv("STRATA_PREFILL_STREAM_AHEAD", ahead, 1);
        for (int64_t slots : {int64_t(2), k, k + 1, n_expert / 2, n_expert - 1}) {
            const SlotRun r = run_on_slots(path, slots);
            ASSERT_EQ(r.logits.size(), ref.size());
            EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0)
                << "ahead " << ahead << ", " << slots << " slots";
            EXPECT_EQ(r.filled, r.stats.expert_cache_misses);
            EXPECT_GT(r.ahead_fills, 0u) << "ahead " << ahead << ", " << slots << " slots";
        }
    }
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// The LFU expert cache (--expert-cache-policy lfu) gives the bits of experts read in place, alone, with the streamed
// schedule and with next-layer prefetch, on every slot count; its fills are its misses.
TEST_P(MoeScheduleSlots, LfuPolicyChangesNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    for (const char *mode : {"alone", "streamed", "prefetch"}) {
        if (std::strcmp(mode, "streamed") == 0) ::setenv("STRATA_PREFILL_STREAM_AHEAD", "4", 1);
        if (std::strcmp(mode, "prefetch") == 0) ::setenv("STRATA_DECODE_PREFETCH", "1", 1);
        for (int64_t slots : {int64_t(2), k, k + 1, n_expert / 2, n_expert - 1}) {
            const SlotRun r = run_on_slots(path, slots, SlotPolicy::Lfu);
            ASSERT_EQ(r.logits.size(), ref.size());
            EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0) << mode << ", " << slots << " slots";
            EXPECT_EQ(r.filled, r.stats.expert_cache_misses) << mode << ", " << slots << " slots";
            EXPECT_GT(r.stats.expert_cache_misses, 0u);
        }
        ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
        ::unsetenv("STRATA_DECODE_PREFETCH");
    }
}

// Next-layer prefetch (STRATA_DECODE_PREFETCH=1): the predicted experts filled ahead and pinned change no bit, with
// and without the streamed schedule; the prediction is scored on the decode steps.
TEST_P(MoeScheduleSlots, PrefetchChangesNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    ::setenv("STRATA_DECODE_PREFETCH", "1", 1);
    uint64_t prefetched = 0;
    for (const char *ahead : {"0", "4"}) {
        ::setenv("STRATA_PREFILL_STREAM_AHEAD", ahead, 1);
        for (int64_t slots : {int64_t(2), k + 1, n_expert / 2, n_expert - 1}) {
            const SlotRun r = run_on_slots(path, slots);
            ASSERT_EQ(r.logits.size(), ref.size());
            EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0)
                << "ahead " << ahead << ", " << slots << " slots";
            const ExpertCacheStats &st = r.stats;
            EXPECT_EQ(r.filled, st.expert_cache_misses);
            // every pass is decode-sized here (chunks of 7, then single tokens: 27 tokens), and every MoE layer but
            // the first has a prediction: picks = 27 * (layers - 1) * k
            EXPECT_EQ(st.prefetch.picks, uint64_t(27 * (r.n_layer - 1) * k));
            EXPECT_LE(st.prefetch.predicted, st.prefetch.picks);
            prefetched += st.prefetch.prefetched;
        }
    }
    EXPECT_GT(prefetched, 0u);
    ::unsetenv("STRATA_DECODE_PREFETCH");
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// The full schedule (STRATA_PREFILL_SCHEDULE=full): the next layer's missing experts filled ahead and pinned until
// it routes change no bit, for every lookahead, ring and slot count; every fill is still a miss, and some are made
// ahead for the next layer, some of which it then routes to; the same for predicted (only the experts the next
// router's top-k on this layer's input names); routed makes none (auto: whichever its rule picks for these chunks).
TEST_P(MoeScheduleSlots, FullScheduleChangesNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    for (const char *schedule : {"full", "routed", "auto", "predicted"}) {
        ::setenv("STRATA_PREFILL_SCHEDULE", schedule, 1);
        uint64_t streamed_next = 0, used = 0;
        for (const char *ring : {"", "1", "1000"}) {
            if (*ring) ::setenv("STRATA_PREFILL_RING", ring, 1);
            for (const char *ahead : {"1", "4", "64"}) {
                ::setenv("STRATA_PREFILL_STREAM_AHEAD", ahead, 1);
                for (int64_t slots : {int64_t(4), k + 1, n_expert / 2, n_expert - 1}) {
                    const SlotRun r = run_on_slots(path, slots);
                    ASSERT_EQ(r.logits.size(), ref.size());
                    EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0)
                        << schedule << ", ring " << ring << ", ahead " << ahead << ", " << slots << " slots";
                    EXPECT_EQ(r.filled, r.stats.expert_cache_misses)
                        << schedule << ", ring " << ring << ", ahead " << ahead << ", " << slots << " slots";
                    streamed_next += r.stats.prefetch.streamed_next;
                    used += r.stats.prefetch.streamed_next_used;
                    EXPECT_LE(r.stats.prefetch.streamed_next_used, r.stats.prefetch.streamed_next);
                }
            }
            ::unsetenv("STRATA_PREFILL_RING");
        }
        if (std::strcmp(schedule, "full") == 0 || std::strcmp(schedule, "predicted") == 0) {
            EXPECT_GT(streamed_next, 0u) << schedule;
            EXPECT_GT(used, 0u) << schedule;
        } else if (std::strcmp(schedule, "routed") == 0) {
            EXPECT_EQ(streamed_next, 0u);
        }
    }
    ::unsetenv("STRATA_PREFILL_SCHEDULE");
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// The scan fence (STRATA_PREFILL_SCAN_FENCE) moves a sweep's fills to earlier layers' slots: no bit changes under
// either schedule, every fill is a miss.
TEST_P(MoeScheduleSlots, ScanFenceChangesNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    for (const char *fence : {"1", "0"})
        for (const char *schedule : {"full", "routed"})
            for (const char *ahead : {"1", "4"}) {
                ::setenv("STRATA_PREFILL_SCAN_FENCE", fence, 1);
                ::setenv("STRATA_PREFILL_SCHEDULE", schedule, 1);
                ::setenv("STRATA_PREFILL_STREAM_AHEAD", ahead, 1);
                for (int64_t slots : {int64_t(4), k + 1, n_expert / 2, n_expert - 1}) {
                    const SlotRun r = run_on_slots(path, slots);
                    const std::string what = std::string("fence ") + fence + ", " + schedule + ", ahead " + ahead +
                                             ", " + std::to_string(slots) + " slots";
                    ASSERT_EQ(r.logits.size(), ref.size()) << what;
                    EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0) << what;
                    EXPECT_EQ(r.filled, r.stats.expert_cache_misses) << what;
                }
            }
    ::unsetenv("STRATA_PREFILL_SCAN_FENCE");
    ::unsetenv("STRATA_PREFILL_SCHEDULE");
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// A 150-token prompt in passes of 128 and 22 tokens, then three single tokens, on 6 slots of a test backend with
// marks, with the environment variable `var` set to `value` while the engine is made: the logits and the engine's
// counters.
std::pair<std::vector<float>, ExpertCacheStats> timed_run(const std::string &path, const char *var,
                                                         const char *value) {
    ::setenv(var, value, 1);
    auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
    be->fake_marks();
    EngineConfig cfg;
    cfg.n_batch = 128;
    cfg.n_ctx = 256;
    cfg.expert_slots = 6;
    auto e = std::make_unique<Engine>(load_model(path), std::move(be), cfg);
    ::unsetenv(var);
    const int32_t s = e->new_sequence();
    std::vector<int32_t> prompt;
    for (int i = 0; i < 150; i++) prompt.push_back(int32_t((i * 41 + 3) % e->n_vocab()));
    std::vector<std::vector<float>> lg;
    e->decode({{s, prompt, true}}, lg);
    std::vector<float> all = lg[0];
    for (int t = 0; t < 3; t++) {
        e->decode({{s, {int32_t((t * 7 + 1) % e->n_vocab())}, false}}, lg);
        all.insert(all.end(), lg[0].begin(), lg[0].end());
    }
    return {all, e->expert_stats()};
}

// With `var` on, every phase of every MoE layer of the passes of `kind` is timed, `passes` of them of `tokens` in all,
// and no bit changes; off nothing is. Device spans are read from the backend's marks (one millisecond from each mark
// to the next, so each phase's device time is its count of spans).
void check_timing(const std::string &path, const char *var, TimingKind kind, uint64_t passes, uint64_t tokens) {
    auto go = [&](const char *value) {
        auto [logits, st] = timed_run(path, var, value);
        EXPECT_TRUE((kind == TimingKind::Prompt ? st.decode_timing : st.timing).empty())
            << "the other kind was not asked for";
        return std::make_pair(logits, kind == TimingKind::Prompt ? st.timing : st.decode_timing);
    };
    const auto [off, none] = go("0");
    const auto [on, layers] = go("1");
    ASSERT_EQ(on.size(), off.size());
    EXPECT_EQ(std::memcmp(on.data(), off.data(), off.size() * 4), 0);
    EXPECT_TRUE(none.empty());
    int timed = 0;
    bool first = true;
    uint64_t uploads = 0;
    for (const LayerTiming &L : layers) {
        if (L.layer < 0) continue;
        timed++;
        EXPECT_EQ(L.passes, passes) << L.layer;
        EXPECT_EQ(L.tokens, tokens) << L.layer;
        EXPECT_EQ(L.device_lost, 0u) << L.layer;
        const PhaseTime &up = L.phase[size_t(TimingPhase::Upload)], &wait = L.phase[size_t(TimingPhase::CopyWait)];
        for (int p = 0; p < k_timing_phases; p++) {
            const PhaseTime &t = L.phase[size_t(p)];
            const TimingPhase ph = TimingPhase(p);
            const std::string what = std::to_string(L.layer) + " " + timing_phase_name(ph);
            if (ph == TimingPhase::Upload || ph == TimingPhase::CopyWait) {
                // a streamed layer's batches: each its fills issued, then the wait for them
                EXPECT_EQ(t.calls, up.calls) << what;
            } else if (ph == TimingPhase::Experts) {
                // the gathered rows, each streamed batch's compute, and the layer's end (the next layer's fills
                // issued ahead, where the schedule does); one pass where a layer streams
                EXPECT_EQ(t.calls, passes + wait.calls + (wait.calls ? 1 : 0)) << what;
            } else {
                const bool mixer = ph == TimingPhase::Mixer;
                EXPECT_EQ(t.calls, mixer && first ? 0 : passes) << what;  // a pass's first MoE layer has no mixer
            }
            EXPECT_EQ(t.device_ms, double(t.calls)) << what;
            EXPECT_GE(t.host_ms, 0.0);
        }
        uploads += up.calls;
        first = false;
    }
    EXPECT_GT(timed, 1);
    // the prompt pass streams its misses through 6 slots; decode-sized passes stream nothing (moe_schedule.h)
    if (kind == TimingKind::Prompt) {
        EXPECT_GT(uploads, 0u);
    } else {
        EXPECT_EQ(uploads, 0u);
    }
    const std::string table = timing_table(layers, kind);
    EXPECT_NE(table.find("| experts |"), std::string::npos);
    EXPECT_NE(table.find("| copy_wait |"), std::string::npos);
    EXPECT_NE(table.find(kind == TimingKind::Prompt ? "prompt passes" : "decode passes"), std::string::npos);
}

// STRATA_PREFILL_TIMING=1: the 128-token pass only (decode-sized ones are not prompt passes).
TEST_P(MoeScheduleSlots, PrefillTimingCountsEveryPhaseAndChangesNoBit) {
    check_timing(model_path(GetParam()), "STRATA_PREFILL_TIMING", TimingKind::Prompt, 1, 128);
}

// STRATA_DECODE_TIMING=1: the decode-sized passes only, the prompt's 22-token tail and the three single tokens.
TEST_P(MoeScheduleSlots, DecodeTimingCountsEveryPhaseAndChangesNoBit) {
    check_timing(model_path(GetParam()), "STRATA_DECODE_TIMING", TimingKind::Decode, 4, 22 + 3);
}

// The hybrid split (decode_hybrid.h) on a backend that computes experts in the GPU's arithmetic on the host: the
// misses it gives the host give the bits of the same misses copied in and computed by the backend, for every share,
// the fitted model and the rule before it, the decode overlap on and off, the handoff of the host's rows and the
// early fills (STRATA_DECODE_HANDOFF, STRATA_DECODE_EARLY_FILLS) on and off, at two cache sizes; the host takes some
// wherever the share is above zero, and none with the split off. Runs the split's grouping (the host's rows last),
// the rows' upload and the combine in CPU-only CI; the GPU suite checks the same against the CUDA kernels.
TEST_P(MoeScheduleSlots, HybridSplitGivesTheBitsOfTheBackendAlone) {
    const std::string path = model_path(GetParam());
    auto engine = [&](int64_t slots, double share) {
        auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
        be->gpu_arithmetic();
        be->fake_marks();
        be->hand_off();
        EngineConfig cfg = config(slots);
        cfg.cpu_share = share;
        cfg.cpu_threads = 2;
        return std::make_unique<Engine>(load_model(path), std::move(be), cfg);
    };
    const int64_t n_expert = engine(0, 0.0)->hparams().n_expert, k = engine(0, 0.0)->hparams().n_expert_used;
    for (int64_t slots : {k + 1, n_expert / 2}) {
        ::setenv("STRATA_DECODE_CPU", "0", 1);
        const std::vector<float> ref = run(*engine(slots, -1.0));
        ::unsetenv("STRATA_DECODE_CPU");
        // overlap, fit, handoff, early fills
        const char *cases[7][4] = {{"1", "1", "1", "0"}, {"0", "1", "1", "0"}, {"1", "0", "1", "0"},
                                   {"0", "0", "1", "0"}, {"1", "1", "0", "0"}, {"1", "1", "1", "1"},
                                   {"1", "1", "0", "1"}};
        for (double share : {1.0, 0.5, -1.0, 0.0})
            for (const auto &c : cases) {
                if (share >= 0.0 && std::strcmp(c[1], "0") == 0) continue;  // a fixed share takes no model
                ::setenv("STRATA_DECODE_OVERLAP", c[0], 1);
                ::setenv("STRATA_DECODE_SPLIT_FIT", c[1], 1);
                ::setenv("STRATA_DECODE_HANDOFF", c[2], 1);
                ::setenv("STRATA_DECODE_EARLY_FILLS", c[3], 1);
                auto e = engine(slots, share);
                ::unsetenv("STRATA_DECODE_OVERLAP");
                ::unsetenv("STRATA_DECODE_SPLIT_FIT");
                ::unsetenv("STRATA_DECODE_HANDOFF");
                ::unsetenv("STRATA_DECODE_EARLY_FILLS");
                const std::vector<float> got = run(*e);
                const std::string what = std::to_string(slots) + " slots, share " + std::to_string(share) +
                                         ", overlap " + c[0] + ", fit " + c[1] + ", handoff " + c[2] +
                                         ", early fills " + c[3];
                ASSERT_EQ(got.size(), ref.size()) << what;
                EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
                const ExpertCacheStats st = e->expert_stats();
                EXPECT_EQ(st.hybrid_on, share != 0.0) << what;
                if (share > 0.0) {
                    EXPECT_GT(st.hybrid.host_experts, 0u) << what;
                }
                if (share == 0.0) {
                    EXPECT_EQ(st.hybrid.host_experts, 0u) << what;
                }
                // the handoff where the overlap and its switch are on and the pool has a worker
                const bool handoff = std::strcmp(c[0], "1") == 0 && std::strcmp(c[2], "1") == 0;
                if (!handoff) {
                    EXPECT_EQ(st.hybrid.handoffs, 0u) << what;
                }
                if (handoff && share > 0.0 && e->expert_stats().hybrid.host_experts > 0 && hardware_threads() >= 2) {
                    EXPECT_GT(st.hybrid.handoffs, 0u) << what;
                }
                // early fills where the overlap and their switch are on and the device has part of a split layer
                // (at share 1 the host takes every miss, and the few slots seldom hold a routed expert)
                const bool early = std::strcmp(c[0], "1") == 0 && std::strcmp(c[3], "1") == 0;
                if (early && share != 0.0 && share != 1.0) {
                    EXPECT_GT(st.hybrid.early_fills, 0u) << what;
                }
                if (!early) {
                    EXPECT_EQ(st.hybrid.early_fills, 0u) << what;
                }
            }
    }
}

// Mapped misses (Backend::maps_host_experts) on a backend that computes in the GPU's arithmetic and routes
// decode-sized passes itself from its own record of its fills: the bits of every miss copied in, with the split off
// (the device alone: nothing grouped by the strata layer, nothing filled) and on (its device part's misses read in
// place), at two cache sizes, through a prompt in one pass (fills), decoding, another sequence's prompt (evictions)
// and decoding again; with the split on, every decode pass split (its device part copying or reading in place) or
// each alone or split as the decode mode chooses (decode_mode.h). The reads are counted, as mapped misses in the
// engine's figures; under LFU the misses whose requests outnumber the cache's weakest slot are admitted (filled for
// later passes), the bits unchanged.
TEST_P(MoeScheduleSlots, MappedMissesGiveTheBitsOfMissesCopiedIn) {
    const std::string path = model_path(GetParam());
    struct Made {
        std::unique_ptr<Engine> e;
        HostSlotBackend *be;
    };
    auto engine = [&](int64_t slots, double share, bool mapped, SlotPolicy policy = SlotPolicy::Lru) {
        auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
        HostSlotBackend *hb = be.get();
        be->gpu_arithmetic();
        be->fake_marks();
        if (mapped) be->map_misses();
        EngineConfig cfg = config(slots);
        cfg.n_batch = 32;
        cfg.n_seq_max = 2;
        cfg.cpu_share = share;
        cfg.cpu_threads = 2;
        cfg.expert_cache_policy = policy;
        return Made{std::make_unique<Engine>(load_model(path), std::move(be), cfg), hb};
    };
    auto script = [](Engine &e) {
        const int32_t a = e.new_sequence(), b = e.new_sequence();
        std::vector<std::vector<float>> lg;
        std::vector<float> all;
        auto keep = [&] { all.insert(all.end(), lg[0].begin(), lg[0].end()); };
        std::vector<int32_t> pa, pb;
        for (int i = 0; i < 23; i++) pa.push_back(int32_t((i * 37 + 11) % e.n_vocab()));
        for (int i = 0; i < 19; i++) pb.push_back(int32_t((i * 29 + 3) % e.n_vocab()));
        e.decode({{a, pa, false}}, lg);
        keep();
        for (int t = 0; t < 3; t++) {
            e.decode({{a, {int32_t((t * 53 + 5) % e.n_vocab())}, false}}, lg);
            keep();
        }
        e.decode({{b, pb, false}}, lg);
        keep();
        for (int t = 0; t < 3; t++) {
            e.decode({{a, {int32_t((t * 41 + 7) % e.n_vocab())}, false}}, lg);
            keep();
        }
        return all;
    };
    const Made probe = engine(0, 0.0, false);
    const int64_t n_expert = probe.e->hparams().n_expert, k = probe.e->hparams().n_expert_used;
    for (int64_t slots : {k + 1, n_expert / 2}) {
        const std::vector<float> ref = script(*engine(slots, 0.0, false).e);
        for (double share : {0.0, 0.5, -1.0})
            for (const char *split : {"choose", "copy", "mapped"}) {
                // choose: each decode pass alone or split by measured time (the default); copy: every pass split,
                // its device part copying its misses in; mapped: reading them in place
                if (share == 0.0 && std::strcmp(split, "choose") != 0) continue;  // no split to choose
                ::setenv("STRATA_DECODE_CHOOSE", std::strcmp(split, "choose") == 0 ? "1" : "0", 1);
                ::setenv("STRATA_DECODE_SPLIT_MAPPED", std::strcmp(split, "mapped") == 0 ? "1" : "0", 1);
                const Made m = engine(slots, share, true);
                ::unsetenv("STRATA_DECODE_CHOOSE");
                ::unsetenv("STRATA_DECODE_SPLIT_MAPPED");
                const uint64_t filled0 = m.be->filled();
                const std::vector<float> got = script(*m.e);
                const std::string what =
                    std::to_string(slots) + " slots, share " + std::to_string(share) + ", split " + split;
                ASSERT_EQ(got.size(), ref.size()) << what;
                EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
                const ExpertCacheStats st = m.e->expert_stats();
                EXPECT_GT(m.be->filled(), filled0) << what << ": the prompts fill slots";
                const DecodeModeStats &dm = st.decode_modes;
                if (share == 0.0) {
                    EXPECT_FALSE(st.hybrid_on) << what;
                    EXPECT_GT(st.mapped_misses, 0u) << what;
                    EXPECT_GT(m.be->mapped_reads().from_slots, 0u) << what << ": decoding hits what the prompts left";
                    EXPECT_EQ(m.be->grouped_mapped(), 0u) << what;
                    EXPECT_EQ(dm.alone + dm.split, 0u) << what;
                } else if (std::strcmp(split, "choose") == 0) {
                    // six decoding passes of one token: a run of four split, then alone
                    EXPECT_TRUE(st.hybrid_on) << what;
                    EXPECT_EQ(dm.split, 4u) << what;
                    EXPECT_EQ(dm.alone, 2u) << what;
                    EXPECT_EQ(dm.switches, 1u) << what;
                    EXPECT_GT(m.be->mapped_reads().from_host, 0u) << what << ": the passes alone read in place";
                    EXPECT_EQ(m.be->grouped_mapped(), 0u) << what << ": the split's device part copies";
                } else {
                    EXPECT_TRUE(st.hybrid_on) << what;
                    EXPECT_EQ(dm.alone + dm.split, 0u) << what;
                    EXPECT_EQ(m.be->mapped_reads().from_host, 0u) << what << ": every pass split";
                    if (std::strcmp(split, "mapped") == 0) {
                        EXPECT_GT(m.be->grouped_mapped(), 0u) << what << ": the split's device part read in place";
                    } else {
                        EXPECT_EQ(m.be->grouped_mapped(), 0u) << what;
                        EXPECT_EQ(st.mapped_misses, 0u) << what;
                    }
                }
                EXPECT_EQ(st.mapped_admitted, 0u) << what << ": LRU admits nothing";
            }
    }
    // Admission under LFU (STRATA_DECODE_ADMIT): one token decoded again and again routes alike, so its experts'
    // requests soon outnumber those of what the prompt left, and the split's device part fills them for later
    // passes; the bits stay those of every miss copied in; =0 fills nothing while decoding.
    auto repeat = [&](Engine &e) {
        const int32_t a = e.new_sequence();
        std::vector<std::vector<float>> lg;
        std::vector<int32_t> pa;
        for (int i = 0; i < 23; i++) pa.push_back(int32_t((i * 37 + 11) % e.n_vocab()));
        e.decode({{a, pa, false}}, lg);
        std::vector<float> all = lg[0];
        for (int t = 0; t < 12; t++) {
            e.decode({{a, {7}, false}}, lg);
            all.insert(all.end(), lg[0].begin(), lg[0].end());
        }
        return all;
    };
    const int64_t slots = n_expert / 2;
    const std::vector<float> ref = repeat(*engine(slots, 0.0, false, SlotPolicy::Lfu).e);
    for (const char *admit : {"1", "0"}) {
        ::setenv("STRATA_DECODE_ADMIT", admit, 1);
        ::setenv("STRATA_DECODE_CHOOSE", "0", 1);
        ::setenv("STRATA_DECODE_SPLIT_MAPPED", "1", 1);  // admission: of what the split's device part reads in place
        const Made m = engine(slots, 0.5, true, SlotPolicy::Lfu);
        ::unsetenv("STRATA_DECODE_ADMIT");
        ::unsetenv("STRATA_DECODE_CHOOSE");
        ::unsetenv("STRATA_DECODE_SPLIT_MAPPED");
        const std::vector<float> got = repeat(*m.e);
        ASSERT_EQ(got.size(), ref.size()) << admit;
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << "STRATA_DECODE_ADMIT=" << admit;
        const ExpertCacheStats st = m.e->expert_stats();
        EXPECT_GT(st.mapped_misses, 0u) << admit;
        if (std::strcmp(admit, "1") == 0) {
            EXPECT_GT(st.mapped_admitted, 0u);
        } else {
            EXPECT_EQ(st.mapped_admitted, 0u);
        }
    }
    // Passes by the device alone (no split: every decoding pass reads its misses in place and fills nothing during
    // it): their routing comes to the host with the pass (Backend::ids_after_pass), and at the next pass's start the
    // misses requested far more than the weakest slot are filled (STRATA_DECODE_ADMIT_ALONE); the bits stay those of
    // every miss copied in, and later passes find in slots what they read from the host before.
    // Under LFU and expected next use alike.
    for (SlotPolicy policy : {SlotPolicy::Lfu, SlotPolicy::Next}) {
        const std::string name = slot_policy_name(policy);
        uint64_t from_slots[2] = {0, 0};
        for (const char *alone : {"1", "0"}) {
            ::setenv("STRATA_DECODE_ADMIT_ALONE", alone, 1);
            const Made m = engine(slots, 0.0, true, policy);
            ::unsetenv("STRATA_DECODE_ADMIT_ALONE");
            const std::vector<float> got = repeat(*m.e);
            ASSERT_EQ(got.size(), ref.size()) << alone;
            EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0)
                << name << ", STRATA_DECODE_ADMIT_ALONE=" << alone;
            const ExpertCacheStats st = m.e->expert_stats();
            EXPECT_FALSE(st.hybrid_on);
            EXPECT_GT(st.mapped_misses, 0u) << name << alone;
            from_slots[alone[0] == '1'] = m.be->mapped_reads().from_slots;
            if (alone[0] == '1') {
                EXPECT_GT(st.mapped_admitted, 0u) << name;
            } else {
                EXPECT_EQ(st.mapped_admitted, 0u) << name;
            }
        }
        EXPECT_GT(from_slots[1], from_slots[0]) << name << ": the admitted experts are read from slots afterwards";
    }
    // LRU has no counts to admit by
    const Made lru = engine(slots, 0.0, true, SlotPolicy::Lru);
    EXPECT_EQ(std::memcmp(repeat(*lru.e).data(), ref.data(), ref.size() * 4), 0);
    EXPECT_EQ(lru.e->expert_stats().mapped_admitted, 0u);
}

// The decode overlap (moe_schedule.h: the shared expert first, its fills on the copy stream) gives the bits of
// experts read in place whether on, off, or with its fills on the compute stream, at several cache sizes; on, a
// layer with a shared expert fills ahead (the copy stream) in decode-sized passes, off it never does.
TEST_P(MoeScheduleSlots, DecodeOverlapChangesNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    bool shared = false;
    for (const LayerWeights &L : in_place->model().layers) shared = shared || L.gate_shexp.present();
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    ::setenv("STRATA_PREFILL_STREAM_AHEAD", "0", 1);  // the prompt's fills on the compute stream: only decode's ahead
    const char *cases[3][2] = {{"1", "1"}, {"0", "1"}, {"1", "0"}};
    for (const auto &c : cases)
        for (int64_t slots : {k + 1, n_expert / 2, n_expert - 1}) {
            ::setenv("STRATA_DECODE_OVERLAP", c[0], 1);
            ::setenv("STRATA_DECODE_COPY_STREAM", c[1], 1);
            const SlotRun r = run_on_slots(path, slots);
            const std::string what = std::string("overlap ") + c[0] + ", copy stream " + c[1] + ", " +
                                     std::to_string(slots) + " slots";
            ASSERT_EQ(r.logits.size(), ref.size()) << what;
            EXPECT_EQ(std::memcmp(r.logits.data(), ref.data(), ref.size() * 4), 0) << what;
            const bool ahead = shared && std::strcmp(c[0], "1") == 0 && std::strcmp(c[1], "1") == 0;
            if (ahead) {
                EXPECT_GT(r.ahead_fills, 0u) << what;
            } else {
                EXPECT_EQ(r.ahead_fills, 0u) << what;
            }
        }
    ::unsetenv("STRATA_DECODE_OVERLAP");
    ::unsetenv("STRATA_DECODE_COPY_STREAM");
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// Auto takes the full schedule after a layer whose routing reached 90% of its experts (a 23-token prompt in one pass
// reaches every expert of these 8-expert layers) and the predicted one below (2-token passes reach at most 2 k):
// over a prompt it fills ahead exactly what the schedule it takes fills, and the logits stay those of the experts
// read in place.
TEST_P(MoeScheduleSlots, AutoIsFullAfterLayersThatReachedTheirExpertsAndPredictedBelow) {
    const std::string path = model_path(GetParam());
    ::setenv("STRATA_PREFILL_STREAM_AHEAD", "4", 1);  // every pass streamed, so the rule alone decides
    for (bool whole_prompt : {true, false}) {
        EngineConfig cfg = config(0);
        cfg.n_batch = whole_prompt ? 64 : 2;
        auto in_place = make_cpu_engine(path, cfg);
        const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
        ASSERT_LE(2 * k, n_expert * 9 / 10) << "two tokens must not reach 90% of the experts";
        auto prompt_logits = [](Engine &e) {
            std::vector<int32_t> prompt;
            for (int i = 0; i < 23; i++) prompt.push_back(int32_t((i * 37 + 11) % e.n_vocab()));
            std::vector<std::vector<float>> lg;
            e.decode({{e.new_sequence(), prompt, true}}, lg);
            return lg[0];
        };
        const std::vector<float> ref = prompt_logits(*in_place);
        cfg.expert_slots = n_expert;
        auto filled_ahead = [&](const char *schedule) {
            ::setenv("STRATA_PREFILL_SCHEDULE", schedule, 1);
            auto e =
                std::make_unique<Engine>(load_model(path), std::make_unique<HostSlotBackend>(uint64_t(1) << 34), cfg);
            ::unsetenv("STRATA_PREFILL_SCHEDULE");
            const std::vector<float> got = prompt_logits(*e);
            EXPECT_EQ(got.size(), ref.size());
            EXPECT_EQ(std::memcmp(got.data(), ref.data(), std::min(got.size(), ref.size()) * 4), 0)
                << schedule << (whole_prompt ? ", one pass" : ", 2-token passes");
            return e->expert_stats().prefetch.streamed_next;
        };
        const uint64_t a = filled_ahead("auto");
        EXPECT_GT(a, 0u);
        EXPECT_EQ(a, filled_ahead(whole_prompt ? "full" : "predicted"))
            << (whole_prompt ? "one pass" : "2-token passes");
        EXPECT_EQ(filled_ahead("routed"), 0u);
    }
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// Auto's line from the prediction's recall: where the two schedules' costs in the bus's time meet (1 + r - r^2 for
// full, r (2 - q) for predicted), lower the worse the prediction, never below 0.618 (q = 0) nor above 1 (q = 1).
TEST(MoeSchedule, FullShareThresholdIsWhereTheCostsMeet) {
    double before = 2.0;
    for (double q = 1.0; q >= -0.001; q -= 0.05) {
        const double r = full_share_threshold(q);
        EXPECT_NEAR(1.0 + r - r * r, r * (2.0 - q), 1e-12) << q;
        EXPECT_LT(r, before) << q;  // a worse prediction: full from lower shares on
        before = r;
    }
    EXPECT_DOUBLE_EQ(full_share_threshold(1.0), 1.0);
    EXPECT_NEAR(full_share_threshold(0.9), 0.9512, 1e-4);
    EXPECT_NEAR(full_share_threshold(0.0), 0.6180, 1e-4);
    EXPECT_DOUBLE_EQ(full_share_threshold(1.5), 1.0);  // clamped
    // the costs either side: predicted cheaper below the line, full above
    for (double q : {0.3, 0.7, 0.95}) {
        const double r0 = full_share_threshold(q) - 0.02, r1 = full_share_threshold(q) + 0.02;
        ASSERT_LE(r1, 1.0) << q;
        EXPECT_GT(1.0 + r0 - r0 * r0, r0 * (2.0 - q)) << q;
        EXPECT_LT(1.0 + r1 - r1 * r1, r1 * (2.0 - q)) << q;
    }
}

// Auto's costs from measured rates (prefill_cost.h), in units of one expert's copy: with no window and no compute
// full never wins below r = 1 (its extra copies are all cost) and ties at 1; a window that hides full's fills makes it
// win where the prediction misses much; compute that hides every copy leaves only full's evictions; the ring caps
// what either fills ahead.
TEST(PrefillCost, FullWinsWhereTheWindowPaysForItsCopies) {
    NextLayerCost c;
    c.expert_s = 1.0;
    c.missing = 100;
    c.ahead = 1000;
    for (double r : {0.3, 0.68, 0.95}) {
        c.share = r, c.recall = 0.9;
        const ScheduleCost s = next_layer_cost(c);
        EXPECT_NEAR(s.full_s, 100.0 * (1.0 + r * (1.0 - r)), 1e-9) << r;
        EXPECT_NEAR(s.predicted_s, 100.0 * r, 1e-9) << r;  // 90% ahead, 10% after the routing
        EXPECT_FALSE(s.full()) << r;
    }
    c.share = 1.0;
    EXPECT_TRUE(next_layer_cost(c).full());  // a tie: full needs no next-layer router
    // the window hides every fill ahead: full's cost is its evictions, predicted's the experts it missed
    c.window_s = 200.0, c.share = 0.7;
    c.recall = 0.5;
    EXPECT_NEAR(next_layer_cost(c).full_s, 100.0 * 0.3 * 0.7, 1e-9);
    EXPECT_NEAR(next_layer_cost(c).predicted_s, 0.5 * 70.0, 1e-9);
    EXPECT_TRUE(next_layer_cost(c).full());
    c.recall = 0.95;
    EXPECT_FALSE(next_layer_cost(c).full());  // 3.5 late copies against 21 evictions
    // compute longer than any copy: full only adds its evictions; at r = 1 a tie
    c.window_s = 0.0, c.compute_s = 1000.0, c.recall = 0.5;
    EXPECT_NEAR(next_layer_cost(c).full_s, 1000.0 + 21.0, 1e-9);
    EXPECT_NEAR(next_layer_cost(c).predicted_s, 1000.0, 1e-9);
    c.share = 1.0;
    EXPECT_TRUE(next_layer_cost(c).full());
    // the ring: 40 filled ahead at most; full's other 60 routed experts come after the routing
    c.compute_s = 0.0, c.ahead = 40, c.share = 1.0, c.recall = 0.9;
    EXPECT_NEAR(next_layer_cost(c).full_s, 100.0, 1e-9);
    EXPECT_NEAR(next_layer_cost(c).predicted_s, 100.0, 1e-9);
    c.window_s = 30.0;
    EXPECT_NEAR(next_layer_cost(c).full_s, 10.0 + 60.0, 1e-9);
    EXPECT_NEAR(next_layer_cost(c).predicted_s, 10.0 + 60.0, 1e-9);
    // nothing missing: nothing to copy, the compute alone
    c.missing = 0, c.compute_s = 5.0;
    EXPECT_DOUBLE_EQ(next_layer_cost(c).full_s, 5.0);
    EXPECT_DOUBLE_EQ(next_layer_cost(c).predicted_s, 5.0);
}

// Auto by the measured rates on a partial cache (a bus rate reported at start, prompt passes of 70 tokens timed by
// the model's samples): the layers after the first sampled pass are chosen by the costs, and the logits are those of
// the experts read in place, with the model on and off (STRATA_PREFILL_COST=0: none chosen so).
TEST_P(MoeScheduleSlots, AutoByMeasuredRatesChangesNoBit) {
    const std::string path = model_path(GetParam());
    EngineConfig cfg = config(0);
    cfg.n_batch = 70;
    cfg.n_ctx = 256;
    auto in_place = make_cpu_engine(path, cfg);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 210; i++) prompt.push_back(int32_t((i * 37 + 11) % in_place->n_vocab()));
    std::vector<std::vector<float>> ref;
    in_place->decode({{in_place->new_sequence(), prompt, true}}, ref);
    const int64_t classes = std::string(GetParam()).find("-mixed") != std::string::npos ? 2 : 1;
    cfg.expert_slots = classes * in_place->hparams().n_expert / 2;
    for (const char *on : {"1", "0"}) {
        ::setenv("STRATA_PREFILL_COST", on, 1);
        auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
        be->set_bus_rate(0.001);  // slow enough that the copies, not the compute, decide
        auto e = std::make_unique<Engine>(load_model(path), std::move(be), cfg);
        ::unsetenv("STRATA_PREFILL_COST");
        std::vector<std::vector<float>> lg;
        e->decode({{e->new_sequence(), prompt, true}}, lg);
        ASSERT_EQ(lg[0].size(), ref[0].size());
        EXPECT_EQ(std::memcmp(lg[0].data(), ref[0].data(), ref[0].size() * 4), 0) << "cost model " << on;
        const PrefetchStats pf = e->expert_stats().prefetch;
        if (*on == '1') {
            EXPECT_GT(pf.cost_full + pf.cost_predicted, 0u) << "no layer chosen by the rates";
        } else {
            EXPECT_EQ(pf.cost_full + pf.cost_predicted, 0u);
        }
        EXPECT_GT(pf.streamed_next, 0u);
    }
}

// The predicted schedule counts its recall (2-token passes through a half-size cache: half a layer's experts in each
// slot class); a bad fixed line is refused.
TEST_P(MoeScheduleSlots, PredictedScheduleCountsItsRecall) {
    const std::string path = model_path(GetParam());
    ::setenv("STRATA_PREFILL_STREAM_AHEAD", "4", 1);
    EngineConfig cfg = config(0);
    cfg.n_batch = 2;
    auto in_place = make_cpu_engine(path, cfg);
    const int64_t classes = std::string(GetParam()).find("-mixed") != std::string::npos ? 2 : 1;
    cfg.expert_slots = classes * in_place->hparams().n_expert / 2;
    ::setenv("STRATA_PREFILL_SCHEDULE", "predicted", 1);
    auto e = std::make_unique<Engine>(load_model(path), std::make_unique<HostSlotBackend>(uint64_t(1) << 34), cfg);
    ::unsetenv("STRATA_PREFILL_SCHEDULE");
    std::vector<int32_t> prompt;
    for (int i = 0; i < 23; i++) prompt.push_back(int32_t((i * 37 + 11) % e->n_vocab()));
    std::vector<std::vector<float>> lg, ref;
    e->decode({{e->new_sequence(), prompt, true}}, lg);
    in_place->decode({{in_place->new_sequence(), prompt, true}}, ref);
    EXPECT_EQ(std::memcmp(lg[0].data(), ref[0].data(), ref[0].size() * 4), 0);
    const PrefetchStats pf = e->expert_stats().prefetch;
    EXPECT_GT(pf.streamed_next, 0u);
    EXPECT_GT(pf.recall_predicted, 0u);
    EXPECT_LE(pf.recall_predicted, pf.streamed_next_used);  // filled ahead, routed, and without a slot before
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
    ::setenv("STRATA_PREFILL_FULL_SHARE", "1.5", 1);
    try {
        auto bad = std::make_unique<Engine>(load_model(path), std::make_unique<HostSlotBackend>(uint64_t(1) << 34), cfg);
        ADD_FAILURE() << "STRATA_PREFILL_FULL_SHARE=1.5 taken";
    } catch (const Error &err) {
        EXPECT_NE(std::string(err.what()).find("STRATA_PREFILL_FULL_SHARE=1.5"), std::string::npos) << err.what();
    }
    ::unsetenv("STRATA_PREFILL_FULL_SHARE");
}

// A schedule that does not exist is refused at start, by name.
TEST(MoeSchedule, UnknownPrefillScheduleIsRefused) {
    ::setenv("STRATA_PREFILL_SCHEDULE", "sideways", 1);
    try {
        (void)prefill_schedule_from_env();
        ADD_FAILURE() << "no error";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("STRATA_PREFILL_SCHEDULE=sideways"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("routed, full, auto or predicted"), std::string::npos) << e.what();
    }
    ::unsetenv("STRATA_PREFILL_SCHEDULE");
}

namespace {

// A prompt of 1100 tokens in passes of up to 1024 (both on a loan, kept for the call), then three decoded tokens
// and another prompt of 600 (a loan again): every logit, concatenated.
std::vector<float> run_long(Engine &e) {
    const int32_t s = e.new_sequence();
    std::vector<int32_t> prompt;
    for (int i = 0; i < 1100; i++) prompt.push_back(int32_t((i * 37 + 11) % e.n_vocab()));
    std::vector<std::vector<float>> lg;
    e.decode({{s, prompt, true}}, lg);
    std::vector<float> all = lg[0];
    for (int t = 0; t < 3; t++) {
        e.decode({{s, {int32_t((t * 53 + 5) % e.n_vocab())}, false}}, lg);
        all.insert(all.end(), lg[0].begin(), lg[0].end());
    }
    prompt.resize(600);
    e.decode({{s, prompt, true}}, lg);
    all.insert(all.end(), lg[0].begin(), lg[0].end());
    return all;
}

EngineConfig long_config() {
    EngineConfig c;
    c.n_batch = 1024;
    c.n_ctx = 1800;
    return c;
}

// Experts of the MoE layers the trunk runs, all told (MTP blocks not run).
int64_t moe_experts(const Engine &e) {
    int64_t n_moe = 0;
    for (int64_t il = 0; il < e.hparams().n_layer; il++) n_moe += e.model().layers[size_t(il)].gate_inp.present();
    return n_moe * e.hparams().n_expert;
}

// The slot size of long_config's plan with all but one of `total` experts cached (to size loans in slots).
size_t slot_bytes_of(const std::string &path, int64_t total) {
    EngineConfig c = long_config();
    c.expert_slots = total - 1;
    return Engine(load_model(path), std::make_unique<HostSlotBackend>(uint64_t(1) << 34), c).plan().slot_bytes;
}

}  // namespace

// Slot size classes (placement.h; STRATA_SLOT_CLASSES, on): with them and without (every slot the largest size),
// under both policies and the streamed schedule, the bits of experts read in place. On the mixed file the plans
// with them have a class per expert size; a file of one size has one class either way.
TEST_P(MoeScheduleSlots, SlotClassesChangeNoBit) {
    const std::string path = model_path(GetParam());
    const bool mixed = std::string(GetParam()).find("-mixed") != std::string::npos;
    auto in_place = make_cpu_engine(path, config(0));
    const std::vector<float> ref = run(*in_place);
    const int64_t n_expert = in_place->hparams().n_expert, total = moe_experts(*in_place);
    for (const char *classes : {"1", "0"})
        for (const char *ahead : {"0", "4"})
            for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu, SlotPolicy::Next})
                for (int64_t slots : {n_expert, total / 2, total - 2}) {
                    ::setenv("STRATA_SLOT_CLASSES", classes, 1);
                    ::setenv("STRATA_PREFILL_STREAM_AHEAD", ahead, 1);
                    auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
                    HostSlotBackend *hb = be.get();
                    EngineConfig cfg = config(slots);
                    cfg.expert_cache_policy = policy;
                    Engine e(load_model(path), std::move(be), cfg);
                    const std::string what = std::string("classes ") + classes + ", ahead " + ahead + ", " +
                                             slot_policy_name(policy) + ": " + e.plan().check_line;
                    const std::vector<float> got = run(e);
                    ASSERT_EQ(got.size(), ref.size()) << what;
                    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
                    EXPECT_EQ(hb->filled(), e.expert_stats().expert_cache_misses) << what;
                    EXPECT_EQ(e.plan().slot_classes.size(), mixed && classes[0] == '1' ? 2u : 1u) << what;
                }
    ::unsetenv("STRATA_SLOT_CLASSES");
    ::unsetenv("STRATA_PREFILL_STREAM_AHEAD");
}

// A loan bigger than the larger slot class can lend takes from both classes (the larger's slots first, then the
// smaller's top ones: one range of the loan's allocation, placement.h) and changes no bit, under both policies; the
// lent slots of both classes are scribbled over and never read.
TEST(MoeScheduleSlotClasses, PromptLoansFromEveryClassChangeNoBit) {
    const std::string path = model_path("tiny-qwen3next-mixed");
    auto in_place = make_cpu_engine(path, long_config());
    const std::vector<float> ref = run_long(*in_place);
    const int64_t k = in_place->hparams().n_expert_used, total = moe_experts(*in_place);
    const size_t slot_bytes = slot_bytes_of(path, total);
    for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu, SlotPolicy::Next}) {
        auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
        HostSlotBackend *hb = be.get();
        EngineConfig c = long_config();
        c.expert_slots = total / 2;
        c.loan_floor_slots = k + 1;
        c.scratch_bytes = 9 * slot_bytes;  // more than one class can lend
        c.expert_cache_policy = policy;
        Engine e(load_model(path), std::move(be), c);
        const Placement &p = e.plan();
        const std::string what = std::string(slot_policy_name(policy)) + ": " + p.check_line;
        ASSERT_EQ(p.slot_classes.size(), 2u) << what;
        ASSERT_EQ(p.loan_class_slots.size(), 2u) << what;
        EXPECT_GT(p.loan_class_slots[0], 0) << what;
        EXPECT_GT(p.loan_class_slots[1], 0) << what;
        const std::vector<float> got = run_long(e);
        ASSERT_EQ(got.size(), ref.size()) << what;
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
        EXPECT_EQ(e.expert_stats().loans, 2u) << what;
        EXPECT_EQ(hb->loans(), 2u) << what;
    }
}

// Prompt loans (placement.h): passes over 512 tokens run while the top slots are lent (and scribbled over), under
// either policy, both refills and both prefill schedules, and give the bits of experts read in place; no expert is
// read from a lent slot; STRATA_PROMPT_LOAN=0 makes none.
TEST_P(MoeScheduleSlots, PromptLoansChangeNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, long_config());
    const std::vector<float> ref = run_long(*in_place);
    const int64_t k = in_place->hparams().n_expert_used, total = moe_experts(*in_place);
    // the slot size, to plan a loan of three slots (the host backend's scratch is its own; the plan only sizes it)
    const size_t slot_bytes = slot_bytes_of(path, total);
    ASSERT_GT(slot_bytes, 0u);
    for (const char *loan : {"1", "0"})
        for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu, SlotPolicy::Next})
            for (const char *refill : {"before", "last"})
                for (const char *schedule : {"routed", "full"}) {
                    ::setenv("STRATA_PROMPT_LOAN", loan, 1);
                    ::setenv("STRATA_LOAN_REFILL", refill, 1);
                    ::setenv("STRATA_PREFILL_SCHEDULE", schedule, 1);
                    auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
                    HostSlotBackend *hb = be.get();
                    EngineConfig c = long_config();
                    c.expert_slots = std::max<int64_t>(k + 4, total / 2);
                    c.loan_floor_slots = k + 1;
                    c.scratch_bytes = 3 * slot_bytes;
                    c.expert_cache_policy = policy;
                    Engine e(load_model(path), std::move(be), c);
                    const std::string what = std::string("loan ") + loan + ", " + slot_policy_name(policy) +
                                             ", refill " + refill + ", " + schedule + ": " + e.plan().check_line;
                    const std::vector<float> got = run_long(e);
                    ASSERT_EQ(got.size(), ref.size());
                    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
                    // the mixed file's loan comes from the larger of its two slot classes
                    if (std::string(GetParam()).find("-mixed") != std::string::npos) {
                        EXPECT_EQ(e.plan().slot_classes.size(), 2u) << what;
                    }
                    const ExpertCacheStats st = e.expert_stats();
                    if (loan[0] == '1') {
                        EXPECT_EQ(e.plan().loan_slots, 3) << what;
                        EXPECT_EQ(e.plan().resident_chunk_tokens, k_loan_resident_chunk) << what;
                        EXPECT_EQ(st.loans, 2u) << what;
                        EXPECT_EQ(hb->loans(), 2u) << what;
                    } else {
                        EXPECT_EQ(e.plan().loan_slots, 0) << what;
                        EXPECT_EQ(hb->loans(), 0u) << what;
                    }
                }
    ::unsetenv("STRATA_PROMPT_LOAN");
    ::unsetenv("STRATA_LOAN_REFILL");
    ::unsetenv("STRATA_PREFILL_SCHEDULE");
}

// A prompt pass's shared expert goes before its routed experts (STRATA_PREFILL_SHARED_FIRST, on) or after them (=0):
// the bits of experts read in place either way, under both schedules and with a loan; decode-sized passes (the decode
// overlap off here) keep theirs after.
TEST_P(MoeScheduleSlots, PromptSharedExpertFirstChangesNoBit) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, long_config());
    const std::vector<float> ref = run_long(*in_place);
    int64_t n_moe = 0, n_shared = 0;  // the trunk's MoE layers, and those with a shared expert (MTP blocks not run)
    const HParams &hp = in_place->hparams();
    for (int64_t il = 0; il < hp.n_layer; il++) {
        n_moe += in_place->model().layers[size_t(il)].gate_inp.present();
        n_shared += in_place->model().layers[size_t(il)].gate_shexp.present();
    }
    const int64_t total = n_moe * hp.n_expert, k = hp.n_expert_used;
    ::setenv("STRATA_DECODE_OVERLAP", "0", 1);
    for (const char *first : {"1", "0"})
        for (const char *schedule : {"routed", "full"})
            for (const char *loan : {"1", "0"}) {
                ::setenv("STRATA_PREFILL_SHARED_FIRST", first, 1);
                ::setenv("STRATA_PREFILL_SCHEDULE", schedule, 1);
                ::setenv("STRATA_PROMPT_LOAN", loan, 1);
                auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
                HostSlotBackend *hb = be.get();
                EngineConfig c = long_config();
                c.expert_slots = std::max<int64_t>(k + 4, total / 2);
                c.loan_floor_slots = k + 1;
                Engine e(load_model(path), std::move(be), c);
                const std::string what =
                    std::string("shared first ") + first + ", " + schedule + ", loan " + loan;
                const std::vector<float> got = run_long(e);
                ASSERT_EQ(got.size(), ref.size()) << what;
                EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
                if (n_shared == 0) {
                    EXPECT_EQ(hb->shared_before() + hb->shared_after(), 0u) << what;
                    continue;
                }
                // run_long: prompt passes (at least three, as the plan chunks them) and three decoded tokens
                if (first[0] == '1') {
                    EXPECT_GE(hb->shared_before(), uint64_t(3 * n_shared)) << what;
                    EXPECT_EQ(hb->shared_before() % uint64_t(n_shared), 0u) << what;
                    EXPECT_EQ(hb->shared_after(), uint64_t(3 * n_shared)) << what;
                } else {
                    EXPECT_EQ(hb->shared_before(), 0u) << what;
                    EXPECT_GE(hb->shared_after(), uint64_t(6 * n_shared)) << what;
                }
            }
    ::unsetenv("STRATA_DECODE_OVERLAP");
    ::unsetenv("STRATA_PREFILL_SHARED_FIRST");
    ::unsetenv("STRATA_PREFILL_SCHEDULE");
    ::unsetenv("STRATA_PROMPT_LOAN");
}

// Prompt loans with mapped misses: a loan scribbles over its slots and takes their experts out of the backend's
// record, the refill puts experts back, and decoding between the loans reads each miss from the file or from the
// slot its fill put it in, never from a lent one (a prompt's last pass of one token runs on the loan, mapped): the
// bits of no loan and every miss copied in, with the split off, on (LFU, admission on, its device part reading in
// place) and chosen pass by pass, the lent slots refilled with what they held and with the last pass's favourites.
TEST_P(MoeScheduleSlots, PromptLoansWithMappedMissesChangeNoBit) {
    const std::string path = model_path(GetParam());
    auto probe = make_cpu_engine(path, long_config());
    const int64_t k = probe->hparams().n_expert_used, total = moe_experts(*probe);
    const size_t slot_bytes = slot_bytes_of(path, total);
    auto engine = [&](bool mapped, double share, HostSlotBackend **hb) {
        auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
        *hb = be.get();
        be->gpu_arithmetic();
        be->fake_marks();
        if (mapped) be->map_misses();
        EngineConfig c = long_config();
        c.expert_slots = std::max<int64_t>(k + 4, total / 2);
        c.loan_floor_slots = k + 1;
        c.scratch_bytes = 3 * slot_bytes;
        c.expert_cache_policy = SlotPolicy::Lfu;
        c.cpu_share = share;
        c.cpu_threads = 2;
        c.n_seq_max = 2;
        return std::make_unique<Engine>(load_model(path), std::move(be), c);
    };
    // run_long, then a prompt of 1025 tokens: its last pass, of one token, runs on the loan (device-routed, mapped)
    auto script = [&](Engine &e) {
        std::vector<float> all = run_long(e);
        const int32_t s = e.new_sequence();
        std::vector<int32_t> prompt;
        for (int i = 0; i < 1025; i++) prompt.push_back(int32_t((i * 29 + 3) % e.n_vocab()));
        std::vector<std::vector<float>> lg;
        e.decode({{s, prompt, false}}, lg);
        all.insert(all.end(), lg[0].begin(), lg[0].end());
        return all;
    };
    HostSlotBackend *hb = nullptr;
    ::setenv("STRATA_PROMPT_LOAN", "0", 1);
    const std::vector<float> ref = script(*engine(false, 0.0, &hb));
    ::unsetenv("STRATA_PROMPT_LOAN");
    for (const char *refill : {"before", "last"})
        for (double share : {0.0, 0.5, 0.4}) {
            // 0.5: every pass split, its device part reading in place; 0.4: alone or split by measured time
            if (share == 0.4 && std::strcmp(refill, "last") == 0) continue;
            ::setenv("STRATA_LOAN_REFILL", refill, 1);
            ::setenv("STRATA_DECODE_CHOOSE", share == 0.5 ? "0" : "1", 1);
            ::setenv("STRATA_DECODE_SPLIT_MAPPED", share == 0.5 ? "1" : "0", 1);
            auto e = engine(true, share, &hb);
            ::unsetenv("STRATA_LOAN_REFILL");
            ::unsetenv("STRATA_DECODE_CHOOSE");
            ::unsetenv("STRATA_DECODE_SPLIT_MAPPED");
            const std::vector<float> got = script(*e);
            const std::string what =
                "share " + std::to_string(share) + ", refill " + refill + ": " + e->plan().check_line;
            ASSERT_EQ(got.size(), ref.size()) << what;
            EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
            EXPECT_EQ(hb->loans(), 3u) << what;
            if (share != 0.4) {
                EXPECT_GT(e->expert_stats().mapped_misses, 0u) << what;
            }
        }
}

// A prompt's favourites (STRATA_PROMPT_FAVOURITES): after a prompt of one pass and after one on a loan, decoding's
// first pass turns the cache toward the experts the prompt passes routed most rows to, filled ahead; under either
// policy, with misses copied in or read in place (mapped), the bits of experts read in place; =0 fills none.
TEST_P(MoeScheduleSlots, PromptFavouritesChangeNoBit) {
    const std::string path = model_path(GetParam());
    // a prompt of 300 tokens (one pass), three decoded tokens, a prompt of 1100 (passes on a loan), three more
    auto script = [](Engine &e) {
        const int32_t s = e.new_sequence();
        std::vector<int32_t> prompt;
        for (int i = 0; i < 300; i++) prompt.push_back(int32_t((i * 37 + 11) % e.n_vocab()));
        std::vector<std::vector<float>> lg;
        e.decode({{s, prompt, true}}, lg);
        std::vector<float> all = lg[0];
        auto decode3 = [&](int salt) {
            for (int t = 0; t < 3; t++) {
                e.decode({{s, {int32_t((t * 53 + salt) % e.n_vocab())}, false}}, lg);
                all.insert(all.end(), lg[0].begin(), lg[0].end());
            }
        };
        decode3(5);
        prompt.clear();
        for (int i = 0; i < 1100; i++) prompt.push_back(int32_t((i * 29 + 3) % e.n_vocab()));
        e.decode({{s, prompt, true}}, lg);
        all.insert(all.end(), lg[0].begin(), lg[0].end());
        decode3(17);
        return all;
    };
    auto in_place = make_cpu_engine(path, long_config());
    const std::vector<float> ref = script(*in_place);
    const int64_t k = in_place->hparams().n_expert_used, total = moe_experts(*in_place);
    const size_t slot_bytes = slot_bytes_of(path, total);
    ASSERT_GT(slot_bytes, 0u);
    for (const char *fav : {"1", "0"})
        for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu, SlotPolicy::Next})
            for (bool mapped : {false, true}) {
                ::setenv("STRATA_PROMPT_FAVOURITES", fav, 1);
                auto be = std::make_unique<HostSlotBackend>(uint64_t(1) << 34);
                HostSlotBackend *hb = be.get();
                if (mapped) be->map_misses();
                EngineConfig c = long_config();
                c.expert_slots = std::max<int64_t>(k + 4, total / 2);
                c.loan_floor_slots = k + 1;
                c.scratch_bytes = 3 * slot_bytes;
                c.expert_cache_policy = policy;
                c.cpu_share = 0.0;
                Engine e(load_model(path), std::move(be), c);
                ::unsetenv("STRATA_PROMPT_FAVOURITES");
                const std::string what = std::string("favourites ") + fav + ", " + slot_policy_name(policy) +
                                         (mapped ? ", mapped" : ", copied in") + ": " + e.plan().check_line;
                const std::vector<float> got = script(e);
                ASSERT_EQ(got.size(), ref.size()) << what;
                EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << what;
                EXPECT_EQ(hb->loans(), 1u) << what;
                const ExpertCacheStats st = e.expert_stats();
                if (fav[0] == '1') {
                    EXPECT_GT(st.favourite_fills, 0u) << what;
                } else {
                    EXPECT_EQ(st.favourite_fills, 0u) << what;
                }
                // every slot a fill, a miss copied in or a favourite: the fills the backend saw
                if (!mapped) {
                    EXPECT_GE(hb->filled(), st.expert_cache_misses + st.favourite_fills) << what;
                }
            }
}

// An expert-popularity profile (runtime/expert_profile.h): the favourites one engine's prompt scored, through the
// file, start another engine's cache as its first pass begins (a short prompt, which scores nothing itself), with the
// bits of experts read in place; without the profile nothing is filled so; a profile of another shape is refused.
TEST_P(MoeScheduleSlots, ExpertProfileStartsTheNextEnginesCache) {
    const std::string path = model_path(GetParam());
    auto in_place = make_cpu_engine(path, long_config());
    const int64_t n_expert = in_place->hparams().n_expert, k = in_place->hparams().n_expert_used;
    const int64_t total = moe_experts(*in_place);
    auto engine = [&] {
        EngineConfig c = long_config();
        c.expert_slots = std::max<int64_t>(k + 4, total / 3);
        c.cpu_share = 0.0;
        return std::make_unique<Engine>(load_model(path), std::make_unique<HostSlotBackend>(uint64_t(1) << 34), c);
    };
    // a prompt of 5 tokens (one decode-sized pass) and four decoded tokens
    auto short_script = [](Engine &e) {
        const int32_t s = e.new_sequence();
        std::vector<std::vector<float>> lg;
        e.decode({{s, {3, 14, 15, 92, 65}, false}}, lg);
        std::vector<float> all = lg[0];
        for (int t = 0; t < 4; t++) {
            e.decode({{s, {int32_t((t * 41 + 7) % e.n_vocab())}, false}}, lg);
            all.insert(all.end(), lg[0].begin(), lg[0].end());
        }
        return all;
    };
    const std::vector<float> ref = short_script(*in_place);
    EXPECT_TRUE(in_place->expert_profile().empty());  // reads every expert in place: no cache, no scores

    auto a = engine();
    EXPECT_TRUE(a->expert_profile().empty());
    {
        const int32_t s = a->new_sequence();
        std::vector<int32_t> prompt;
        for (int i = 0; i < 300; i++) prompt.push_back(int32_t((i * 37 + 11) % a->n_vocab()));
        std::vector<std::vector<float>> lg;
        a->decode({{s, prompt, false}}, lg);
    }
    const ExpertProfile p = a->expert_profile();
    ASSERT_FALSE(p.empty());
    EXPECT_EQ(p.arch, a->hparams().arch_name);
    EXPECT_EQ(p.n_layer, a->hparams().n_layer);
    EXPECT_EQ(p.n_expert, n_expert);
    // what --expert-profile does at a run's start and end (runtime/expert_profile.h)
    const std::string file = testing::TempDir() + "engine-profile-" + std::to_string(::getpid()) + ".gguf";
    std::filesystem::remove(file);
    EXPECT_NE(start_expert_profile(file, *in_place).find("no partial expert cache"), std::string::npos);
    EXPECT_EQ(end_expert_profile(file, *in_place), "");
    EXPECT_THROW(start_expert_profile(testing::TempDir() + "no-such-folder/p.gguf", *a), Error);
    EXPECT_NE(start_expert_profile(file, *a).find("none yet"), std::string::npos);
    EXPECT_NE(end_expert_profile(file, *a).find("written to"), std::string::npos);
    const ExpertProfile q = read_expert_profile(file);
    EXPECT_EQ(q.arch, p.arch);

    auto b = engine();
    EXPECT_NE(start_expert_profile(file, *b).find("scores of"), std::string::npos);
    std::filesystem::remove(file);
    EXPECT_EQ(b->expert_profile().scores, q.scores);  // given back as read (nothing scored since)
    const std::vector<float> got = short_script(*b);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0);
    EXPECT_GT(b->expert_stats().favourite_fills, 0u);

    auto c = engine();
    EXPECT_EQ(end_expert_profile(file, *c), "");  // nothing scored: nothing written
    EXPECT_FALSE(std::filesystem::exists(file));
    const std::vector<float> none = short_script(*c);
    EXPECT_EQ(std::memcmp(none.data(), ref.data(), ref.size() * 4), 0);
    EXPECT_EQ(c->expert_stats().favourite_fills, 0u);

    ExpertProfile other = q;
    other.n_expert += 1;
    EXPECT_THROW(c->seed_expert_profile(other), Error);
    other = q;
    other.arch = "llama";
    EXPECT_THROW(c->seed_expert_profile(other), Error);
}

INSTANTIATE_TEST_SUITE_P(Tiny, MoeScheduleSlots,
                         ::testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35moe",
                                           "tiny-qwen3next-mixed"));
