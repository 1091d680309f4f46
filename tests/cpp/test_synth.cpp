// Synthetic models: the tensor list against the file the writer produces, the qwen3.5-397b-a17b preset against the
// released model's shapes and parameter counts (its file would be ~200 GB), and --route-skew measured by running the
// CPU engine and counting which experts the routers choose.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "format/gguf.h"
#include "synth/route_skew.h"
#include "synth/synth.h"
#include "model/tensor_role.h"
#include "runtime/engine.h"
#include "synth_cache.h"

using namespace strata;

namespace {

std::string synth_path(const std::string &preset, float skew) {
    SynthOptions o;
    o.preset = preset;
    o.route_skew = skew;
    o.seed = 11;
    o.n_threads = 2;
    return test::cached_synth_model("synth-" + preset + "-skew" + strfmt("%g", double(skew)), o);
}

const SynthTensor &find(const std::vector<SynthTensor> &ts, const std::string &name) {
    for (const SynthTensor &t : ts)
        if (t.name == name) return t;
    ADD_FAILURE() << "no tensor " << name;
    static const SynthTensor none{};
    return none;
}

int64_t n_elements(const SynthTensor &t) {
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    return n;
}

}  // namespace

TEST(SynthTensors, ListIsWhatTheWriterWrites) {
    for (const char *preset : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
        const std::string path = synth_path(preset, 0.0f);
        SynthOptions o;
        o.preset = preset;
        const std::vector<SynthTensor> list = synth_tensors(synth_hparams(preset), o);
        std::unique_ptr<GgufFile> f = GgufFile::open(path);
        ASSERT_EQ(list.size(), f->tensors().size()) << preset;
        for (size_t i = 0; i < list.size(); i++) {
            const GgufTensor &t = f->tensors()[i];
            EXPECT_EQ(list[i].name, t.name);
            EXPECT_EQ(list[i].ne, std::vector<int64_t>(t.ne, t.ne + t.n_dims)) << list[i].name;
            EXPECT_EQ(list[i].type, t.type) << list[i].name;
            EXPECT_EQ(list[i].bytes, t.n_bytes) << list[i].name;
        }
    }
}

// Qwen/Qwen3.5-397B-A17B: hidden 4096, 60 layers (every 4th full attention), 32/2 heads of 256, GDN 16 k / 64 v
// heads of 128, 512 experts top-10 of 1024, shared expert 1024, vocab 248320, one MTP block.
TEST(SynthPreset, Qwen35_397B_Hyperparameters) {
    const HParams hp = synth_hparams("qwen3.5-397b-a17b");
    EXPECT_EQ(hp.arch, Arch::QWEN35MOE);
    EXPECT_EQ(hp.n_embd, 4096);
    EXPECT_EQ(hp.n_layer, 60);
    EXPECT_EQ(hp.n_nextn, 1);
    EXPECT_EQ(hp.n_layer_all, 61);
    EXPECT_EQ(hp.n_head, 32);
    EXPECT_EQ(hp.n_head_kv, 2);
    EXPECT_EQ(hp.head_dim_k, 256);
    EXPECT_EQ(hp.n_rot, 64);  // partial_rotary_factor 0.25
    EXPECT_EQ(hp.rope_sections[0], 11);
    EXPECT_EQ(hp.rope_sections[1], 11);
    EXPECT_EQ(hp.rope_sections[2], 10);
    EXPECT_FLOAT_EQ(hp.rope_theta, 1e7f);
    EXPECT_EQ(hp.n_expert, 512);
    EXPECT_EQ(hp.n_expert_used, 10);
    EXPECT_EQ(hp.n_ff_exp, 1024);
    EXPECT_EQ(hp.n_ff_shexp, 1024);
    EXPECT_EQ(hp.n_vocab, 248320);
    EXPECT_EQ(hp.n_ctx_train, 262144);
    EXPECT_EQ(hp.ssm_conv_kernel, 4);
    EXPECT_EQ(hp.ssm_n_group, 16);
    EXPECT_EQ(hp.ssm_dt_rank, 64);
    EXPECT_EQ(hp.ssm_d_state, 128);
    EXPECT_EQ(hp.gdn_head_v_dim(), 128);
    int n_attention = 0;
    for (int64_t il = 0; il < hp.n_layer; il++) n_attention += !hp.is_recurrent(il);
    EXPECT_EQ(n_attention, 15);
    EXPECT_FALSE(hp.is_recurrent(3));
    EXPECT_TRUE(hp.is_recurrent(4));
}

TEST(SynthPreset, Qwen35_397B_Tensors) {
    SynthOptions o;  // Q4_K experts, Q8_0 the rest
    const HParams hp = synth_hparams("qwen3.5-397b-a17b");
    const std::vector<SynthTensor> ts = synth_tensors(hp, o);
    using ne = std::vector<int64_t>;
    EXPECT_EQ(find(ts, "token_embd.weight").ne, (ne{4096, 248320}));
    EXPECT_EQ(find(ts, "output.weight").ne, (ne{4096, 248320}));
    // GDN layer: qkv = 2 x 16 x 128 + 64 x 128 channels, z and the output over 64 x 128
    EXPECT_EQ(find(ts, "blk.0.attn_qkv.weight").ne, (ne{4096, 12288}));
    EXPECT_EQ(find(ts, "blk.0.attn_gate.weight").ne, (ne{4096, 8192}));
    EXPECT_EQ(find(ts, "blk.0.ssm_beta.weight").ne, (ne{4096, 64}));
    EXPECT_EQ(find(ts, "blk.0.ssm_alpha.weight").ne, (ne{4096, 64}));
    EXPECT_EQ(find(ts, "blk.0.ssm_conv1d.weight").ne, (ne{4, 12288}));
    EXPECT_EQ(find(ts, "blk.0.ssm_out.weight").ne, (ne{8192, 4096}));
    EXPECT_EQ(find(ts, "blk.0.ssm_norm.weight").ne, (ne{128}));
    // attention layer: q carries the output gate (2 x 32 x 256)
    EXPECT_EQ(find(ts, "blk.3.attn_q.weight").ne, (ne{4096, 16384}));
    EXPECT_EQ(find(ts, "blk.3.attn_k.weight").ne, (ne{4096, 512}));
    EXPECT_EQ(find(ts, "blk.3.attn_output.weight").ne, (ne{8192, 4096}));
    EXPECT_EQ(find(ts, "blk.59.ffn_gate_inp.weight").ne, (ne{4096, 512}));
    EXPECT_EQ(find(ts, "blk.59.ffn_gate_exps.weight").ne, (ne{4096, 1024, 512}));
    EXPECT_EQ(find(ts, "blk.59.ffn_down_exps.weight").ne, (ne{1024, 4096, 512}));
    EXPECT_EQ(find(ts, "blk.59.ffn_down_shexp.weight").ne, (ne{1024, 4096}));
    EXPECT_EQ(find(ts, "blk.60.nextn.eh_proj.weight").ne, (ne{8192, 4096}));
    EXPECT_EQ(find(ts, "blk.59.ffn_gate_exps.weight").type, DType::Q4_K);
    EXPECT_EQ(find(ts, "blk.0.attn_qkv.weight").type, DType::Q8_0);

    // Parameter counts: 397B in all (the name), 17B active per token (10 of 512 experts), MTP block aside.
    TensorRoleContext ctx;
    ctx.n_trunk_layers = int(hp.n_layer);
    double total = 0, experts = 0;
    std::map<std::string, uint64_t> bytes_by_role;
    for (const SynthTensor &t : ts) {
        const TensorClass c = classify_tensor(t.name, ctx);
        bytes_by_role[tensor_role_name(c.role)] += t.bytes;
        if (c.role == TensorRole::Mtp) continue;
        total += double(n_elements(t));
        if (c.role == TensorRole::RoutedExpert) experts += double(n_elements(t));
    }
    const double active = total - experts + experts * 10.0 / 512.0;
    EXPECT_NEAR(total / 1e9, 396.3, 1.0);
    EXPECT_NEAR(active / 1e9, 17.3, 0.5);
    // What `strata inspect` totals by role for this file: experts dominate; the rest fits a GPU.
    const double gib = double(uint64_t(1) << 30);
    EXPECT_NEAR(double(bytes_by_role["routed_expert"]) / gib, 202.5, 0.5);  // 60 x 3 x 512 x 4096 x 1024 at 4.5 bits
    EXPECT_NEAR(double(bytes_by_role["embedding"]) / gib, 1.01, 0.01);      // 248320 x 4096 at Q8_0
    EXPECT_GT(bytes_by_role["mtp"], 0u);
    uint64_t all = 0;
    for (const SynthTensor &t : ts) all += t.bytes;
    std::printf(
        "qwen3.5-397b-a17b (Q4_K experts, Q8_0 rest): %zu tensors, %.1f GiB, %.1fB parameters without MTP, "
        "%.2fB active\n",
        ts.size(), double(all) / gib, total / 1e9, active / 1e9);
}

// ---- route skew ------------------------------------------------------------------------------------------------

TEST(RouteSkew, SelectionRatesAreCappedZipf) {
    const std::vector<double> r0 = zipf_selection_rates(8, 2, 0.0);
    for (double x : r0) EXPECT_DOUBLE_EQ(x, 0.25);
    const std::vector<double> r = zipf_selection_rates(8, 2, 1.2);
    double sum = 0;
    for (double x : r) sum += x;
    EXPECT_NEAR(sum, 2.0, 1e-9);
    EXPECT_NEAR(r[0] / r[1], std::pow(2.0, 1.2), 1e-6);
    const std::vector<double> capped = zipf_selection_rates(128, 8, 1.2);  // rank 1 would need more than every token
    EXPECT_DOUBLE_EQ(capped[0], 1.0);
    EXPECT_LT(capped[5], 1.0);
}

namespace {

// Per layer, how many times each expert was among a token's n_expert_used highest router logits (ties to the lower
// id, as the engine routes), over one prefill of n_tokens seeded random ids, on the CPU engine.
std::vector<std::vector<int64_t>> routing_counts(const std::string &path, int64_t n_tokens) {
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.n_ctx = n_tokens;
    cfg.n_batch = 128;
    cfg.kv_type = KvType::F32;
    std::unique_ptr<Engine> eng = make_cpu_engine(path, cfg);
    const HParams &hp = eng->hparams();
    std::vector<std::vector<int64_t>> counts(size_t(hp.n_layer), std::vector<int64_t>(size_t(hp.n_expert), 0));
    Tracer tracer;
    tracer.want = [](const std::string &name) {
        return name.size() > 15 && name.compare(name.size() - 15, 15, ".ffn_moe_logits") == 0;
    };
    tracer.sink = [&](const std::string &name, int64_t rows, int64_t cols, const float *data) {
        const int il = tensor_layer(name);
        ASSERT_GE(il, 0);
        ASSERT_EQ(cols, hp.n_expert);
        std::vector<int64_t> order(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; r++) {
            const float *lg = data + r * cols;
            for (int64_t e = 0; e < cols; e++) order[size_t(e)] = e;
            std::partial_sort(order.begin(), order.begin() + hp.n_expert_used, order.end(),
                              [&](int64_t a, int64_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
            for (int64_t k = 0; k < hp.n_expert_used; k++) counts[size_t(il)][size_t(order[size_t(k)])]++;
        }
    };
    eng->set_tracer(&tracer);
    std::vector<int32_t> ids;
    uint64_t x = 12345;
    for (int64_t i = 0; i < n_tokens; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids.push_back(int32_t((x >> 33) % uint64_t(hp.n_vocab)));
    }
    std::vector<std::vector<float>> logits;
    eng->decode({{eng->new_sequence(), ids, false}}, logits);
    return counts;
}

// Share of all selections taken by the most chosen tenth of the experts (at least one), over that tenth's uniform
// share: 1 for perfectly even routing.
double top_tenth_concentration(std::vector<int64_t> counts) {
    std::sort(counts.rbegin(), counts.rend());
    const size_t top = std::max<size_t>(1, (counts.size() + 9) / 10);
    double top_sum = 0, sum = 0;
    for (size_t i = 0; i < counts.size(); i++) (i < top ? top_sum : sum) += double(counts[i]);
    sum += top_sum;
    return (top_sum / sum) / (double(top) / double(counts.size()));
}

}  // namespace

// S = 1.2 must concentrate routing clearly (the most chosen tenth of the experts takes over twice its uniform
// share in every layer); S = 0 must not.
TEST(RouteSkew, ConcentratesRoutingOnTheCpuEngine) {
    for (const char *preset : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
        for (float skew : {0.0f, 1.2f}) {
            const std::vector<std::vector<int64_t>> counts = routing_counts(synth_path(preset, skew), 384);
            for (size_t il = 0; il < counts.size(); il++) {
                const double c = top_tenth_concentration(counts[il]);
                std::string row;
                std::vector<int64_t> sorted = counts[il];
                std::sort(sorted.rbegin(), sorted.rend());
                for (int64_t n : sorted) row += strfmt(" %lld", (long long)n);
                std::printf("%s S=%.1f layer %zu: top tenth takes %.2fx its uniform share; counts by rank:%s\n", preset,
                            double(skew), il, c, row.c_str());
                if (skew > 0)
                    EXPECT_GT(c, 2.0) << preset << " layer " << il;
                else
                    EXPECT_LT(c, 2.0) << preset << " layer " << il;
            }
        }
    }
}

// The skew is an edit of the router and embedding values only: the file's tensors and their shapes are unchanged.
TEST(RouteSkew, SameTensorsAsUnskewed) {
    std::unique_ptr<GgufFile> a = GgufFile::open(synth_path("tiny-qwen3moe", 0.0f));
    std::unique_ptr<GgufFile> b = GgufFile::open(synth_path("tiny-qwen3moe", 1.2f));
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    for (size_t i = 0; i < a->tensors().size(); i++) {
        EXPECT_EQ(a->tensors()[i].name, b->tensors()[i].name);
        EXPECT_EQ(a->tensors()[i].n_bytes, b->tensors()[i].n_bytes);
    }
    const GgufValue *name = b->find("general.name");
    ASSERT_NE(name, nullptr);
    EXPECT_EQ(std::string(name->str), "synthetic tiny-qwen3moe route-skew 1.2");
    SynthOptions bad;
    bad.route_skew = -0.5f;
    EXPECT_THROW(synth_tensors(synth_hparams("tiny-qwen3moe"), bad), Error);
}

// --mixed-down: the routed experts' down matrices of the Q4_K_M recipe's layers (the first and last eighth, every
// third between) take the given type, every other tensor what it would have taken.
TEST(SynthTensors, MixedDownTypeOnTheRecipesLayers) {
    const HParams hp = synth_hparams("qwen3-30b-a3b");
    SynthOptions plain, mixed;
    mixed.mixed_down_type = DType::Q6_K;
    const std::vector<SynthTensor> a = synth_tensors(hp, plain), b = synth_tensors(hp, mixed);
    ASSERT_EQ(a.size(), b.size());
    int64_t n_mixed = 0;
    for (size_t i = 0; i < a.size(); i++) {
        ASSERT_EQ(a[i].name, b[i].name);
        int il = -1;
        const bool down = std::sscanf(a[i].name.c_str(), "blk.%d.ffn_down_exps.weight", &il) == 1 &&
                          a[i].name.find("ffn_down_exps") != std::string::npos;
        if (down && mixed_down_layer(il, hp.n_layer_all)) {
            EXPECT_EQ(b[i].type, DType::Q6_K) << b[i].name;
            EXPECT_GT(b[i].bytes, a[i].bytes) << b[i].name;
            n_mixed++;
        } else {
            EXPECT_EQ(b[i].type, a[i].type) << b[i].name;
            EXPECT_EQ(b[i].bytes, a[i].bytes) << b[i].name;
        }
    }
    // 48 layers: 0-5 and 42-47, and every third of 6-41 from 8 (8, 11, ..., 41)
    EXPECT_EQ(n_mixed, 6 + 6 + 12);
    EXPECT_TRUE(mixed_down_layer(0, 48) && mixed_down_layer(8, 48) && mixed_down_layer(47, 48));
    EXPECT_FALSE(mixed_down_layer(6, 48) || mixed_down_layer(7, 48) || mixed_down_layer(40, 48));
}
