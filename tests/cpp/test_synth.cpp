// Synthetic models: the tensor list against the file the writer produces, and the qwen3.5-397b-a17b preset against
// the released model's shapes and parameter counts (its file would be ~200 GB).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <unistd.h>

#include "core/error.h"
#include "format/gguf.h"
#include "model/synth.h"
#include "model/tensor_role.h"
#include "runtime/engine.h"

using namespace strata;

namespace {

std::string synth_path(const std::string &preset, float skew) {
    const std::string path = std::string(STRATA_BINARY_DIR) + "/test-models/synth-" + preset + "-skew" +
                             strfmt("%g", double(skew)) + ".gguf";
    if (!std::filesystem::exists(path)) {
        std::filesystem::create_directories(std::filesystem::path(path).parent_path());
        SynthOptions o;
        o.preset = preset;
        o.route_skew = skew;
        o.seed = 11;
        o.n_threads = 2;
        // Test processes run in parallel: each writes its own temporary; the rename makes the first complete file win.
        const std::string tmp = path + ".tmp" + std::to_string(::getpid());
        write_synthetic_model(o, tmp);
        std::filesystem::rename(tmp, path);
    }
    return path;
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
    EXPECT_NEAR(double(bytes_by_role["embedding"]) / gib, 1.01, 0.01);       // 248320 x 4096 at Q8_0
    EXPECT_GT(bytes_by_role["mtp"], 0u);
    uint64_t all = 0;
    for (const SynthTensor &t : ts) all += t.bytes;
    std::printf("qwen3.5-397b-a17b (Q4_K experts, Q8_0 rest): %zu tensors, %.1f GiB, %.1fB parameters without MTP, "
                "%.2fB active\n",
                ts.size(), double(all) / gib, total / 1e9, active / 1e9);
}
