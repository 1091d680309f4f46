// Engine behaviour on synthetic tiny models of each architecture: token-by-token decoding equals one prefill,
// the prefill chunk size does not matter, sequences batched together give what each gives alone, forks
// continue from their prefix, and bad inputs are refused without changing any sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/synth.h"
#include "runtime/engine.h"

using namespace strata;

namespace {

std::string model_path(const std::string &preset, DType et, DType dt) {
    std::string path = std::string(STRATA_BINARY_DIR) + "/test-models/" + preset + "-" + dtype_name(et) + "-" +
                       dtype_name(dt) + ".gguf";
    if (!std::filesystem::exists(path)) {
        std::filesystem::create_directories(std::filesystem::path(path).parent_path());
        SynthOptions o;
        o.preset = preset;
        o.expert_type = et;
        o.dense_type = dt;
        o.seed = 7;
        write_synthetic_model(o, path + ".tmp");
        std::filesystem::rename(path + ".tmp", path);
    }
    return path;
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

void expect_close(const std::vector<float> &a, const std::vector<float> &b, float rel, const char *what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    const float tol = rel * std::max(max_abs(a), 1e-6f);
    float worst = 0;
    for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, std::fabs(a[i] - b[i]));
    EXPECT_LE(worst, tol) << what;
}

}  // namespace

class EngineTest : public ::testing::TestWithParam<const char *> {
protected:
    std::unique_ptr<Engine> make(int64_t n_batch, int32_t n_seq = 2) {
        EngineConfig cfg;
        cfg.n_threads = 2;
        cfg.n_ctx = 256;
        cfg.n_batch = n_batch;
        cfg.n_seq_max = n_seq;
        cfg.kv_type = KvType::F32;
        return make_cpu_engine(model_path(GetParam(), DType::Q4_K, DType::Q8_0), cfg);
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
    expect_close(la[0], lb, 1e-4f, "prefill vs token by token");
    EXPECT_EQ(b->seq_len(sb), 40);
}

TEST_P(EngineTest, ChunkSizeDoesNotMatter) {
    const std::vector<int32_t> prompt = prompt_tokens(70, 2);
    std::vector<float> ref;
    for (int64_t nb : {512, 64, 17, 5, 1}) {
        auto e = make(nb);
        std::vector<std::vector<float>> l;
        e->decode({{e->new_sequence(), prompt, true}}, l);
        if (ref.empty()) ref = l[0];
        else expect_close(ref, l[0], 1e-4f, "chunked prefill");
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

TEST_P(EngineTest, ForkContinuesFromThePrefix) {
    const std::vector<int32_t> prefix = prompt_tokens(12, 5), tail = prompt_tokens(6, 6);
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
    expect_close(tail_ref, lf[0], 1e-4f, "fork vs one sequence");
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

INSTANTIATE_TEST_SUITE_P(Tiny, EngineTest, ::testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35moe"));
