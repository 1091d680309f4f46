// Synthetic model files: presets, metadata, a built-in byte-level tokenizer, and seeded weights produced row by
// row in parallel while the file is written (files larger than memory are fine).
#include "synth/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "core/error.h"
#include "core/threads.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "format/quantize_file.h"
#include "synth/route_skew.h"

namespace strata {

namespace {

struct Preset {
    const char *name;
    HParams hp;
};

HParams base(Arch arch, const char *arch_name) {
    HParams hp;
    hp.arch = arch;
    hp.arch_name = arch_name;
    hp.rms_eps = 1e-6f;
    return hp;
}

HParams qwen3moe(int64_t embd, int64_t layers, int64_t heads, int64_t kv, int64_t hd, int64_t experts, int64_t used,
                 int64_t ff, int64_t vocab) {
    HParams hp = base(Arch::QWEN3MOE, "qwen3moe");
    hp.n_embd = embd;
    hp.n_layer = hp.n_layer_all = layers;
    hp.n_head = heads;
    hp.n_head_kv = kv;
    hp.head_dim_k = hp.head_dim_v = hd;
    hp.n_rot = hd;
    hp.rope_theta = 1e6f;
    hp.n_expert = experts;
    hp.n_expert_used = used;
    hp.n_ff_exp = ff;
    hp.n_vocab = vocab;
    hp.n_ctx_train = 40960;
    hp.recurrent.assign(size_t(layers), false);
    return hp;
}

HParams qwen3next(Arch arch, int64_t embd, int64_t layers, int64_t mtp, int64_t heads, int64_t kv, int64_t hd,
                  int64_t k_heads, int64_t v_heads, int64_t d_state, int64_t experts, int64_t used, int64_t ff,
                  int64_t ff_sh, int64_t vocab) {
    HParams hp = base(arch, arch == Arch::QWEN35MOE ? "qwen35moe" : "qwen3next");
    hp.n_embd = embd;
    hp.n_layer = layers;
    hp.n_nextn = mtp;
    hp.n_layer_all = layers + mtp;
    hp.n_head = heads;
    hp.n_head_kv = kv;
    hp.head_dim_k = hp.head_dim_v = hd;
    hp.n_rot = hd / 4;
    hp.attn_output_gate = true;
    hp.rope_theta = arch == Arch::QWEN35MOE ? 1e7f : 5e6f;
    if (arch == Arch::QWEN35MOE) {
        hp.rope_type = RopeType::IMROPE;
        hp.gdn_vhead_tiled = true;
        // sections cover n_rot/2 rotary pairs in the released 11:11:10 proportions
        int32_t half = int32_t(hp.n_rot / 2);
        hp.rope_sections[0] = (half * 11 + 16) / 32;
        hp.rope_sections[1] = (half * 11 + 16) / 32;
        hp.rope_sections[2] = half - hp.rope_sections[0] - hp.rope_sections[1];
    }
    hp.n_expert = experts;
    hp.n_expert_used = used;
    hp.n_ff_exp = ff;
    hp.n_ff_shexp = ff_sh;
    hp.n_vocab = vocab;
    hp.n_ctx_train = 262144;
    hp.ssm_conv_kernel = 4;
    hp.ssm_d_state = d_state;
    hp.ssm_n_group = k_heads;
    hp.ssm_dt_rank = v_heads;
    hp.ssm_d_inner = v_heads * d_state;
    hp.recurrent.resize(size_t(hp.n_layer_all));
    for (int64_t il = 0; il < hp.n_layer_all; il++) hp.recurrent[size_t(il)] = il < layers && (il + 1) % 4 != 0;
    return hp;
}

const std::vector<Preset> &presets() {
    static const std::vector<Preset> p = {
        {"tiny-qwen3moe", qwen3moe(256, 2, 4, 2, 64, 8, 2, 256, 512)},
        {"tiny-qwen3next", qwen3next(Arch::QWEN3NEXT, 256, 4, 0, 4, 2, 64, 2, 4, 64, 8, 2, 256, 256, 512)},
        {"tiny-qwen35moe", qwen3next(Arch::QWEN35MOE, 256, 4, 1, 4, 2, 64, 2, 4, 64, 8, 2, 256, 256, 512)},
        // experts large beside a pass's activations, as in released models, at a size tests can write: prompt
        // loans (placement.h) hold real passes on it
        {"small-qwen3next", qwen3next(Arch::QWEN3NEXT, 512, 4, 0, 4, 2, 64, 2, 4, 64, 128, 2, 1024, 256, 512)},
        {"qwen3-30b-a3b", qwen3moe(2048, 48, 32, 4, 128, 128, 8, 768, 151936)},
        {"qwen3-235b-a22b", qwen3moe(4096, 94, 64, 4, 128, 128, 8, 1536, 151936)},
        {"qwen3-next-80b-a3b",
         qwen3next(Arch::QWEN3NEXT, 2048, 48, 0, 16, 2, 256, 16, 32, 128, 512, 10, 512, 512, 151936)},
        {"qwen3.5-35b-a3b",
         qwen3next(Arch::QWEN35MOE, 2048, 40, 1, 16, 2, 256, 16, 32, 128, 256, 8, 512, 512, 248320)},
        // Qwen/Qwen3.5-397B-A17B, text_config of its config.json as restated by Megatron's Qwen3.5 MIMO config and
        // model tables in other engines (the Hugging Face file itself was not reachable here): hidden 4096, 60
        // layers (full_attention_interval 4), 32 q / 2 kv heads of 256, linear-attention 16 k / 64 v heads of 128,
        // conv 4, 512 experts top-10, moe_intermediate 1024, shared expert 1024, vocab 248320, rope theta 1e7 with
        // partial_rotary_factor 0.25, mrope_section [11, 11, 10]; one MTP block (mtp_num_hidden_layers 1, as in
        // every Qwen3.5 config). These shapes add up to 396B parameters without the MTP block and 17.3B active.
        {"qwen3.5-397b-a17b",
         qwen3next(Arch::QWEN35MOE, 4096, 60, 1, 32, 2, 256, 16, 64, 128, 512, 10, 1024, 1024, 248320)},
    };
    return p;
}

// ---- seeded values -------------------------------------------------------------------------------------------

inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t hash_name(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
    return h;
}

// Roughly normal (sum of four 16-bit uniforms), unit variance, from a counter.
inline float normal_at(uint64_t key, uint64_t i) {
    uint64_t h = mix64(key ^ mix64(i));
    float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

// How a tensor's values are drawn: mean + std * normal, optionally an exp-shaped range for decay parameters.
struct Dist {
    enum Kind { NORMAL, NEG_EXP } kind = NORMAL;
    float mean = 0, std = 1;
};

// A change to the first n_cols values of every row after they are drawn (route skew, below).
struct RowEdit {
    int64_t n_cols = 0;  // 0: none
    std::function<void(int64_t row, float *cols)> apply;
};

// One tensor as planned: name, shape, type (after falling back to F32 where the type cannot hold it), values.
struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;
    DType type;
    Dist dist;
    RowEdit edit;
};

struct TensorPlan {
    TensorSpec spec;
    uint64_t key;
    ThreadPool *pool;
};

float draw(const Dist &d, uint64_t key, uint64_t i) {
    const float z = normal_at(key, i);
    return d.kind == Dist::NEG_EXP ? -std::exp(d.mean + d.std * z) : d.mean + d.std * z;
}

// Large tensors are assembled from a pool of pre-quantized 256-element pieces picked by a hash of their position:
// quantizing every value of a 45 GB file would take far longer than writing it, and the pieces are still valid
// blocks with the intended scale. Small tensors are drawn value by value.
constexpr int64_t k_pool_pieces = 8192, k_piece = 256, k_pool_threshold = int64_t(1) << 24;

struct PiecePool {
    std::vector<uint8_t> bytes;
    size_t piece_bytes = 0;
};

PiecePool make_pool(const TensorPlan &t) {
    PiecePool p;
    p.piece_bytes = row_bytes(t.spec.type, k_piece);
    p.bytes.resize(p.piece_bytes * size_t(k_pool_pieces));
    t.pool->parallel_for(k_pool_pieces, 64, [&](int64_t i0, int64_t i1) {
        std::vector<float> v(static_cast<size_t>(k_piece));
        for (int64_t i = i0; i < i1; i++) {
            for (int64_t j = 0; j < k_piece; j++)
                v[size_t(j)] = draw(t.spec.dist, t.key ^ 0x5bd1e995u, uint64_t(i * k_piece + j));
            quantize_row(t.spec.type, v.data(), p.bytes.data() + size_t(i) * p.piece_bytes, k_piece);
        }
    });
    return p;
}

// A pooled row's edit: the pieces holding the edited columns are decoded, edited and encoded again.
void edit_pooled_row(const TensorPlan &t, size_t piece_bytes, int64_t row, uint8_t *out, std::vector<float> &buf) {
    const int64_t n = (t.spec.edit.n_cols + k_piece - 1) / k_piece * k_piece;
    buf.resize(static_cast<size_t>(n));
    for (int64_t p = 0; p < n / k_piece; p++)
        dequantize_row(t.spec.type, out + size_t(p) * piece_bytes, buf.data() + p * k_piece, k_piece);
    t.spec.edit.apply(row, buf.data());
    quantize_row(t.spec.type, buf.data(), out, n);
}

void fill_rows(const TensorPlan &t, const PiecePool *pool, int64_t row0, int64_t n_rows, uint8_t *dst) {
    const TensorSpec &s = t.spec;
    const int64_t ne0 = s.ne[0];
    const size_t rb = row_bytes(s.type, ne0);
    t.pool->parallel_for(n_rows, 4, [&](int64_t r0, int64_t r1) {
        std::vector<float> row(static_cast<size_t>(ne0)), edit_buf;
        for (int64_t r = r0; r < r1; r++) {
            uint8_t *out = dst + size_t(r) * rb;
            const int64_t gr = row0 + r;
            if (pool) {
                for (int64_t p = 0; p < ne0 / k_piece; p++) {
                    const uint64_t pick = mix64(t.key ^ mix64(uint64_t(gr * (ne0 / k_piece) + p))) % k_pool_pieces;
                    std::memcpy(out + size_t(p) * pool->piece_bytes, pool->bytes.data() + pick * pool->piece_bytes,
                                pool->piece_bytes);
                }
                if (s.edit.n_cols > 0) edit_pooled_row(t, pool->piece_bytes, gr, out, edit_buf);
                continue;
            }
            for (int64_t i = 0; i < ne0; i++) row[size_t(i)] = draw(s.dist, t.key, uint64_t(gr * ne0 + i));
            if (s.edit.n_cols > 0) s.edit.apply(gr, row.data());
            if (s.type == DType::F32) std::memcpy(out, row.data(), rb);
            else quantize_row(s.type, row.data(), out, ne0);
        }
    });
}

int64_t n_rows_of(const std::vector<int64_t> &ne) {
    int64_t rows = 1;
    for (size_t i = 1; i < ne.size(); i++) rows *= ne[i];
    return rows;
}

// ---- metadata -------------------------------------------------------------------------------------------------

void write_hparams(GgufWriter &w, const HParams &hp, const std::string &name) {
    const std::string a = hp.arch_name + ".";
    w.add_string("general.architecture", hp.arch_name);
    w.add_string("general.name", name);
    w.add_u32(a + "context_length", uint32_t(hp.n_ctx_train));
    w.add_u32(a + "embedding_length", uint32_t(hp.n_embd));
    w.add_u32(a + "block_count", uint32_t(hp.n_layer_all));
    w.add_u32(a + "attention.head_count", uint32_t(hp.n_head));
    w.add_u32(a + "attention.head_count_kv", uint32_t(hp.n_head_kv));
    w.add_u32(a + "attention.key_length", uint32_t(hp.head_dim_k));
    w.add_u32(a + "attention.value_length", uint32_t(hp.head_dim_v));
    w.add_f32(a + "attention.layer_norm_rms_epsilon", hp.rms_eps);
    w.add_f32(a + "rope.freq_base", hp.rope_theta);
    w.add_u32(a + "rope.dimension_count", uint32_t(hp.n_rot));
    w.add_u32(a + "expert_count", uint32_t(hp.n_expert));
    w.add_u32(a + "expert_used_count", uint32_t(hp.n_expert_used));
    w.add_u32(a + "expert_feed_forward_length", uint32_t(hp.n_ff_exp));
    if (hp.arch != Arch::QWEN3MOE) {
        w.add_u32(a + "expert_shared_feed_forward_length", uint32_t(hp.n_ff_shexp));
        w.add_u32(a + "ssm.conv_kernel", uint32_t(hp.ssm_conv_kernel));
        w.add_u32(a + "ssm.state_size", uint32_t(hp.ssm_d_state));
        w.add_u32(a + "ssm.group_count", uint32_t(hp.ssm_n_group));
        w.add_u32(a + "ssm.time_step_rank", uint32_t(hp.ssm_dt_rank));
        w.add_u32(a + "ssm.inner_size", uint32_t(hp.ssm_d_inner));
        w.add_u32(a + "full_attention_interval", 4);
    }
    if (hp.arch == Arch::QWEN35MOE) {
        w.add_array(a + "rope.dimension_sections", GgufType::I32, hp.rope_sections, 4);
        w.add_u32(a + "nextn_predict_layers", uint32_t(hp.n_nextn));
    }
}

// GPT-2 byte-to-unicode alphabet: printable bytes stand for themselves, the rest map to U+0100 upwards.
std::string byte_symbol(int b) {
    auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
    int cp = b;
    if (!printable(b)) {
        int n = 0;
        for (int c = 0; c < b; c++) n += !printable(c);
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) s += char(cp);
    else {
        s += char(0xc0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3f));
    }
    return s;
}

// A byte-level BPE vocabulary with no merges (every byte a token), the Qwen chat specials, and unused fillers
// up to n_vocab.
void write_builtin_tokenizer(GgufWriter &w, int64_t n_vocab) {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; b++) {
        tokens.push_back(byte_symbol(b));
        types.push_back(1);
    }
    const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (const char *s : specials) {
        tokens.push_back(s);
        types.push_back(3);
    }
    for (const char *s : {"<think>", "</think>", "<tool_call>", "</tool_call>"}) {
        tokens.push_back(s);
        types.push_back(4);
    }
    if (int64_t(tokens.size()) > n_vocab) fail("synth: vocabulary of %lld is too small for the built-in tokenizer", (long long)n_vocab);
    while (int64_t(tokens.size()) < n_vocab) {
        tokens.push_back(strfmt("<|unused_%zu|>", tokens.size()));
        types.push_back(5);
    }
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_array("tokenizer.ggml.token_type", GgufType::I32, types.data(), types.size());
    w.add_string_array("tokenizer.ggml.merges", {});
    w.add_u32("tokenizer.ggml.eos_token_id", 258);      // <|im_end|>
    w.add_u32("tokenizer.ggml.padding_token_id", 256);  // <|endoftext|>
    w.add_u32("tokenizer.ggml.bos_token_id", 256);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
}

// ---- the tensor list ------------------------------------------------------------------------------------------

// Route skew (SynthOptions::route_skew) needs a per-expert offset on the router logits, and Qwen routers have no
// bias. It gets one through the residual stream: every token embedding carries the constant c = skew_value(n_embd)
// on channel k_skew_channel, which the blocks only perturb (they add noise and some drift to it), so after RMS norm
// the router input holds about c / rms on that channel for every token. Router column k_skew_channel then holds
// offset / c: the logit of expert e gains offset[rank of e] relative to the rest of the logit, which a random router
// makes roughly standard normal (its scale is divided by the same rms). The other channels of the residual grow
// with depth and c does not, so the offsets weigh less in later layers: in 40- and 48-layer test configurations at
// S = 1.2 the intended top tenth of the experts took 4.4-4.6x its uniform share in the first layer (5.1x intended)
// and 1.3-2.2x in the last ones. Which experts are popular is shuffled per layer.
constexpr int64_t k_skew_channel = 0;

// About a fifth of the embedding's energy: large enough to dominate what the blocks add, small enough to leave the
// other channels' normalisation nearly as it was.
float skew_value(int64_t n_embd) { return 0.5f * std::sqrt(float(n_embd)); }

// Experts by popularity for layer il: order[r] is the expert of rank r (a seeded Fisher-Yates shuffle).
std::vector<int64_t> popularity_order(int64_t n_expert, uint64_t seed, int64_t il) {
    std::vector<int64_t> order(static_cast<size_t>(n_expert));
    for (int64_t e = 0; e < n_expert; e++) order[size_t(e)] = e;
    const uint64_t key = mix64(seed ^ 0x726f757465ull) ^ mix64(uint64_t(il));
    for (int64_t i = n_expert - 1; i > 0; i--)
        std::swap(order[size_t(i)], order[size_t(mix64(key ^ uint64_t(i)) % uint64_t(i + 1))]);
    return order;
}

RowEdit skew_embedding_edit(const HParams &hp) {
    const float c = skew_value(hp.n_embd);
    return {k_skew_channel + 1, [c](int64_t, float *cols) { cols[k_skew_channel] = c; }};
}

// Router rows are experts: row e's skew column is the offset of e's popularity rank in this layer, over c.
RowEdit skew_router_edit(const HParams &hp, uint64_t seed, int64_t il,
                         std::shared_ptr<const std::vector<float>> offsets) {
    const std::vector<int64_t> order = popularity_order(hp.n_expert, seed, il);
    std::vector<float> column(static_cast<size_t>(hp.n_expert));
    for (size_t r = 0; r < order.size(); r++) column[size_t(order[r])] = (*offsets)[r] / skew_value(hp.n_embd);
    return {k_skew_channel + 1, [column](int64_t e, float *cols) { cols[k_skew_channel] = column[size_t(e)]; }};
}

// Every tensor of the file, in file order, with how its values are drawn.
std::vector<TensorSpec> plan_tensors(const HParams &hp, const SynthOptions &opt) {
    if (!std::isfinite(opt.route_skew) || opt.route_skew < 0)
        fail("route skew must be a number >= 0 (got %g)", double(opt.route_skew));
    std::vector<TensorSpec> specs;
    auto add = [&](std::string name, std::vector<int64_t> ne, DType type, Dist d) -> TensorSpec & {
        if (ne.size() == 1 || ne[0] % dtype_info(type).block_size != 0 || !can_quantize(type)) type = DType::F32;
        specs.push_back({std::move(name), std::move(ne), type, d, {}});
        return specs.back();
    };
    auto mat = [&](int64_t ne0) { return Dist{Dist::NORMAL, 0.0f, 1.0f / std::sqrt(float(ne0))}; };
    const Dist norm{Dist::NORMAL, 1.0f, 0.05f};
    const DType dt = opt.dense_type, et = opt.expert_type;
    const int64_t E = hp.n_embd, hd = hp.head_dim_k;
    const bool skew = opt.route_skew > 0;
    std::shared_ptr<const std::vector<float>> offsets;
    if (skew)
        offsets = std::make_shared<const std::vector<float>>(
            zipf_router_offsets(hp.n_expert, hp.n_expert_used, opt.route_skew));

    TensorSpec &embd = add("token_embd.weight", {E, hp.n_vocab}, dt, Dist{Dist::NORMAL, 0.0f, 1.0f});
    if (skew) embd.edit = skew_embedding_edit(hp);
    add("output_norm.weight", {E}, DType::F32, norm);
    add("output.weight", {E, hp.n_vocab}, dt, mat(E));
    for (int64_t il = 0; il < hp.n_layer_all; il++) {
        auto n = [&](const char *s) { return strfmt("blk.%lld.%s", (long long)il, s); };
        add(n("attn_norm.weight"), {E}, DType::F32, norm);
        add(n(hp.arch == Arch::QWEN3MOE ? "ffn_norm.weight" : "post_attention_norm.weight"), {E}, DType::F32, norm);
        if (hp.is_recurrent(il)) {
            const int64_t nv = hp.ssm_dt_rank;
            add(n("attn_qkv.weight"), {E, hp.gdn_conv_dim()}, dt, mat(E));
            add(n("attn_gate.weight"), {E, hp.ssm_d_inner}, dt, mat(E));
            if (hp.arch == Arch::QWEN35MOE) {
                add(n("ssm_beta.weight"), {E, nv}, dt, mat(E));
                add(n("ssm_alpha.weight"), {E, nv}, dt, mat(E));
            } else {
                add(n("ssm_ba.weight"), {E, 2 * nv}, dt, mat(E));
            }
            add(n("ssm_conv1d.weight"), {hp.ssm_conv_kernel, hp.gdn_conv_dim()}, DType::F32, mat(hp.ssm_conv_kernel));
            add(n("ssm_dt.bias"), {nv}, DType::F32, Dist{Dist::NORMAL, 0.0f, 0.5f});
            add(n("ssm_a"), {nv}, DType::F32, Dist{Dist::NEG_EXP, 1.0f, 0.5f});
            add(n("ssm_norm.weight"), {hp.gdn_head_v_dim()}, DType::F32, norm);
            add(n("ssm_out.weight"), {hp.ssm_d_inner, E}, dt, mat(hp.ssm_d_inner));
        } else {
            const int64_t q_rows = hp.n_head * hd * (hp.attn_output_gate ? 2 : 1);
            add(n("attn_q.weight"), {E, q_rows}, dt, mat(E));
            add(n("attn_k.weight"), {E, hp.n_head_kv * hd}, dt, mat(E));
            add(n("attn_v.weight"), {E, hp.n_head_kv * hd}, dt, mat(E));
            add(n("attn_output.weight"), {hp.n_head * hd, E}, dt, mat(hp.n_head * hd));
            add(n("attn_q_norm.weight"), {hd}, DType::F32, norm);
            add(n("attn_k_norm.weight"), {hd}, DType::F32, norm);
        }
        TensorSpec &router = add(n("ffn_gate_inp.weight"), {E, hp.n_expert}, DType::F32, mat(E));
        if (skew) router.edit = skew_router_edit(hp, opt.seed, il, offsets);
        add(n("ffn_gate_exps.weight"), {E, hp.n_ff_exp, hp.n_expert}, et, mat(E));
        add(n("ffn_up_exps.weight"), {E, hp.n_ff_exp, hp.n_expert}, et, mat(E));
        const DType down = opt.mixed_down_type && mixed_down_layer(il, hp.n_layer_all) ? *opt.mixed_down_type : et;
        add(n("ffn_down_exps.weight"), {hp.n_ff_exp, E, hp.n_expert}, down, mat(hp.n_ff_exp));
        if (hp.n_ff_shexp > 0) {
            add(n("ffn_gate_inp_shexp.weight"), {E}, DType::F32, mat(E));
            add(n("ffn_gate_shexp.weight"), {E, hp.n_ff_shexp}, dt, mat(E));
            add(n("ffn_up_shexp.weight"), {E, hp.n_ff_shexp}, dt, mat(E));
            add(n("ffn_down_shexp.weight"), {hp.n_ff_shexp, E}, dt, mat(hp.n_ff_shexp));
        }
        if (il >= hp.n_layer) {
            add(n("nextn.eh_proj.weight"), {2 * E, E}, dt, mat(2 * E));
            add(n("nextn.enorm.weight"), {E}, DType::F32, norm);
            add(n("nextn.hnorm.weight"), {E}, DType::F32, norm);
            add(n("nextn.shared_head_norm.weight"), {E}, DType::F32, norm);
        }
    }
    return specs;
}

}  // namespace

bool mixed_down_layer(int64_t il, int64_t n) {
    return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

std::vector<std::string> synth_presets() {
    std::vector<std::string> out;
    for (const Preset &p : presets()) out.push_back(p.name);
    return out;
}

HParams synth_hparams(const std::string &preset) {
    for (const Preset &p : presets())
        if (preset == p.name) return p.hp;
    std::string all;
    for (const std::string &n : synth_presets()) all += (all.empty() ? "" : ", ") + n;
    fail("unknown preset '%s' (presets: %s)", preset.c_str(), all.c_str());
}

std::vector<SynthTensor> synth_tensors(const HParams &hp, const SynthOptions &opt) {
    std::vector<SynthTensor> out;
    for (const TensorSpec &t : plan_tensors(hp, opt))
        out.push_back({t.name, t.ne, t.type, row_bytes(t.type, t.ne[0]) * uint64_t(n_rows_of(t.ne))});
    return out;
}

SynthReport write_synthetic_model(const SynthOptions &opt, const std::string &path) {
    HParams hp = synth_hparams(opt.preset);
    std::unique_ptr<GgufFile> vocab;
    if (!opt.vocab_file.empty()) {
        vocab = GgufFile::open(opt.vocab_file);
        const GgufValue *toks = vocab->find("tokenizer.ggml.tokens");
        if (!toks) fail("%s: no tokenizer.ggml.tokens to copy", opt.vocab_file.c_str());
        hp.n_vocab = int64_t(toks->count);
    }
    std::vector<TensorSpec> specs = plan_tensors(hp, opt);
    ThreadPool pool(opt.n_threads);
    GgufWriter w;
    std::string name = "synthetic " + opt.preset;
    if (opt.route_skew > 0) name += strfmt(" route-skew %g", double(opt.route_skew));
    write_hparams(w, hp, name);
    w.add_u32("general.file_type", 15);
    if (vocab) {
        for (const GgufKV &kv : vocab->kvs())
            if (kv.key.substr(0, 10) == "tokenizer.") gguf_copy_kv(w, kv);
    } else {
        write_builtin_tokenizer(w, hp.n_vocab);
    }

    std::vector<std::unique_ptr<TensorPlan>> plans;
    SynthReport rep;
    for (TensorSpec &spec : specs) {
        const uint64_t key = mix64(opt.seed) ^ hash_name(spec.name);
        auto t = std::make_unique<TensorPlan>(TensorPlan{std::move(spec), key, &pool});
        const TensorPlan *tp = t.get();
        const TensorSpec &s = tp->spec;
        rep.bytes += row_bytes(s.type, s.ne[0]) * uint64_t(n_rows_of(s.ne));
        rep.n_tensors++;
        auto pool_holder = std::make_shared<std::unique_ptr<PiecePool>>();
        const bool pooled = s.ne[0] * n_rows_of(s.ne) >= k_pool_threshold && s.ne[0] % k_piece == 0;
        w.add_tensor_streamed(s.name, s.type, s.ne, [tp, pooled, pool_holder](uint64_t offset, uint8_t *dst, size_t n) {
            if (pooled && !*pool_holder) *pool_holder = std::make_unique<PiecePool>(make_pool(*tp));
            const size_t rb = row_bytes(tp->spec.type, tp->spec.ne[0]);
            STRATA_ASSERT(offset % rb == 0 && n % rb == 0);
            fill_rows(*tp, pooled ? pool_holder->get() : nullptr, int64_t(offset / rb), int64_t(n / rb), dst);
            if (pooled && offset + n == rb * size_t(n_rows_of(tp->spec.ne))) pool_holder->reset();  // tensor done
        });
        plans.push_back(std::move(t));
    }
    w.write(path);
    return rep;
}

}  // namespace strata
