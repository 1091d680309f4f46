// The sampler's fast paths against the plain algorithms they replace: the first largest logit, the top-k candidates,
// and whole sampling chains (penalties, temperature, top-k, top-p, min-p, the draw) picking the same tokens for the
// same seeds; log-probabilities made only when asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <unordered_map>

#include "runtime/sampler.h"

using namespace strata;

namespace {

// The scan the fast argmax stands for: move on only to a strictly larger value.
int32_t scan_argmax(const std::vector<float> &l) {
    size_t best = 0;
    for (size_t i = 1; i < l.size(); i++)
        if (l[i] > l[best]) best = i;
    return int32_t(best);
}

// Values drawn from a small set with NaNs, both zeros and infinities, so ties and odd values are common.
std::vector<float> odd_logits(std::mt19937 &rng, size_t n) {
    std::vector<float> v(n);
    for (float &x : v) {
        switch (rng() % 10) {
            case 0: x = NAN; break;
            case 1: x = 0.0f; break;
            case 2: x = -0.0f; break;
            case 3: x = INFINITY; break;
            case 4: x = -INFINITY; break;
            default: x = float(int(rng() % 5)) - 2.0f;
        }
    }
    return v;
}

// The sampling chain as it was written before its fast paths: a copy, penalties, an index sort of every candidate,
// truncation, the draw. The rng is the sampler's own (seeded alike, drawn from alike).
int32_t reference_sample(const SamplerParams &p, std::mt19937_64 &rng, std::vector<float> logits,
                         const std::vector<int32_t> &history) {
    const int64_t n = int64_t(logits.size());
    const bool penalise = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (penalise && p.repeat_last_n > 0 && !history.empty()) {
        std::unordered_map<int32_t, int> count;
        const size_t start = history.size() > size_t(p.repeat_last_n) ? history.size() - size_t(p.repeat_last_n) : 0;
        for (size_t i = start; i < history.size(); i++)
            if (history[i] >= 0 && history[i] < n) count[history[i]]++;
        for (auto [tok, c] : count) {
            float &l = logits[size_t(tok)];
            l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
            l -= p.presence_penalty + p.frequency_penalty * float(c);
        }
    }
    if (p.temperature <= 0) return scan_argmax(logits);
    std::vector<int32_t> cand(static_cast<size_t>(n));
    std::iota(cand.begin(), cand.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    const size_t k = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), cand.size()) : cand.size();
    std::partial_sort(cand.begin(), cand.begin() + int64_t(k), cand.end(), better);
    cand.resize(k);
    std::vector<double> prob(k);
    const double mx = logits[size_t(cand[0])];
    double sum = 0;
    for (size_t i = 0; i < k; i++) sum += prob[i] = std::exp((double(logits[size_t(cand[i])]) - mx) / p.temperature);
    for (double &x : prob) x /= sum;
    size_t keep = k;
    if (p.top_p < 1) {
        double cum = 0;
        for (size_t i = 0; i < k; i++) {
            cum += prob[i];
            if (cum >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0) {
        size_t m = 1;
        while (m < keep && prob[m] >= p.min_p * prob[0]) m++;
        keep = m;
    }
    double total = 0;
    for (size_t i = 0; i < keep; i++) total += prob[i];
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng), acc = 0;
    for (size_t i = 0; i < keep; i++) {
        acc += prob[i];
        if (r < acc) return cand[i];
    }
    return cand[keep - 1];
}

}  // namespace

TEST(Argmax, FirstLargestAsTheScanPicksIt) {
    std::mt19937 rng(7);
    for (int t = 0; t < 20000; t++) {
        const std::vector<float> v = odd_logits(rng, 1 + rng() % 100);
        ASSERT_EQ(argmax(v.data(), int64_t(v.size())), scan_argmax(v)) << "case " << t;
    }
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> big(151936);
    for (float &x : big) x = d(rng);
    for (int t = 0; t < 20; t++) {
        big[rng() % big.size()] = 20.0f + float(t % 3);  // a maximum, sometimes repeated later
        EXPECT_EQ(argmax(big.data(), int64_t(big.size())), scan_argmax(big));
    }
    EXPECT_EQ(argmax(big.data(), 0), 0);
    const std::vector<float> nan_first{NAN, 5.0f, 6.0f};
    EXPECT_EQ(argmax(nan_first.data(), 3), 0);
    const std::vector<float> zeros{-1.0f, -0.0f, 0.0f};
    EXPECT_EQ(argmax(zeros.data(), 3), 1);
}

TEST(BestCandidates, TheFirstKOfAPartialSort) {
    std::mt19937 rng(11);
    for (int t = 0; t < 3000; t++) {
        const size_t n = 1 + rng() % 300;
        std::vector<float> l(n);
        for (float &x : l) x = float(int(rng() % 7)) - 3.0f + (rng() % 4 == 0 ? 0.5f : 0.0f);  // many ties
        std::vector<int32_t> ids;
        const bool subset = rng() % 2;
        if (subset)
            for (size_t i = 0; i < n; i++)
                if (rng() % 3) ids.push_back(int32_t(i));
        if (subset && ids.empty()) ids.push_back(0);
        std::vector<int32_t> ref = subset ? ids : std::vector<int32_t>(n);
        if (!subset) std::iota(ref.begin(), ref.end(), 0);
        const size_t k = 1 + rng() % (ref.size() + 3);  // past the count too
        auto better = [&](int32_t a, int32_t b) {
            return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
        };
        const size_t kk = std::min(k, ref.size());
        std::partial_sort(ref.begin(), ref.begin() + int64_t(kk), ref.end(), better);
        ref.resize(kk);
        ASSERT_EQ(best_candidates(l.data(), subset ? &ids : nullptr, int64_t(n), k), ref) << "case " << t;
    }
}

TEST(Sampler, PicksWhatThePlainChainPicks) {
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 2.5f);
    const int64_t n = 5000;
    std::vector<float> logits(static_cast<size_t>(n));
    for (int cfg = 0; cfg < 12; cfg++) {
        SamplerParams p;
        p.seed = 100 + uint64_t(cfg);
        p.temperature = cfg % 4 == 0 ? 0.0f : 0.3f + 0.4f * float(cfg % 3);
        p.top_k = cfg % 3 == 0 ? 0 : cfg % 3 == 1 ? 40 : 3000;
        p.top_p = cfg % 2 ? 0.9f : 1.0f;
        p.min_p = cfg % 5 == 1 ? 0.0f : 0.05f;
        p.repeat_penalty = cfg % 2 ? 1.15f : 1.0f;
        p.presence_penalty = cfg % 3 == 2 ? 0.5f : 0.0f;
        Sampler s(p);
        std::mt19937_64 ref_rng(p.seed);
        std::vector<int32_t> history;
        for (int step = 0; step < 40; step++) {
            for (float &x : logits) x = d(rng);
            if (step % 7 == 3) logits[size_t(rng() % n)] = logits[size_t(rng() % n)];  // a tie
            const int32_t got = s.sample(logits.data(), n, history);
            const int32_t want = reference_sample(p, ref_rng, logits, history);
            ASSERT_EQ(got, want) << "configuration " << cfg << ", step " << step;
            history.push_back(got);
        }
    }
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfThePenalisedLogitsWhenAskedFor) {
    SamplerParams p;
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    Sampler s(p);
    const std::vector<float> logits{1.0f, 3.0f, 2.0f, -1.0f};
    EXPECT_EQ(s.sample(logits.data(), 4, {1}), 2);  // 3 / 2 = 1.5 falls below 2
    const std::vector<float> &lp = s.last_logprobs();
    ASSERT_EQ(lp.size(), 4u);
    const double z = std::exp(1.0) + std::exp(1.5) + std::exp(2.0) + std::exp(-1.0);
    EXPECT_NEAR(lp[1], 1.5 - std::log(z), 1e-6);
    EXPECT_NEAR(lp[2], 2.0 - std::log(z), 1e-6);
    // a later sample replaces them
    const std::vector<float> flat{0.0f, 0.0f, 0.0f, 0.0f};
    EXPECT_EQ(s.sample(flat.data(), 4, {}), 0);
    EXPECT_NEAR(s.last_logprobs()[3], -std::log(4.0), 1e-6);
}
