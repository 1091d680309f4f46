// Engine behaviour on synthetic tiny models of each architecture: token-by-token decoding equals one prefill,
// the prefill chunk size does not matter, sequences batched together give what each gives alone, forks
// continue from their prefix, greedy decoding by decode_argmax picks the arg-max of decode()'s logits, and bad inputs
// are refused without changing any sequence.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "synth/synth.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "synth_cache.h"

using namespace strata;

namespace {

std::string model_path(const std::string &preset, DType et, DType dt) {
    SynthOptions o;
    o.preset = preset;
    o.expert_type = et;
    o.dense_type = dt;
    o.seed = 7;
    return test::cached_synth_model(preset + "-" + dtype_name(et) + "-" + dtype_name(dt), o);
}

std::vector<int32_t> prompt_tokens(int n, int salt) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; i++) t.push_back(int32_t((i * 37 + salt * 11 + 5) % 250));
    return t;
}

float max_abs(const std::vector<float> &v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

// The engine issue's tolerances. Float weights: max |difference| <= 1e-3 x max |logit| at every position.
// Quantized weights (activations are quantized per row, so a different chunking can move a value across a rounding
// step): NMSE over all positions <= 1e-3, and the same top-1 token at >= 99% of the positions where the reference
// has a clear winner. The synthetic models have random output matrices and near-flat logits; a top-2 gap below
// k_clear_gap (about 5x the rms logit error these comparisons show) is a tie, not a decision.
constexpr float k_clear_gap = 0.1f;

void expect_close(const std::vector<float> &a, const std::vector<float> &b, int64_t n_vocab, bool quantized,
                  const char *what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    if (!quantized) {
        const float tol = 1e-3f * std::max(max_abs(a), 1e-6f);
        float worst = 0;
        for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, std::fabs(a[i] - b[i]));
        EXPECT_LE(worst, tol) << what;
        return;
    }
    const size_t rows = a.size() / size_t(n_vocab);
    size_t clear = 0, same_top1 = 0;
    double err = 0, ref = 0;
    for (size_t r = 0; r < rows; r++) {
        const float *x = a.data() + r * size_t(n_vocab), *y = b.data() + r * size_t(n_vocab);
        int64_t ax = 0, ay = 0;
        for (int64_t i = 0; i < n_vocab; i++) {
            err += double(x[i] - y[i]) * (x[i] - y[i]);
            ref += double(x[i]) * x[i];
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        float second = -INFINITY;
        for (int64_t i = 0; i < n_vocab; i++)
            if (i != ax) second = std::max(second, x[i]);
        if (x[ax] - second >= k_clear_gap) {
            clear++;
            same_top1 += ax == ay;
        }
    }
    EXPECT_LE(err / ref, 1e-3) << what;
    EXPECT_GE(clear, rows / 2) << what << ": too few positions with a clear top-1 to judge";
    EXPECT_GE(double(same_top1), 0.99 * double(clear)) << what;
}

}  // namespace

class EngineTest : public ::testing::TestWithParam<std::tuple<const char *, bool>> {
  protected:
    bool quantized() const { return std::get<1>(GetParam()); }
    void expect_close(const std::vector<float> &a, const std::vector<float> &b, const char *what) {
        ::expect_close(a, b, 512, quantized(), what);
    }
    std::unique_ptr<Engine> make(int64_t n_batch, int32_t n_seq = 2) {
        EngineConfig cfg;
        cfg.n_threads = 2;
        cfg.n_ctx = 256;
        cfg.n_batch = n_batch;
        cfg.n_seq_max = n_seq;
        cfg.kv_type = KvType::F32;
        const char *preset = std::get<0>(GetParam());
        if (quantized()) return make_cpu_engine(model_path(preset, DType::Q4_K, DType::Q8_0), cfg);
        return make_cpu_engine(model_path(preset, DType::F32, DType::F32), cfg);
    }
};

TEST_P(EngineTest, TokenByTokenEqualsPrefill) {
    const std::vector<int32_t> prompt = prompt_tokens(40, 1);
    auto a = make(512);
    std::vector<std::vector<float>> la;
    int32_t sa = a->new_sequence();
    a->decode({{sa, prompt, true}}, la);
    const int64_t V = a->n_vocab();
    // the logits vary across positions (the model is not degenerate)
    EXPECT_NE(la[0][0], la[0][size_t(V)]);

    auto b = make(512);
    int32_t sb = b->new_sequence();
    std::vector<float> lb;
    for (int32_t t : prompt) {
        std::vector<std::vector<float>> out;
        b->decode({{sb, {t}, false}}, out);
        lb.insert(lb.end(), out[0].begin(), out[0].end());
    }
    expect_close(la[0], lb, "prefill vs token by token");
    EXPECT_EQ(b->seq_len(sb), 40);
}

TEST_P(EngineTest, ChunkSizeDoesNotMatter) {
    const std::vector<int32_t> prompt = prompt_tokens(70, 2);
    std::vector<float> ref;
    for (int64_t nb : {512, 64, 17, 5, 1}) {
        auto e = make(nb);
        std::vector<std::vector<float>> l;
        e->decode({{e->new_sequence(), prompt, true}}, l);
        if (ref.empty())
            ref = l[0];
        else
            expect_close(ref, l[0], "chunked prefill");
    }
}

TEST_P(EngineTest, BatchedSequencesEqualEachAlone) {
    const std::vector<int32_t> p1 = prompt_tokens(23, 3), p2 = prompt_tokens(9, 4);
    auto e = make(512);
    std::vector<std::vector<float>> both, one, two;
    int32_t s1 = e->new_sequence(), s2 = e->new_sequence();
    e->decode({{s1, p1, true}, {s2, p2, true}}, both);
    // then one decode step for both together
    std::vector<std::vector<float>> step;
    e->decode({{s1, {42}, false}, {s2, {43}, false}}, step);

    auto a = make(512);
    int32_t x = a->new_sequence();
    a->decode({{x, p1, true}}, one);
    std::vector<std::vector<float>> step1;
    a->decode({{x, {42}, false}}, step1);
    auto b = make(512);
    int32_t y = b->new_sequence();
    b->decode({{y, p2, true}}, two);
    std::vector<std::vector<float>> step2;
    b->decode({{y, {43}, false}}, step2);

    // Every op works per token or per sequence, so batching is exact, not just close.
    EXPECT_EQ(both[0], one[0]);
    EXPECT_EQ(both[1], two[0]);
    EXPECT_EQ(step[0], step1[0]);
    EXPECT_EQ(step[1], step2[0]);
}

// decode_greedy's steps are decode_argmax's, one call after another: the ids take is given, in step order, the
// steps it returns (stopping where take says so, its sequences that many positions longer), and bad inputs refused
// with nothing changed.
TEST_P(EngineTest, GreedyDecodingIsArgmaxStepByStep) {
    const std::vector<int32_t> p1 = prompt_tokens(11, 5), p2 = prompt_tokens(6, 6);
    auto a = make(512, 3), b = make(512);
    const int32_t a1 = a->new_sequence(), a2 = a->new_sequence(), b1 = b->new_sequence(), b2 = b->new_sequence();
    std::vector<int32_t> first, ids;
    a->decode_argmax({{a1, p1, false}, {a2, p2, false}}, first);
    b->decode_argmax({{b1, p1, false}, {b2, p2, false}}, ids);
    std::vector<std::vector<int32_t>> got;
    const int64_t n = a->decode_greedy({{a1, {first[0]}, false}, {a2, {first[1]}, false}}, 7,
                                       [&](int64_t step, const std::vector<int32_t> &s) {
                                           EXPECT_EQ(step, int64_t(got.size()));
                                           got.push_back(s);
                                           return true;
                                       });
    EXPECT_EQ(n, 7);
    ASSERT_EQ(got.size(), 7u);
    for (int step = 0; step < 7; step++) {
        b->decode_argmax({{b1, {ids[0]}, false}, {b2, {ids[1]}, false}}, ids);
        EXPECT_EQ(got[size_t(step)], ids) << "step " << step;
    }
    EXPECT_EQ(a->seq_len(a1), b->seq_len(b1));
    EXPECT_EQ(a->seq_len(a2), b->seq_len(b2));
    // stopped by take at its third step: three positions longer, and on from there as step by step
    got.clear();
    EXPECT_EQ(a->decode_greedy({{a1, {ids[0]}, false}}, 50,
                               [&](int64_t, const std::vector<int32_t> &s) {
                                   got.push_back(s);
                                   return got.size() < 3;
                               }),
              3);
    for (int step = 0; step < 3; step++) {
        b->decode_argmax({{b1, {ids[0]}, false}}, ids);
        EXPECT_EQ(got[size_t(step)], ids) << "stopped run, step " << step;
    }
    EXPECT_EQ(a->seq_len(a1), b->seq_len(b1));
    std::vector<int32_t> more;
    a->decode_argmax({{a1, {ids[0]}, false}}, more);
    b->decode_argmax({{b1, {ids[0]}, false}}, ids);
    EXPECT_EQ(more, ids);
    // refused: two tokens, every position's logits, a token outside the vocabulary, one sequence twice
    const int64_t len = a->seq_len(a1);
    auto none = [](int64_t, const std::vector<int32_t> &) { return true; };
    EXPECT_THROW(a->decode_greedy({{a1, {1, 2}, false}}, 3, none), Error);
    EXPECT_THROW(a->decode_greedy({{a1, {1}, true}}, 3, none), Error);
    EXPECT_THROW(a->decode_greedy({{a1, {int32_t(a->n_vocab())}, false}}, 3, none), Error);
    EXPECT_THROW(a->decode_greedy({{a1, {1}, false}, {a1, {2}, false}}, 3, none), Error);
    const int32_t gone = a->new_sequence();
    a->drop(gone);
    EXPECT_THROW(a->decode_greedy({{gone, {1}, false}}, 3, none), Error);
    EXPECT_EQ(a->seq_len(a1), len);
    EXPECT_EQ(a->decode_greedy({{a1, {1}, false}}, 0, none), 0);
    EXPECT_EQ(a->seq_len(a1), len);
}

// Greedy decoding through decode_argmax picks what the arg-max of decode()'s logits picks, step after step, for two
// sequences in one call (the second starting from another prompt), and leaves the sequences where decode() does.
TEST_P(EngineTest, ArgmaxDecodingIsTheArgmaxOfTheLogits) {
    const std::vector<int32_t> p1 = prompt_tokens(11, 5), p2 = prompt_tokens(6, 6);
    auto a = make(512), b = make(512);
    const int32_t a1 = a->new_sequence(), a2 = a->new_sequence(), b1 = b->new_sequence(), b2 = b->new_sequence();
    std::vector<std::vector<float>> logits;
    a->decode({{a1, p1, false}, {a2, p2, false}}, logits);
    std::vector<int32_t> ids;
    b->decode_argmax({{b1, p1, false}, {b2, p2, false}}, ids);
    const int64_t V = a->n_vocab();
    for (int step = 0; step < 6; step++) {
        ASSERT_EQ(ids.size(), 2u);
        const int32_t want1 = argmax(logits[0].data(), V), want2 = argmax(logits[1].data(), V);
        EXPECT_EQ(ids[0], want1) << "step " << step;
        EXPECT_EQ(ids[1], want2) << "step " << step;
        a->decode({{a1, {want1}, false}, {a2, {want2}, false}}, logits);
        b->decode_argmax({{b1, {ids[0]}, false}, {b2, {ids[1]}, false}}, ids);
    }
    EXPECT_EQ(b->seq_len(b1), a->seq_len(a1));
    EXPECT_EQ(b->seq_len(b2), a->seq_len(a2));
    // every position's logits is decode()'s alone
    EXPECT_THROW(b->decode_argmax({{b1, {1, 2}, true}}, ids), Error);
    EXPECT_EQ(b->seq_len(b1), a->seq_len(a1));
}

TEST_P(EngineTest, ForkContinuesFromThePrefix) {
    const std::vector<int32_t> prefix = prompt_tokens(12, 5), tail = prompt_tokens(30, 6);
    auto e = make(512, 3);
    std::vector<std::vector<float>> l;
    int32_t s = e->new_sequence();
    e->decode({{s, prefix, false}}, l);
    int32_t f = e->fork(s);
    EXPECT_EQ(e->seq_len(f), 12);
    std::vector<std::vector<float>> lf, ls;
    e->decode({{f, tail, true}}, lf);
    e->decode({{s, {1}, false}}, ls);  // the original goes its own way

    auto ref = make(512);
    std::vector<int32_t> whole = prefix;
    whole.insert(whole.end(), tail.begin(), tail.end());
    std::vector<std::vector<float>> lr;
    ref->decode({{ref->new_sequence(), whole, true}}, lr);
    std::vector<float> tail_ref(lr[0].end() - int64_t(tail.size()) * ref->n_vocab(), lr[0].end());
    expect_close(tail_ref, lf[0], "fork vs one sequence");
}

TEST_P(EngineTest, BadInputChangesNothing) {
    auto e = make(512);
    int32_t s = e->new_sequence();
    std::vector<std::vector<float>> l;
    e->decode({{s, {1, 2, 3}, false}}, l);
    EXPECT_THROW(e->decode({{s, {4, int32_t(e->n_vocab())}, false}}, l), Error);
    EXPECT_THROW(e->decode({{s, std::vector<int32_t>(300, 1), false}}, l), Error);
    EXPECT_THROW(e->decode({{9, {1}, false}}, l), Error);
    EXPECT_THROW(e->decode({{s, {}, false}}, l), Error);
    EXPECT_EQ(e->seq_len(s), 3);
    e->new_sequence();
    EXPECT_THROW(e->new_sequence(), Error);  // two slots, both taken
    e->drop(s);
    EXPECT_NO_THROW(e->new_sequence());
}

INSTANTIATE_TEST_SUITE_P(Tiny, EngineTest,
                         ::testing::Combine(::testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35moe"),
                                            ::testing::Bool()),
                         [](const auto &info) {
                             std::string n = std::get<0>(info.param);
                             for (char &c : n)
                                 if (c == '-') c = '_';
                             return n + (std::get<1>(info.param) ? "_q4k" : "_f32");
                         });
