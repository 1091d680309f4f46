// Perplexity: the windows and what each scores (llama.cpp's conventions, and the strided form), the log-likelihood
// of one row, and the engine-level figure against the same sum made by hand from each window's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"
#include "synth/synth.h"
#include "synth_cache.h"

using namespace strata;

namespace {

// Every token the windows score (window start + j + 1 for j in [first, ctx - 1)), in order.
std::vector<int64_t> scored_tokens(const std::vector<PplWindow> &w, int64_t ctx) {
    std::vector<int64_t> out;
    for (const PplWindow &x : w)
        for (int64_t j = x.first; j < ctx - 1; j++) out.push_back(x.start + j + 1);
    return out;
}

}  // namespace

TEST(PerplexityWindows, DisjointWindowsScoreTheirSecondHalf) {
    PerplexityOptions o;
    o.ctx = 8;
    const std::vector<PplWindow> w = perplexity_windows(27, o);  // three whole windows; the last 3 tokens unused
    ASSERT_EQ(w.size(), 3u);
    for (size_t i = 0; i < w.size(); i++) {
        EXPECT_EQ(w[i].start, int64_t(8 * i));
        EXPECT_EQ(w[i].first, 4);
    }
    // predictions at positions 4..6 of each window: tokens 5..7, 13..15, 21..23
    EXPECT_EQ(scored_tokens(w, 8), (std::vector<int64_t>{5, 6, 7, 13, 14, 15, 21, 22, 23}));
    o.max_windows = 2;
    EXPECT_EQ(perplexity_windows(27, o).size(), 2u);
}

TEST(PerplexityWindows, StridedWindowsScoreEveryLaterTokenOnce) {
    PerplexityOptions o;
    o.ctx = 8;
    o.stride = 3;
    const std::vector<PplWindow> w = perplexity_windows(20, o);  // starts 0, 3, 6, 9, 12
    ASSERT_EQ(w.size(), 5u);
    const std::vector<int64_t> t = scored_tokens(w, 8);
    std::vector<int64_t> want;
    for (int64_t i = 5; i < 20; i++) want.push_back(i);  // from ctx/2 + 1 on, each once, in order
    EXPECT_EQ(t, want);
}

TEST(PerplexityWindows, RefusesWhatScoresNothing) {
    PerplexityOptions o;
    o.ctx = 16;
    EXPECT_THROW(perplexity_windows(15, o), Error);  // shorter than one window
    o.ctx = 1;
    EXPECT_THROW(perplexity_windows(100, o), Error);
    o.ctx = 16;
    o.stride = 16;
    EXPECT_THROW(perplexity_windows(100, o), Error);
}

TEST(PerplexityNll, LogSoftmaxOfTheTarget) {
    const float logits[3] = {1.0f, 2.0f, 3.0f};
    const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
    EXPECT_NEAR(token_nll(logits, 3, 0), lse - 1.0, 1e-12);
    EXPECT_NEAR(token_nll(logits, 3, 2), lse - 3.0, 1e-12);
    const float big[2] = {1000.0f, 1000.0f};  // no overflow
    EXPECT_NEAR(token_nll(big, 2, 1), std::log(2.0), 1e-12);
}

// The engine-level figure equals the mean over the scored positions of -log softmax, each window read alone from a
// fresh sequence with its first token replaced by BOS.
TEST(PerplexityEngine, MatchesTheLogitsOfEachWindow) {
    SynthOptions so;
    so.preset = "tiny-qwen3next";
    so.seed = 3;
    const std::string path = test::cached_synth_model("tiny-qwen3next-ppl", so);
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.n_ctx = 32;
    cfg.n_batch = 32;
    auto eng = make_cpu_engine(path, cfg);
    std::vector<int32_t> toks;
    for (int i = 0; i < 100; i++) toks.push_back(int32_t((i * 29 + 7) % 250));
    PerplexityOptions o;
    o.ctx = 32;
    o.bos = 3;
    int64_t calls = 0;
    const PerplexityResult r = perplexity(*eng, toks, o, [&](int64_t done, int64_t total, double) {
        calls++;
        EXPECT_EQ(done, calls);
        EXPECT_EQ(total, 3);
    });
    EXPECT_EQ(calls, 3);
    ASSERT_EQ(r.running.size(), 3u);
    EXPECT_EQ(r.n_scored, 3 * 15);

    const int64_t V = eng->n_vocab();
    double sum = 0;
    int64_t n = 0;
    for (int64_t s = 0; s + 32 <= 100; s += 32) {
        std::vector<int32_t> in(toks.begin() + s, toks.begin() + s + 32);
        in[0] = 3;
        const int32_t seq = eng->new_sequence();
        std::vector<std::vector<float>> l;
        eng->decode({{seq, in, true}}, l);
        eng->drop(seq);
        for (int64_t j = 16; j < 31; j++) {
            const float *row = l[0].data() + j * V;
            double mx = row[0], z = 0;
            for (int64_t i = 1; i < V; i++) mx = std::max(mx, double(row[i]));
            for (int64_t i = 0; i < V; i++) z += std::exp(double(row[i]) - mx);
            sum += mx + std::log(z) - double(row[toks[size_t(s + j + 1)]]);
            n++;
        }
    }
    EXPECT_NEAR(r.nll_mean, sum / double(n), 1e-9);
    EXPECT_NEAR(r.ppl, std::exp(sum / double(n)), 1e-9 * r.ppl);
    EXPECT_GT(r.ppl_stderr, 0.0);
    EXPECT_LT(r.ppl_stderr, r.ppl);
    // the window does not fit the engine's context
    o.ctx = 64;
    EXPECT_THROW(perplexity(*eng, toks, o), Error);
}
