// Perplexity over windows of a token sequence (conventions in perplexity.h).
#include "runtime/perplexity.h"

#include <cmath>

#include "core/error.h"
#include "runtime/engine.h"

namespace strata {

std::vector<PplWindow> perplexity_windows(int64_t n_tokens, const PerplexityOptions &o) {
    if (o.ctx < 2) fail("perplexity: a window of %lld tokens scores nothing (at least 2)", (long long)o.ctx);
    if (o.stride < 0 || o.stride >= o.ctx)
        fail("perplexity: the stride must be from 1 to ctx - 1 = %lld (got %lld)", (long long)(o.ctx - 1),
             (long long)o.stride);
    std::vector<PplWindow> w;
    if (o.stride == 0) {
        for (int64_t s = 0; s + o.ctx <= n_tokens; s += o.ctx) w.push_back({s, o.ctx / 2});
    } else {
        // Window i starts at i * stride; the first window scores from ctx/2 on like a disjoint one, later ones their
        // last `stride` predictions, which are exactly the tokens the previous window did not reach.
        for (int64_t s = 0; s + o.ctx <= n_tokens; s += o.stride)
            w.push_back({s, s == 0 ? o.ctx / 2 : o.ctx - 1 - o.stride});
    }
    if (w.empty())
        fail("perplexity: the text has %lld tokens, fewer than one window of %lld (--ctx)", (long long)n_tokens,
             (long long)o.ctx);
    if (o.max_windows > 0 && int64_t(w.size()) > o.max_windows) w.resize(size_t(o.max_windows));
    return w;
}

double token_nll(const float *logits, int64_t n_vocab, int32_t target) {
    STRATA_ASSERT(target >= 0 && target < n_vocab);
    double mx = logits[0];
    for (int64_t i = 1; i < n_vocab; i++) mx = std::max(mx, double(logits[i]));
    double sum = 0;
    for (int64_t i = 0; i < n_vocab; i++) sum += std::exp(double(logits[i]) - mx);
    return mx + std::log(sum) - double(logits[target]);
}

PerplexityResult perplexity(Engine &eng, const std::vector<int32_t> &tokens, const PerplexityOptions &o,
                            const std::function<void(int64_t, int64_t, double)> &progress) {
    const std::vector<PplWindow> windows = perplexity_windows(int64_t(tokens.size()), o);
    if (eng.config().n_ctx < o.ctx)
        fail("perplexity: windows of %lld tokens need a context of that many (the engine has %lld)",
             (long long)o.ctx, (long long)eng.config().n_ctx);
    const int64_t V = eng.n_vocab();
    PerplexityResult r;
    double sum = 0, sum2 = 0;
    std::vector<std::vector<float>> logits;
    for (size_t wi = 0; wi < windows.size(); wi++) {
        const PplWindow &w = windows[wi];
        std::vector<int32_t> in(tokens.begin() + w.start, tokens.begin() + w.start + o.ctx);
        if (o.bos >= 0) in[0] = o.bos;
        const int32_t seq = eng.new_sequence();
        try {
            eng.decode({{seq, in, true}}, logits);
        } catch (...) {
            eng.drop(seq);
            throw;
        }
        eng.drop(seq);
        STRATA_ASSERT(int64_t(logits[0].size()) == o.ctx * V);
        for (int64_t j = w.first; j < o.ctx - 1; j++) {
            const double nll = token_nll(logits[0].data() + j * V, V, tokens[size_t(w.start + j + 1)]);
            sum += nll;
            sum2 += nll * nll;
            r.n_scored++;
        }
        r.running.push_back(std::exp(sum / double(r.n_scored)));
        if (progress) progress(int64_t(wi + 1), int64_t(windows.size()), r.running.back());
    }
    const double n = double(r.n_scored);
    r.nll_mean = sum / n;
    r.ppl = std::exp(r.nll_mean);
    // the standard error of the mean log-likelihood, carried to the perplexity
    const double var = n > 1 ? std::max(0.0, (sum2 / n - r.nll_mean * r.nll_mean) * n / (n - 1)) : 0.0;
    r.ppl_stderr = r.ppl * std::sqrt(var / n);
    return r;
}

}  // namespace strata
