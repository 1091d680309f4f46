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
