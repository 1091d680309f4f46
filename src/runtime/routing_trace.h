// The routing-trace file (docs/routing-trace.md): every MoE layer's routing of every forward pass, as the schedule
// ran it, written as it comes. tools/trace summarises it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "strata/moe_schedule.h"

namespace strata {

class RoutingTraceWriter final : public RoutingObserver {
  public:
    // Creates (truncates) path and writes the header; throws strata::Error naming the file when it cannot.
    RoutingTraceWriter(const std::string &path, int64_t n_layer, int64_t n_expert, int64_t k);
    ~RoutingTraceWriter() override;
    RoutingTraceWriter(const RoutingTraceWriter &) = delete;
    RoutingTraceWriter &operator=(const RoutingTraceWriter &) = delete;

    void routed(int64_t il, int64_t n_tokens, int64_t k, const int32_t *ids, const float *weights) override;
    // Flushes and closes; throws naming the file when the data did not all reach it.
    void close();

    int64_t passes() const { return pass_ + 1; }
    int64_t records() const { return records_; }

  private:
    std::string path_;
    std::FILE *f_ = nullptr;
    int64_t n_expert_, k_;
    int64_t pass_ = -1, last_layer_ = -1, records_ = 0;
};

}  // namespace strata
