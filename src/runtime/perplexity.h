// Perplexity of a model over a token sequence, with llama.cpp's conventions: the tokens are cut into windows of ctx
// tokens, each evaluated in a fresh sequence, and only the predictions in a window's second half are scored (the
// first half is context), so every scored token has at least ctx/2 tokens before it. With a stride, windows overlap
// instead: they start every `stride` tokens and score their last `stride` predictions.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace strata {

class Engine;

struct PerplexityOptions {
    int64_t ctx = 512;
    int64_t stride = 0;      // 0: disjoint windows, second half scored
    int64_t max_windows = 0; // 0: all that fit
    int32_t bos = -1;        // >= 0: a window's first token is replaced by it (llama.cpp, for vocabularies adding BOS)
};

// One window: tokens [start, start + ctx); the predictions made at positions [first, ctx - 1) of it are scored (the
// prediction at window position j is of token start + j + 1).
struct PplWindow {
    int64_t start = 0, first = 0;
};

// The windows over n_tokens tokens; throws strata::Error naming what is missing when there is not even one.
std::vector<PplWindow> perplexity_windows(int64_t n_tokens, const PerplexityOptions &o);

struct PerplexityResult {
    int64_t n_scored = 0;
    double nll_mean = 0, ppl = 0, ppl_stderr = 0;
    std::vector<double> running;  // the perplexity over the windows so far, after each window
};

// -log softmax(logits)[target], in double.
double token_nll(const float *logits, int64_t n_vocab, int32_t target);

// Runs every window through the engine (one sequence at a time; the engine needs a free sequence and a context of
// ctx) and scores it; progress(windows done, windows, perplexity so far) after each.
PerplexityResult perplexity(Engine &eng, const std::vector<int32_t> &tokens, const PerplexityOptions &o,
                            const std::function<void(int64_t, int64_t, double)> &progress = nullptr);

}  // namespace strata
