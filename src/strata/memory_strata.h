// A model placed on a backend: the placement plan computed from the backend's facts and carried out, the caches
// made, the expert slot table filled as the plan says, and the MoE schedule the forward pass runs experts through.
// What the engine holds for one participating device.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/weights.h"
#include "strata/expert_slots.h"
#include "strata/moe_schedule.h"
#include "strata/placement_plan.h"

namespace strata {

struct StrataOptions {
    PlanOptions plan;
    int32_t n_seqs = 1;
    int64_t n_ctx = 4096;
    KvType kv_type = KvType::F16;
    int64_t l0 = 0, l1 = -1;                       // the layers whose caches it holds (a split model's part)
    SlotPolicy slot_policy = SlotPolicy::Lfu;      // the expert cache's replacement policy (expert_slots.h)
    HybridOptions hybrid;                          // decoding's misses on the host (decode_hybrid.h)
    std::function<void(const std::string &)> log;  // the check line (nullptr: quiet)
};

// PlanOptions from the environment's switches (STRATA_CUDA_HOST_PINNED, STRATA_CUDA_STAGER, STRATA_CUDA_PIN), the
// rest as given.
PlanOptions plan_options_from_env(PlanOptions o);

// Expert-cache traffic: how many slots, hits and misses of the slot table and of mapped passes (a mapped miss is
// read from the host copy in place: Backend::maps_host_experts), bytes copied into slots or read so over the bus
// since start (zeros where the backend reads every expert in place).
struct ExpertCacheStats {
    int64_t n_slots = 0, n_experts = 0;
    uint64_t expert_cache_hits = 0, expert_cache_misses = 0, bytes_streamed = 0;
    uint64_t mapped_misses = 0;    // of expert_cache_misses, those read in place
    uint64_t mapped_admitted = 0;  // of those, filled into a slot afterwards for later passes (admission)
    uint64_t favourite_fills = 0;  // experts filled as decoding began, for the prompts' favourites (moe_schedule.h)
    // next-layer prefetch (STRATA_DECODE_PREFETCH): routed picks with a prediction, those predicted, experts filled
    PrefetchStats prefetch;
    // misses computed on the host (decode_hybrid.h): counted apart from expert_cache_misses (those copied in)
    HybridStats hybrid;
    bool hybrid_on = false;
    DecodeModeStats decode_modes;  // decode-sized passes run alone or split where both applied (decode_mode.h)
    int hybrid_threads = 0;
    uint64_t loans = 0;         // prompt loans made (placement.h)
    int64_t loan_slots = 0;     // the most slots one borrows
    uint64_t loaned_slots = 0;  // slots they borrowed, summed
    std::vector<LayerTiming> timing;  // STRATA_PREFILL_TIMING=1: prompt passes by layer and phase (pass_timing.h)
    std::vector<LayerTiming> decode_timing;  // STRATA_DECODE_TIMING=1: decode-sized passes, the same way
};

class MemoryStrata {
  public:
    // Plans (throws strata::Error naming the smallest budget that works when it does not fit), prepares the backend,
    // makes the caches and fills the slots the plan keeps resident; logs the check line.
    MemoryStrata(Backend &be, Model &m, const StrataOptions &o);

    const Placement &plan() const { return plan_; }
    ExpertRunner &moe() { return *schedule_; }
    void set_routing_observer(RoutingObserver *o) { schedule_->set_observer(o); }
    void set_route_override(const RouteOverride &o) { schedule_->set_route_override(o); }
    ExpertCacheStats stats() const;
    const ExpertSlotTable *slots() const { return slots_.get(); }
    // The prompts' favourite scores, given back from a profile (ExpertSlotTable::seed_favourites; nothing where the
    // backend reads every expert in place or every expert is resident).
    void seed_favourites(const std::vector<std::vector<double>> &scores) {
        if (slots_ && !slots_->all_resident()) slots_->seed_favourites(scores);
    }

    // Prompt loans (placement.h): passes of more than plan().resident_chunk_tokens tokens run between begin_loan()
    // and end_loan(). begin_loan(tokens) takes the top plan().loan_split_for(tokens) slots of each class out of the
    // cache (their experts forgotten; tokens: the call's largest pass; STRATA_LOAN_SIZED=0: plan().loan_class_slots
    // whatever the pass) and gives their memory to the backend as scratch; end_loan gives them back and refills them,
    // on the copy stream, with STRATA_LOAN_REFILL's choice: "before" (default) what they held before the loan, "last"
    // the experts with the most rows in the last prompt pass that are not in a slot; with the prompts' favourites on
    // (STRATA_PROMPT_FAVOURITES, moe_schedule.h) it leaves them empty for those. Both do nothing where there is no
    // loan (begin_loan: or one is on already).
    void begin_loan(int64_t tokens);
    void end_loan();

  private:
    Placement plan_;
    Backend &be_;
    std::vector<ExpertWeights> experts_;
    bool lent_ = false;
    uint64_t loans_ = 0, loaned_slots_ = 0;
    int64_t lent_n_ = 0;                                  // slots the loan on now borrowed
    bool refill_last_ = false;                            // STRATA_LOAN_REFILL=last
    bool loan_sized_ = true;                              // STRATA_LOAN_SIZED=0: every loan borrows plan().loan_slots
    std::vector<std::pair<int32_t, int32_t>> loan_held_;  // (layer, expert) the lent slots held
    std::unique_ptr<ExpertSlotTable> slots_;
    std::unique_ptr<MoeSchedule> schedule_;
};

}  // namespace strata
