// Zipf selection rates and the router offsets that produce them, calibrated by simulation: the rate at which an
// offset wins a top-k has no closed form for k > 1, but it is monotonic in the offset, so a fixed-point iteration on
// a fixed sample of normal logits converges.
#include "synth/route_skew.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace strata {

namespace {

constexpr int k_sample_tokens = 4096;  // simulated tokens: rates down to ~1e-3 are seen a few times
constexpr int k_iterations = 80;
constexpr double k_step = 0.7;  // damping of the log-rate correction

// Standard normals from a counter (splitmix64 + Box-Muller): the same sample on every platform, unlike
// std::normal_distribution.
double normal_at(uint64_t i) {
    auto mix = [](uint64_t x) {
        x += 0x9e3779b97f4a7c15ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        return x ^ (x >> 31);
    };
    const uint64_t h = mix(i ^ 0x2545f4914f6cdd1dull);
    const double u1 = (double(h >> 40) + 0.5) / double(uint64_t(1) << 24);
    const double u2 = double(h & 0xffffff) / double(uint64_t(1) << 24);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// How often each expert is in the top k of (offsets + sample row), per token.
std::vector<double> simulated_rates(const std::vector<double> &offsets, int64_t k, const std::vector<double> &z) {
    const size_t n = offsets.size();
    std::vector<double> count(n, 0.0), logit(n);
    std::vector<int64_t> order(n);
    for (size_t t = 0; t < z.size() / n; t++) {
        for (size_t e = 0; e < n; e++) logit[e] = offsets[e] + z[t * n + e];
        std::iota(order.begin(), order.end(), 0);
        std::nth_element(order.begin(), order.begin() + k - 1, order.end(), [&](int64_t a, int64_t b) {
            return logit[size_t(a)] > logit[size_t(b)] || (logit[size_t(a)] == logit[size_t(b)] && a < b);
        });
        for (int64_t i = 0; i < k; i++) count[size_t(order[size_t(i)])] += 1.0;
    }
    for (double &c : count) c /= double(z.size() / n);
    return count;
}

}  // namespace

std::vector<double> zipf_selection_rates(int64_t n_expert, int64_t k, double skew) {
    STRATA_ASSERT(n_expert > 0 && k > 0 && k <= n_expert && skew >= 0);
    std::vector<double> w(static_cast<size_t>(n_expert));
    for (int64_t r = 0; r < n_expert; r++) w[size_t(r)] = std::pow(double(r + 1), -skew);
    // rate_r = min(1, lambda w_r) with the rates summing to k: the sum grows with lambda, so bisect on it.
    auto total = [&](double lambda) {
        double s = 0;
        for (double x : w) s += std::min(1.0, lambda * x);
        return s;
    };
    double lo = 0, hi = 1;
    while (total(hi) < double(k)) hi *= 2;
    for (int i = 0; i < 100; i++) {
        const double mid = 0.5 * (lo + hi);
        (total(mid) < double(k) ? lo : hi) = mid;
    }
    std::vector<double> rates;
    for (double x : w) rates.push_back(std::min(1.0, hi * x));
    return rates;
}

std::vector<float> zipf_router_offsets(int64_t n_expert, int64_t k, double skew) {
    std::vector<float> out(static_cast<size_t>(n_expert), 0.0f);
    if (skew == 0) return out;
    const std::vector<double> target = zipf_selection_rates(n_expert, k, skew);
    std::vector<double> z(size_t(k_sample_tokens) * size_t(n_expert));
    for (size_t i = 0; i < z.size(); i++) z[i] = normal_at(i);

    // Start from what a softmax sampler would need (offset = log rate), then correct by the log of what the
    // simulated top-k misses by; a rate never seen counts as half a token so the correction stays finite.
    std::vector<double> b(static_cast<size_t>(n_expert));
    for (size_t r = 0; r < b.size(); r++) b[r] = std::log(target[r]);
    const double floor_rate = 0.5 / k_sample_tokens;
    for (int it = 0; it < k_iterations; it++) {
        const std::vector<double> got = simulated_rates(b, k, z);
        for (size_t r = 0; r < b.size(); r++)
            b[r] += k_step * (std::log(std::max(target[r], floor_rate)) - std::log(std::max(got[r], floor_rate)));
    }
    const double mean = std::accumulate(b.begin(), b.end(), 0.0) / double(b.size());
    for (size_t r = 0; r < b.size(); r++) out[r] = float(b[r] - mean);
    return out;
}

}  // namespace strata
