// Seeded expert draws and the router's weights for them (route_override.h).
#include "strata/route_override.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <cstdio>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace strata {

namespace {

uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// A counter-based stream: draw i of key (seed, il, pass, row), uniform in [0, 1).
struct Stream {
    uint64_t key, i = 0;
    double next() { return double(splitmix(key ^ splitmix(++i)) >> 11) * 0x1.0p-53; }
};

uint64_t key_of(uint64_t seed, int64_t il, int64_t pass, int64_t row) {
    return splitmix(splitmix(splitmix(seed) ^ uint64_t(il)) ^ uint64_t(pass) * 0x100000001b3ull) ^ uint64_t(row);
}

// Zipf over ranks: the cumulative distribution of P(rank r) ~ 1/(r+1)^S, and which expert holds each rank at layer
// il (a seeded permutation), cached per (n, S, seed, layer).
struct ZipfTable {
    std::vector<double> cdf;
    std::vector<int32_t> expert_of_rank;
};

const ZipfTable &zipf_table(int64_t n, double s, uint64_t seed, int64_t il) {
    static std::mutex mu;
    static std::map<std::tuple<int64_t, double, uint64_t, int64_t>, ZipfTable> cache;
    std::lock_guard<std::mutex> lock(mu);
    ZipfTable &t = cache[{n, s, seed, il}];
    if (t.cdf.empty()) {
        t.cdf.resize(size_t(n));
        double acc = 0;
        for (int64_t r = 0; r < n; r++) t.cdf[size_t(r)] = acc += 1.0 / std::pow(double(r + 1), s);
        for (double &c : t.cdf) c /= acc;
        t.expert_of_rank.resize(size_t(n));
        std::iota(t.expert_of_rank.begin(), t.expert_of_rank.end(), 0);
        Stream st{key_of(seed, il, -1, -1)};
        for (int64_t i = n - 1; i > 0; i--) {  // Fisher-Yates
            const int64_t j = std::min<int64_t>(i, int64_t(st.next() * double(i + 1)));
            std::swap(t.expert_of_rank[size_t(i)], t.expert_of_rank[size_t(j)]);
        }
    }
    return t;
}

}  // namespace

RouteOverride parse_route_override(const std::string &s) {
    RouteOverride o;
    if (s == "model") return o;
    if (s == "uniform") {
        o.kind = RouteOverride::Uniform;
        return o;
    }
    if (s.rfind("zipf:", 0) == 0) {
        const std::string v = s.substr(5);
        char *end = nullptr;
        const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
        if (!v.empty() && end && *end == '\0' && x > 0.0 && x <= 10.0) {
            o.kind = RouteOverride::Zipf;
            o.skew = x;
            return o;
        }
    }
    fail("--routing: '%s' is not a routing (expected model, uniform or zipf:S with 0 < S <= 10, e.g. zipf:1.2)",
         s.c_str());
}

std::string route_override_name(const RouteOverride &o) {
    switch (o.kind) {
        case RouteOverride::Model:
            return "model";
        case RouteOverride::Uniform:
            return "uniform";
        case RouteOverride::Zipf: {
            char b[32];
            std::snprintf(b, sizeof b, "zipf:%g", o.skew);
            return b;
        }
    }
    return "model";
}

void draw_experts(const RouteOverride &o, int64_t il, int64_t pass, int64_t row, int64_t n_expert, int64_t k,
                  int32_t *ids) {
    STRATA_ASSERT(o.active() && k >= 1 && k <= n_expert);
    Stream st{key_of(o.seed, il, pass, row)};
    const ZipfTable *z = o.kind == RouteOverride::Zipf ? &zipf_table(n_expert, o.skew, o.seed, il) : nullptr;
    for (int64_t j = 0; j < k; j++) {
        int32_t e;
        do {  // distinct: draw again on a repeat (k is a small share of n_expert)
            const double u = st.next();
            if (z) {
                const int64_t r = std::lower_bound(z->cdf.begin(), z->cdf.end(), u) - z->cdf.begin();
                e = z->expert_of_rank[size_t(std::min<int64_t>(r, n_expert - 1))];
            } else {
                e = int32_t(std::min<int64_t>(n_expert - 1, int64_t(u * double(n_expert))));
            }
        } while (std::find(ids, ids + j, e) != ids + j);
        ids[j] = e;
    }
}

void router_weights(const float *logits, const MoeParams &p, int32_t *ids, float *weights) {
    std::vector<float> prob(static_cast<size_t>(p.n_expert));
    router_softmax(logits, p.n_expert, prob.data());
    std::sort(ids, ids + p.n_expert_used, [&](int32_t a, int32_t b) {
        return prob[size_t(a)] > prob[size_t(b)] || (prob[size_t(a)] == prob[size_t(b)] && a < b);
    });
    chosen_weights(prob.data(), p, ids, weights);
}

}  // namespace strata
