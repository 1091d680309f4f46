// The sampling chain: penalties -> constraint mask -> (greedy | temperature -> top-k -> top-p -> min-p -> draw).
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "core/error.h"

namespace strata {

void validate(const SamplerParams &p) {
    if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
        fail("temperature must be a finite number >= 0 (got %g)", double(p.temperature));
    if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p must be in (0, 1] (got %g)", double(p.top_p));
    if (!(p.min_p >= 0 && p.min_p <= 1)) fail("min_p must be in [0, 1] (got %g)", double(p.min_p));
    if (!(p.repeat_penalty > 0) || !std::isfinite(p.repeat_penalty))
        fail("repeat_penalty must be a finite number > 0 (got %g)", double(p.repeat_penalty));
    if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
        fail("presence and frequency penalties must be finite numbers");
    if (p.repeat_last_n < 0) fail("repeat_last_n must be >= 0 (got %d)", p.repeat_last_n);
}

int32_t argmax(const float *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return int32_t(best);
}

Sampler::Sampler(const SamplerParams &p, std::unique_ptr<TokenConstraint> constraint)
    : p_(p), rng_(p.seed), constraint_(std::move(constraint)) {
    validate(p);
}

int32_t Sampler::sample(const float *logits_in, int64_t n_vocab, const std::vector<int32_t> &history) {
    std::vector<float> logits(logits_in, logits_in + n_vocab);

    // Penalties over the recent window.
    const bool penalise = p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
    if (penalise && p_.repeat_last_n > 0 && !history.empty()) {
        std::unordered_map<int32_t, int> count;
        const size_t start = history.size() > size_t(p_.repeat_last_n) ? history.size() - size_t(p_.repeat_last_n) : 0;
        for (size_t i = start; i < history.size(); i++)
            if (history[i] >= 0 && history[i] < n_vocab) count[history[i]]++;
        for (auto [tok, c] : count) {
            float &l = logits[size_t(tok)];
            l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
            l -= p_.presence_penalty + p_.frequency_penalty * float(c);
        }
    }

    // Log-probabilities of the penalised distribution, for reporting.
    logprobs_.resize(size_t(n_vocab));
    {
        float mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (float l : logits) sum += std::exp(double(l - mx));
        const float lse = mx + float(std::log(sum));
        for (int64_t i = 0; i < n_vocab; i++) logprobs_[size_t(i)] = logits[size_t(i)] - lse;
    }

    // The constraint's mask: a greedy pick that it allows is the pick under the mask too, and costs one check.
    const TokenMask *mask = nullptr;
    if (constraint_) {
        if (p_.temperature <= 0) {
            const int32_t best = argmax(logits.data(), n_vocab);
            if (constraint_->allows(best)) {
                constraint_->accept(best);
                return best;
            }
        }
        mask = constraint_->allowed();
    }
    std::vector<int32_t> cand;
    if (mask) {  // the allowed ids, in order, a mask word at a time
        const size_t n_words = std::min(mask->words.size(), size_t((n_vocab + 63) / 64));
        for (size_t w = 0; w < n_words; w++)
            for (uint64_t bits = mask->words[w]; bits; bits &= bits - 1) {
                const int64_t id = int64_t(w * 64) + __builtin_ctzll(bits);
                if (id < n_vocab) cand.push_back(int32_t(id));
            }
        if (cand.empty()) fail("the constraint allows no token here");
    }
    auto pick = [&](int32_t token) {
        if (constraint_) constraint_->accept(token);
        return token;
    };
    if (p_.temperature <= 0) {
        if (!mask) return pick(argmax(logits.data(), n_vocab));
        int32_t best = cand[0];
        for (int32_t id : cand)
            if (logits[size_t(id)] > logits[size_t(best)]) best = id;
        return pick(best);
    }

    // Candidates sorted by logit (ties: lower id first), truncated by top-k.
    if (!mask) {
        cand.resize(static_cast<size_t>(n_vocab));
        std::iota(cand.begin(), cand.end(), 0);
    }
    auto better = [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    size_t k = p_.top_k > 0 ? std::min<size_t>(size_t(p_.top_k), cand.size()) : cand.size();
    std::partial_sort(cand.begin(), cand.begin() + int64_t(k), cand.end(), better);
    cand.resize(k);

    std::vector<double> prob(k);
    const double mx = logits[size_t(cand[0])];
    double sum = 0;
    for (size_t i = 0; i < k; i++) sum += prob[i] = std::exp((double(logits[size_t(cand[i])]) - mx) / p_.temperature);
    for (double &x : prob) x /= sum;

    // top-p: the smallest prefix whose mass reaches p; min-p: drop tokens below min_p times the best.
    size_t keep = k;
    if (p_.top_p < 1) {
        double cum = 0;
        for (size_t i = 0; i < k; i++) {
            cum += prob[i];
            if (cum >= p_.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p_.min_p > 0) {
        size_t m = 1;
        while (m < keep && prob[m] >= p_.min_p * prob[0]) m++;
        keep = m;
    }
    double total = 0;
    for (size_t i = 0; i < keep; i++) total += prob[i];
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng_), acc = 0;
    for (size_t i = 0; i < keep; i++) {
        acc += prob[i];
        if (r < acc) return pick(cand[i]);
    }
    return pick(cand[keep - 1]);
}

}  // namespace strata
