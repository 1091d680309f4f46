// A model split over several participants (Engine's split, strata/split_plan.h): two or three CPU participants, each
// holding its own layers' weights and caches, give the one participant's logits bit for bit over prompts, decoding
// steps of two sequences, greedy picks, forks and cuts back to checkpoints; and the cost model's split of layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <sstream>

#include "backend/host_floats.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/part_pipeline.h"
#include "strata/split_plan.h"
#include "synth/synth.h"
#include "synth_cache.h"

using namespace strata;

namespace {

std::string model_path(const std::string &preset, bool quantized) {
    SynthOptions o;
    o.preset = preset;
    o.expert_type = quantized ? DType::Q4_K : DType::F32;
    o.dense_type = quantized ? DType::Q8_0 : DType::F32;
    o.seed = 7;
    return test::cached_synth_model(preset + "-" + dtype_name(o.expert_type) + "-" + dtype_name(o.dense_type), o);
}

std::vector<int32_t> prompt_tokens(int n, int salt) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; i++) t.push_back(int32_t((i * 37 + salt * 11 + 5) % 250));
    return t;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

EngineConfig base_config(int64_t n_batch) {
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.n_ctx = 256;
    cfg.n_batch = n_batch;
    cfg.n_seq_max = 3;
    cfg.kv_type = KvType::F16;
    cfg.device = Device::Cpu;
    return cfg;
}

// A CPU engine split at the given layer counts (empty: not split).
std::unique_ptr<Engine> make(const std::string &path, const std::vector<int64_t> &layers, int64_t n_batch = 512) {
    EngineConfig cfg = base_config(n_batch);
    for (int64_t n : layers) cfg.parts.push_back({Device::Cpu, 0, 0, n});
    return cfg.parts.empty() ? make_cpu_engine(path, cfg) : make_engine(path, cfg);
}

// Everything one engine gives over a fixed script of calls, as one vector of floats (ids as floats).
std::vector<float> script(Engine &e) {
    std::vector<float> got;
    auto keep = [&](const std::vector<std::vector<float>> &l) {
        for (const auto &v : l) got.insert(got.end(), v.begin(), v.end());
    };
    std::vector<std::vector<float>> l;
    const int32_t s1 = e.new_sequence(), s2 = e.new_sequence();
    e.decode({{s1, prompt_tokens(29, 1), true}, {s2, prompt_tokens(7, 2), true}}, l);
    keep(l);
    StateCheckpoint cp;
    if (e.can_rewind()) cp = e.checkpoint(s1);
    for (int step = 0; step < 4; step++) {
        e.decode({{s1, {int32_t(40 + step)}, false}, {s2, {int32_t(90 + step)}, false}}, l);
        keep(l);
    }
    const int32_t f = e.fork(s2);
    e.decode({{f, prompt_tokens(5, 3), true}}, l);
    keep(l);
    std::vector<int32_t> ids;
    e.decode_argmax({{s2, {7}, false}, {f, {8}, false}}, ids);
    for (int32_t id : ids) got.push_back(float(id));
    if (e.can_rewind()) {  // back to the checkpoint, then on another way
        e.rewind(s1, 29, &cp);
        e.decode({{s1, {3, 4, 5}, true}}, l);
        keep(l);
    }
    return got;
}

}  // namespace

class SplitTest : public ::testing::TestWithParam<std::tuple<const char *, bool>> {
  protected:
    std::string path() const { return model_path(std::get<0>(GetParam()), std::get<1>(GetParam())); }
};

// Every way of cutting the model in two, and a cut in three, gives the one participant's results bit for bit.
TEST_P(SplitTest, PartsGiveTheWholeModelsBits) {
    auto whole = make(path(), {});
    const int64_t n = whole->hparams().n_layer;
    ASSERT_GE(n, 2);
    const std::vector<float> ref = script(*whole);
    ASSERT_FALSE(ref.empty());
    std::vector<std::vector<int64_t>> splits;
    for (int64_t k = 1; k < n; k++) splits.push_back({k, n - k});
    if (n >= 3) splits.push_back({1, n - 2, 1});
    for (const auto &sp : splits) {
        auto e = make(path(), sp);
        ASSERT_EQ(e->n_parts(), sp.size());
        EXPECT_EQ(e->part_layers(0).second, sp[0]);
        std::ostringstream what;
        what << "split";
        for (int64_t k : sp) what << ' ' << k;
        EXPECT_TRUE(same_bits(script(*e), ref)) << what.str();
    }
}

// The chunk size still matters only as it does for the whole model: a split with 7-token passes gives what the
// whole model gives with 7-token passes, its passes run through the parts as a pipeline (part 1 on pass j while
// part 0 is on pass j + 1: runtime/part_pipeline.h) or one after the other (STRATA_SPLIT_PIPELINE=0), two sequences
// in one call, then the script's steps.
TEST_P(SplitTest, ChunkedPromptsAsTheWholeModels) {
    auto whole = make(path(), {}, 7);
    const int64_t n = whole->hparams().n_layer;
    std::vector<std::vector<float>> a, b;
    const int32_t w1 = whole->new_sequence(), w2 = whole->new_sequence();
    whole->decode({{w1, prompt_tokens(40, 4), true}, {w2, prompt_tokens(19, 5), false}}, a);
    whole->drop(w1), whole->drop(w2);
    const std::vector<float> rest = script(*whole);
    for (const char *pipe : {"1", "0"}) {
        ::setenv("STRATA_SPLIT_PIPELINE", pipe, 1);
        std::vector<std::vector<int64_t>> splits{{n / 2, n - n / 2}};
        if (n >= 3) splits.push_back({1, n - 2, 1});
        for (const auto &sp : splits) {
            auto e = make(path(), sp, 7);
            const int32_t s1 = e->new_sequence(), s2 = e->new_sequence();
            e->decode({{s1, prompt_tokens(40, 4), true}, {s2, prompt_tokens(19, 5), false}}, b);
            ASSERT_EQ(b.size(), 2u);
            EXPECT_TRUE(same_bits(a[0], b[0])) << "STRATA_SPLIT_PIPELINE=" << pipe << ", " << sp.size() << " parts";
            EXPECT_TRUE(same_bits(a[1], b[1])) << "STRATA_SPLIT_PIPELINE=" << pipe << ", " << sp.size() << " parts";
            EXPECT_EQ(e->seq_len(s1), 40);
            EXPECT_EQ(e->seq_len(s2), 19);
            e->drop(s1), e->drop(s2);
            EXPECT_TRUE(same_bits(script(*e), rest)) << "STRATA_SPLIT_PIPELINE=" << pipe;
        }
    }
    ::unsetenv("STRATA_SPLIT_PIPELINE");
}

// A call of one pass holding several sequences is cut between them into micro-passes, one a part, which run through
// the parts as a pipeline (STRATA_SPLIT_MICROBATCH, runtime/part_pipeline.h): three prompts of different lengths in
// one call, then decoding steps and greedy picks of the three together, give the whole model's bits with the cut on
// and off, for two and three parts.
TEST_P(SplitTest, MicroPassesGiveTheWholeModelsBits) {
    auto run = [](Engine &e) {
        std::vector<float> got;
        std::vector<std::vector<float>> l;
        const int32_t a = e.new_sequence(), b = e.new_sequence(), c = e.new_sequence();
        e.decode({{a, prompt_tokens(21, 6), true}, {b, prompt_tokens(4, 7), false}, {c, prompt_tokens(13, 8), true}},
                 l);
        for (const auto &v : l) got.insert(got.end(), v.begin(), v.end());
        for (int step = 0; step < 3; step++) {
            e.decode({{a, {int32_t(60 + step)}, false}, {b, {int32_t(70 + step)}, false},
                      {c, {int32_t(80 + step)}, false}},
                     l);
            for (const auto &v : l) got.insert(got.end(), v.begin(), v.end());
        }
        std::vector<int32_t> ids;
        for (int step = 0; step < 3; step++) {
            e.decode_argmax({{c, {int32_t(5 + step)}, false}, {a, {int32_t(9 + step)}, false}}, ids);
            for (int32_t id : ids) got.push_back(float(id));
        }
        EXPECT_EQ(e.seq_len(a), 27);
        EXPECT_EQ(e.seq_len(b), 7);
        EXPECT_EQ(e.seq_len(c), 19);
        return got;
    };
    auto whole = make(path(), {});
    const int64_t n = whole->hparams().n_layer;
    const std::vector<float> ref = run(*whole);
    for (const char *micro : {"1", "0"}) {
        ::setenv("STRATA_SPLIT_MICROBATCH", micro, 1);
        std::vector<std::vector<int64_t>> splits{{n / 2, n - n / 2}};
        if (n >= 3) splits.push_back({1, n - 2, 1});
        for (const auto &sp : splits) {
            auto e = make(path(), sp);
            EXPECT_TRUE(same_bits(run(*e), ref)) << "STRATA_SPLIT_MICROBATCH=" << micro << ", " << sp.size() << " parts";
            // one prompt call and six steps, each cut into min(sequences, parts) micro-passes
            const uint64_t want = micro[0] == '1' ? 4 * std::min<uint64_t>(3, sp.size()) + 3 * 2 : 0;
            EXPECT_EQ(e->micro_passes(), want) << "STRATA_SPLIT_MICROBATCH=" << micro << ", " << sp.size() << " parts";
        }
    }
    ::unsetenv("STRATA_SPLIT_MICROBATCH");
}

INSTANTIATE_TEST_SUITE_P(Tiny, SplitTest,
                         ::testing::Combine(::testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35moe"),
                                            ::testing::Bool()),
                         [](const auto &info) {
                             std::string n = std::get<0>(info.param);
                             for (char &c : n)
                                 if (c == '-') c = '_';
                             return n + (std::get<1>(info.param) ? "_q4k" : "_f32");
                         });

// The residual stream's host memory: a backend without page-locked memory gives ordinary memory; it grows only when
// asked for more, keeps its buffer when asked for less, and moves with its owner.
TEST(HostFloats, OrdinaryMemoryGrowsAndMoves) {
    std::unique_ptr<Backend> cpu = make_cpu_backend(1);
    HostFloats a;
    EXPECT_EQ(a.size(), 0u);
    a.resize(1000, *cpu);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(a.size(), 1000u);
    EXPECT_FALSE(a.page_locked());
    for (size_t i = 0; i < a.size(); i++) a.data()[i] = float(i);
    const float *p = a.data();
    a.resize(10, *cpu);  // smaller: the same buffer
    EXPECT_EQ(a.data(), p);
    EXPECT_EQ(a.size(), 10u);
    EXPECT_EQ(a.data()[9], 9.0f);
    HostFloats b(std::move(a));
    EXPECT_EQ(b.data(), p);
    EXPECT_EQ(b.size(), 10u);
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(a.size(), 0u);
    b.resize(5000, *cpu);  // larger: a new buffer of that size
    EXPECT_EQ(b.size(), 5000u);
    b.data()[4999] = 1.0f;
}

TEST(SplitConfig, BadSplitsAreRefusedByName) {
    const std::string p = model_path("tiny-qwen3moe", true);
    auto whole = make(p, {});
    const int64_t n = whole->hparams().n_layer;
    try {
        make(p, {1, n});
        FAIL() << "a split adding up to more layers than the model was taken";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("add up to"), std::string::npos) << e.what();
    }
    EXPECT_THROW(make(p, {n, 0}), Error);  // some parts given, one not
    EXPECT_THROW(make(p, {1}), Error);     // one participant runs every layer
    EXPECT_EQ(make(p, {n})->n_parts(), 1u);
    EngineConfig cfg = base_config(512);
    cfg.parts = {{Device::Cpu, 0, 0, 0}, {Device::Cpu, 0, 0, 0}};
    auto chosen = make_engine(p, cfg);  // the cost model's choice: CPU parts of equal rates share the layers evenly
    EXPECT_EQ(chosen->n_parts(), 2u);
    EXPECT_EQ(chosen->part_layers(0).second, n / 2);
}

// ---- the pipeline ----

// Each part's passes run in order on one thread; part p starts pass j only after part p - 1 finished it and after
// part p + 1 finished pass j - 2 (the residual buffer it writes); the last part's finished() comes in pass order.
TEST(PartPipeline, OrderAndBuffers) {
    for (size_t parts : {2u, 3u, 4u}) {
        const size_t n = 9;
        std::atomic<int> clock{0};
        std::vector<std::vector<int>> start(parts, std::vector<int>(n, -1)), end = start;
        std::vector<size_t> finished;
        PartPipeline pl;
        pl.run = [&](size_t p, size_t j) {
            start[p][j] = clock++;
            std::this_thread::sleep_for(std::chrono::microseconds(200 * (p + 1)));
            end[p][j] = clock++;
        };
        pl.finished = [&](size_t j) { finished.push_back(j); };
        EXPECT_EQ(run_part_pipeline(parts, n, pl), n);
        for (size_t p = 0; p < parts; p++)
            for (size_t j = 0; j < n; j++) {
                ASSERT_GE(start[p][j], 0);
                // its own passes in order; its input written; the buffer it writes read by the part after
                const int prev = j > 0 ? end[p][j - 1] : -1, input = p > 0 ? end[p - 1][j] : -1;
                const int buffer = p + 1 < parts && j >= 2 ? end[p + 1][j - 2] : -1;
                EXPECT_LT(std::max({prev, input, buffer}), start[p][j]) << "part " << p << " pass " << j;
            }
        ASSERT_EQ(finished.size(), n);
        for (size_t j = 0; j < n; j++) EXPECT_EQ(finished[j], j);
    }
}

// A part that throws stops the pipeline: the error reaches the caller, no part starts a pass after it, and the
// passes the last part finished are reported.
TEST(PartPipeline, AnErrorStopsEveryPart) {
    std::atomic<int> after{0};
    std::atomic<bool> thrown{false};
    PartPipeline pl;
    pl.run = [&](size_t p, size_t j) {
        if (thrown) after++;
        if (p == 1 && j == 3) {
            thrown = true;
            throw Error("part 1 failed on pass 3");
        }
    };
    size_t done = 99;
    try {
        run_part_pipeline(3, 10, pl, &done);
        FAIL() << "the error was lost";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("pass 3"), std::string::npos);
    }
    EXPECT_LE(done, 3u);
    EXPECT_LE(after.load(), 2);  // at most the passes other parts had already begun
}

// Micro-passes take whole segments, as many as asked where there are enough, the largest as small as it can be.
TEST(PartPipeline, MicroPassesAreBalancedCutsBetweenSequences) {
    using V = std::vector<size_t>;
    EXPECT_EQ(micro_pass_starts({1}, 2), V{0});
    EXPECT_EQ(micro_pass_starts({1, 1}, 1), V{0});
    EXPECT_EQ(micro_pass_starts({1, 1, 1, 1}, 2), (V{0, 2}));
    EXPECT_EQ(micro_pass_starts({1, 1, 1}, 2).size(), 2u);
    EXPECT_EQ(micro_pass_starts({1, 1}, 4), (V{0, 1}));
    EXPECT_EQ(micro_pass_starts({21, 4, 13}, 2), (V{0, 1}));  // 21 | 17
    EXPECT_EQ(micro_pass_starts({4, 13, 21}, 2), (V{0, 2}));  // 17 | 21
    EXPECT_EQ(micro_pass_starts({5, 5, 5, 5, 20}, 2), (V{0, 4}));
    EXPECT_EQ(micro_pass_starts({5, 5, 5, 5, 20}, 3), (V{0, 2, 4}));
    EXPECT_EQ(micro_pass_starts({1, 1, 1, 1, 1, 1, 1, 1}, 4), (V{0, 2, 4, 6}));
    // the largest micro-pass is the smallest any cut into that many gives (every cut tried)
    const std::vector<int64_t> t{7, 1, 9, 3, 3, 8, 2, 6, 4};
    for (size_t m = 1; m <= 4; m++) {
        const V got = micro_pass_starts(t, m);
        ASSERT_EQ(got.size(), m);
        auto largest = [&](const V &st) {
            int64_t worst = 0;
            for (size_t g = 0; g < st.size(); g++) {
                int64_t sum = 0;
                for (size_t i = st[g]; i < (g + 1 < st.size() ? st[g + 1] : t.size()); i++) sum += t[i];
                worst = std::max(worst, sum);
            }
            return worst;
        };
        int64_t best = INT64_MAX;
        for (uint32_t mask = 0; mask < (1u << (t.size() - 1)); mask++) {
            if (size_t(__builtin_popcount(mask)) != m - 1) continue;
            V st{0};
            for (size_t i = 1; i < t.size(); i++)
                if (mask >> (i - 1) & 1) st.push_back(i);
            best = std::min(best, largest(st));
        }
        EXPECT_EQ(largest(got), best) << m << " micro-passes";
    }
}

// ---- the cost model ----

namespace {
std::vector<SplitLayer> equal_layers(int n) {
    SplitLayer l;
    l.resident_bytes = 100e6, l.read_bytes = 90e6, l.expert_bytes = 1000e6, l.routed_bytes = 40e6;
    return std::vector<SplitLayer>(size_t(n), l);
}
SplitPart gpu(double gib) {
    SplitPart p;
    p.capacity_bytes = gib * 1073741824.0;
    p.fixed_bytes = 500e6;
    p.read_gbs = 2000, p.bus_gbs = 25;
    return p;
}
}  // namespace

TEST(SplitPlan, EqualPartsShareEqualLayersEvenly) {
    EXPECT_EQ(split_layers(equal_layers(48), {gpu(12), gpu(12)}), (std::vector<int64_t>{0, 24, 48}));
    EXPECT_EQ(split_layers(equal_layers(48), {gpu(12), gpu(12), gpu(12)}), (std::vector<int64_t>{0, 16, 32, 48}));
}

// A part with less memory caches less of its layers' experts, so its misses cost more: it gets fewer layers, and
// the split's slowest part is faster than the even split's.
TEST(SplitPlan, TheSmallerPartGetsFewerLayers) {
    const auto layers = equal_layers(48);
    const std::vector<SplitPart> parts{gpu(12), gpu(8)};
    const std::vector<int64_t> b = split_layers(layers, parts);
    ASSERT_EQ(b.size(), 3u);
    EXPECT_GT(b[1], 24);
    auto slowest = [&](int64_t k) {
        return std::max(split_part_seconds(layers, parts[0], 0, k), split_part_seconds(layers, parts[1], k, 48));
    };
    EXPECT_LT(slowest(b[1]), slowest(24));
    for (int64_t k = 1; k < 48; k++)
        if (split_part_seconds(layers, parts[0], 0, k) >= 0 && split_part_seconds(layers, parts[1], k, 48) >= 0) {
            EXPECT_LE(slowest(b[1]), slowest(k)) << k;
        }
}

// A slower bus (a part that misses at a lower rate) also moves layers away from it.
TEST(SplitPlan, RatesMoveTheSplit) {
    SplitPart slow = gpu(10), fast = gpu(10);
    slow.bus_gbs = 8;
    const std::vector<int64_t> b = split_layers(equal_layers(48), {slow, fast});
    EXPECT_LT(b[1], 24);
}

TEST(SplitPlan, WhatDoesNotFitIsRefused) {
    try {
        split_layers(equal_layers(48), {gpu(1), gpu(1)});
        FAIL() << "48 layers of 100 MB taken by two 1 GiB parts";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("do not fit"), std::string::npos) << e.what();
    }
    EXPECT_THROW(split_layers(equal_layers(2), {gpu(12), gpu(12), gpu(12)}), Error);  // a part with no layer
    // the CPU holds what it is given: a small GPU and the host
    SplitPart host;
    host.device_memory = false;
    host.read_gbs = 100;
    const std::vector<int64_t> b = split_layers(equal_layers(48), {gpu(2), host});
    EXPECT_GT(b[1], 0);
    EXPECT_GE(split_part_seconds(equal_layers(48), gpu(2), 0, b[1]), 0.0);
}
