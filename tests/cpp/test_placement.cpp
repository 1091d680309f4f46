// The strata layer on the CPU, with no device: the placement plan as a pure function (all resident, the smallest
// budget that works, budgets in between, too small, host tiers, the check line), the expert slot table's policy, the
// grouping of a routing by expert, and the MoE schedule through expert slots: a backend with host-memory slots
// gives bit-identical logits whatever the slot count, and the same as reading every expert in place.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <regex>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/threads.h"
#include "core/units.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "strata/expert_slots.h"
#include "strata/memory_strata.h"
#include "strata/moe_schedule.h"
#include "strata/placement_plan.h"
#include "synth/synth.h"
#include "synth_cache.h"

using namespace strata;

namespace {

constexpr uint64_t MiB = uint64_t(1) << 20, GiB = uint64_t(1) << 30;

// A device as a plan sees it.
DeviceFacts device(uint64_t free_bytes, uint64_t host_available = 64 * GiB) {
    DeviceFacts d;
    d.has_device_memory = true;
    d.name = "CUDA0";
    d.free_bytes = d.total_bytes = free_bytes;
    d.runtime_bytes = 500 * MiB;
    d.host_available_bytes = host_available;
    return d;
}

struct Loaded {
    std::unique_ptr<Model> m;
    WeightSet ws;
    CacheShape caches;
};

// mixed: the experts' down matrices of some layers Q6_K (SynthOptions::mixed_down_type), two expert sizes.
Loaded load(const std::string &preset, int64_t n_ctx = 4096, bool mixed = false) {
    SynthOptions o;
    o.preset = preset;
    if (mixed) o.mixed_down_type = DType::Q6_K;
    Loaded l;
    l.m = load_model(test::cached_synth_model("plan-" + preset + (mixed ? "-mixed" : ""), o));
    l.ws = weight_set(*l.m);
    l.caches = cache_shape(l.m->hp, 1, n_ctx, KvType::F16);
    return l;
}

Placement plan(const Loaded &l, const DeviceFacts &d, PlanOptions o = {}) {
    return plan_placement(l.ws, l.m->hp, l.caches, d, o);
}

// The smallest budget the plan names when one is too small ("give at least X").
uint64_t named_minimum(const Loaded &l, const DeviceFacts &d) {
    PlanOptions o;
    o.vram_budget = 1 * MiB;
    try {
        plan(l, d, o);
    } catch (const Error &e) {
        const std::string msg = e.what();
        std::smatch m;
        const std::regex re("give at least ([0-9.]+) (KiB|MiB|GiB)");
        EXPECT_TRUE(std::regex_search(msg, m, re)) << msg;
        const double unit = m[2] == "KiB" ? 1024.0 : m[2] == "MiB" ? double(MiB) : double(GiB);
        return uint64_t(std::stod(m[1]) * unit);
    }
    ADD_FAILURE() << "a 1 MiB budget was accepted";
    return 0;
}

uint64_t resident(const Placement &p) { return p.weight_bytes + p.cache_bytes + p.scratch_bytes + p.misc_bytes; }

}  // namespace

TEST(PlacementPlan, NothingToPlaceOnTheCpu) {
    const Loaded l = load("tiny-qwen3moe");
    const Placement p = plan(l, DeviceFacts{});
    EXPECT_FALSE(p.device);
    EXPECT_EQ(p.n_slots, 0);
    EXPECT_TRUE(p.check_line.empty());
    EXPECT_EQ(p.caches.layers.size(), size_t(l.m->hp.n_layer));
}

TEST(PlacementPlan, AllResidentWhenTheDeviceHoldsEverything) {
    for (const char *preset : {"tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35moe"}) {
        const Loaded l = load(preset);
        const Placement p = plan(l, device(80 * GiB));
        EXPECT_TRUE(p.all_resident()) << preset;
        EXPECT_EQ(p.n_experts_total, l.m->hp.n_expert * l.m->hp.n_layer) << preset;  // every tiny layer is MoE
        EXPECT_EQ(p.host, HostTier::none);
        EXPECT_NE(p.check_line.find("100% of experts"), std::string::npos) << p.check_line;
        EXPECT_NE(p.check_line.find("host 0 GiB"), std::string::npos) << p.check_line;
        // Slot layouts hold a layer's three matrices, each aligned, within the slot size.
        for (size_t il = 0; il < p.layouts.size(); il++) {
            const ExpertSlotLayout &L = p.layouts[il];
            const ExpertWeights &e = l.ws.experts[il];
            EXPECT_EQ(L.up_off % 256, 0u);
            EXPECT_GE(L.up_off, e.gate->matrix_bytes());
            EXPECT_GE(L.down_off, L.up_off + e.up->matrix_bytes());
            EXPECT_LE(L.bytes, p.slot_bytes);
        }
        // The budget holds what the plan allocates, and the resident part is what the tensors and caches take.
        EXPECT_LE(resident(p) + uint64_t(p.n_slots) * p.slot_bytes, p.budget_bytes);
        uint64_t kv = 0;
        for (size_t il = 0; il < l.caches.layers.size(); il++)
            kv += (l.caches.first_bytes(il) + 255) / 256 * 256 + (l.caches.second_bytes(il) + 255) / 256 * 256;
        EXPECT_EQ(p.cache_bytes, kv);
    }
}

// A split model's part before the last computes no logits: its scratch leaves out the vocabulary slice, exactly
// (scratch_estimate's output term), and everything else stays as planned.
TEST(PlacementPlan, APartWithoutLogitsPlansNoLogitSlice) {
    const Loaded l = load("tiny-qwen3next");
    PlanOptions o;
    o.chunk_tokens = 512;
    const Placement with = plan(l, device(80 * GiB), o);
    o.logits = false;
    const Placement without = plan(l, device(80 * GiB), o);
    const HParams &hp = l.m->hp;
    EXPECT_LT(scratch_estimate(hp, 512, false, false), scratch_estimate(hp, 512, false, true));
    EXPECT_LT(without.scratch_bytes, with.scratch_bytes);
    const uint64_t rows = std::min<uint64_t>(512, uint64_t(k_logit_slice_rows)), E = uint64_t(hp.n_embd);
    const uint64_t out = 4 * rows * (2 * E + uint64_t(hp.n_vocab)) + 5 * rows * E;
    // the estimate's margin is an eighth of the total (each total rounded down on its own)
    const uint64_t diff = scratch_estimate(hp, 512, false, true) - scratch_estimate(hp, 512, false, false);
    EXPECT_GE(diff, out + out / 8);
    EXPECT_LE(diff, out + out / 8 + 1);
    EXPECT_EQ(without.weight_bytes, with.weight_bytes);
    EXPECT_EQ(without.cache_bytes, with.cache_bytes);
}

// The pinned staging for a pass's uploads grows with the chunk (a prompt chunk's routing tables: 12 bytes a
// token-expert pair per MoE layer at least), from a 4 MiB floor to a 256 MiB cap.
TEST(PlacementPlan, StagingHoldsAPassOfUploads) {
    const Loaded l = load("tiny-qwen3moe");
    const HParams &hp = l.m->hp;
    for (int64_t chunk : {16, 512, 8192, 32768}) {
        PlanOptions o;
        o.chunk_tokens = chunk;
        const Placement p = plan(l, device(80 * GiB), o);
        const uint64_t pairs = uint64_t(chunk * hp.n_expert_used);
        EXPECT_GE(p.stage_bytes, std::min<uint64_t>(256 * MiB, uint64_t(hp.n_layer) * 12 * pairs)) << chunk;
        EXPECT_GE(p.stage_bytes, 4 * MiB) << chunk;
        EXPECT_LE(p.stage_bytes, 256 * MiB) << chunk;
    }
    EXPECT_EQ(plan(l, DeviceFacts{}).stage_bytes, 0u);  // nothing to stage on the CPU
    // A Qwen3-30B-A3B's shape: 48 MoE layers of 128 experts, 8 routed.
    HParams q30 = hp;
    q30.n_layer = 48;
    q30.n_expert = 128;
    q30.n_expert_used = 8;
    EXPECT_EQ(stage_estimate(q30, 16), 4 * MiB);
    for (int64_t chunk : {4096, 8192}) {
        const uint64_t s = stage_estimate(q30, chunk);
        EXPECT_GE(s, 48 * 12 * uint64_t(chunk) * 8) << chunk;
        EXPECT_LT(s, 48 * 20 * uint64_t(chunk) * 8) << chunk;
    }
    EXPECT_EQ(stage_estimate(q30, 65535), 256 * MiB);
}

TEST(PlacementPlan, TooSmallNamesTheMinimumAndTheMinimumWorks) {
    const Loaded l = load("tiny-qwen3next");
    const DeviceFacts d = device(80 * GiB);
    const uint64_t minimum = named_minimum(l, d);
    ASSERT_GT(minimum, 500 * MiB);  // the runtime's share is part of it
    // The message rounds to 0.1 MiB: a little more works and holds the fewest slots a layer needs.
    PlanOptions o;
    o.vram_budget = minimum + 128 * 1024;
    const Placement p = plan(l, d, o);
    EXPECT_GE(p.n_slots, l.m->hp.n_expert_used);
    EXPECT_LT(p.n_slots, p.n_experts_total);
    EXPECT_LE(resident(p) + uint64_t(p.n_slots) * p.slot_bytes, p.budget_bytes);
    EXPECT_EQ(p.budget_total_bytes, o.vram_budget);
    EXPECT_EQ(p.budget_bytes, o.vram_budget - d.runtime_bytes - k_plan_runtime_margin);
    // Less than the minimum is refused, naming the parts.
    o.vram_budget = minimum - 256 * 1024;
    try {
        plan(l, d, o);
        FAIL() << "a budget under the minimum was accepted";
    } catch (const Error &e) {
        const std::string msg = e.what();
        for (const char *part : {"--vram-budget", "is too small for this model", "weights", "KV cache and states",
                                 "scratch for 512-token passes", "slots of", "CUDA runtime", "give at least"})
            EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
    }
}

TEST(PlacementPlan, BudgetsInBetweenGrowTheExpertCacheOnly) {
    const Loaded l = load("tiny-qwen35moe");
    const DeviceFacts d = device(80 * GiB);
    const uint64_t minimum = named_minimum(l, d);
    const Placement all = plan(l, d);
    const uint64_t full = all.budget_total_bytes;  // more than enough
    int64_t last = 0;
    for (int i = 0; i <= 8; i++) {
        PlanOptions o;
        o.vram_budget = minimum + 128 * 1024 + uint64_t(i) * (all.slot_bytes * uint64_t(all.n_experts_total) / 8);
        const Placement p = plan(l, d, o);
        EXPECT_GE(p.n_slots, last) << o.vram_budget;  // more budget, never fewer slots
        last = p.n_slots;
        EXPECT_EQ(resident(p), resident(all));  // the resident stratum does not depend on the budget
        EXPECT_LE(resident(p) + uint64_t(p.n_slots) * p.slot_bytes, p.budget_bytes);
        // Every slot the budget can take is taken, up to one per expert.
        EXPECT_TRUE(p.n_slots == p.n_experts_total || p.budget_bytes - resident(p) - uint64_t(p.n_slots) * p.slot_bytes <
                                                          p.slot_bytes)
            << o.vram_budget;
        EXPECT_EQ(p.host == HostTier::none, p.all_resident());
    }
    EXPECT_EQ(last, all.n_experts_total);
    EXPECT_LT(minimum, full);
    // A cap on the slot count is a cap.
    PlanOptions capped;
    capped.expert_slots = 3;
    EXPECT_EQ(plan(l, d, capped).n_slots, 3);
}

TEST(PlacementPlan, HostTierFollowsRamAndSwitches) {
    const Loaded l = load("tiny-qwen3moe");
    PlanOptions o;
    o.expert_slots = 4;
    Placement p = plan(l, device(80 * GiB), o);
    EXPECT_EQ(p.host, HostTier::pinned_copy);
    EXPECT_NE(p.check_line.find("pinned copy"), std::string::npos) << p.check_line;
    // Not enough host RAM for a pinned copy and headroom: the mapping through the stager.
    p = plan(l, device(80 * GiB, 1 * GiB), o);
    EXPECT_EQ(p.host, HostTier::stager);
    EXPECT_NE(p.check_line.find("pageable (a pinned copy needs 4.00 GiB, 1.00 GiB available) via pinned stager 4 x "
                                "32.0 MiB"),
              std::string::npos)
        << p.check_line;
    EXPECT_EQ(p.stager_buffers, 4);
    // --host-mem pinned: no fallback; the refusal names the RAM it needs and the way out
    PlanOptions req = o;
    req.require_pinned_copy = true;
    try {
        plan(l, device(80 * GiB, 1 * GiB), req);
        ADD_FAILURE() << "a pinned copy that does not fit was planned";
    } catch (const Error &e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("needs 4.00 GiB of host RAM"), std::string::npos) << msg;
        EXPECT_NE(msg.find("--host-mem mmap"), std::string::npos) << msg;
    }
    EXPECT_EQ(plan(l, device(80 * GiB), req).host, HostTier::pinned_copy);
    o.host_pinned_copy = false;
    p = plan(l, device(80 * GiB), o);
    EXPECT_EQ(p.host, HostTier::stager);
    o.stager = false;
    p = plan(l, device(80 * GiB), o);
    EXPECT_EQ(p.host, HostTier::pageable);
    o.pin_mapping = true;
    p = plan(l, device(80 * GiB), o);
    EXPECT_EQ(p.host, HostTier::pinned_mapping);
    EXPECT_GT(p.stager_buffers, 0);  // the fallback where registering the mapping fails
}

TEST(PlacementPlan, CheckLineText) {
    const Loaded l = load("tiny-qwen3moe");
    PlanOptions o;
    o.expert_slots = 5;
    const Placement p = plan(l, device(40 * GiB), o);
    EXPECT_EQ(p.check_line,
              "strata: CUDA0 plan: resident " + format_bytes(p.weight_bytes + p.cache_bytes + p.scratch_bytes) +
                  ", expert cache 5 slots (" + format_bytes(5 * p.slot_bytes) + ", 31% of experts), host " +
                  format_bytes(p.host_expert_bytes) + " pinned copy, KV f16 1 x 4096 (" + format_bytes(p.cache_bytes) +
                  " with states), scratch " + format_bytes(p.scratch_bytes) +
                  " for 512-token chunks, CUDA runtime 500.0 MiB, budget " + format_bytes(p.budget_total_bytes));
    DeviceFacts unknown = device(40 * GiB);
    unknown.runtime_estimated = true;
    EXPECT_NE(plan(l, unknown).check_line.find("(estimated: the driver's count is not readable)"), std::string::npos);
}

TEST(PlacementPlan, RefusesWhatTheKernelsCannotTake) {
    const Loaded l = load("tiny-qwen3moe");
    PlanOptions o;
    // more token-expert pairs than a grid row takes is fine (the kernels over pairs launch in row slices) ...
    o.chunk_tokens = 65536 / int64_t(l.m->hp.n_expert_used) + 1;
    EXPECT_NO_THROW(plan(l, device(80 * GiB), o));
    // ... more tokens than one grid dimension takes is not
    o.chunk_tokens = 65536;
    EXPECT_THROW(plan(l, device(80 * GiB), o), Error);
    o.chunk_tokens = 512;
    o.vram_budget = 100 * GiB;  // more than the device has free
    EXPECT_THROW(plan(l, device(80 * GiB), o), Error);
}

// ---- the slot table ----

TEST(ExpertSlotTable, LeastRecentlyUsedAndCounters) {
    ExpertSlotTable t({4, 0, 4}, {100, 0, 200}, 3);
    std::vector<SlotFill> fills;
    int32_t s[3];
    const int32_t a[2] = {0, 1};
    t.acquire(0, a, 2, s, false, fills);
    EXPECT_EQ(fills.size(), 2u);
    EXPECT_EQ(t.stats().misses, 2u);
    EXPECT_EQ(t.stats().bytes_filled, 200u);
    fills.clear();
    const int32_t b[2] = {1, 2};  // 1 is a hit, 2 takes the empty slot
    t.acquire(0, b, 2, s, false, fills);
    EXPECT_EQ(t.stats().hits, 1u);
    ASSERT_EQ(fills.size(), 1u);
    EXPECT_EQ(t.slot_of(0, 2), fills[0].slot);
    fills.clear();
    // Layer 2's expert 3 evicts the least recently used: expert 0 of layer 0.
    const int32_t c[1] = {3};
    t.acquire(2, c, 1, s, false, fills);
    EXPECT_EQ(t.slot_of(0, 0), -1);
    EXPECT_EQ(t.slot_of(2, 3), s[0]);
    EXPECT_EQ(t.stats().bytes_filled, 500u);  // 2 + 1 experts of layer 0, one of layer 2
    // A fill that did not happen leaves its slot empty, not claiming the expert.
    t.forget(2, fills);
    EXPECT_EQ(t.slot_of(2, 3), -1);
    fills.clear();
    t.acquire(2, c, 1, s, false, fills);
    EXPECT_EQ(fills.size(), 1u);
}

TEST(ExpertSlotTable, ScanEvictsTheMostRecentOutsideTheRequest) {
    // Sweeping 3 experts of a layer through 2 slots, twice: LRU never hits, scan eviction keeps one for the next pass.
    auto sweep_hits = [](bool scan) {
        ExpertSlotTable t({3}, {1}, 2);
        std::vector<SlotFill> fills;
        int32_t s[1];
        for (int pass = 0; pass < 4; pass++)
            for (int32_t e = 0; e < 3; e++) t.acquire(0, &e, 1, s, scan, fills);
        return t.stats().hits;
    };
    EXPECT_EQ(sweep_hits(false), 0u);
    EXPECT_GT(sweep_hits(true), 0u);
}

// After a fence, a scan's misses take the most recently used slots of before it (an earlier layer's, whose compute
// is done) while there are any, and the slots touched since stay; with none left, the earlier rule.
TEST(ExpertSlotTable, ScanFenceTakesSlotsOfBeforeTheFence) {
    for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu}) {
        ExpertSlotTable t({8, 8}, {1, 1}, 6, policy);
        std::vector<SlotFill> fills;
        int32_t s[8];
        const int32_t a[4] = {0, 1, 2, 3};
        t.acquire(0, a, 4, s, true, fills);  // layer 0 (4 slots), then layer 1 begins
        t.fence();
        const int32_t b[2] = {0, 1};
        t.acquire(1, b, 2, s, true, fills);  // the two empty slots
        const std::string what = slot_policy_name(policy);
        for (int32_t e = 2; e < 4; e++) {  // two misses, one request each: layer 0's most recent slots go
            t.acquire(1, &e, 1, s, true, fills);
            EXPECT_GE(t.slot_of(1, 0), 0) << what;
            EXPECT_GE(t.slot_of(1, 1), 0) << what;
        }
        EXPECT_EQ(t.slot_of(0, 3), -1) << what;
        EXPECT_EQ(t.slot_of(0, 2), -1) << what;
        EXPECT_GE(t.slot_of(0, 0), 0) << what;
        EXPECT_GE(t.slot_of(0, 1), 0) << what;
        for (int32_t e = 4; e < 8; e++) t.acquire(1, &e, 1, s, true, fills);  // then the rest of layer 0, then ...
        EXPECT_EQ(t.slot_of(0, 0), -1) << what;
        EXPECT_EQ(t.slot_of(0, 1), -1) << what;
        int held = 0;  // ... the rule without a fence: the most recent slot outside the request
        for (int32_t e = 0; e < 8; e++) held += t.slot_of(1, e) >= 0;
        EXPECT_EQ(held, 6) << what;
        EXPECT_GE(t.slot_of(1, 7), 0) << what;
    }
}

TEST(ExpertSlotTable, LfuGivesUpTheLeastRequestedTiesToTheLeastRecent) {
    ExpertSlotTable t({4}, {1}, 2, SlotPolicy::Lfu);
    EXPECT_EQ(t.policy(), SlotPolicy::Lfu);
    std::vector<SlotFill> fills;
    int32_t s[1];
    auto get = [&](int32_t e) { t.acquire(0, &e, 1, s, false, fills); };
    get(0), get(0), get(0), get(1), get(2);  // 0 asked 3 times, 1 once: 2 takes 1's slot
    EXPECT_GE(t.slot_of(0, 0), 0);
    EXPECT_EQ(t.slot_of(0, 1), -1);
    EXPECT_GE(t.slot_of(0, 2), 0);
    get(3);  // 2 and 3 once each beside 0's three: 2 (the least recent of the least requested) goes
    EXPECT_EQ(t.slot_of(0, 2), -1);
    EXPECT_GE(t.slot_of(0, 0), 0);
    // Counts survive eviction: 1 asked three more times (four in all) takes 3's slot (3: once) and then outranks 0
    get(1), get(1), get(1);
    EXPECT_GE(t.slot_of(0, 1), 0);
    EXPECT_GE(t.slot_of(0, 0), 0);
    EXPECT_EQ(t.slot_of(0, 3), -1);
    get(2);  // the least requested resident is now 0 (three against four)
    EXPECT_EQ(t.slot_of(0, 0), -1);
    EXPECT_GE(t.slot_of(0, 1), 0);
    EXPECT_EQ(t.stats().hits + t.stats().misses, 10u);
}

// Admission of misses read in place (ExpertSlotTable::admit, factor 2): an empty slot takes any; a full cache gives
// up its least requested slot only to an expert requested more than twice as often, counting the request; a refused
// miss leaves the cache as it was (and is no miss of the table's: the pass read it in place); LRU never admits.
TEST(ExpertSlotTable, AdmitTakesOnlyFarMoreRequestedMisses) {
    ExpertSlotTable t({6}, {10}, 2, SlotPolicy::Lfu);
    std::vector<SlotFill> fills;
    int32_t s[1];
    auto get = [&](int32_t e) { t.acquire(0, &e, 1, s, false, fills); };
    get(0), get(0), get(1);  // counts 0: 2, 1: 1; the cache is full
    fills.clear();
    const ExpertSlotTable::Stats before = t.stats();
    EXPECT_FALSE(t.admit(0, 2, 2.0, fills));  // 2 asked once: not above twice 1's one
    EXPECT_FALSE(t.admit(0, 2, 2.0, fills));  // twice: not above twice one either
    EXPECT_TRUE(fills.empty());
    EXPECT_EQ(t.slot_of(0, 2), -1);
    EXPECT_GE(t.slot_of(0, 1), 0);
    EXPECT_TRUE(t.admit(0, 2, 2.0, fills));  // three: above two, takes 1's slot
    ASSERT_EQ(fills.size(), 1u);
    EXPECT_EQ(fills[0].expert, 2);
    EXPECT_EQ(t.slot_of(0, 2), fills[0].slot);
    EXPECT_EQ(t.slot_of(0, 1), -1);
    EXPECT_GE(t.slot_of(0, 0), 0);
    EXPECT_EQ(t.stats().hits, before.hits);
    EXPECT_EQ(t.stats().misses, before.misses);
    EXPECT_EQ(t.stats().bytes_filled, before.bytes_filled + 10);
    // an empty slot takes any miss: a table with a free slot
    ExpertSlotTable u({6}, {10}, 2, SlotPolicy::Lfu);
    fills.clear();
    EXPECT_TRUE(u.admit(0, 4, 2.0, fills));
    EXPECT_EQ(u.slot_of(0, 4), fills[0].slot);
    // LRU: no counts, no admission
    ExpertSlotTable l({6}, {10}, 2, SlotPolicy::Lru);
    fills.clear();
    EXPECT_FALSE(l.admit(0, 4, 2.0, fills));
    EXPECT_TRUE(fills.empty());
}

TEST(ExpertSlotTable, LfuDecayLetsRecentRequestsWin) {
    // 0 asked 8 times, then 1 asked 3 times, then 2 comes to two slots: without decay 0 keeps its slot; halving
    // every 2 requests weighs 1's recent requests more (0's count 30 against 1's 64 in units of the first increment).
    auto keeps_zero = [](uint64_t decay_every) {
        ExpertSlotTable t({3}, {1}, 2, SlotPolicy::Lfu, decay_every);
        std::vector<SlotFill> fills;
        int32_t s[1];
        auto get = [&](int32_t e) { t.acquire(0, &e, 1, s, false, fills); };
        for (int i = 0; i < 8; i++) get(0);
        for (int i = 0; i < 3; i++) get(1);
        get(2);
        return t.slot_of(0, 0) >= 0;
    };
    EXPECT_TRUE(keeps_zero(0));   // 8 against 3
    EXPECT_FALSE(keeps_zero(2));  // 0's count halved four more times than 1's
}

TEST(ExpertSlotTable, LfuNeverGivesUpAPinnedSlotOrOneOfTheRequest) {
    ExpertSlotTable t({4}, {1}, 2, SlotPolicy::Lfu);
    std::vector<SlotFill> fills;
    int32_t s[2];
    const int32_t ab[2] = {0, 1};
    t.acquire(0, ab, 2, s, false, fills);
    t.pin(s[0], true);
    t.pin(s[1], true);
    const int32_t c[1] = {2};
    EXPECT_THROW(t.acquire(0, c, 1, s, false, fills), Error);
    EXPECT_EQ(t.slot_of(0, 2), -1);
    t.pin(t.slot_of(0, 1), false);
    fills.clear();
    t.acquire(0, c, 1, s, false, fills);  // 1 was unpinned: it goes, 0 stays
    EXPECT_EQ(t.slot_of(0, 1), -1);
    EXPECT_GE(t.slot_of(0, 0), 0);
    // two missing experts through 2 slots where 0 is pinned: refused, no fill asked for, 0 still there
    const int32_t bd[2] = {1, 3};
    fills.clear();
    EXPECT_THROW(t.acquire(0, bd, 2, s, false, fills), Error);
    EXPECT_TRUE(fills.empty());
    EXPECT_EQ(t.slot_of(0, 1), -1);
    EXPECT_EQ(t.slot_of(0, 3), -1);
    EXPECT_GE(t.slot_of(0, 0), 0);
}

TEST(ExpertSlotTable, LfuServesALayerCycleThatLruCannot) {
    // Decoding's pattern: every step visits layers 0..3, two experts each, from a skewed choice (experts 0-1 most of
    // the time); 6 slots for 8 requests per step. LRU evicts each expert just before its layer comes round again.
    auto hits = [](SlotPolicy p) {
        ExpertSlotTable t({4, 4, 4, 4}, {1, 1, 1, 1}, 6, p, 4 * 2 * 32);
        std::vector<SlotFill> fills;
        int32_t s[2];
        uint32_t x = 12345;
        for (int step = 0; step < 400; step++) {
            t.begin_pass();
            for (int64_t il = 0; il < 4; il++) {
                x = x * 1103515245u + 12345u;
                const int32_t pair[2] = {0, (x >> 16) % 8 == 0 ? 2 + int32_t((x >> 20) % 2) : 1};
                t.acquire(il, pair, 2, s, false, fills);
            }
        }
        return t.stats().hits;
    };
    const uint64_t lru = hits(SlotPolicy::Lru), lfu = hits(SlotPolicy::Lfu), next = hits(SlotPolicy::Next);
    std::printf("  layer cycle, 3,200 requests: LRU %llu hits, LFU %llu, expected next use %llu\n",
                (unsigned long long)lru, (unsigned long long)lfu, (unsigned long long)next);
    EXPECT_LT(lru, 320u);        // under 10%
    EXPECT_GT(lfu, 1600u);       // over half
    EXPECT_GT(next, 1600u);
}

// Expected next use (SlotPolicy::Next), worked by hand: two MoE layers of two experts, two slots, no decay; a pass
// reads layer 0 then layer 1. The streams of tools/trace's test_next_use_by_hand, with the same hits.
TEST(ExpertSlotTable, NextUseEvictsTheExpertExpectedFarthest) {
    struct Rec {
        int pass;
        bool decode;
        int64_t il;
        int32_t e;
    };
    // Each record one expert; a decode record's miss is offered for admission, a prompt record's acquired.
    auto replay = [](const std::vector<Rec> &recs, std::vector<int> &hits) {
        ExpertSlotTable t({2, 2}, {1, 1}, 2, SlotPolicy::Next);
        std::vector<SlotFill> fills;
        int last = -1;
        for (const Rec &r : recs) {
            if (r.pass != last) t.begin_pass(), last = r.pass;
            const bool hit = t.slot_of(r.il, r.e) >= 0;
            hits.push_back(hit);
            int32_t s;
            if (!r.decode)
                t.acquire(r.il, &r.e, 1, &s, false, fills);
            else if (hit)
                t.note_requests(r.il, &r.e, 1);
            else
                t.admit(r.il, r.e, 2.0, fills);
        }
        return t;
    };
    // Experts (0, 0) and (1, 0) fill the cache and hit in pass 1. In pass 2 (0, 1) misses: both cached experts were
    // used in 2 of 3 passes, so each waits L (1 - p) / p = 1 layer step past its layer's turn, which comes in 1 step
    // for layer 1 and 2 for layer 0 (its turn now): (0, 0) is expected farthest (3 against 2). Decoding, (0, 1) (1 pass
    // of 3) would wait 2 + 2 (2/3) / (1/3) = 6 > 3: read where it is, and (0, 0) hits in pass 3.
    std::vector<Rec> recs = {{0, true, 0, 0}, {0, true, 1, 0}, {1, true, 0, 0}, {1, true, 1, 0},
                             {2, true, 0, 1}, {2, true, 1, 0}, {3, true, 0, 0}};
    std::vector<int> hits;
    replay(recs, hits);
    EXPECT_EQ(hits, (std::vector<int>{0, 0, 1, 1, 0, 1, 1}));
    // A prompt pass 2 takes every miss: (0, 1) takes (0, 0)'s place, not (1, 0)'s, which hits; (0, 0) then misses.
    recs[4].decode = recs[5].decode = false;
    hits.clear();
    replay(recs, hits);
    EXPECT_EQ(hits, (std::vector<int>{0, 0, 1, 1, 0, 1, 0}));
    // Layer 1's expert 1 comes in a prompt pass reading layer 1 only: it takes (1, 0)'s place, whose layer's turn is
    // now (a whole cycle to its next), not (0, 0)'s, whose turn comes next; LFU's recency would take (0, 0).
    recs = {{0, true, 0, 0},  {0, true, 1, 0}, {1, true, 0, 0}, {1, true, 1, 0},
            {2, false, 1, 1}, {3, true, 0, 0}, {3, true, 1, 0}};
    hits.clear();
    const ExpertSlotTable t = replay(recs, hits);
    EXPECT_EQ(hits, (std::vector<int>{0, 0, 1, 1, 0, 1, 0}));
    EXPECT_GE(t.slot_of(1, 0), 0);  // pass 3's miss of (1, 0), offered for admission, took (1, 1)'s place back
    EXPECT_EQ(t.policy(), SlotPolicy::Next);
}

// Under expected next use, admission never gives up a slot the layer's turn has touched (its hits, noted before its
// misses are offered), though that slot's wait is the longest.
TEST(ExpertSlotTable, NextUseAdmissionKeepsTheTurnsOwnSlots) {
    ExpertSlotTable t({2, 2}, {1, 1}, 2, SlotPolicy::Next);
    std::vector<SlotFill> fills;
    int32_t s[1];
    const int32_t e0 = 0, e1 = 1;
    for (int pass = 0; pass < 4; pass++) {  // (1, 0) in passes 0-3, (0, 0) in pass 0: the cache holds both
        t.begin_pass();
        if (pass == 0) t.acquire(0, &e0, 1, s, false, fills);
        t.acquire(1, &e0, 1, s, false, fills);
    }
    for (int pass = 4; pass < 8; pass++) {  // (0, 1) read in place and (1, 0) hit, in passes 4-7
        t.begin_pass();
        t.note_requests(0, &e1, 1);
        t.note_requests(1, &e0, 1);
    }
    // Pass 8 asks for (0, 0) and (0, 1): rates 2/9 and 5/9, (1, 0) 8/9. (0, 0) waits longest (2 + 2 (7/9) / (2/9)
    // = 9 layer steps) but is the turn's own; (1, 0) waits 1 + 2 (1/9) / (8/9) = 1.25, less than (0, 1)'s own
    // 2 + 2 (4/9) / (5/9) = 3.6: refused.
    t.begin_pass();
    t.note_requests(0, &e0, 1);
    fills.clear();
    EXPECT_FALSE(t.admit(0, e1, 2.0, fills));
    EXPECT_GE(t.slot_of(0, 0), 0);
    EXPECT_GE(t.slot_of(1, 0), 0);
    // Pass 9 asks for (0, 1) alone: (0, 0) (2/10: 10 steps) is no longer the turn's, and (0, 1) (6/10: 3.3) takes it
    t.begin_pass();
    EXPECT_TRUE(t.admit(0, e1, 2.0, fills));
    EXPECT_EQ(t.slot_of(0, 0), -1);
    EXPECT_GE(t.slot_of(0, 1), 0);
}

TEST(ExpertSlotTable, PolicyNames) {
    EXPECT_EQ(parse_slot_policy("lru"), SlotPolicy::Lru);
    EXPECT_EQ(parse_slot_policy("lfu"), SlotPolicy::Lfu);
    EXPECT_EQ(parse_slot_policy("next"), SlotPolicy::Next);
    EXPECT_STREQ(slot_policy_name(SlotPolicy::Lfu), "lfu");
    EXPECT_STREQ(slot_policy_name(SlotPolicy::Next), "next");
    try {
        parse_slot_policy("arc");
        FAIL() << "accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("expected lru, lfu or next"), std::string::npos) << e.what();
    }
}

TEST(ExpertSlotTable, PlaceAllGivesEveryExpertItsOwnSlot) {
    ExpertSlotTable t({2, 0, 3}, {1, 0, 1}, 5);
    const auto fills = t.place_all();
    EXPECT_TRUE(t.all_resident());
    EXPECT_EQ(fills[0].size(), 2u);
    EXPECT_TRUE(fills[1].empty());
    EXPECT_EQ(fills[2].size(), 3u);
    std::vector<int> used(5, 0);
    for (const auto &f : fills)
        for (const SlotFill &x : f) used[size_t(x.slot)]++;
    EXPECT_EQ(used, std::vector<int>(5, 1));
    EXPECT_EQ(t.stats().bytes_filled, 0u);  // start-up, not traffic
}

// ---- grouping ----

TEST(RouteGroups, RowsByExpertAndEntriesInExpertOrder) {
    // 3 tokens, k = 2, 4 experts.
    const std::vector<int32_t> ids = {2, 0, 0, 3, 2, 3};
    const RouteGroups g = group_by_expert(ids, 3, 2, 4);
    EXPECT_EQ(g.used, (std::vector<int32_t>{0, 2, 3}));
    EXPECT_EQ(g.count, (std::vector<int32_t>{2, 0, 2, 2}));
    EXPECT_EQ(g.first, (std::vector<int32_t>{0, 2, 2, 4}));
    EXPECT_EQ(g.src_row, (std::vector<int64_t>{0, 1, 0, 2, 1, 2}));  // expert 0: tokens 0, 1; 2: 0, 2; 3: 1, 2
    // Token 0 adds expert 0 (entry 1, row 0) then expert 2 (entry 0, row 2).
    EXPECT_EQ(std::vector<int32_t>(g.yrow.begin(), g.yrow.begin() + 2), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(std::vector<int32_t>(g.widx.begin(), g.widx.begin() + 2), (std::vector<int32_t>{1, 0}));
    EXPECT_EQ(std::vector<int32_t>(g.yrow.begin() + 4, g.yrow.end()), (std::vector<int32_t>{3, 5}));
}

// A reference grouping, written plainly: rows of each expert in token order (experts ascending, `last`'s after the
// others), and each token's entries sorted by expert id.
RouteGroups plain_groups(const std::vector<int32_t> &ids, int64_t T, int64_t k, int64_t n,
                         const std::vector<int32_t> &last) {
    RouteGroups g;
    g.count.assign(size_t(n), 0);
    g.first.assign(size_t(n), 0);
    for (int32_t e : ids) g.count[size_t(e)]++;
    for (int32_t e = 0; e < n; e++)
        if (g.count[size_t(e)]) g.used.push_back(e);
    std::vector<int32_t> order;
    for (int32_t e = 0; e < n; e++)
        if (std::find(last.begin(), last.end(), e) == last.end()) order.push_back(e);
    order.insert(order.end(), last.begin(), last.end());
    std::vector<int32_t> row_of(size_t(T * k));
    for (int32_t e : order) {
        g.first[size_t(e)] = int32_t(g.src_row.size());
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < k; j++)
                if (ids[size_t(t * k + j)] == e) {
                    row_of[size_t(t * k + j)] = int32_t(g.src_row.size());
                    g.src_row.push_back(t);
                }
    }
    for (int64_t t = 0; t < T; t++) {
        std::vector<int32_t> ord(static_cast<size_t>(k));
        for (int64_t j = 0; j < k; j++) ord[size_t(j)] = int32_t(j);
        std::sort(ord.begin(), ord.end(),
                  [&](int32_t a, int32_t b) { return ids[size_t(t * k + a)] < ids[size_t(t * k + b)]; });
        for (int64_t j = 0; j < k; j++) {
            g.yrow.push_back(row_of[size_t(t * k + ord[size_t(j)])]);
            g.widx.push_back(int32_t(t * k + ord[size_t(j)]));
        }
    }
    return g;
}

// The grouping a prompt pass takes (token ranges over a pool's threads, memory reused from call to call) is the plain
// one's, for passes below and above the parallel threshold, with and without experts placed last, on pools of 1-5.
TEST(RouteGroups, ThreadsAndReuseGiveThePlainGrouping) {
    std::mt19937 rng(5);
    RouteGroups g;  // reused across every call
    for (int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        for (int64_t T : {int64_t(1), int64_t(7), int64_t(3000), int64_t(9001)})
            for (int64_t k : {int64_t(4), int64_t(10)}) {
                const int64_t n = 128;
                std::vector<int32_t> ids(size_t(T * k));
                for (int64_t t = 0; t < T; t++) {
                    std::vector<int32_t> p(static_cast<size_t>(n));
                    for (int32_t i = 0; i < n; i++) p[size_t(i)] = i;
                    for (int64_t j = 0; j < k; j++) {
                        std::swap(p[size_t(j)], p[size_t(j + int64_t(rng() % uint32_t(n - j)))]);
                        ids[size_t(t * k + j)] = p[size_t(j)];
                    }
                }
                for (const std::vector<int32_t> &last : {std::vector<int32_t>{}, std::vector<int32_t>{3, 40, 127}}) {
                    const RouteGroups want = plain_groups(ids, T, k, n, last);
                    group_by_expert(ids, T, k, n, last, g, &pool);
                    const std::string what = "threads " + std::to_string(threads) + ", T " + std::to_string(T) +
                                             ", k " + std::to_string(k) + ", last " + std::to_string(last.size());
                    EXPECT_EQ(g.used, want.used) << what;
                    EXPECT_EQ(g.count, want.count) << what;
                    EXPECT_EQ(g.first, want.first) << what;
                    EXPECT_EQ(g.src_row, want.src_row) << what;
                    EXPECT_EQ(g.yrow, want.yrow) << what;
                    EXPECT_EQ(g.widx, want.widx) << what;
                }
            }
    }
}

// ---- what decoding reads ----

// From the file's tensor list, by name: routed experts k of n, the token embedding one row (the output matrix is
// separate in these files), everything else whole.
TEST(DecodeWeightBytes, KOfTheExpertsAndOneEmbeddingRow) {
    for (const char *preset : {"tiny-qwen3moe", "tiny-qwen3next"}) {
        const Loaded l = load(preset);
        const HParams &hp = l.m->hp;
        ASSERT_TRUE(l.m->output.present()) << preset;
        double want = 0;
        for (const GgufTensor &t : l.m->file->tensors()) {
            const std::string name(t.name);
            if (name.find("_exps.") != std::string::npos)
                want += double(t.n_bytes) * double(hp.n_expert_used) / double(hp.n_expert);
            else if (name == "token_embd.weight")
                want += double(row_bytes(t.type, t.ne[0]));
            else
                want += double(t.n_bytes);
        }
        EXPECT_DOUBLE_EQ(double(decode_weight_bytes(*l.m)), want) << preset;
    }
}

TEST(ExpertSlotTable, PinnedSlotsAreNoVictims) {
    ExpertSlotTable t({8}, {100}, 3);
    std::vector<SlotFill> fills;
    int32_t s[3];
    const int32_t first[3] = {0, 1, 2};
    t.acquire(0, first, 3, s, false, fills);
    t.pin(s[0], true);  // expert 0 is the least recently used, and kept
    const int32_t next[1] = {5};
    int32_t s5;
    fills.clear();
    t.acquire(0, next, 1, &s5, false, fills);
    EXPECT_NE(s5, s[0]);
    EXPECT_EQ(t.slot_of(0, 0), s[0]);
    EXPECT_EQ(t.slot_of(0, 1), -1);  // the least recently used one not pinned
    // scan eviction (the most recently used outside the request) skips pins too
    t.pin(s5, true);
    const int32_t more[1] = {6};
    int32_t s6;
    fills.clear();
    t.acquire(0, more, 1, &s6, true, fills);
    EXPECT_TRUE(s6 != s[0] && s6 != s5);
    // every slot pinned: a clear refusal, nothing changed
    t.pin(s6, true);
    const int32_t last[1] = {7};
    int32_t s7;
    fills.clear();
    const uint64_t misses = t.stats().misses;
    EXPECT_THROW(t.acquire(0, last, 1, &s7, false, fills), Error);
    EXPECT_EQ(t.slot_of(0, 6), s6);
    EXPECT_EQ(t.slot_of(0, 7), -1);
    EXPECT_TRUE(fills.empty());
    EXPECT_EQ(t.stats().misses, misses);
    t.pin(s6, false);
    fills.clear();
    t.acquire(0, last, 1, &s7, false, fills);
    EXPECT_EQ(s7, s6);
}

// The prompts' favourites: scores are the rows per expert, halving every k_favourite_half_tokens prompt tokens;
// keep_favourites fills empty slots first, then lets the weakest slot give way to the best expert in no slot while
// that one scores above factor times it, never touching a pinned or lent slot; the fills count as traffic.
TEST(ExpertSlotTable, FavouritesFillEmptySlotsThenReplaceTheWeakest) {
    for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu}) {
        ExpertSlotTable t({8, 0, 8}, {100, 0, 300}, 5, policy, 0);
        EXPECT_FALSE(t.favourites_pending());
        EXPECT_TRUE(t.keep_favourites(1.5)[0].empty());  // no scores: nothing to do
        std::vector<SlotFill> fills;
        int32_t s[4];
        const int32_t held[4] = {0, 1, 2, 3};  // four of the five slots; one stays empty
        t.acquire(0, held, 4, s, false, fills);
        // layer 0: experts 4 and 5 far ahead, 1 and 3 a little; layer 2: expert 6
        t.note_prompt_rows(0, {0, 2, 0, 4, 9, 8, 0, 0}, 64);
        t.note_prompt_rows(2, {0, 0, 0, 0, 0, 0, 5, 0}, 64);
        EXPECT_TRUE(t.favourites_pending());
        const uint64_t bytes = t.stats().bytes_filled, misses = t.stats().misses;
        const std::vector<std::vector<SlotFill>> f = t.keep_favourites(1.5);
        EXPECT_FALSE(t.favourites_pending());
        // 4 (9) takes the empty slot; 5 (8) and layer 2's 6 (5) replace 0 and 2 (score 0); 1 (2) stays, as 3 (4) does
        ASSERT_EQ(f.size(), 3u);
        EXPECT_EQ(f[0].size(), 2u);
        EXPECT_EQ(f[2].size(), 1u);
        for (int32_t e : {4, 5}) EXPECT_GE(t.slot_of(0, e), 0) << e;
        EXPECT_GE(t.slot_of(2, 6), 0);
        for (int32_t e : {0, 2}) EXPECT_EQ(t.slot_of(0, e), -1) << e;
        for (int32_t e : {1, 3}) EXPECT_EQ(t.slot_of(0, e), s[e]) << e;
        EXPECT_EQ(t.stats().bytes_filled, bytes + 2 * 100 + 300);
        EXPECT_EQ(t.stats().misses, misses);
        for (const std::vector<SlotFill> &layer : f)
            for (const SlotFill &x : layer) EXPECT_TRUE(x.slot >= 0 && x.slot < 5);
        // 7 at 2 rows does not beat 1.5 times expert 1's (2, decayed a little: the weakest slot)
        t.note_prompt_rows(0, {0, 0, 0, 0, 0, 0, 0, 2}, 1);
        EXPECT_TRUE(t.keep_favourites(1.5)[0].empty());
        EXPECT_EQ(t.slot_of(0, 7), -1);
        // a factor of 1 lets it in, in place of expert 1 (the weakest slot)
        t.note_prompt_rows(0, {0, 0, 0, 0, 0, 0, 0, 0}, 1);
        const std::vector<std::vector<SlotFill>> g = t.keep_favourites(1.0);
        ASSERT_EQ(g[0].size(), 1u);
        EXPECT_EQ(g[0][0].slot, s[1]);
        EXPECT_EQ(t.slot_of(0, 7), s[1]);
        EXPECT_EQ(t.slot_of(0, 1), -1);
    }
}

TEST(ExpertSlotTable, FavouriteScoresHalveEveryHalfLifeOfPromptTokens) {
    ExpertSlotTable t({4}, {100}, 2);
    const int64_t half = int64_t(ExpertSlotTable::k_favourite_half_tokens);
    t.note_prompt_rows(0, {8, 0, 0, 0}, 16);
    EXPECT_NEAR(t.favourite_score(0, 0), 8.0, 1e-12);
    t.note_prompt_rows(0, {0, 4, 0, 0}, half);
    EXPECT_NEAR(t.favourite_score(0, 0), 4.0, 1e-12);
    EXPECT_NEAR(t.favourite_score(0, 1), 4.0, 1e-12);
    t.note_prompt_rows(0, {0, 0, 0, 0}, 2 * half);
    EXPECT_NEAR(t.favourite_score(0, 0), 1.0, 1e-12);
    EXPECT_EQ(t.favourite_score(0, 2), 0.0);
}

TEST(ExpertSlotTable, FavouritesNeverTakeAPinnedOrLentSlot) {
    ExpertSlotTable t({8}, {100}, 4);
    std::vector<SlotFill> fills;
    int32_t s[4];
    const int32_t held[4] = {0, 1, 2, 3};
    t.acquire(0, held, 4, s, false, fills);
    t.pin(s[0], true);
    const std::vector<std::pair<int32_t, int32_t>> lent = t.lend(1);  // the top slot, holding one of the four
    ASSERT_EQ(lent.size(), 1u);
    t.note_prompt_rows(0, {0, 0, 0, 0, 9, 9, 9, 9}, 64);
    const std::vector<std::vector<SlotFill>> f = t.keep_favourites(1.5);
    EXPECT_EQ(f[0].size(), 2u);  // four slots, one pinned and one lent
    EXPECT_EQ(t.slot_of(0, 0), s[0]);
    for (const SlotFill &x : f[0]) EXPECT_TRUE(x.slot != s[0] && x.slot < 3) << x.slot;
    t.end_loan();  // the lent slot comes back empty: the next call fills it
    t.note_prompt_rows(0, {0, 0, 0, 0, 0, 0, 0, 0}, 1);
    EXPECT_EQ(t.keep_favourites(1.5)[0].size(), 1u);
}

// A cap on the fills of a call: the best-scored go first, the call leaves the favourites pending, the next goes on
// where it stopped, and the end is the same cache as one call without the cap.
TEST(ExpertSlotTable, FavouriteFillsUpToACapACall) {
    auto table = [] {
        auto t = std::make_unique<ExpertSlotTable>(std::vector<int64_t>{8}, std::vector<size_t>{100}, 4);
        std::vector<SlotFill> fills;
        int32_t s[4];
        const int32_t held[4] = {0, 1, 2, 3};
        t->acquire(0, held, 4, s, false, fills);
        t->note_prompt_rows(0, {0, 1, 0, 0, 9, 7, 5, 0}, 64);
        return t;
    };
    auto whole = table();
    EXPECT_EQ(whole->keep_favourites(1.5)[0].size(), 3u);
    auto capped = table();
    std::vector<SlotFill> f = capped->keep_favourites(1.5, 2)[0];
    ASSERT_EQ(f.size(), 2u);
    EXPECT_GE(capped->slot_of(0, 4), 0);  // the best two first
    EXPECT_GE(capped->slot_of(0, 5), 0);
    EXPECT_EQ(capped->slot_of(0, 6), -1);
    EXPECT_TRUE(capped->favourites_pending());
    f = capped->keep_favourites(1.5, 2)[0];
    ASSERT_EQ(f.size(), 1u);
    EXPECT_FALSE(capped->favourites_pending());
    for (int32_t e = 0; e < 8; e++) EXPECT_EQ(capped->slot_of(0, e) >= 0, whole->slot_of(0, e) >= 0) << e;
    EXPECT_TRUE(capped->keep_favourites(1.5, 2)[0].empty());
}

// Scores given back (an expert-popularity profile): each layer with experts takes its list, keep_favourites is then
// due and fills the best of them; the scores read back are the ones given; a list of another length is refused.
TEST(ExpertSlotTable, SeededFavouritesAreKeptAsDecodingBegins) {
    ExpertSlotTable t({4, 0, 4}, {100, 0, 100}, 3);
    EXPECT_TRUE(t.favourite_scores().empty());
    t.seed_favourites({{0, 7, 0, 3}, {}, {5, 0, 0, 0}});
    EXPECT_TRUE(t.favourites_pending());
    ASSERT_EQ(t.favourite_scores().size(), 3u);
    EXPECT_EQ(t.favourite_scores()[0], (std::vector<double>{0, 7, 0, 3}));
    EXPECT_TRUE(t.favourite_scores()[1].empty());
    const std::vector<std::vector<SlotFill>> f = t.keep_favourites(1.5);
    EXPECT_EQ(f[0].size(), 2u);
    EXPECT_EQ(f[2].size(), 1u);
    for (int32_t e : {1, 3}) EXPECT_GE(t.slot_of(0, e), 0) << e;
    EXPECT_GE(t.slot_of(2, 0), 0);
    // prompts add to the given scores, halving them as they go
    t.note_prompt_rows(0, {0, 0, 2, 0}, int64_t(ExpertSlotTable::k_favourite_half_tokens));
    EXPECT_NEAR(t.favourite_score(0, 1), 3.5, 1e-12);
    EXPECT_NEAR(t.favourite_score(0, 2), 2.0, 1e-12);
    EXPECT_THROW(t.seed_favourites({{1, 2, 3}}), Error);
    EXPECT_THROW(t.seed_favourites({{}, {}, {}, {1, 2, 3, 4}}), Error);
}

// A prompt loan takes the top slots out of the cache under either policy: their experts are forgotten (and named),
// no request gets one while lent, and they come back empty, the first to be filled.
TEST(ExpertSlotTable, LentSlotsLeaveTheCacheAndComeBackEmpty) {
    for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu}) {
        ExpertSlotTable t({8, 8}, {100, 100}, 6, policy, 0);
        std::vector<SlotFill> fills;
        int32_t s[6];
        const int32_t all[6] = {0, 1, 2, 3, 4, 5};
        t.acquire(0, all, 6, s, false, fills);
        const std::vector<std::pair<int32_t, int32_t>> held = t.lend(2);
        EXPECT_EQ(t.n_slots(), 4);
        EXPECT_EQ(t.n_lent(), 2);
        ASSERT_EQ(held.size(), 2u);
        for (const auto &[il, e] : held) {
            EXPECT_EQ(il, 0);
            EXPECT_EQ(t.slot_of(0, e), -1);
        }
        // requests of another layer cycle through the four slots left, never a lent one
        for (int round = 0; round < 3; round++)
            for (int32_t e = 0; e < 8; e++) {
                int32_t got;
                fills.clear();
                t.acquire(1, &e, 1, &got, false, fills);
                EXPECT_LT(got, 4) << slot_policy_name(policy);
            }
        t.end_loan();
        EXPECT_EQ(t.n_slots(), 6);
        EXPECT_EQ(t.n_lent(), 0);
        // the returned slots are filled first, and only those
        fills.clear();
        EXPECT_TRUE(t.fill_empty(0, held[0].second, fills));
        EXPECT_TRUE(t.fill_empty(0, held[1].second, fills));
        ASSERT_EQ(fills.size(), 2u);
        EXPECT_GE(std::min(fills[0].slot, fills[1].slot), 4);
        EXPECT_NE(fills[0].slot, fills[1].slot);
        int32_t other = 7;
        while (t.slot_of(0, other) >= 0) other--;
        EXPECT_FALSE(t.fill_empty(0, other, fills)) << "no empty slot is left";
        EXPECT_EQ(fills.size(), 2u);
    }
}

namespace {

// The tensors of a preset's shapes without a file: every layer's routed experts (Q4_K) and one dense Q8_0 matrix a
// layer of about its attention's size, plus the embeddings; pointers distinct, never read.
struct FakeWeights {
    std::vector<Weight> w;
    WeightSet ws;
    HParams hp;
    CacheShape caches;
};
// mixed: the down matrices of SynthOptions::mixed_down_type's layers Q6_K (as a Q4_K_M file has them).
std::unique_ptr<FakeWeights> fake_weights(const std::string &preset, bool mixed = false) {
    auto f = std::make_unique<FakeWeights>();
    f->hp = synth_hparams(preset);
    const HParams &hp = f->hp;
    const int64_t E = hp.n_embd, F = hp.n_ff_exp, L = hp.n_layer;
    f->w.reserve(size_t(4 * L + 2));
    static uint8_t base[1];
    auto add = [&](DType t, int64_t k, int64_t n, int64_t ne2) -> Weight * {
        Weight x;
        x.name = "fake";
        x.type = t;
        x.ne[0] = k, x.ne[1] = n, x.ne[2] = ne2;
        x.row_bytes = size_t(k / dtype_info(t).block_size) * dtype_info(t).block_bytes;
        x.expert_stride = x.matrix_bytes();
        x.host = base + f->w.size();  // distinct, never read
        f->w.push_back(x);
        return &f->w.back();
    };
    f->ws.matrices.push_back(add(DType::Q8_0, E, hp.n_vocab, 1));
    f->ws.matrices.push_back(add(DType::Q8_0, E, hp.n_vocab, 1));
    f->ws.experts.resize(size_t(L));
    for (int64_t il = 0; il < L; il++) {
        f->ws.matrices.push_back(add(DType::Q8_0, E, 4 * E, 1));
        ExpertWeights &x = f->ws.experts[size_t(il)];
        x.il = il;
        x.gate = add(DType::Q4_K, E, F, hp.n_expert);
        x.up = add(DType::Q4_K, E, F, hp.n_expert);
        x.down = add(mixed && mixed_down_layer(il, L) ? DType::Q6_K : DType::Q4_K, F, E, hp.n_expert);
    }
    f->caches = cache_shape(hp, 1, 32768, KvType::F16);
    return f;
}

}  // namespace

// Prompt loans on the real presets' shapes under a 12 GiB budget: the resident scratch is for 512-token passes,
// bigger passes borrow the top slots, the cache keeps its floor, the loan holds the chunk's scratch, and a chunk no
// loan can hold shrinks to the largest that fits. Without loans (the switch) the whole chunk's scratch is resident.
TEST(PlacementPlan, PromptLoansLendSlotsToBigPasses) {
    for (const char *preset : {"qwen3-30b-a3b", "qwen3-next-80b-a3b"}) {
        const auto f = fake_weights(preset);
        const DeviceFacts d = device(140 * GiB);
        for (int64_t chunk : {int64_t(512), int64_t(4096), int64_t(16384), int64_t(32768)}) {
            PlanOptions o;
            o.vram_budget = 12 * GiB;
            o.chunk_tokens = chunk;
            const Placement p = plan_placement(f->ws, f->hp, f->caches, d, o);
            SCOPED_TRACE(std::string(preset) + ", chunk " + std::to_string(chunk) + ": " + p.check_line);
            std::printf("%s chunk %lld: %s\n", preset, (long long)chunk, p.check_line.c_str());
            EXPECT_FALSE(p.all_resident());
            EXPECT_EQ(p.resident_chunk_tokens, std::min<int64_t>(chunk, k_loan_resident_chunk));
            EXPECT_EQ(p.scratch_bytes, (scratch_estimate(f->hp, p.resident_chunk_tokens) + 255) / 256 * 256);
            if (chunk <= k_loan_resident_chunk) {
                EXPECT_EQ(p.loan_slots, 0);
                continue;
            }
            ASSERT_GT(p.loan_slots, 0);
            EXPECT_LE(p.chunk_tokens, chunk);
            EXPECT_GT(p.chunk_tokens, k_loan_resident_chunk);
            EXPECT_GE(uint64_t(p.loan_slots) * p.slot_bytes, scratch_estimate(f->hp, p.chunk_tokens));
            EXPECT_GE(p.n_slots - p.loan_slots, k_loan_floor_layers * f->hp.n_expert);
            // a shorter pass borrows what its own scratch needs: no more, never less, never more than the chunk's
            EXPECT_EQ(p.loan_slots_for(k_loan_resident_chunk), 0);
            EXPECT_EQ(p.loan_slots_for(p.chunk_tokens), p.loan_slots);
            int64_t before = 0;
            for (int64_t t = k_loan_resident_chunk + 1; t <= p.chunk_tokens; t += 97) {
                const int64_t n = p.loan_slots_for(t);
                EXPECT_GE(uint64_t(n) * p.slot_bytes, scratch_estimate(f->hp, t)) << t;
                EXPECT_LT(uint64_t(n - 1) * p.slot_bytes, scratch_estimate(f->hp, (t + 255) / 256 * 256)) << t;
                EXPECT_GE(n, before) << t;
                EXPECT_LE(n, p.loan_slots) << t;
                before = n;
            }
            if (p.chunk_tokens >= 4096) {
                EXPECT_LT(p.loan_slots_for(1024), p.loan_slots);
            }
            if (p.chunk_tokens < chunk) {  // the next size up would not have fitted
                EXPECT_GT(scratch_estimate(f->hp, p.chunk_tokens + 256),
                          uint64_t(p.n_slots - k_loan_floor_layers * f->hp.n_expert) * p.slot_bytes);
                EXPECT_NE(p.check_line.find("not the " + std::to_string(chunk) + " asked"), std::string::npos);
            }
            EXPECT_NE(p.check_line.find("prompt loan"), std::string::npos);
            // the switch off: the chunk's scratch resident, fewer slots
            o.prompt_loan = false;
            try {
                const Placement q = plan_placement(f->ws, f->hp, f->caches, d, o);
                EXPECT_EQ(q.loan_slots, 0);
                EXPECT_EQ(q.chunk_tokens, chunk);
                EXPECT_LT(q.n_slots, p.n_slots);
            } catch (const Error &) {  // the chunk's scratch alone is more than the budget
                EXPECT_GE(scratch_estimate(f->hp, chunk), 8 * GiB);
            }
        }
    }
}

// Two expert sizes (the down matrices of half the layers Q6_K): each layer's experts take slots of their own size, the
// slot classes in increasing size and numbered class after class; every class's experts cached in about the same
// share; every byte within the budget, and as many slots or more than one class of the largest size gives (the
// switch off), more where the cache is partial; the check line names the sizes.
TEST(PlacementPlan, LayersOfTwoExpertSizesTakeSlotsOfTheirOwnSize) {
    const Loaded l = load("tiny-qwen3next", 4096, true);
    const DeviceFacts d = device(80 * GiB);
    const Placement all = plan(l, d);
    ASSERT_EQ(all.slot_classes.size(), 2u);
    EXPECT_LT(all.slot_classes[0].bytes, all.slot_classes[1].bytes);
    EXPECT_EQ(all.slot_bytes, all.slot_classes[1].bytes);
    EXPECT_TRUE(all.all_resident());
    std::vector<int64_t> experts(2, 0);
    for (size_t il = 0; il < all.layouts.size(); il++) {
        const ExpertSlotLayout &L = all.layouts[il];
        ASSERT_GE(L.cls, 0);
        EXPECT_EQ(all.slot_classes[size_t(L.cls)].bytes, L.bytes) << il;
        EXPECT_EQ(L.cls, mixed_down_layer(int64_t(il), l.m->hp.n_layer_all) ? 1 : 0) << il;
        experts[size_t(L.cls)] += l.m->hp.n_expert;
    }
    for (size_t c = 0; c < 2; c++) {
        EXPECT_EQ(all.slot_classes[c].n_experts, experts[c]);
        EXPECT_EQ(all.slot_classes[c].n, experts[c]);  // all resident: a slot each
    }
    EXPECT_EQ(all.slot_classes[1].first, all.slot_classes[0].n);
    const uint64_t minimum = named_minimum(l, d), top = minimum + all.slots_total_bytes() * 5 / 4;
    int gained = 0;
    for (int i = 0; i <= 16; i++) {
        PlanOptions o;
        o.vram_budget = minimum + 128 * 1024 + uint64_t(i) * ((top - minimum) / 16);
        const Placement p = plan(l, d, o);
        o.slot_classes = false;
        const Placement q = plan(l, d, o);
        SCOPED_TRACE(p.check_line);
        ASSERT_EQ(q.slot_classes.size(), 1u);
        EXPECT_EQ(q.slot_classes[0].bytes, q.slot_bytes);
        EXPECT_EQ(q.slot_classes[0].n, q.n_slots);
        EXPECT_LE(resident(p) + p.slots_total_bytes(), p.budget_bytes);
        EXPECT_GE(p.n_slots, q.n_slots);
        int64_t sum = 0;
        for (const SlotClass &c : p.slot_classes) {
            EXPECT_EQ(c.first, sum);
            sum += c.n;
        }
        EXPECT_EQ(sum, p.n_slots);
        if (p.slot_classes.size() == 2 && !p.all_resident()) {
            const SlotClass &a = p.slot_classes[0], &b = p.slot_classes[1];
            EXPECT_GE(a.n, l.m->hp.n_expert_used);
            EXPECT_GE(b.n, l.m->hp.n_expert_used);
            EXPECT_NEAR(double(a.n) / double(a.n_experts), double(b.n) / double(b.n_experts),
                        2.0 / double(std::min(a.n_experts, b.n_experts)));
            EXPECT_TRUE(std::regex_search(p.check_line, std::regex("; [0-9]+ x [0-9.]+ [KMG]iB \\+ [0-9]+ x ")));
            gained += p.n_slots > q.n_slots;
        }
    }
    EXPECT_GT(gained, 0);
    // Fewer slots asked for than there are sizes: one class of the largest size.
    PlanOptions one;
    one.expert_slots = 1;
    const Placement p1 = plan(l, d, one);
    ASSERT_EQ(p1.slot_classes.size(), 1u);
    EXPECT_EQ(p1.n_slots, 1);
    EXPECT_EQ(p1.slot_classes[0].bytes, p1.slot_bytes);
}

// The 30B-A3B's shape with a Q4_K_M file's Q6_K down matrices at 12 GiB: slots of two sizes hold more experts than
// slots all of the larger size, with the same chunk; a prompt loan borrows from every class, leaving each its share
// of the floor, and any loan (any pass size) takes one range of the loan's allocation: the last class's slots first.
TEST(PlacementPlan, SizeClassesOnAQ4KmShapeHoldMoreExpertsAndLendFromEveryClass) {
    const auto f = fake_weights("qwen3-30b-a3b", true);
    const DeviceFacts d = device(140 * GiB);
    for (int64_t chunk : {int64_t(512), int64_t(4096), int64_t(16384)}) {
        PlanOptions o;
        o.vram_budget = 12 * GiB;
        o.chunk_tokens = chunk;
        const Placement p = plan_placement(f->ws, f->hp, f->caches, d, o);
        o.slot_classes = false;
        const Placement q = plan_placement(f->ws, f->hp, f->caches, d, o);
        SCOPED_TRACE(p.check_line);
        std::printf("chunk %lld: %s\n  one size: %lld slots, chunk %lld\n", (long long)chunk, p.check_line.c_str(),
                    (long long)q.n_slots, (long long)q.chunk_tokens);
        ASSERT_EQ(p.slot_classes.size(), 2u);
        EXPECT_GT(p.n_slots, q.n_slots + q.n_slots / 20);  // the Q4_K layers' slots 13% smaller: 5% or more
        EXPECT_LE(resident(p) + p.slots_total_bytes(), p.budget_bytes);
        EXPECT_GE(p.chunk_tokens, q.chunk_tokens);
        if (chunk <= k_loan_resident_chunk) {
            EXPECT_EQ(p.loan_slots, 0);
            continue;
        }
        ASSERT_GT(p.loan_slots, 0);
        ASSERT_EQ(p.loan_class_slots.size(), 2u);
        EXPECT_GE(p.loan_bytes(), scratch_estimate(f->hp, p.chunk_tokens));
        int64_t sum = 0;
        for (size_t c = 0; c < 2; c++) {
            const SlotClass &k = p.slot_classes[c];
            EXPECT_GE(k.n - p.loan_class_slots[c],
                      k_loan_floor_layers * f->hp.n_expert * k.n_experts / p.n_experts_total);
            sum += p.loan_class_slots[c];
        }
        EXPECT_EQ(sum, p.loan_slots);
        // every pass size: enough bytes, and the tail of the allocation (class 0 only once class 1 is all taken)
        for (int64_t t = k_loan_resident_chunk + 1; t <= p.chunk_tokens; t += 193) {
            const std::vector<int64_t> x = p.loan_split_for(t);
            ASSERT_EQ(x.size(), 2u);
            EXPECT_GE(uint64_t(x[0]) * p.slot_classes[0].bytes + uint64_t(x[1]) * p.slot_classes[1].bytes,
                      scratch_estimate(f->hp, t))
                << t;
            EXPECT_TRUE(x[0] == 0 || x[1] == p.loan_class_slots[1]) << t;
            EXPECT_EQ(p.loan_slots_for(t), x[0] + x[1]);
        }
    }
}

// Size classes in the table: a layer's experts take only slots of its class, victims of either policy come from
// that class, a loan lends the top class's top slots, and favourites move within their class.
TEST(ExpertSlotTable, SizeClassesKeepTheirLayersApart) {
    for (SlotPolicy policy : {SlotPolicy::Lru, SlotPolicy::Lfu}) {
        SCOPED_TRACE(slot_policy_name(policy));
        // layers 0 and 2 in class 0 (slots 0-2), layer 1 in class 1 (slots 3-4)
        ExpertSlotTable t({4, 4, 4}, {100, 200, 100}, {0, 1, 0}, {3, 2}, policy, 0);
        EXPECT_EQ(t.n_slots(), 5);
        EXPECT_EQ(t.n_classes(), 2u);
        EXPECT_EQ(t.n_slots_for(0), 3);
        EXPECT_EQ(t.n_slots_for(1), 2);
        EXPECT_EQ(t.n_slots_for(2), 3);
        std::vector<SlotFill> fills;
        int32_t s[4];
        const int32_t e01[2] = {0, 1}, e012[3] = {0, 1, 2};
        t.acquire(1, e01, 2, s, false, fills);
        for (int i = 0; i < 2; i++) EXPECT_TRUE(s[i] == 3 || s[i] == 4) << s[i];
        t.acquire(0, e012, 3, s, false, fills);
        for (int i = 0; i < 3; i++) EXPECT_LT(s[i], 3);
        // a third expert of layer 1 evicts one of layer 1's, never layer 0's
        const int32_t e2 = 2;
        t.acquire(1, &e2, 1, s, false, fills);
        EXPECT_TRUE(s[0] == 3 || s[0] == 4) << s[0];
        for (int32_t e = 0; e < 3; e++) EXPECT_GE(t.slot_of(0, e), 0) << e;
        // layer 2 evicts layer 0's experts, never layer 1's
        t.acquire(2, e01, 2, s, false, fills);
        for (int i = 0; i < 2; i++) EXPECT_LT(s[i], 3);
        EXPECT_GE(t.slot_of(1, 2), 0);
        EXPECT_EQ(t.stats().misses, 8u);
        EXPECT_EQ(t.stats().bytes_filled, uint64_t(2 * 200 + 3 * 100 + 200 + 2 * 100));
        // a loan of one slot of each class: each class's top slot (2 and 4), the rest serving on
        const auto held = t.lend(std::vector<int64_t>{1, 1});
        EXPECT_EQ(t.n_slots(), 3);
        EXPECT_EQ(t.n_lent(), 2);
        EXPECT_EQ(t.n_slots_for(1), 1);
        EXPECT_EQ(t.n_slots_for(0), 2);
        for (const auto &[il, e] : held) EXPECT_EQ(t.slot_of(il, e), -1);
        const int32_t e3 = 3;
        t.acquire(1, &e3, 1, s, false, fills);
        EXPECT_EQ(s[0], 3);
        t.acquire(2, &e3, 1, s, false, fills);
        EXPECT_LT(s[0], 2);
        t.end_loan();
        EXPECT_EQ(t.n_slots_for(1), 2);
        EXPECT_EQ(t.n_slots_for(0), 3);
        EXPECT_EQ(t.n_lent(), 0);
        // favourites of layer 1 take class 1's slots only; layer 0's favourite takes class 0's
        std::vector<int32_t> rows1 = {0, 50, 0, 0}, rows0 = {0, 0, 0, 40};
        t.note_prompt_rows(1, rows1, 16);
        t.note_prompt_rows(0, rows0, 16);
        const std::vector<std::vector<SlotFill>> fav = t.keep_favourites(1.0);
        for (const SlotFill &f : fav[1]) EXPECT_TRUE(f.slot == 3 || f.slot == 4) << f.slot;
        for (const SlotFill &f : fav[0]) EXPECT_LT(f.slot, 3);
        EXPECT_GE(t.slot_of(1, 1), 3);
        EXPECT_GE(t.slot_of(0, 3), 0);
        EXPECT_LT(t.slot_of(0, 3), 3);
    }
    // every expert in a slot of its class
    ExpertSlotTable all({2, 2}, {300, 100}, {1, 0}, {2, 2}, SlotPolicy::Lru, 0);
    const auto fills = all.place_all();
    for (const SlotFill &f : fills[0]) EXPECT_GE(f.slot, 2);
    for (const SlotFill &f : fills[1]) EXPECT_LT(f.slot, 2);
    EXPECT_TRUE(all.all_resident());
}

// Where the slots live (slot_pools, what the CUDA backend allocates): every slot inside its pool, of its class's size,
// no two overlapping; pools of at most the cap except the loan's; the loan's pool the lendable slots exactly, and the
// slots of any loan (every pass size) one range of it, its tail. One size and two sizes, with loans and without.
TEST(PlacementPlan, SlotPoolsKeepEveryLoanOneRange) {
    for (const bool mixed : {false, true}) {
        const auto f = fake_weights("qwen3-30b-a3b", mixed);
        for (int64_t chunk : {int64_t(512), int64_t(4096), int64_t(16384)}) {
            PlanOptions o;
            o.vram_budget = 12 * GiB;
            o.chunk_tokens = chunk;
            const Placement p = plan_placement(f->ws, f->hp, f->caches, device(140 * GiB), o);
            SCOPED_TRACE(p.check_line);
            const uint64_t cap = uint64_t(256) << 20;
            const SlotPools sp = slot_pools(p, cap);
            ASSERT_EQ(int64_t(sp.slots.size()), p.n_slots);
            EXPECT_EQ(sp.loan_pool >= 0, p.loan_slots > 0);
            std::vector<std::vector<std::pair<uint64_t, uint64_t>>> used(sp.pool_bytes.size());
            for (const SlotClass &c : p.slot_classes)
                for (int64_t s = c.first; s < c.first + c.n; s++) {
                    const SlotPools::At &a = sp.slots[size_t(s)];
                    ASSERT_GE(a.pool, 0);
                    ASSERT_LT(size_t(a.pool), sp.pool_bytes.size());
                    EXPECT_EQ(a.bytes, c.bytes);
                    EXPECT_LE(a.offset + a.bytes, sp.pool_bytes[size_t(a.pool)]);
                    used[size_t(a.pool)].push_back({a.offset, a.offset + a.bytes});
                }
            for (size_t i = 0; i < used.size(); i++) {
                std::sort(used[i].begin(), used[i].end());
                uint64_t end = 0;
                for (const auto &[b, e] : used[i]) {
                    EXPECT_GE(b, end) << "pool " << i;  // no overlap
                    end = e;
                }
                EXPECT_EQ(end, sp.pool_bytes[i]) << "pool " << i;  // and no gap at the end
                if (int32_t(i) != sp.loan_pool) {
                    EXPECT_LE(sp.pool_bytes[i], cap);
                }
            }
            if (p.loan_slots == 0) continue;
            EXPECT_EQ(sp.pool_bytes[size_t(sp.loan_pool)], p.loan_bytes());
            for (int64_t t = k_loan_resident_chunk + 1; t <= p.chunk_tokens; t += 251) {
                const std::vector<int64_t> x = p.loan_split_for(t);
                std::vector<std::pair<uint64_t, uint64_t>> r;
                for (size_t c = 0; c < x.size(); c++) {
                    const SlotClass &k = p.slot_classes[c];
                    for (int64_t s = k.first + k.n - x[c]; s < k.first + k.n; s++) {
                        const SlotPools::At &a = sp.slots[size_t(s)];
                        EXPECT_EQ(a.pool, sp.loan_pool) << t;
                        r.push_back({a.offset, a.offset + a.bytes});
                    }
                }
                std::sort(r.begin(), r.end());
                for (size_t i = 1; i < r.size(); i++) EXPECT_EQ(r[i].first, r[i - 1].second) << t;
                ASSERT_FALSE(r.empty());
                EXPECT_EQ(r.back().second, p.loan_bytes()) << t;  // the tail
                EXPECT_GE(r.back().second - r.front().first, scratch_estimate(f->hp, t)) << t;
            }
        }
    }
}
