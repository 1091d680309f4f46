// Token sampling from logits: penalties, then greedy or temperature sampling restricted by top-k, top-p and
// min-p, over the tokens an optional constraint allows (constrained decoding). Deterministic for a given seed; ties
// go to the lower token id.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/argmax.h"

namespace strata {

struct SamplerParams {
    float temperature = 0.8f;  // <= 0: greedy
    int32_t top_k = 40;        // <= 0: off
    float top_p = 0.95f;       // >= 1: off
    float min_p = 0.05f;       // <= 0: off
    float repeat_penalty = 1.0f;     // 1: off; applied to tokens in the last repeat_last_n
    float presence_penalty = 0.0f;   // subtracted once from tokens seen in the window
    float frequency_penalty = 0.0f;  // subtracted per occurrence in the window
    int32_t repeat_last_n = 64;
    uint64_t seed = 0;
};

// Checks ranges; throws strata::Error naming the parameter.
void validate(const SamplerParams &p);

// A set of token ids, one bit each.
struct TokenMask {
    std::vector<uint64_t> words;
    void assign(int64_t n_vocab, bool all) { words.assign(size_t((n_vocab + 63) / 64), all ? ~uint64_t(0) : 0); }
    bool test(int64_t id) const { return (words[size_t(id >> 6)] >> (id & 63)) & 1; }
    void set(int64_t id) { words[size_t(id >> 6)] |= uint64_t(1) << (id & 63); }
    void reset(int64_t id) { words[size_t(id >> 6)] &= ~(uint64_t(1) << (id & 63)); }
};

// What may come next, for constrained decoding (src/grammar implements it): the sampler draws only among the tokens
// it allows and tells it which one was drawn.
class TokenConstraint {
  public:
    virtual ~TokenConstraint() = default;
    // The tokens that may come next (ids at or past the mask's size never may), or nullptr when any token may.
    // Throws strata::Error when the constraint cannot go on (it allows no token of this vocabulary).
    virtual const TokenMask *allowed() = 0;
    // Whether this one token may come next: cheaper than allowed(), so a greedy pick is checked first.
    virtual bool allows(int32_t token) = 0;
    // The token that came next. Throws strata::Error for one that is not allowed.
    virtual void accept(int32_t token) = 0;
};

class Sampler {
public:
    explicit Sampler(const SamplerParams &p, std::unique_ptr<TokenConstraint> constraint = nullptr);
    // Picks the next token given the logits (n_vocab) and the sequence so far (for penalties). With a constraint,
    // only among the tokens it allows (their penalised logits unchanged, the others out), and the constraint is
    // told the pick; throws strata::Error when it allows none.
    int32_t sample(const float *logits, int64_t n_vocab, const std::vector<int32_t> &history);
    // The log-probabilities of the last sample() call's distribution after penalties (before truncation and before
    // a constraint's mask: the model's own view), for logprobs reporting: log softmax of the penalised logits.
    const std::vector<float> &last_logprobs();
    TokenConstraint *constraint() const { return constraint_.get(); }
    // Whether sample() picks the logits' arg-max (core/argmax.h's) whatever the history: greedy, no penalty, no
    // constraint. Such picks can be made where the logits are (Engine::decode_greedy).
    bool picks_argmax() const {
        return p_.temperature <= 0 && !constraint_ && p_.repeat_penalty == 1.0f && p_.presence_penalty == 0.0f &&
               p_.frequency_penalty == 0.0f;
    }

private:
    SamplerParams p_;
    std::mt19937_64 rng_;
    std::vector<float> penalised_;  // the last sample()'s logits after penalties
    std::vector<float> logprobs_;   // made from them when asked for
    bool logprobs_stale_ = false;
    std::unique_ptr<TokenConstraint> constraint_;
};

// The k best of the candidate ids (every id 0..n-1 where ids is null) by logit, ties to the lower id, best first:
// the first k of a partial sort of them all (the sampler's top-k), found without sorting them all.
std::vector<int32_t> best_candidates(const float *logits, const std::vector<int32_t> *ids, int64_t n, size_t k);

}  // namespace strata
