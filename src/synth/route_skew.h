// Zipf-like expert popularity for synthetic models (`strata synth --route-skew S`): how often each popularity rank
// should be routed to, and the router logit offsets that make top-k routing do so. Trained MoE routers are far from
// uniform, and how uneven they are decides what an expert cache can hit; random routers are nearly uniform.
// The offsets assume what a random router gives: logits close to independent standard normals per expert.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

// Per-token selection rate of the expert of popularity rank r (0 = most popular) under top-k routing over n_expert
// experts: proportional to 1/(r+1)^skew, capped at 1 (an expert is chosen at most once per token), summing to k.
// skew 0 gives k/n_expert for every rank.
std::vector<double> zipf_selection_rates(int64_t n_expert, int64_t k, double skew);

// Offsets b[r] such that the top k of (b[r] + z_r), z_r independent standard normals, contain rank r at the rates
// above (mean zero; all zero for skew 0). Calibrated on a fixed sample, so the same inputs give the same offsets.
std::vector<float> zipf_router_offsets(int64_t n_expert, int64_t k, double skew);

}  // namespace strata
