// The routing-trace writer: a record per (pass, MoE layer); a new pass starts where a layer does not follow the last.
#include "runtime/routing_trace.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"

namespace strata {

namespace {

constexpr uint32_t k_version = 1, k_with_weights = 1;

void put_u32(std::vector<uint8_t> &b, uint32_t v) {
    for (int i = 0; i < 4; i++) b.push_back(uint8_t(v >> (8 * i)));
}

void put_u16(std::vector<uint8_t> &b, uint16_t v) {
    b.push_back(uint8_t(v));
    b.push_back(uint8_t(v >> 8));
}

}  // namespace

RoutingTraceWriter::RoutingTraceWriter(const std::string &path, int64_t n_layer, int64_t n_expert, int64_t k)
    : path_(path), n_expert_(n_expert), k_(k) {
    if (n_expert < 1 || n_expert > 65536 || k < 1 || k > n_expert)
        fail("--routing-trace: a model of %lld experts, %lld per token, does not fit the trace format (ids are 16-bit)",
             (long long)n_expert, (long long)k);
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) fail("--routing-trace: cannot create '%s': %s", path.c_str(), std::strerror(errno));
    std::vector<uint8_t> h(8);
    std::memcpy(h.data(), "STRTRACE", 8);
    put_u32(h, k_version);
    put_u32(h, uint32_t(n_layer));
    put_u32(h, uint32_t(n_expert));
    put_u32(h, uint32_t(k));
    put_u32(h, k_with_weights);
    put_u32(h, 0);
    if (std::fwrite(h.data(), 1, h.size(), f_) != h.size())
        fail("--routing-trace: writing '%s' failed: %s", path.c_str(), std::strerror(errno));
}

RoutingTraceWriter::~RoutingTraceWriter() {
    if (f_) std::fclose(f_);
}

void RoutingTraceWriter::routed(int64_t il, int64_t n_tokens, int64_t k, const int32_t *ids, const float *weights) {
    if (!f_) fail("--routing-trace: '%s' is already closed", path_.c_str());
    STRATA_ASSERT(k == k_ && n_tokens >= 0);
    if (il <= last_layer_ || pass_ < 0) pass_++;
    last_layer_ = il;
    std::vector<uint8_t> b;
    b.reserve(size_t(12 + 4 * n_tokens * k));
    put_u32(b, uint32_t(pass_));
    put_u32(b, uint32_t(il));
    put_u32(b, uint32_t(n_tokens));
    for (int64_t i = 0; i < n_tokens * k; i++) {
        STRATA_ASSERT(ids[i] >= 0 && ids[i] < n_expert_);
        put_u16(b, uint16_t(ids[i]));
    }
    for (int64_t i = 0; i < n_tokens * k; i++) put_u16(b, f32_to_f16(weights[i]));
    if (std::fwrite(b.data(), 1, b.size(), f_) != b.size())
        fail("--routing-trace: writing '%s' failed: %s", path_.c_str(), std::strerror(errno));
    records_++;
}

void RoutingTraceWriter::close() {
    if (!f_) return;
    const bool ok = std::fflush(f_) == 0;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok || !closed) fail("--routing-trace: writing '%s' failed: %s", path_.c_str(), std::strerror(errno));
}

}  // namespace strata
