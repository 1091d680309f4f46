// The expert slot table and its replacement policy (expert_slots.h).
#include "strata/expert_slots.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

ExpertSlotTable::ExpertSlotTable(std::vector<int64_t> n_expert, std::vector<size_t> expert_bytes, int64_t n_slots)
    : expert_bytes_(std::move(expert_bytes)) {
    STRATA_ASSERT(expert_bytes_.size() == n_expert.size() && n_slots >= 0);
    table_.resize(n_expert.size());
    for (size_t il = 0; il < n_expert.size(); il++) {
        table_[il].assign(size_t(n_expert[il]), -1);
        n_total_ += n_expert[il];
    }
    slots_.resize(size_t(n_slots));
    for (int32_t s = 0; s < int32_t(n_slots); s++) push_back(s);
}

void ExpertSlotTable::unlink(int32_t s) {
    Slot &x = slots_[size_t(s)];
    if (x.prev >= 0)
        slots_[size_t(x.prev)].next = x.next;
    else
        lru_head_ = x.next;
    if (x.next >= 0)
        slots_[size_t(x.next)].prev = x.prev;
    else
        lru_tail_ = x.prev;
    x.prev = x.next = -1;
}

void ExpertSlotTable::push_back(int32_t s) {
    Slot &x = slots_[size_t(s)];
    x.prev = lru_tail_;
    x.next = -1;
    if (lru_tail_ >= 0)
        slots_[size_t(lru_tail_)].next = s;
    else
        lru_head_ = s;
    lru_tail_ = s;
}

void ExpertSlotTable::assign(int32_t slot, int64_t il, int32_t e) {
    Slot &s = slots_[size_t(slot)];
    if (s.layer >= 0) table_[size_t(s.layer)][size_t(s.expert)] = -1;
    s.layer = int32_t(il);
    s.expert = e;
    table_[size_t(il)][size_t(e)] = slot;
}

std::vector<std::vector<SlotFill>> ExpertSlotTable::place_all() {
    STRATA_ASSERT(n_slots() >= n_total_);
    std::vector<std::vector<SlotFill>> fills(table_.size());
    int32_t next = 0;
    for (size_t il = 0; il < table_.size(); il++)
        for (int32_t e = 0; e < int32_t(table_[il].size()); e++) {
            assign(next, int64_t(il), e);
            fills[il].push_back({next++, e});
        }
    all_resident_ = n_total_ > 0;
    return fills;
}

void ExpertSlotTable::acquire(int64_t il, const int32_t *experts, int64_t n, int32_t *slots_out, bool scan,
                              std::vector<SlotFill> &fills) {
    STRATA_ASSERT(il >= 0 && size_t(il) < table_.size() && !table_[size_t(il)].empty());
    STRATA_ASSERT(n <= n_slots());
    std::vector<int32_t> &tab = table_[size_t(il)];
    const uint64_t call = ++calls_;
    auto kept = [&](int32_t s) { return slots_[size_t(s)].call == call || slots_[size_t(s)].pinned; };
    const size_t fills0 = fills.size();
    // First move every requested expert that is resident to the recent end, so that refilling the others cannot
    // evict it: after that, the n - 1 or fewer slots this call has touched are all behind at least one untouched one.
    for (int64_t i = 0; i < n; i++) {
        STRATA_ASSERT(experts[i] >= 0 && size_t(experts[i]) < tab.size());
        const int32_t s = tab[size_t(experts[i])];
        if (s >= 0) {
            unlink(s);
            push_back(s);
            slots_[size_t(s)].call = call;
            stats_.hits++;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t s = tab[size_t(experts[i])];
        if (s < 0) {
            s = lru_head_;
            while (s >= 0 && kept(s)) s = slots_[size_t(s)].next;
            if (scan && s >= 0 && slots_[size_t(s)].layer >= 0) {  // empty slots first, in any case
                // The slots this call touched, and those pinned, are at the recent end: the first one before them.
                int32_t v = lru_tail_;
                while (v >= 0 && kept(v)) v = slots_[size_t(v)].prev;
                if (v >= 0) s = v;
            }
            if (s < 0) {
                // this call's assignments hold no bytes yet: undone before refusing
                const std::vector<SlotFill> made(fills.begin() + int64_t(fills0), fills.end());
                fills.resize(fills0);
                forget(il, made);
                stats_.misses -= made.size();
                stats_.bytes_filled -= made.size() * expert_bytes_[size_t(il)];
                fail("expert slots: all %lld slots hold experts kept for compute still to come", (long long)n_slots());
            }
            STRATA_ASSERT(!kept(s));
            slots_[size_t(s)].call = call;
            assign(s, il, experts[i]);
            fills.push_back({s, experts[i]});
            unlink(s);
            push_back(s);
            stats_.misses++;
            stats_.bytes_filled += expert_bytes_[size_t(il)];
        }
        slots_out[i] = s;
    }
}

void ExpertSlotTable::forget(int64_t il, const std::vector<SlotFill> &fills) {
    for (const SlotFill &f : fills) {
        Slot &s = slots_[size_t(f.slot)];
        if (s.layer == int32_t(il) && s.expert == f.expert) {
            table_[size_t(il)][size_t(f.expert)] = -1;
            s.layer = s.expert = -1;
        }
    }
}

}  // namespace strata
