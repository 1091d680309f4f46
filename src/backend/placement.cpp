// Sizes of the caches a backend holds, and names for messages.
#include "backend/placement.h"

#include "core/error.h"
#include "format/dtype.h"

namespace strata {

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
