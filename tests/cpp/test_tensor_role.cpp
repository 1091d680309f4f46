// Tensor roles for the llama.cpp names of the MoE architectures we target (REFERENCE.md §3).
#include <gtest/gtest.h>

#include "format/gguf.h"
#include "gguf_samples.h"
#include "model/tensor_role.h"

using namespace strata;

namespace {

TensorRole role(std::string_view name, const TensorRoleContext &ctx = {}) {
    return classify_tensor(name, ctx).role;
}

}  // namespace

TEST(TensorRole, GlobalTensors) {
    EXPECT_EQ(role("token_embd.weight"), TensorRole::Embedding);
    EXPECT_EQ(role("output.weight"), TensorRole::Output);
    EXPECT_EQ(role("output_norm.weight"), TensorRole::Norm);
    EXPECT_EQ(role("rope_freqs.weight"), TensorRole::Other);
    EXPECT_EQ(classify_tensor("output.weight").layer, -1);
}

TEST(TensorRole, Qwen3MoeBlock) {
    const char *attention[] = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"};
    for (const char *a : attention) EXPECT_EQ(role(std::string("blk.7.") + a + ".weight"), TensorRole::Attention) << a;
    EXPECT_EQ(role("blk.7.attn_qkv.weight"), TensorRole::Attention);  // no ssm_* in the layer: fused attention
    EXPECT_EQ(role("blk.7.attn_norm.weight"), TensorRole::Norm);
    EXPECT_EQ(role("blk.7.ffn_norm.weight"), TensorRole::Norm);
    EXPECT_EQ(role("blk.7.ffn_gate_inp.weight"), TensorRole::Router);
    EXPECT_EQ(role("blk.7.ffn_gate_exps.weight"), TensorRole::RoutedExpert);
    EXPECT_EQ(role("blk.7.ffn_up_exps.weight"), TensorRole::RoutedExpert);
    EXPECT_EQ(role("blk.7.ffn_down_exps.weight"), TensorRole::RoutedExpert);
    EXPECT_EQ(role("blk.7.ffn_gate_up_exps.weight"), TensorRole::RoutedExpert);
    EXPECT_EQ(classify_tensor("blk.47.ffn_down_exps.weight").layer, 47);
}

TEST(TensorRole, Qwen3NextGdnAndSharedExperts) {
    TensorRoleContext ctx;
    ctx.ssm_layers = {true, true, true, false};
    for (const char *g :
         {"ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_ba.weight", "ssm_norm.weight", "ssm_out.weight",
          "ssm_beta.weight", "ssm_alpha.weight", "ssm_in.weight", "attn_gate.weight", "attn_qkv.weight"})
        EXPECT_EQ(role(std::string("blk.0.") + g, ctx), TensorRole::Gdn) << g;
    EXPECT_EQ(role("blk.3.attn_qkv.weight", ctx), TensorRole::Attention);
    EXPECT_EQ(role("blk.3.attn_q.weight", ctx), TensorRole::Attention);
    EXPECT_EQ(role("blk.0.post_attention_norm.weight", ctx), TensorRole::Norm);
    EXPECT_EQ(role("blk.0.ffn_gate_shexp.weight"), TensorRole::SharedExpert);
    EXPECT_EQ(role("blk.0.ffn_up_shexp.weight"), TensorRole::SharedExpert);
    EXPECT_EQ(role("blk.0.ffn_down_shexp.weight"), TensorRole::SharedExpert);
    EXPECT_EQ(role("blk.0.ffn_gate_inp_shexp.weight"), TensorRole::SharedExpert);  // not the router
}

TEST(TensorRole, DeepSeekGlmAndGptOss) {
    for (const char *a : {"attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_k_b",
                          "attn_v_b", "attn_kv_b", "attn_sinks"})
        EXPECT_EQ(role(std::string("blk.5.") + a + ".weight"), TensorRole::Attention) << a;
    EXPECT_EQ(role("blk.5.attn_q.bias"), TensorRole::Attention);
    EXPECT_EQ(role("blk.5.exp_probs_b.bias"), TensorRole::Router);
    EXPECT_EQ(role("blk.5.ffn_gate_inp.bias"), TensorRole::Router);
    EXPECT_EQ(role("blk.5.ffn_gate_exps.bias"), TensorRole::RoutedExpert);
    EXPECT_EQ(role("blk.0.ffn_gate.weight"), TensorRole::DenseFfn);  // leading dense blocks
    EXPECT_EQ(role("blk.0.ffn_up.weight"), TensorRole::DenseFfn);
    EXPECT_EQ(role("blk.0.ffn_down.weight"), TensorRole::DenseFfn);
    EXPECT_EQ(role("blk.5.something_new.weight"), TensorRole::Other);
}

TEST(TensorRole, MtpBlocksPastTheTrunk) {
    TensorRoleContext ctx;
    ctx.n_trunk_layers = 40;
    EXPECT_EQ(role("blk.39.ffn_down_exps.weight", ctx), TensorRole::RoutedExpert);
    EXPECT_EQ(role("blk.40.ffn_down_exps.weight", ctx), TensorRole::Mtp);
    EXPECT_EQ(role("blk.40.attn_q.weight", ctx), TensorRole::Mtp);
    EXPECT_EQ(role("blk.40.nextn.eh_proj.weight", ctx), TensorRole::Mtp);
    EXPECT_EQ(role("blk.12.nextn.enorm.weight"), TensorRole::Mtp);  // nextn.* is MTP even without the context
}

TEST(TensorRole, LayerParsing) {
    std::string_view rest;
    EXPECT_EQ(tensor_layer("blk.12.attn_q.weight", &rest), 12);
    EXPECT_EQ(rest, "attn_q.weight");
    EXPECT_EQ(tensor_layer("blk.x.attn_q.weight"), -1);
    EXPECT_EQ(tensor_layer("blk.12"), -1);
    EXPECT_EQ(tensor_layer("blk..a"), -1);
    EXPECT_EQ(tensor_layer("blk.99999999999.a"), -1);
    EXPECT_EQ(tensor_layer("token_embd.weight", &rest), -1);
    EXPECT_EQ(rest, "token_embd.weight");
}

TEST(TensorRole, ContextFromAFile) {
    GgufWriter w;
    w.add_string("general.architecture", "qwen35moe");
    w.add_u32("qwen35moe.block_count", 3);
    w.add_u32("qwen35moe.nextn_predict_layers", 1);
    strata::testing::add_sample_tensor(w, 0, "blk.1.ssm_a", DType::F32, {4});
    strata::testing::add_sample_tensor(w, 1, "blk.1.attn_qkv.weight", DType::F32, {4});
    strata::testing::add_sample_tensor(w, 2, "blk.0.attn_qkv.weight", DType::F32, {4});
    auto bytes = w.write_to_memory();
    auto f = GgufFile::from_memory(bytes.data(), bytes.size());
    TensorRoleContext ctx = tensor_role_context(*f);
    EXPECT_EQ(ctx.n_trunk_layers, 2);
    EXPECT_EQ(ctx.ssm_layers, (std::vector<bool>{false, true}));
    EXPECT_EQ(role("blk.1.attn_qkv.weight", ctx), TensorRole::Gdn);
    EXPECT_EQ(role("blk.0.attn_qkv.weight", ctx), TensorRole::Attention);
    EXPECT_EQ(role("blk.2.ffn_up_exps.weight", ctx), TensorRole::Mtp);
    EXPECT_STREQ(tensor_role_name(TensorRole::RoutedExpert), "routed_expert");
}
