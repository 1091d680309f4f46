// The expert slot table and its replacement policy (expert_slots.h).
#include "strata/expert_slots.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace strata {

SlotPolicy parse_slot_policy(const std::string &s) {
    if (s == "lru") return SlotPolicy::Lru;
    if (s == "lfu") return SlotPolicy::Lfu;
    if (s == "next") return SlotPolicy::Next;
    fail("expert cache policy '%s': expected lru, lfu or next", s.c_str());
}

const char *slot_policy_name(SlotPolicy p) {
    return p == SlotPolicy::Lfu ? "lfu" : p == SlotPolicy::Next ? "next" : "lru";
}

namespace {

std::vector<int32_t> one_class(const std::vector<int64_t> &n_expert) {
    std::vector<int32_t> c(n_expert.size(), -1);
    for (size_t il = 0; il < n_expert.size(); il++)
        if (n_expert[il] > 0) c[il] = 0;
    return c;
}

}  // namespace

ExpertSlotTable::ExpertSlotTable(std::vector<int64_t> n_expert, std::vector<size_t> expert_bytes, int64_t n_slots,
                                 SlotPolicy policy, uint64_t decay_every)
    : ExpertSlotTable(n_expert, std::move(expert_bytes), one_class(n_expert), {n_slots}, policy, decay_every) {}

ExpertSlotTable::ExpertSlotTable(std::vector<int64_t> n_expert, std::vector<size_t> expert_bytes,
                                 std::vector<int32_t> layer_class, const std::vector<int64_t> &class_slots,
                                 SlotPolicy policy, uint64_t decay_every)
    : expert_bytes_(std::move(expert_bytes)),
      layer_class_(std::move(layer_class)),
      policy_(policy),
      decay_every_(decay_every) {
    STRATA_ASSERT(expert_bytes_.size() == n_expert.size() && layer_class_.size() == n_expert.size());
    table_.resize(n_expert.size());
    for (size_t il = 0; il < n_expert.size(); il++) {
        table_[il].assign(size_t(n_expert[il]), -1);
        n_total_ += n_expert[il];
        STRATA_ASSERT(n_expert[il] == 0 || (layer_class_[il] >= 0 && size_t(layer_class_[il]) < class_slots.size()));
    }
    for (const int64_t n : class_slots) {
        STRATA_ASSERT(n >= 0);
        Class c;
        c.first = n_avail_, c.n = c.n_avail = n;
        const int32_t cls = int32_t(classes_.size());
        classes_.push_back(c);
        slots_.resize(size_t(n_avail_ + n));
        for (int64_t s = c.first; s < c.first + n; s++) slots_[size_t(s)].cls = cls;
        for (int64_t s = c.first; s < c.first + n; s++) push_back(int32_t(s));
        n_avail_ += n;
    }
    ordinal_.assign(n_expert.size(), -1);
    turn_call_.assign(n_expert.size(), 0);
    turn_pass_.assign(n_expert.size(), ~uint64_t(0));
    for (size_t il = 0; il < n_expert.size(); il++)
        if (n_expert[il] > 0) ordinal_[il] = int32_t(n_moe_++);
    if (counted()) {
        counts_.resize(n_expert.size());
        for (size_t il = 0; il < n_expert.size(); il++) counts_[il].assign(size_t(n_expert[il]), 0.0);
        last_use_.assign(slots_.size(), 0);
        by_rank_.resize(classes_.size());
        if (policy_ == SlotPolicy::Next) {
            by_layer_.resize(n_expert.size());
            class_layers_.resize(classes_.size());
            for (size_t il = 0; il < n_expert.size(); il++)
                if (n_expert[il] > 0) class_layers_[size_t(layer_class_[il])].push_back(int32_t(il));
        }
        for (int32_t s = 0; s < int32_t(slots_.size()); s++) rank_insert(s);
    }
}

void ExpertSlotTable::rank_insert(int32_t s) {
    by_rank_[size_t(slots_[size_t(s)].cls)].insert({rank_of(s), s});
    const Slot &x = slots_[size_t(s)];
    if (!by_layer_.empty() && x.layer >= 0)
        by_layer_[size_t(x.layer)].insert({{counts_[size_t(x.layer)][size_t(x.expert)], x.expert}, s});
}

void ExpertSlotTable::rank_erase(int32_t s) {
    by_rank_[size_t(slots_[size_t(s)].cls)].erase({rank_of(s), s});
    const Slot &x = slots_[size_t(s)];
    if (!by_layer_.empty() && x.layer >= 0)
        by_layer_[size_t(x.layer)].erase({{counts_[size_t(x.layer)][size_t(x.expert)], x.expert}, s});
}

ExpertSlotTable::Rank ExpertSlotTable::rank_of(int32_t s) const {
    const Slot &x = slots_[size_t(s)];
    const double c = x.layer < 0 ? -1.0 : counts_[size_t(x.layer)][size_t(x.expert)];
    return {c, last_use_[size_t(s)]};
}

void ExpertSlotTable::touch(int32_t s) {
    unlink(s);
    push_back(s);
    if (!counted()) return;
    std::set<std::pair<Rank, int32_t>> &order = by_rank_[size_t(slots_[size_t(s)].cls)];
    order.erase({rank_of(s), s});  // the last use changes, the layer's order (count, expert) does not
    last_use_[size_t(s)] = ++uses_;
    order.insert({rank_of(s), s});
}

void ExpertSlotTable::count(int64_t il, int32_t e) {
    if (!counted()) return;
    if (decay_every_ && requests_ && requests_ % decay_every_ == 0) {
        step_ *= 2.0;  // every count halved, relative to the next increments
        if (step_ > 1e12) {  // back to small numbers: the order of the slots does not change
            for (auto &layer : counts_)
                for (double &c : layer) c /= step_;
            passes_ /= step_;
            step_ = 1.0;
            for (auto &r : by_rank_) r.clear();
            for (auto &r : by_layer_) r.clear();
            for (int32_t s = 0; s < int32_t(slots_.size()); s++)
                if (!slots_[size_t(s)].lent) rank_insert(s);
        }
    }
    if (pass_pending_) {
        passes_ += step_;
        pass_pending_ = false;
    }
    requests_++;
    const int32_t s = table_[size_t(il)][size_t(e)];
    if (s >= 0) rank_erase(s);
    counts_[size_t(il)][size_t(e)] += step_;
    if (s >= 0) rank_insert(s);
}

double ExpertSlotTable::rate(int64_t il, int32_t e) const {
    const double c = std::max(counts_[size_t(il)][size_t(e)], 1e-9 * step_);
    return std::min(c / std::max(passes_, step_), 1.0);
}

double ExpertSlotTable::wait(int64_t from_il, int64_t il, int32_t e) const {
    const double L = double(n_moe_);
    const int64_t back = ((ordinal_[size_t(il)] - ordinal_[size_t(from_il)]) % n_moe_ + n_moe_) % n_moe_;
    const double ahead = back == 0 ? L : double(back), p = rate(il, e);
    return ahead + L * (1.0 - p) / p;
}

void ExpertSlotTable::start_turn(int64_t il, uint64_t call) {
    if (turn_pass_[size_t(il)] == pass_no_) return;
    turn_pass_[size_t(il)] = pass_no_;
    turn_call_[size_t(il)] = call;
}

int32_t ExpertSlotTable::next_use_victim(int32_t cls, int64_t il, uint64_t call, bool turn) const {
    auto kept = [&](const Slot &x) {
        return x.call == call || x.pinned || (turn && x.layer == il && x.call >= turn_call_[size_t(il)]);
    };
    for (const auto &[rank, s] : by_rank_[size_t(cls)]) {  // empty slots first
        if (rank.first >= 0.0) break;
        if (!kept(slots_[size_t(s)])) return s;
    }
    // Each layer's candidate: its least counted slot not kept (ties to the lowest expert), whose wait is the
    // layer's longest; the longest of those goes (ties to the lowest layer).
    int32_t best = -1;
    double far = -1.0;
    for (const int32_t l : class_layers_[size_t(cls)]) {
        for (const auto &[rank, s] : by_layer_[size_t(l)]) {
            const Slot &x = slots_[size_t(s)];
            if (kept(x)) continue;
            const double w = wait(il, l, x.expert);
            if (w > far) best = s, far = w;  // (the layers come in ascending order: a tie keeps the lower)
            break;
        }
    }
    return best;
}

int32_t ExpertSlotTable::victim(int32_t cls, int64_t il, bool scan, uint64_t call, bool turn) const {
    if (cls < 0) return -1;
    const Class &C = classes_[size_t(cls)];
    auto kept = [&](int32_t s) { return slots_[size_t(s)].call == call || slots_[size_t(s)].pinned; };
    if (policy_ == SlotPolicy::Lfu && !scan) {
        for (const auto &[rank, s] : by_rank_[size_t(cls)])
            if (!kept(s)) return s;
        return -1;
    }
    if (policy_ == SlotPolicy::Next && !scan) return next_use_victim(cls, il, call, turn);
    // LRU, and a scan under either policy (each expert of the sweep requested once: LFU would order it as LRU)
    int32_t s = C.lru_head;
    while (s >= 0 && kept(s)) s = slots_[size_t(s)].next;
    if (scan && s >= 0 && slots_[size_t(s)].layer >= 0) {  // empty slots first, in any case
        if (fence_ > 0) {
            // Touched slots move to the recent end, so the search resumes where it last stopped while that slot
            // is still before the fence.
            auto before = [&](int32_t v) { return !kept(v) && slots_[size_t(v)].call < fence_; };
            const int32_t h = C.fence_hint;
            int32_t v = h >= 0 && before(h) && !slots_[size_t(h)].lent ? h : C.lru_tail;
            while (v >= 0 && !before(v)) v = slots_[size_t(v)].prev;
            if (v >= 0) {
                C.fence_hint = slots_[size_t(v)].prev;
                return v;
            }
        }
        // The slots this call touched, and those pinned, are at the recent end: the first one before them.
        int32_t v = C.lru_tail;
        while (v >= 0 && kept(v)) v = slots_[size_t(v)].prev;
        if (v >= 0) s = v;
    }
    return s;
}

void ExpertSlotTable::unlink(int32_t s) {
    Slot &x = slots_[size_t(s)];
    Class &C = classes_[size_t(x.cls)];
    if (x.prev >= 0)
        slots_[size_t(x.prev)].next = x.next;
    else
        C.lru_head = x.next;
    if (x.next >= 0)
        slots_[size_t(x.next)].prev = x.prev;
    else
        C.lru_tail = x.prev;
    x.prev = x.next = -1;
}

void ExpertSlotTable::push_back(int32_t s) {
    Slot &x = slots_[size_t(s)];
    Class &C = classes_[size_t(x.cls)];
    x.prev = C.lru_tail;
    x.next = -1;
    if (C.lru_tail >= 0)
        slots_[size_t(C.lru_tail)].next = s;
    else
        C.lru_head = s;
    C.lru_tail = s;
}

void ExpertSlotTable::push_front(int32_t s) {
    Slot &x = slots_[size_t(s)];
    Class &C = classes_[size_t(x.cls)];
    x.prev = -1;
    x.next = C.lru_head;
    if (C.lru_head >= 0)
        slots_[size_t(C.lru_head)].prev = s;
    else
        C.lru_tail = s;
    C.lru_head = s;
}

std::vector<std::pair<int32_t, int32_t>> ExpertSlotTable::lend(int64_t n) {
    STRATA_ASSERT(classes_.size() == 1);
    return lend(std::vector<int64_t>{n});
}

std::vector<std::pair<int32_t, int32_t>> ExpertSlotTable::lend(const std::vector<int64_t> &per_class) {
    STRATA_ASSERT(per_class.size() <= classes_.size() && !all_resident_);
    std::vector<std::pair<int32_t, int32_t>> held;
    for (size_t c = 0; c < per_class.size(); c++) {
        Class &C = classes_[c];
        const int64_t n = per_class[c];
        STRATA_ASSERT(n >= 0 && n <= C.n_avail && C.n_avail == C.n);  // one loan at a time
        for (int64_t i = C.first + C.n - n; i < C.first + C.n; i++) {
            const int32_t s = int32_t(i);
            Slot &x = slots_[size_t(i)];
            STRATA_ASSERT(!x.pinned && !x.lent);
            if (counted()) rank_erase(s);
            if (x.layer >= 0) {
                held.push_back({x.layer, x.expert});
                table_[size_t(x.layer)][size_t(x.expert)] = -1;
                x.layer = x.expert = -1;
            }
            unlink(s);
            x.lent = true;
        }
        C.n_avail -= n;
        n_avail_ -= n;
    }
    return held;
}

void ExpertSlotTable::end_loan() {
    for (size_t i = 0; i < slots_.size(); i++) {
        if (!slots_[i].lent) continue;
        const int32_t s = int32_t(i);
        slots_[i].lent = false;
        slots_[i].call = 0;
        push_front(s);
        if (counted()) {
            last_use_[i] = 0;
            rank_insert(s);
        }
    }
    n_avail_ = int64_t(slots_.size());
    for (Class &c : classes_) c.n_avail = c.n;
}

bool ExpertSlotTable::fill_empty(int64_t il, int32_t e, std::vector<SlotFill> &fills) {
    STRATA_ASSERT(il >= 0 && size_t(il) < table_.size() && e >= 0 && size_t(e) < table_[size_t(il)].size());
    STRATA_ASSERT(table_[size_t(il)][size_t(e)] < 0);
    const int32_t s = victim(class_of(il), il, false, ++calls_);  // an empty slot comes first under every policy
    if (s < 0 || slots_[size_t(s)].layer >= 0) return false;
    assign(s, il, e);
    touch(s);
    fills.push_back({s, e});
    stats_.bytes_filled += expert_bytes_[size_t(il)];
    return true;
}

void ExpertSlotTable::assign(int32_t slot, int64_t il, int32_t e) {
    Slot &s = slots_[size_t(slot)];
    STRATA_ASSERT(s.cls == class_of(il));
    const bool lfu = counted();
    if (lfu) rank_erase(slot);
    if (s.layer >= 0) table_[size_t(s.layer)][size_t(s.expert)] = -1;
    s.layer = int32_t(il);
    s.expert = e;
    table_[size_t(il)][size_t(e)] = slot;
    if (lfu) rank_insert(slot);
}

std::vector<std::vector<SlotFill>> ExpertSlotTable::place_all() {
    STRATA_ASSERT(n_slots() >= n_total_);
    std::vector<std::vector<SlotFill>> fills(table_.size());
    std::vector<int64_t> next(classes_.size());
    for (size_t c = 0; c < classes_.size(); c++) next[c] = classes_[c].first;
    for (size_t il = 0; il < table_.size(); il++)
        for (int32_t e = 0; e < int32_t(table_[il].size()); e++) {
            int64_t &s = next[size_t(class_of(int64_t(il)))];
            STRATA_ASSERT(s <
                          classes_[size_t(class_of(int64_t(il)))].first + classes_[size_t(class_of(int64_t(il)))].n);
            assign(int32_t(s), int64_t(il), e);
            fills[il].push_back({int32_t(s++), e});
        }
    all_resident_ = n_total_ > 0;
    return fills;
}

void ExpertSlotTable::acquire(int64_t il, const int32_t *experts, int64_t n, int32_t *slots_out, bool scan,
                              std::vector<SlotFill> &fills) {
    STRATA_ASSERT(il >= 0 && size_t(il) < table_.size() && !table_[size_t(il)].empty());
    STRATA_ASSERT(n <= n_slots_for(il));
    std::vector<int32_t> &tab = table_[size_t(il)];
    const uint64_t call = ++calls_;
    start_turn(il, call);
    auto kept = [&](int32_t s) { return slots_[size_t(s)].call == call || slots_[size_t(s)].pinned; };
    const size_t fills0 = fills.size();
    // First move every requested expert that is resident to the recent end, so that refilling the others cannot
    // evict it: after that, the n - 1 or fewer slots this call has touched are all behind at least one untouched one.
    for (int64_t i = 0; i < n; i++) {
        STRATA_ASSERT(experts[i] >= 0 && size_t(experts[i]) < tab.size());
        count(il, experts[i]);
        const int32_t s = tab[size_t(experts[i])];
        if (s >= 0) {
            touch(s);
            slots_[size_t(s)].call = call;
            stats_.hits++;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t s = tab[size_t(experts[i])];
        if (s < 0) {
            s = victim(class_of(il), il, scan, call);
            if (s < 0) {
                // this call's assignments hold no bytes yet: undone before refusing
                const std::vector<SlotFill> made(fills.begin() + int64_t(fills0), fills.end());
                fills.resize(fills0);
                forget(il, made);
                stats_.misses -= made.size();
                stats_.bytes_filled -= made.size() * expert_bytes_[size_t(il)];
                fail("expert slots: all %lld slots hold experts kept for compute still to come",
                     (long long)n_slots_for(il));
            }
            STRATA_ASSERT(!kept(s));
            slots_[size_t(s)].call = call;
            assign(s, il, experts[i]);
            fills.push_back({s, experts[i]});
            touch(s);
            stats_.misses++;
            stats_.bytes_filled += expert_bytes_[size_t(il)];
        }
        slots_out[i] = s;
    }
}

void ExpertSlotTable::note_requests(int64_t il, const int32_t *experts, int64_t n) {
    STRATA_ASSERT(il >= 0 && size_t(il) < table_.size());
    const uint64_t call = ++calls_;
    start_turn(il, call);
    for (int64_t i = 0; i < n; i++) {
        STRATA_ASSERT(experts[i] >= 0 && size_t(experts[i]) < table_[size_t(il)].size());
        count(il, experts[i]);
        const int32_t s = table_[size_t(il)][size_t(experts[i])];
        if (s >= 0) {
            touch(s);
            slots_[size_t(s)].call = call;
        }
    }
}

bool ExpertSlotTable::admit(int64_t il, int32_t e, double factor, std::vector<SlotFill> &fills) {
    STRATA_ASSERT(il >= 0 && size_t(il) < table_.size() && e >= 0 && size_t(e) < table_[size_t(il)].size());
    STRATA_ASSERT(table_[size_t(il)][size_t(e)] < 0);
    if (!counted()) return false;
    count(il, e);
    const uint64_t call = ++calls_;
    start_turn(il, call);
    const int32_t s = victim(class_of(il), il, false, call, /*turn=*/true);
    if (s < 0) return false;
    const Slot &v = slots_[size_t(s)];
    if (v.layer >= 0 && policy_ == SlotPolicy::Next && !(wait(il, il, e) < wait(il, v.layer, v.expert))) return false;
    if (v.layer >= 0 && policy_ == SlotPolicy::Lfu &&
        !(counts_[size_t(il)][size_t(e)] > factor * counts_[size_t(v.layer)][size_t(v.expert)]))
        return false;
    slots_[size_t(s)].call = call;
    assign(s, il, e);
    touch(s);
    fills.push_back({s, e});
    stats_.bytes_filled += expert_bytes_[size_t(il)];
    return true;
}

void ExpertSlotTable::note_prompt_rows(int64_t il, const std::vector<int32_t> &rows, int64_t tokens) {
    STRATA_ASSERT(il >= 0 && size_t(il) < table_.size() && rows.size() == table_[size_t(il)].size());
    if (favourites_.empty()) favourites_.resize(table_.size());
    std::vector<double> &f = favourites_[size_t(il)];
    if (f.empty()) f.assign(rows.size(), 0.0);
    const double keep = std::exp2(-double(tokens) / k_favourite_half_tokens);
    for (size_t e = 0; e < rows.size(); e++) f[e] = f[e] * keep + double(rows[e]);
    favourites_pending_ = true;
}

void ExpertSlotTable::seed_favourites(const std::vector<std::vector<double>> &scores) {
    if (scores.size() > table_.size())
        fail("expert scores for %zu layers: this model has %zu", scores.size(), table_.size());
    for (size_t il = 0; il < scores.size(); il++) {
        if (scores[il].empty() || table_[il].empty()) continue;
        if (scores[il].size() != table_[il].size())
            fail("expert scores of layer %zu: %zu experts, expected %zu", il, scores[il].size(), table_[il].size());
        if (favourites_.empty()) favourites_.resize(table_.size());
        favourites_[il] = scores[il];
        favourites_pending_ = true;
    }
}

std::vector<std::vector<SlotFill>> ExpertSlotTable::keep_favourites(double factor, int64_t max_fills) {
    favourites_pending_ = false;
    std::vector<std::vector<SlotFill>> fills(table_.size());
    if (all_resident_ || favourites_.empty()) return fills;
    struct Pick {
        double score;
        int32_t layer, expert, slot;
    };
    // Experts in no slot, best first; per class, the slots that may give way, weakest first. The best experts in turn
    // take their class's weakest slot left, until a class's next pair would not gain (and so no later pair of it).
    std::vector<Pick> in;
    std::vector<std::vector<Pick>> out(classes_.size());
    for (size_t il = 0; il < favourites_.size(); il++)
        for (size_t e = 0; e < favourites_[il].size(); e++)
            if (favourites_[il][e] > 0.0 && table_[il][e] < 0)
                in.push_back({favourites_[il][e], int32_t(il), int32_t(e), -1});
    std::stable_sort(in.begin(), in.end(), [](const Pick &a, const Pick &b) { return a.score > b.score; });
    for (size_t c = 0; c < classes_.size(); c++) {
        for (int32_t s = classes_[c].lru_head; s >= 0; s = slots_[size_t(s)].next) {  // least recently used first
            const Slot &x = slots_[size_t(s)];
            if (x.pinned || x.lent) continue;
            out[c].push_back({x.layer < 0 ? -1.0 : favourite_score(x.layer, x.expert), x.layer, x.expert, s});
        }
        std::stable_sort(out[c].begin(), out[c].end(), [](const Pick &a, const Pick &b) { return a.score < b.score; });
    }
    std::vector<size_t> taken(classes_.size(), 0);
    std::vector<bool> done(classes_.size(), false);
    int64_t made = 0;
    for (const Pick &p : in) {
        const size_t c = size_t(class_of(p.layer));
        if (done[c]) continue;
        if (taken[c] == out[c].size()) {
            done[c] = true;
            continue;
        }
        const Pick &v = out[c][taken[c]];
        if (v.score >= 0.0 && !(p.score > factor * v.score)) {  // and so every later pair of this class
            done[c] = true;
            continue;
        }
        if (max_fills >= 0 && made >= max_fills) {
            favourites_pending_ = true;  // more to move: the next call
            break;
        }
        taken[c]++, made++;
        assign(v.slot, p.layer, p.expert);
        touch(v.slot);
        fills[size_t(p.layer)].push_back({v.slot, p.expert});
        stats_.bytes_filled += expert_bytes_[size_t(p.layer)];
    }
    return fills;
}

void ExpertSlotTable::forget(int64_t il, const std::vector<SlotFill> &fills) {
    for (const SlotFill &f : fills) {
        Slot &s = slots_[size_t(f.slot)];
        if (s.layer == int32_t(il) && s.expert == f.expert) {
            if (counted()) rank_erase(f.slot);
            table_[size_t(il)][size_t(f.expert)] = -1;
            s.layer = s.expert = -1;
            if (counted()) rank_insert(f.slot);
        }
    }
}

}  // namespace strata
