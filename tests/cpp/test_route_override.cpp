// Benchmark routing (strata/route_override.h): the draws (distinct, in range, reproducible, with the statistics their
// name promises), the router's weights for them (route_topk's own when the draws are its choice), the names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "strata/route_override.h"

using namespace strata;

TEST(RouteOverride, ParsesAndNames) {
    EXPECT_FALSE(parse_route_override("model").active());
    EXPECT_EQ(parse_route_override("uniform").kind, RouteOverride::Uniform);
    const RouteOverride z = parse_route_override("zipf:1.2");
    EXPECT_EQ(z.kind, RouteOverride::Zipf);
    EXPECT_DOUBLE_EQ(z.skew, 1.2);
    EXPECT_EQ(route_override_name(z), "zipf:1.2");
    EXPECT_EQ(route_override_name(parse_route_override("uniform")), "uniform");
    for (const char *bad : {"", "zipf", "zipf:", "zipf:0", "zipf:-1", "zipf:1x", "zipf:11", "Uniform"})
        EXPECT_THROW(parse_route_override(bad), Error) << bad;
}

TEST(RouteOverride, UniformDrawsAreDistinctReproducibleAndFlat) {
    RouteOverride o = parse_route_override("uniform");
    const int64_t n = 64, k = 8, rows = 4000;
    std::vector<int64_t> count(static_cast<size_t>(n), 0);
    std::vector<int32_t> ids(static_cast<size_t>(k)), again(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; r++) {
        draw_experts(o, 3, 7, r, n, k, ids.data());
        draw_experts(o, 3, 7, r, n, k, again.data());
        EXPECT_EQ(ids, again);
        EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), size_t(k));
        for (int32_t e : ids) {
            ASSERT_TRUE(e >= 0 && e < n);
            count[size_t(e)]++;
        }
    }
    // 4000 * 8 / 64 = 500 picks per expert expected; binomial sd ~21: every count within 6 sd
    for (int64_t c : count) EXPECT_NEAR(double(c), 500.0, 130.0);
    // another layer, pass or seed draws otherwise
    std::vector<int32_t> l4(static_cast<size_t>(k)), p8(static_cast<size_t>(k)), s2(static_cast<size_t>(k));
    draw_experts(o, 4, 7, 0, n, k, l4.data());
    draw_experts(o, 3, 8, 0, n, k, p8.data());
    o.seed = 2;
    draw_experts(o, 3, 7, 0, n, k, s2.data());
    draw_experts(parse_route_override("uniform"), 3, 7, 0, n, k, ids.data());
    EXPECT_NE(ids, l4);
    EXPECT_NE(ids, p8);
    EXPECT_NE(ids, s2);
}

TEST(RouteOverride, ZipfDrawsFollowTheirPopularity) {
    const RouteOverride o = parse_route_override("zipf:1.0");
    const int64_t n = 128, rows = 20000;
    std::vector<int64_t> count(static_cast<size_t>(n), 0);
    int32_t id = 0;
    for (int64_t r = 0; r < rows; r++) {
        draw_experts(o, 0, 0, r, n, 1, &id);
        count[size_t(id)]++;
    }
    // k = 1: P(rank 1) = 1 / H_128 = 0.1846; the most picked expert holds about that share
    const double h = [&] {
        double s = 0;
        for (int r = 1; r <= n; r++) s += 1.0 / r;
        return s;
    }();
    std::vector<int64_t> sorted = count;
    std::sort(sorted.rbegin(), sorted.rend());
    EXPECT_NEAR(double(sorted[0]) / rows, 1.0 / h, 0.015);
    EXPECT_NEAR(double(sorted[1]) / rows, 0.5 / h, 0.015);
    // which expert is most popular differs from layer to layer (a seeded permutation per layer)
    std::set<int32_t> top;
    for (int64_t il = 0; il < 8; il++) {
        std::vector<int64_t> c(static_cast<size_t>(n), 0);
        for (int64_t r = 0; r < 2000; r++) {
            draw_experts(o, il, 0, r, n, 1, &id);
            c[size_t(id)]++;
        }
        top.insert(int32_t(std::max_element(c.begin(), c.end()) - c.begin()));
    }
    EXPECT_GE(top.size(), 4u);
}

// Given the router's own choice, the weights and the order are route_topk's, bit for bit.
TEST(RouteOverride, RouterWeightsAreRouteTopk) {
    auto cpu = make_cpu_backend(1);
    const int64_t n = 32, k = 4, T = 50;
    for (const bool norm : {true, false}) {
        MoeParams p;
        p.n_expert = n;
        p.n_expert_used = k;
        p.norm_weights = norm;
        p.weights_scale = norm ? 0.0f : 2.5f;
        cpu->reset_scratch();
        Act logits = cpu->alloc(T, n);
        uint64_t s = 12345;
        for (int64_t i = 0; i < T * n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            logits.data[i] = float(int64_t(s >> 40) % 2000 - 1000) / 250.0f;
        }
        int32_t *ids = cpu->alloc_i32(T * k);
        Act w = cpu->alloc(1, T * k);
        cpu->route_topk(logits, p, ids, w.data);
        for (int64_t t = 0; t < T; t++) {
            std::vector<int32_t> mine(ids + t * k, ids + t * k + k);
            std::reverse(mine.begin(), mine.end());  // any order in: router_weights sorts
            std::vector<float> mw(static_cast<size_t>(k));
            router_weights(logits.row(t), p, mine.data(), mw.data());
            for (int64_t j = 0; j < k; j++) {
                EXPECT_EQ(mine[size_t(j)], ids[t * k + j]);
                EXPECT_EQ(mw[size_t(j)], w.data[t * k + j]);
            }
        }
    }
}

// Backend::route_draws on the host (the default, the CPU backend's): each token's draw for the pass it counts (up by
// one at each new pass, from 0 after reset_draws()) with the router's weights, in the backend's memory.
TEST(RouteOverride, BackendDrawsCountPasses) {
    auto cpu = make_cpu_backend(1);
    const RouteOverride o = parse_route_override("zipf:0.8");
    const RouteDraws d = draws_of(o);
    const int64_t n = 40, k = 5, T = 9;
    const MoeParams p{n, k, true, 0.0f};
    for (int round = 0; round < 2; round++) {
        cpu->reset_draws();
        for (int64_t pass = 0; pass < 3; pass++)
            for (const int64_t il : {1, 4}) {
                cpu->reset_scratch();
                Act logits = cpu->alloc(T, n), w = cpu->alloc(1, T * k);
                for (int64_t i = 0; i < T * n; i++) logits.data[i] = float((i * 7919 + pass * 31 + il) % 97) / 17.0f;
                int32_t *ids = cpu->alloc_i32(T * k);
                cpu->route_draws(logits, p, d, il, il == 1, ids, w);
                for (int64_t t = 0; t < T; t++) {
                    std::vector<int32_t> want(static_cast<size_t>(k));
                    std::vector<float> ww(static_cast<size_t>(k));
                    draw_experts(o, il, pass, t, n, k, want.data());
                    router_weights(logits.row(t), p, want.data(), ww.data());
                    for (int64_t j = 0; j < k; j++) {
                        EXPECT_EQ(ids[t * k + j], want[size_t(j)]) << "round " << round << ", pass " << pass;
                        EXPECT_EQ(w.data[t * k + j], ww[size_t(j)]);
                    }
                }
            }
    }
    EXPECT_FALSE(cpu->draws_on_device());
}

// NaN router logits (a NaN hidden state) still give k distinct experts in range: a NaN ranks below every number.
TEST(RouteTopk, NanLogitsGiveDistinctExpertsInRange) {
    auto cpu = make_cpu_backend(1);
    MoeParams p;
    p.n_expert = 16;
    p.n_expert_used = 4;
    p.norm_weights = true;
    cpu->reset_scratch();
    Act logits = cpu->alloc(3, 16);
    for (int64_t e = 0; e < 16; e++) {
        logits.row(0)[e] = std::nanf("");                          // all NaN
        logits.row(1)[e] = e == 3 ? std::nanf("") : float(e) * 0.1f;  // one NaN: the softmax sum is NaN
        logits.row(2)[e] = float(15 - e);                            // finite: the usual order
    }
    int32_t *ids = cpu->alloc_i32(3 * 4);
    Act w = cpu->alloc(1, 3 * 4);
    cpu->route_topk(logits, p, ids, w.data);
    for (int64_t t = 0; t < 3; t++) {
        std::set<int32_t> seen(ids + t * 4, ids + t * 4 + 4);
        EXPECT_EQ(seen.size(), 4u) << "token " << t;
        for (int32_t id : seen) EXPECT_TRUE(id >= 0 && id < 16) << "token " << t;
    }
    EXPECT_EQ(std::vector<int32_t>(ids + 8, ids + 12), (std::vector<int32_t>{0, 1, 2, 3}));
}
