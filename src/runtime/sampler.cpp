// The sampling chain: penalties -> constraint mask -> (greedy | temperature -> top-k -> top-p -> min-p -> draw).
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

namespace {

// Eight floats as one value (GCC/Clang vector extensions): SIMD whether or not the build lets the auto-vectorizer
// run (cmake/CompilerChecks.cmake may turn it off). Used inside functions only: a 32-byte vector passed or returned
// by value changes the ABI where AVX is off, and GCC warns of it.
typedef float f32x8 __attribute__((vector_size(32)));

}  // namespace

// Log-probabilities of the penalised distribution, for reporting: made when asked for (a full pass of exp over the
// vocabulary, most of a sample's cost had every token paid it).
const std::vector<float> &Sampler::last_logprobs() {
    if (!logprobs_stale_) return logprobs_;
    const std::vector<float> &logits = penalised_;
    logprobs_.resize(logits.size());
    if (!logits.empty()) {
        float mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (float l : logits) sum += std::exp(double(l - mx));
        const float lse = mx + float(std::log(sum));
        for (size_t i = 0; i < logits.size(); i++) logprobs_[i] = logits[i] - lse;
    }
    logprobs_stale_ = false;
    return logprobs_;
}

Sampler::Sampler(const SamplerParams &p, std::unique_ptr<TokenConstraint> constraint)
    : p_(p), rng_(p.seed), constraint_(std::move(constraint)) {
    validate(p);
}

// The k best of ids (all of 0..n-1 where ids is null) by `better` (higher logit, ties to the lower id), best first:
// what a partial sort of every candidate gives, without ordering them all. A heap of the k kept, its worst on top;
// most candidates fall below that at one comparison, and blocks of them whose largest logit does are skipped whole.
std::vector<int32_t> best_candidates(const float *logits, const std::vector<int32_t> *ids, int64_t n, size_t k) {
    auto better = [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    const size_t count = ids ? ids->size() : size_t(n);
    k = std::min(k, count);
    std::vector<int32_t> heap;
    heap.reserve(k);
    auto offer = [&](int32_t id) {
        if (heap.size() < k) {
            heap.push_back(id);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(id, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = id;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    };
    if (k == 0) return heap;
    if (2 * k >= count) {  // most of them kept: a partial sort of all is cheaper than the heap
        std::vector<int32_t> all = ids ? *ids : std::vector<int32_t>(count);
        if (!ids) std::iota(all.begin(), all.end(), 0);
        std::partial_sort(all.begin(), all.begin() + int64_t(k), all.end(), better);
        all.resize(k);
        return all;
    }
    if (ids) {
        for (int32_t id : *ids) offer(id);
    } else {
        constexpr int64_t B = 16;
        int64_t i = 0;
        for (; i + B <= n; i += B) {
            if (heap.size() == k) {  // a block none of whose logits reaches the worst kept one adds nothing
                const float worst = logits[size_t(heap.front())];
                f32x8 v, w;
                std::memcpy(&v, logits + i, sizeof v);
                std::memcpy(&w, logits + i + 8, sizeof w);
                v = w > v ? w : v;
                bool reach = false;
                for (int j = 0; j < 8; j++) reach |= !(v[j] < worst);
                if (!reach) continue;
            }
            for (int64_t j = 0; j < B; j++) offer(int32_t(i + j));
        }
        for (; i < n; i++) offer(int32_t(i));
    }
    std::sort(heap.begin(), heap.end(), better);
    return heap;
}

int32_t Sampler::sample(const float *logits_in, int64_t n_vocab, const std::vector<int32_t> &history) {
    std::vector<float> &logits = penalised_;
    logits.assign(logits_in, logits_in + n_vocab);
    logprobs_stale_ = true;

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
    const size_t n_cand = mask ? cand.size() : size_t(n_vocab);
    const size_t k = p_.top_k > 0 ? std::min<size_t>(size_t(p_.top_k), n_cand) : n_cand;
    cand = best_candidates(logits.data(), mask ? &cand : nullptr, n_vocab, k);

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
