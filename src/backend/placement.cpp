// Sizes of the caches a backend holds, and names for messages.
#include "backend/placement.h"

#include <algorithm>

#include "core/error.h"
#include "format/dtype.h"

namespace strata {

std::vector<int64_t> Placement::loan_take(uint64_t bytes) const {
    std::vector<int64_t> x(loan_class_slots.size(), 0);
    for (size_t c = x.size(); c-- > 0 && bytes > 0;) {
        const uint64_t b = slot_classes[c].bytes;
        x[c] = std::min<int64_t>(loan_class_slots[c], int64_t((bytes + b - 1) / b));
        bytes -= std::min<uint64_t>(bytes, uint64_t(x[c]) * b);
    }
    return x;
}

std::vector<int64_t> Placement::loan_split_for(int64_t tokens) const {
    if (loan_slots <= 0 || tokens <= resident_chunk_tokens) return {};
    const size_t i = size_t((tokens + 255) / 256 - 1);
    return i < loan_step_bytes.size() ? loan_take(loan_step_bytes[i]) : loan_class_slots;
}

int64_t Placement::loan_slots_for(int64_t tokens) const {
    int64_t n = 0;
    for (const int64_t x : loan_split_for(tokens)) n += x;
    return n;
}

uint64_t Placement::loan_bytes() const {
    uint64_t b = 0;
    for (size_t c = 0; c < loan_class_slots.size(); c++) b += uint64_t(loan_class_slots[c]) * slot_classes[c].bytes;
    return b;
}

SlotPools slot_pools(const Placement &p, uint64_t max_pool_bytes) {
    SlotPools out;
    out.slots.resize(size_t(std::max<int64_t>(p.n_slots, 0)));
    const uint64_t loan_bytes = p.loan_bytes();
    if (loan_bytes) {
        out.loan_pool = 0;
        out.pool_bytes.push_back(loan_bytes);
    }
    uint64_t at = 0;      // in the loan pool
    int64_t covered = 0;  // slots numbered so far: the classes number them class after class, leaving none out
    for (size_t c = 0; c < p.slot_classes.size(); c++) {
        const SlotClass &k = p.slot_classes[c];
        STRATA_ASSERT(k.bytes > 0 && k.first == covered && k.first + k.n <= p.n_slots);
        covered += k.n;
        const int64_t lent = c < p.loan_class_slots.size() ? p.loan_class_slots[c] : 0, own = k.n - lent;
        STRATA_ASSERT(lent >= 0 && own >= 0);
        const int64_t per_pool = std::max<int64_t>(1, int64_t(max_pool_bytes / k.bytes));
        for (int64_t done = 0; done < own;) {
            const int64_t n = std::min(per_pool, own - done);
            const int32_t pool = int32_t(out.pool_bytes.size());
            out.pool_bytes.push_back(uint64_t(n) * k.bytes);
            for (int64_t i = 0; i < n; i++)
                out.slots[size_t(k.first + done + i)] = {pool, uint64_t(i) * k.bytes, k.bytes};
            done += n;
        }
        for (int64_t i = 0; i < lent; i++, at += k.bytes) out.slots[size_t(k.first + own + i)] = {0, at, k.bytes};
    }
    STRATA_ASSERT(at == loan_bytes && covered == int64_t(out.slots.size()));
    return out;
}

const char *kv_type_name(KvType t) {
    switch (t) {
        case KvType::F32: return "f32";
        case KvType::F16: return "f16";
        case KvType::Q8_0: return "q8_0";
    }
    return "?";
}

size_t kv_row_bytes(KvType t, int64_t cols) {
    switch (t) {
        case KvType::F32: return size_t(cols) * 4;
        case KvType::F16: return size_t(cols) * 2;
        case KvType::Q8_0: return row_bytes(DType::Q8_0, cols);
    }
    return 0;
}

size_t CacheShape::first_bytes(size_t il) const {
    const Layer &L = layers[il];
    if (L.attention) return size_t(n_seqs) * size_t(n_ctx) * kv_row_bytes(kv_type, L.kv_cols);
    return size_t(n_seqs) * size_t(L.conv_rows * L.conv_cols) * 4;
}

size_t CacheShape::second_bytes(size_t il) const {
    const Layer &L = layers[il];
    if (L.attention) return first_bytes(il);
    return size_t(n_seqs) * size_t(L.state_floats) * 4;
}

const char *host_tier_name(HostTier t) {
    switch (t) {
        case HostTier::none: return "none";
        case HostTier::pinned_copy: return "pinned copy";
        case HostTier::stager: return "pageable via pinned stager";
        case HostTier::pageable: return "pageable";
        case HostTier::pinned_mapping: return "pinned mapping";
    }
    return "?";
}

}  // namespace strata
