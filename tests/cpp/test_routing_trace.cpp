// The routing-trace file: what the engine writes matches docs/routing-trace.md (header, one record per pass and MoE
// layer, ids in range and distinct per token, the weights the router gave), and observing the routing changes no
// logit.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.h"
#include "core/fp16.h"
#include "runtime/engine.h"
#include "runtime/routing_trace.h"
#include "synth/synth.h"
#include "synth_cache.h"

using namespace strata;

namespace {

uint32_t u32_at(const std::vector<uint8_t> &b, size_t off) {
    return uint32_t(b[off]) | uint32_t(b[off + 1]) << 8 | uint32_t(b[off + 2]) << 16 | uint32_t(b[off + 3]) << 24;
}
uint16_t u16_at(const std::vector<uint8_t> &b, size_t off) {
    return uint16_t(b[off] | b[off + 1] << 8);
}

std::vector<float> run(Engine &e, RoutingObserver *obs) {
    e.set_routing_observer(obs);
    const int32_t s = e.new_sequence();
    std::vector<std::vector<float>> l;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 21; i++) prompt.push_back(int32_t((i * 31 + 2) % 250));
    e.decode({{s, prompt, true}}, l);  // passes of 8, 8 and 5 tokens
    std::vector<float> out = l[0];
    for (int i = 0; i < 3; i++) {
        e.decode({{s, {int32_t(7 + i)}, false}}, l);
        out.insert(out.end(), l[0].begin(), l[0].end());
    }
    e.drop(s);
    e.set_routing_observer(nullptr);
    return out;
}

}  // namespace

TEST(RoutingTrace, RecordsEveryPassAndLayerAndChangesNothing) {
    for (const char *preset : {"tiny-qwen3moe", "tiny-qwen3next"}) {
        SynthOptions so;
        so.preset = preset;
        const std::string model = test::cached_synth_model(std::string(preset) + "-trace", so);
        EngineConfig cfg;
        cfg.n_threads = 2;
        cfg.n_ctx = 64;
        cfg.n_batch = 8;
        auto eng = make_cpu_engine(model, cfg);
        const HParams &hp = eng->hparams();
        const std::string path = testing::TempDir() + "trace-" + std::to_string(::getpid()) + ".bin";
        const std::vector<float> plain = run(*eng, nullptr);
        RoutingTraceWriter w(path, hp.n_layer, hp.n_expert, hp.n_expert_used);
        const std::vector<float> traced = run(*eng, &w);
        w.close();
        ASSERT_EQ(plain.size(), traced.size());
        EXPECT_EQ(std::memcmp(plain.data(), traced.data(), plain.size() * 4), 0) << preset;

        std::ifstream in(path, std::ios::binary);
        const std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::remove(path.c_str());
        ASSERT_GE(b.size(), 32u);
        EXPECT_EQ(std::memcmp(b.data(), "STRTRACE", 8), 0);
        EXPECT_EQ(u32_at(b, 8), 1u);
        EXPECT_EQ(u32_at(b, 12), uint32_t(hp.n_layer));
        EXPECT_EQ(u32_at(b, 16), uint32_t(hp.n_expert));
        const uint32_t k = u32_at(b, 20);
        EXPECT_EQ(k, uint32_t(hp.n_expert_used));
        EXPECT_EQ(u32_at(b, 24), 1u);

        const std::vector<uint32_t> pass_tokens = {8, 8, 5, 1, 1, 1};
        int64_t moe_layers = 0;
        for (int64_t il = 0; il < hp.n_layer; il++) moe_layers += hp.n_expert > 0;
        size_t off = 32;
        int64_t records = 0;
        for (uint32_t p = 0; p < pass_tokens.size(); p++) {
            int64_t last = -1;
            for (int64_t l = 0; l < moe_layers; l++) {
                ASSERT_LE(off + 12, b.size()) << preset << " pass " << p;
                EXPECT_EQ(u32_at(b, off), p);
                const int64_t il = u32_at(b, off + 4);
                EXPECT_GT(il, last);
                last = il;
                const uint32_t n = u32_at(b, off + 8);
                EXPECT_EQ(n, pass_tokens[p]);
                off += 12;
                for (uint32_t t = 0; t < n; t++) {
                    std::set<uint16_t> ids;
                    float prev = INFINITY;
                    for (uint32_t j = 0; j < k; j++) {
                        const uint16_t id = u16_at(b, off + 2 * (t * k + j));
                        EXPECT_LT(id, hp.n_expert);
                        ids.insert(id);
                        const float wt = f16_to_f32(u16_at(b, off + 2 * (n * k + t * k + j)));
                        EXPECT_GT(wt, 0.0f);
                        EXPECT_LE(wt, prev);  // the router's order: highest weight first
                        prev = wt;
                    }
                    EXPECT_EQ(ids.size(), k) << "distinct experts per token";
                }
                off += 4 * size_t(n) * k;
                records++;
            }
        }
        EXPECT_EQ(off, b.size()) << preset;
        EXPECT_EQ(records, w.records());
        EXPECT_EQ(w.passes(), 6);
    }
}

TEST(RoutingTrace, RefusesAFileItCannotCreate) {
    EXPECT_THROW(RoutingTraceWriter("/nonexistent-dir/trace.bin", 2, 8, 2), Error);
    EXPECT_THROW(RoutingTraceWriter(testing::TempDir() + "t.bin", 2, 70000, 2), Error);
}
