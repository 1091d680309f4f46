// The expert slot table: which expert of which layer each slot of a device's expert cache holds, which slot holds a
// given expert, recency, the replacement policy and its counters. Device-neutral: the slots' memory, and the copies
// that fill them, are the backend's (Backend::expert_slot, fill_slots); this table only decides. Kernels reach an
// expert only through the slot the table names, so where an expert's bytes live never changes what they compute.
//
// Policies (victims are never a slot of the current request or a pinned one; empty slots go first):
// - LRU: least recently used, and for a chunk that needs most of a layer's experts ("scan": passes then sweep the
//   layers in order) the most recently used slot outside the current request instead: under LRU a sweep larger than
//   the cache evicts each expert just before it is needed again and nothing ever hits, while evicting what was just
//   used keeps the rest of the cache for the next pass. After a fence() (the MoE schedule fences as each layer
//   starts) a scan takes the most recently used slot touched before the fence first: an earlier layer's, whose
//   compute is done, so that its fill does not wait for the compute of the current one.
// - LFU with decay (the engine's default; --expert-cache-policy): the slot whose expert was requested least often,
//   counts kept for every expert (resident or not) and halved before every `decay_every`-th requested expert, ties
//   to the least recently used (what tools/trace simulates as "LFU decay"). Decoding visits the layers in a cycle,
//   which LRU serves worst when the cache is smaller than a token's experts; on the demo model's real routing
//   (models/demo/MODEL_CARD.md) LFU with decay hits 36% at a cache of 10% of the experts where LRU hits 0%.
//   Halving every count keeps their order, so it is done by doubling the increment instead (rescaled when large).
// - Expected next use (--expert-cache-policy next): LFU with decay's counts, and per pass (begin_pass()) a pass count
//   decayed with them; an expert's rate p is its count over the passes (at most 1). Passes visit the layers with
//   experts in a cycle of L, so an expert of layer lc, asked for at layer il, waits for its layer to come round
//   (lc - il layer steps ahead, modulo L; a whole L for il's own) and then L (1 - p) / p more (the passes it is
//   expected to miss): the slot whose expert waits longest goes (ties to the lowest layer, then expert), never one of
//   the current layer's request (acquired together; for admit(), those its request touched since the layer's turn
//   began). A miss read in place (admit()) enters only where its own wait, L + L (1 - p) / p, is shorter. What
//   tools/trace simulates as "next_use". On the demo model's real routing its decode hits 0.4-1.2 points more than
//   LFU with decay's at 10-30% of the experts cached, but only by letting in 6-11 times as many of the misses read
//   in place: in experts moved over the bus a token it is level with LFU with decay at 10% and 5-13% behind at
//   20-30%, and filling every miss it hits less (bench/RESULTS.md, thirty-third round). An option for the GPU's
//   A/B (a fill goes on the copy stream, a read in place on the pass's own path), not the default.
// Size classes (placement.h): a layer's experts go only into slots of the layer's class, and each class is a cache of
// its own under the policy (its own recency list, LFU ranks, fence); counts, decay and favourites span them all.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace strata {

enum class SlotPolicy { Lru, Lfu, Next };

// "lru", "lfu" or "next" (throws strata::Error naming the choices otherwise).
SlotPolicy parse_slot_policy(const std::string &s);
const char *slot_policy_name(SlotPolicy p);

class ExpertSlotTable {
  public:
    struct Stats {
        uint64_t hits = 0, misses = 0, bytes_filled = 0;
    };

    // n_expert[il]: routed experts of layer il (0: none); expert_bytes[il]: the bytes one of them fills.
    // decay_every: LFU's halving period in requested experts (0: never). One size class of n_slots slots.
    ExpertSlotTable(std::vector<int64_t> n_expert, std::vector<size_t> expert_bytes, int64_t n_slots,
                    SlotPolicy policy = SlotPolicy::Lru, uint64_t decay_every = 0);
    // Slots in classes: class c has class_slots[c] slots, numbered class after class; layer il's experts take slots
    // of class layer_class[il] only (-1 for a layer without experts).
    ExpertSlotTable(std::vector<int64_t> n_expert, std::vector<size_t> expert_bytes, std::vector<int32_t> layer_class,
                    const std::vector<int64_t> &class_slots, SlotPolicy policy = SlotPolicy::Lru,
                    uint64_t decay_every = 0);

    // Every expert of every layer in a slot of its own, for good (needs n_slots() >= n_experts_total()): the fills
    // to make, per layer index. Not counted as traffic.
    std::vector<std::vector<SlotFill>> place_all();

    // Makes experts[0..n) of layer il resident (n <= n_slots_for(il), distinct ids): their slots go to slots_out, and
    // the fills that make it so to `fills` (one per expert that was not in a slot; victims by the policy above; never a
    // pinned slot). Throws strata::Error when every slot that could be a victim is pinned.
    void acquire(int64_t il, const int32_t *experts, int64_t n, int32_t *slots_out, bool scan,
                 std::vector<SlotFill> &fills);
    // A pinned slot keeps its expert: a pipelined schedule pins what it acquired ahead until it has computed.
    void pin(int32_t slot, bool on) { slots_[size_t(slot)].pinned = on; }
    // Scan fence: from here on a scan's victim is the most recently used slot not touched since the fence (the
    // slots of layers whose compute is done, where a schedule fences as a layer starts), and only where there is
    // none the rule above. A fill into a slot the current layer reads would wait for that compute.
    void fence() {
        fence_ = calls_ + 1;
        for (Class &c : classes_) c.fence_hint = -1;
    }
    // Admission for a miss read in place (the MoE schedule's mapped misses; expert e of layer il is in no slot): the
    // request is counted, and under LFU, where e's count is above `factor` times that of the expert in the slot the
    // policy would give up (an empty slot: always), e takes that slot: the fill goes to `fills` and counts as traffic,
    // not as a miss (the pass has read it already). Under expected next use, where e's own wait is shorter than that
    // expert's (`factor` unused). LRU has no counts to judge by: never. On the demo model's real
    // routing, simulated (bench/RESULTS.md, ninth round), factor 2 keeps LFU with decay's hit rates with 0.1-0.3
    // fills a token, where filling every miss takes 2-31; under uniform routing 0.3-1.0 a token.
    bool admit(int64_t il, int32_t e, double factor, std::vector<SlotFill> &fills);
    // Requests of experts of layer il served where they were without acquire() (a pass by the device alone, judged
    // after it): counted for LFU, and those in a slot made the most recently used; not counted as hits (the
    // backend counted its reads).
    void note_requests(int64_t il, const int32_t *experts, int64_t n);
    // A pass begins: expected next use counts passes (its first request counts it, after any decay due then), and a
    // layer's turn is its requests within a pass. Without it, all of a layer's requests are one turn.
    void begin_pass() {
        pass_pending_ = true;
        pass_no_++;
    }
    // Fills acquire() asked for that did not happen (the copy failed): those slots hold nothing now.
    void forget(int64_t il, const std::vector<SlotFill> &fills);

    // A prompt loan (placement.h): the top per_class[c] slots of each class c leave the cache (none may be pinned);
    // what they held is forgotten and returned as (layer, expert) pairs. n_slots() and n_slots_for() count only the
    // slots left until end_loan(), which gives them back empty, the first victims of either policy. lend(n): one
    // class, its top n slots, [n_slots() - n, n_slots()).
    std::vector<std::pair<int32_t, int32_t>> lend(const std::vector<int64_t> &per_class);
    std::vector<std::pair<int32_t, int32_t>> lend(int64_t n);
    void end_loan();
    int64_t n_lent() const { return int64_t(slots_.size()) - n_avail_; }
    // An empty slot for expert e of layer il, which must not be in one (after a loan: the slots given back): the
    // fill goes to `fills` and counts as traffic, not as a miss. False where no slot is empty.
    bool fill_empty(int64_t il, int32_t e, std::vector<SlotFill> &fills);

    // A prompt's favourites (STRATA_PROMPT_FAVOURITES, the MoE schedule's): a decode whose passes the device runs
    // alone fills nothing, so it decodes on what the cache held when the prompt ended, and a prompt's passes reach
    // nearly every expert once each, leaving an arbitrary cache behind them. Each prompt pass's rows per expert
    // (rows[e], layer il, a pass of `tokens` tokens) add to a score per expert that halves every
    // k_favourite_half_tokens prompt tokens; keep_favourites() then turns the cache toward the best scores: empty
    // slots first, then the lowest-scored slot (empty, then least recently used, first) gives way to the best-scored
    // expert in no slot while that one scores above `factor` times it. Never a pinned or lent slot. The fills, per
    // layer index, count as traffic, not misses. On the demo model's real routing, simulated (bench/RESULTS.md,
    // twentieth round), a cache so filled and then frozen serves 31-43% of decoding's requests at 10% of the experts
    // cached, where the cache the prompt's passes left serves 11-14%.
    static constexpr double k_favourite_half_tokens = 2048;
    void note_prompt_rows(int64_t il, const std::vector<int32_t> &rows, int64_t tokens);
    bool favourites_pending() const { return favourites_pending_; }  // scores changed since keep_favourites()
    // At most max_fills fills a call (negative: no limit); where it stops there, favourites_pending() stays true and
    // the next call goes on from the best-scored expert still outside.
    std::vector<std::vector<SlotFill>> keep_favourites(double factor, int64_t max_fills = -1);
    // The scores as they stand ([layer][expert]; a layer without experts or without a scored pass yet: empty), and
    // scores given back (an expert-popularity profile of earlier runs, runtime/expert_profile.h): each layer with
    // experts and a score list of its expert count takes it in place of its own; keep_favourites() is then due.
    // Throws strata::Error where a list's length is not its layer's expert count.
    const std::vector<std::vector<double>> &favourite_scores() const { return favourites_; }
    void seed_favourites(const std::vector<std::vector<double>> &scores);
    double favourite_score(int64_t il, int32_t e) const {
        return size_t(il) < favourites_.size() && !favourites_[size_t(il)].empty()
                   ? favourites_[size_t(il)][size_t(e)]
                   : 0.0;
    }

    int64_t n_slots() const { return n_avail_; }
    // The slots layer il's experts can take (its class's, less a loan's).
    int64_t n_slots_for(int64_t il) const {
        const int32_t c = layer_class_[size_t(il)];
        return c < 0 ? 0 : classes_[size_t(c)].n_avail;
    }
    size_t n_classes() const { return classes_.size(); }
    int64_t n_experts_total() const { return n_total_; }
    bool all_resident() const { return all_resident_; }
    int32_t slot_of(int64_t il, int32_t e) const { return table_[size_t(il)][size_t(e)]; }  // -1: none
    const Stats &stats() const { return stats_; }
    SlotPolicy policy() const { return policy_; }

  private:
    struct Slot {
        int32_t layer = -1, expert = -1;
        int32_t cls = 0;
        int32_t prev = -1, next = -1;  // recency list: head = least recently used
        uint64_t call = 0;             // the acquire() that last touched it
        bool pinned = false;
        bool lent = false;  // out of the cache for a prompt loan
    };
    void assign(int32_t slot, int64_t il, int32_t e);
    // Each class: its recency list (head = least recently used), LFU's order of its slots, its fence hint.
    struct Class {
        int64_t first = 0, n = 0, n_avail = 0;
        int32_t lru_head = -1, lru_tail = -1;
        mutable int32_t fence_hint = -1;  // where the last fenced victim search stopped
    };
    void unlink(int32_t s);
    void push_back(int32_t s);   // most recently used
    void push_front(int32_t s);  // least recently used
    void touch(int32_t s);      // most recently used, and for LFU its rank updated
    // The slot to give up in class cls for layer il's request (call `call`; under expected next use, the slots of il
    // touched since its turn began are kept too when `turn` is set); -1 when every one is kept.
    int32_t victim(int32_t cls, int64_t il, bool scan, uint64_t call, bool turn = false) const;
    int32_t next_use_victim(int32_t cls, int64_t il, uint64_t call, bool turn) const;
    bool counted() const { return policy_ != SlotPolicy::Lru; }  // counts and ranks kept (LFU, next use)
    double rate(int64_t il, int32_t e) const;                    // next use: the expert's uses a pass, at most 1
    double wait(int64_t from_il, int64_t il, int32_t e) const;   // next use: layer steps until its expected use
    void start_turn(int64_t il, uint64_t call);                  // a request of layer il (its pass's first: a turn)
    int32_t class_of(int64_t il) const { return layer_class_[size_t(il)]; }
    void rank_insert(int32_t s);  // the slot into its class's order (and next use: its layer's), by its rank now
    void rank_erase(int32_t s);
    void count(int64_t il, int32_t e);  // LFU: one request of expert e of layer il
    using Rank = std::pair<double, uint64_t>;  // LFU: (count of the slot's expert, -1 when empty; last use)
    Rank rank_of(int32_t s) const;

    std::vector<std::vector<int32_t>> table_;  // [layer][expert] -> slot, -1: not resident
    std::vector<size_t> expert_bytes_;
    std::vector<Slot> slots_;
    std::vector<int32_t> layer_class_;
    std::vector<Class> classes_;
    int64_t n_avail_ = 0;  // slots not lent
    int64_t n_total_ = 0;
    bool all_resident_ = false;
    uint64_t calls_ = 0;
    uint64_t fence_ = 0;  // acquires numbered fence_ or later came after the fence (0: none)
    Stats stats_;
    SlotPolicy policy_;
    // LFU: request counts per [layer][expert] in units that double at each decay; the slots ordered by rank.
    std::vector<std::vector<double>> counts_;
    double step_ = 1.0;
    uint64_t decay_every_ = 0, requests_ = 0, uses_ = 0;
    std::vector<uint64_t> last_use_;  // per slot
    std::vector<std::set<std::pair<Rank, int32_t>>> by_rank_;  // per class
    // Expected next use: per layer, its experts' slots by (count, expert), so a layer's candidate is its first slot
    // not kept (within a layer the wait orders as the rate); the layers of each class.
    using LayerRank = std::pair<double, int32_t>;
    std::vector<std::set<std::pair<LayerRank, int32_t>>> by_layer_;
    std::vector<std::vector<int32_t>> class_layers_;
    // Expected next use: passes counted in the counts' units; each layer's place among the layers with experts and
    // their number; each layer's turn: the first call for it in a pass, and that pass.
    double passes_ = 0.0;
    bool pass_pending_ = false;
    uint64_t pass_no_ = 0;
    std::vector<int32_t> ordinal_;
    int64_t n_moe_ = 0;
    std::vector<uint64_t> turn_call_, turn_pass_;
    std::vector<std::vector<double>> favourites_;  // [layer][expert]: the prompts' decayed rows (empty: none yet)
    bool favourites_pending_ = false;
};

}  // namespace strata
