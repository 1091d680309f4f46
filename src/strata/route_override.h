// Routing for benchmarks (`strata bench --routing`): the router's choice replaced by seeded draws
// (Backend::route_draws; the arithmetic in backend/route_draws.h), independent per token and layer, so the memory
// system is measured under routing whose statistics are known (uniform: the worst case for an expert cache; zipf:S:
// expert popularity ~ 1/rank^S, the popular experts shuffled per layer). The weights are the router's for the drawn
// experts: softmax over the layer's logits, renormalised and scaled as Backend::route_topk does, and the ids in its
// order (highest weight first, ties to the lower id).
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace strata {

struct RouteOverride {
    enum Kind { Model, Uniform, Zipf } kind = Model;
    double skew = 0.0;  // Zipf's exponent S
    uint64_t seed = 1;
    bool active() const { return kind != Model; }
};

// "model", "uniform" or "zipf:S" (S > 0); throws strata::Error naming the value and what is expected.
RouteOverride parse_route_override(const std::string &s);
std::string route_override_name(const RouteOverride &o);  // as parsed: "uniform", "zipf:1.2"

// The draws an active override makes (backend/route_draws.h).
RouteDraws draws_of(const RouteOverride &o);

// k distinct experts of n_expert for row `row` of pass `pass` at layer il (the host's draw).
void draw_experts(const RouteOverride &o, int64_t il, int64_t pass, int64_t row, int64_t n_expert, int64_t k,
                  int32_t *ids);

}  // namespace strata
