// A model placed on a backend (memory_strata.h).
#include "strata/memory_strata.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "core/env.h"
#include "core/error.h"

namespace strata {

PlanOptions plan_options_from_env(PlanOptions o) {
    o.host_pinned_copy = env_switch("STRATA_CUDA_HOST_PINNED", true);
    o.stager = env_switch("STRATA_CUDA_STAGER", true);
    o.pin_mapping = env_switch("STRATA_CUDA_PIN", false);
    o.prompt_loan = env_switch("STRATA_PROMPT_LOAN", true);
    o.slot_classes = env_switch("STRATA_SLOT_CLASSES", true);
    return o;
}

MemoryStrata::MemoryStrata(Backend &be, Model &m, const StrataOptions &o) : be_(be) {
    WeightSet ws = weight_set(m);
    experts_ = ws.experts;
    if (const char *r = std::getenv("STRATA_LOAN_REFILL"); r && *r) {
        if (std::strcmp(r, "last") == 0)
            refill_last_ = true;
        else if (std::strcmp(r, "before") != 0)
            fail("STRATA_LOAN_REFILL=%s: expected before or last", r);
    }
    loan_sized_ = env_switch("STRATA_LOAN_SIZED", true);
    const CacheShape caches = cache_shape(m.hp, o.n_seqs, o.n_ctx, o.kv_type, o.l0, o.l1);
    const DeviceFacts dev = be.device_facts();
    plan_ = plan_placement(ws, m.hp, caches, dev, o.plan);
    // The bus rate auto's cost model prices a copy at (prefill_cost.h), measured before anything of the budget is
    // held, where experts will stream; 0 where the backend cannot (the recall's line then decides).
    double bus_gbs = 0;
    if (plan_.device && !plan_.all_resident() && env_switch("STRATA_PREFILL_COST", true))
        bus_gbs = be.start_rates_gbs().second;
    be.prepare(ws, plan_);
    be.init_caches(plan_.caches);
    if (plan_.device) {
        std::vector<int64_t> n_expert(ws.experts.size(), 0);
        std::vector<size_t> expert_bytes(ws.experts.size(), 0);
        for (size_t il = 0; il < ws.experts.size(); il++)
            if (ws.experts[il].present()) {
                n_expert[il] = m.hp.n_expert;
                expert_bytes[il] = ws.experts[il].expert_bytes();
            }
        // LFU halves its counts every 32 tokens' worth of requests (a decode step requests k experts per MoE
        // layer): on the demo model's traces within a point of no decay, ahead of faster decay, and able to follow a
        // change of subject (tools/trace, --decay-every).
        int64_t n_moe = 0;
        for (const int64_t n : n_expert) n_moe += n > 0;
        const uint64_t decay_every = uint64_t(32 * n_moe * std::max<int64_t>(m.hp.n_expert_used, 1));
        std::vector<int32_t> layer_class(ws.experts.size(), -1);
        for (size_t il = 0; il < ws.experts.size() && il < plan_.layouts.size(); il++)
            if (n_expert[il] > 0) layer_class[il] = plan_.layouts[il].cls;
        std::vector<int64_t> class_slots;
        for (const SlotClass &c : plan_.slot_classes) class_slots.push_back(c.n);
        slots_ = std::make_unique<ExpertSlotTable>(std::move(n_expert), std::move(expert_bytes), std::move(layer_class),
                                                   class_slots, o.slot_policy, decay_every);
        if (plan_.all_resident()) {
            // Every expert in a slot of its own for good: filled once now, and the backend told so.
            const std::vector<std::vector<SlotFill>> fills = slots_->place_all();
            for (size_t il = 0; il < ws.experts.size(); il++) {
                if (!ws.experts[il].present()) continue;
                be.fill_slots(ws.experts[il], fills[il], /*ahead=*/true);
                std::vector<int32_t> slot_of(size_t(m.hp.n_expert));
                for (const SlotFill &f : fills[il]) slot_of[size_t(f.expert)] = f.slot;
                be.set_resident_experts(ws.experts[il], slot_of);
            }
        }
    }
    std::vector<const Weight *> routers(size_t(m.hp.n_layer), nullptr);
    for (int64_t il = 0; il < m.hp.n_layer; il++)
        if (m.layers[size_t(il)].gate_inp.present()) routers[size_t(il)] = &m.layers[size_t(il)].gate_inp;
    HybridOptions hy = o.hybrid;
    hy.on = hy.on && env_switch("STRATA_DECODE_CPU", true);
    schedule_ = std::make_unique<MoeSchedule>(be, ws.experts, std::move(routers), slots_.get(), hy);
    schedule_->set_bus_rate(bus_gbs);
    if (o.log && !plan_.check_line.empty()) {
        const bool partial = slots_ && !plan_.all_resident();
        std::string hybrid;
        if (schedule_->hybrid_threads() > 0) {
            hybrid = o.hybrid.share >= 0.0
                         ? strfmt(", %.0f%% of decoding's misses on %d host threads", 100.0 * o.hybrid.share,
                                  schedule_->hybrid_threads())
                         : strfmt(", decoding's misses split with %d host threads", schedule_->hybrid_threads());
            if (schedule_->hybrid_pinned()) hybrid += " (a core each)";
        }
        const std::string bus = bus_gbs > 0 ? strfmt(", bus %.1f GB/s", bus_gbs) : "";
        o.log(plan_.check_line + (partial ? std::string(", expert cache ") + slot_policy_name(o.slot_policy) : "") +
              bus + hybrid + be.prepare_note());
    }
}

void MemoryStrata::begin_loan(int64_t tokens) {
    if (lent_ || !slots_) return;
    const std::vector<int64_t> take = loan_sized_                            ? plan_.loan_split_for(tokens)
                                      : tokens > plan_.resident_chunk_tokens ? plan_.loan_class_slots
                                                                             : std::vector<int64_t>{};
    std::vector<int32_t> lent;  // each class's top take[c] slots
    for (size_t c = 0; c < take.size(); c++) {
        const SlotClass &k = plan_.slot_classes[c];
        for (int64_t s = k.first + k.n - take[c]; s < k.first + k.n; s++) lent.push_back(int32_t(s));
    }
    const int64_t n = int64_t(lent.size());
    if (n <= 0) return;
    schedule_->release_pins();
    loan_held_ = slots_->lend(take);
    try {
        be_.begin_loan(lent);
    } catch (...) {
        slots_->end_loan();
        throw;
    }
    lent_ = true;
    lent_n_ = n;
    loans_++;
    loaned_slots_ += uint64_t(n);
}

void MemoryStrata::end_loan() {
    if (!lent_) return;
    lent_ = false;
    be_.end_loan();
    slots_->end_loan();
    // What goes back into the returned slots: (layer, expert) pairs not in a slot, in order of preference.
    std::vector<std::pair<int32_t, int32_t>> want;
    if (schedule_->favourites_on()) {
        // left empty: the first decode-sized pass fills them with the prompts' favourites (moe_schedule.h)
    } else if (refill_last_) {
        const std::vector<std::vector<int32_t>> &rows = schedule_->last_rows();
        std::vector<std::pair<int32_t, std::pair<int32_t, int32_t>>> ranked;  // (-rows, (layer, expert))
        for (size_t il = 0; il < rows.size(); il++)
            for (size_t e = 0; e < rows[il].size(); e++)
                if (rows[il][e] > 0) ranked.push_back({-rows[il][e], {int32_t(il), int32_t(e)}});
        std::sort(ranked.begin(), ranked.end());
        for (const auto &r : ranked) want.push_back(r.second);
    } else {
        want = std::move(loan_held_);
    }
    loan_held_.clear();
    std::map<int32_t, std::vector<SlotFill>> fills;  // by layer
    int64_t left = lent_n_;
    for (const auto &[il, e] : want) {
        if (left == 0) break;
        if (slots_->slot_of(il, e) >= 0) continue;
        if (!slots_->fill_empty(il, e, fills[il])) continue;  // none of this layer's size left (size classes)
        left--;
    }
    for (auto &[il, f] : fills) {
        if (f.empty()) continue;
        try {
            be_.fill_slots(experts_[size_t(il)], f, /*ahead=*/true);
        } catch (...) {
            slots_->forget(il, f);
            throw;
        }
    }
}

ExpertCacheStats MemoryStrata::stats() const {
    ExpertCacheStats s;
    s.n_slots = plan_.n_slots;
    s.loans = loans_;
    s.loan_slots = plan_.loan_slots;
    s.loaned_slots = loaned_slots_;
    s.n_experts = plan_.n_experts_total;
    if (slots_) {
        s.expert_cache_hits = slots_->stats().hits;
        s.expert_cache_misses = slots_->stats().misses;
        s.bytes_streamed = slots_->stats().bytes_filled;
        const Backend::MappedReads m = be_.mapped_reads();
        s.expert_cache_hits += m.from_slots;
        s.expert_cache_misses += m.from_host;
        s.bytes_streamed += m.host_bytes;
        s.mapped_misses = m.from_host;
        if (schedule_) {
            s.expert_cache_misses += schedule_->mapped_misses();
            s.bytes_streamed += schedule_->mapped_bytes();
            s.mapped_misses += schedule_->mapped_misses();
            s.mapped_admitted = schedule_->admitted();
            s.favourite_fills = schedule_->favourite_fills();
        }
    }
    if (schedule_) {
        s.prefetch = schedule_->prefetch_stats();
        s.timing = schedule_->timing(TimingKind::Prompt);
        s.decode_timing = schedule_->timing(TimingKind::Decode);
        if (const HybridStats *h = schedule_->hybrid_stats()) s.hybrid = *h, s.hybrid_on = true;
        s.decode_modes = schedule_->decode_modes();
    }
    return s;
}

}  // namespace strata
