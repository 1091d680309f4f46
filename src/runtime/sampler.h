// Token sampling from logits: penalties, then greedy or temperature sampling restricted by top-k, top-p and
// min-p. Deterministic for a given seed; ties go to the lower token id.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

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

class Sampler {
public:
    explicit Sampler(const SamplerParams &p);
    // Picks the next token given the logits (n_vocab) and the sequence so far (for penalties).
    int32_t sample(const float *logits, int64_t n_vocab, const std::vector<int32_t> &history);
    // The log-probabilities of the last sample() call's distribution after penalties (before truncation),
    // for logprobs reporting: log softmax of the penalised logits.
    const std::vector<float> &last_logprobs() const { return logprobs_; }

private:
    SamplerParams p_;
    std::mt19937_64 rng_;
    std::vector<float> logprobs_;
};

int32_t argmax(const float *logits, int64_t n);

}  // namespace strata
