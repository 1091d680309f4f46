// Reading hyperparameters from GGUF metadata, with the defaults llama.cpp applies where a key is optional.
#include "model/hparams.h"

#include <algorithm>

#include "core/error.h"
#include "format/gguf.h"

namespace strata {

const char *supported_architectures() { return "qwen3moe, qwen3next, qwen35moe"; }

bool HParams::has_recurrent() const { return std::find(recurrent.begin(), recurrent.end(), true) != recurrent.end(); }

namespace {

struct KeyReader {
    const GgufFile &f;
    std::string prefix;  // "qwen3moe."

    std::string full(const char *key) const { return prefix + key; }

    int64_t get_int(const char *key) const {
        std::string k = full(key);
        const GgufValue *v = f.find(k);
        if (!v) fail("%s: missing required metadata key '%s'", f.path().c_str(), k.c_str());
        if (v->type == GgufType::ARRAY) return uniform_array_int(k, *v);
        return v->as_int(k);
    }
    int64_t get_int(const char *key, int64_t def) const { return f.find(full(key)) ? get_int(key) : def; }

    double get_float(const char *key) const {
        std::string k = full(key);
        const GgufValue *v = f.find(k);
        if (!v) fail("%s: missing required metadata key '%s'", f.path().c_str(), k.c_str());
        return v->as_float(k);
    }
    double get_float(const char *key, double def) const { return f.find(full(key)) ? get_float(key) : def; }

    bool get_bool(const char *key, bool def) const {
        std::string k = full(key);
        const GgufValue *v = f.find(k);
        return v ? v->as_bool(k) : def;
    }

    // llama.cpp accepts per-layer arrays for some counts (head_count_kv); we run models where they are uniform.
    int64_t uniform_array_int(const std::string &k, const GgufValue &v) const {
        std::vector<int64_t> a = v.as_int_array(k);
        if (a.empty()) fail("%s: metadata key '%s' is an empty array", f.path().c_str(), k.c_str());
        for (int64_t x : a)
            if (x != a[0])
                fail("%s: metadata key '%s' varies per layer; only uniform values are supported", f.path().c_str(),
                     k.c_str());
        return a[0];
    }
};

void require_positive(const GgufFile &f, const std::string &key, int64_t v) {
    if (v <= 0) fail("%s: metadata key '%s' must be positive, found %lld", f.path().c_str(), key.c_str(), (long long)v);
}

}  // namespace

HParams read_hparams(const GgufFile &f) {
    HParams hp;
    hp.arch_name = std::string(f.architecture());
    if (hp.arch_name.empty()) fail("%s: missing metadata key 'general.architecture'", f.path().c_str());
    if (hp.arch_name == "qwen3moe") hp.arch = Arch::QWEN3MOE;
    else if (hp.arch_name == "qwen3next") hp.arch = Arch::QWEN3NEXT;
    else if (hp.arch_name == "qwen35moe") hp.arch = Arch::QWEN35MOE;
    else
        fail("%s: architecture '%s' is not supported (supported: %s)", f.path().c_str(), hp.arch_name.c_str(),
             supported_architectures());

    KeyReader k{f, hp.arch_name + "."};
    hp.n_embd = k.get_int("embedding_length");
    hp.n_layer_all = k.get_int("block_count");
    hp.n_ctx_train = k.get_int("context_length");
    hp.n_head = k.get_int("attention.head_count");
    hp.n_head_kv = k.get_int("attention.head_count_kv", hp.n_head);
    require_positive(f, k.full("embedding_length"), hp.n_embd);
    require_positive(f, k.full("block_count"), hp.n_layer_all);
    require_positive(f, k.full("attention.head_count"), hp.n_head);
    require_positive(f, k.full("attention.head_count_kv"), hp.n_head_kv);
    if (hp.n_head % hp.n_head_kv != 0)
        fail("%s: attention.head_count (%lld) is not a multiple of attention.head_count_kv (%lld)", f.path().c_str(),
             (long long)hp.n_head, (long long)hp.n_head_kv);
    hp.head_dim_k = k.get_int("attention.key_length", hp.n_embd / hp.n_head);
    hp.head_dim_v = k.get_int("attention.value_length", hp.head_dim_k);
    require_positive(f, k.full("attention.key_length"), hp.head_dim_k);
    if (hp.head_dim_v != hp.head_dim_k)
        fail("%s: attention.value_length (%lld) differs from attention.key_length (%lld); not supported",
             f.path().c_str(), (long long)hp.head_dim_v, (long long)hp.head_dim_k);
    hp.rms_eps = float(k.get_float("attention.layer_norm_rms_epsilon"));
    hp.rope_theta = float(k.get_float("rope.freq_base", 10000.0));
    hp.n_rot = k.get_int("rope.dimension_count", hp.head_dim_k);
    if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim_k || hp.n_rot % 2 != 0)
        fail("%s: rope.dimension_count (%lld) must be even and within the head size (%lld)", f.path().c_str(),
             (long long)hp.n_rot, (long long)hp.head_dim_k);

    hp.n_expert = k.get_int("expert_count");
    hp.n_expert_used = k.get_int("expert_used_count");
    require_positive(f, k.full("expert_count"), hp.n_expert);
    require_positive(f, k.full("expert_used_count"), hp.n_expert_used);
    if (hp.n_expert_used > hp.n_expert)
        fail("%s: expert_used_count (%lld) exceeds expert_count (%lld)", f.path().c_str(),
             (long long)hp.n_expert_used, (long long)hp.n_expert);
    hp.n_ff_exp = k.get_int("expert_feed_forward_length");
    require_positive(f, k.full("expert_feed_forward_length"), hp.n_ff_exp);
    hp.expert_weights_norm = k.get_bool("expert_weights_norm", true);
    hp.expert_weights_scale = float(k.get_float("expert_weights_scale", 0.0));
    int64_t gating = k.get_int("expert_gating_func", 1);
    if (gating != 1)
        fail("%s: %sexpert_gating_func = %lld: only softmax gating (1) is supported for %s", f.path().c_str(),
             k.prefix.c_str(), (long long)gating, hp.arch_name.c_str());

    if (hp.arch == Arch::QWEN3MOE) {
        hp.n_layer = hp.n_layer_all;
        hp.recurrent.assign(size_t(hp.n_layer_all), false);
    } else {
        hp.attn_output_gate = true;
        hp.n_ff_shexp = k.get_int("expert_shared_feed_forward_length");
        require_positive(f, k.full("expert_shared_feed_forward_length"), hp.n_ff_shexp);
        hp.ssm_conv_kernel = k.get_int("ssm.conv_kernel");
        hp.ssm_d_state = k.get_int("ssm.state_size");
        hp.ssm_n_group = k.get_int("ssm.group_count");
        hp.ssm_dt_rank = k.get_int("ssm.time_step_rank");
        hp.ssm_d_inner = k.get_int("ssm.inner_size");
        for (const char *key : {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
                                "ssm.inner_size"})
            require_positive(f, k.full(key), k.get_int(key));
        if (hp.ssm_dt_rank % hp.ssm_n_group != 0)
            fail("%s: ssm.time_step_rank (%lld v-heads) is not a multiple of ssm.group_count (%lld k-heads)",
                 f.path().c_str(), (long long)hp.ssm_dt_rank, (long long)hp.ssm_n_group);
        if (hp.ssm_d_inner % hp.ssm_dt_rank != 0)
            fail("%s: ssm.inner_size (%lld) is not a multiple of ssm.time_step_rank (%lld)", f.path().c_str(),
                 (long long)hp.ssm_d_inner, (long long)hp.ssm_dt_rank);
        hp.n_nextn = k.get_int("nextn_predict_layers", 0);
        if (hp.n_nextn < 0 || hp.n_nextn >= hp.n_layer_all)
            fail("%s: nextn_predict_layers (%lld) must be below block_count (%lld)", f.path().c_str(),
                 (long long)hp.n_nextn, (long long)hp.n_layer_all);
        hp.n_layer = hp.n_layer_all - hp.n_nextn;
        int64_t interval = k.get_int("full_attention_interval", 4);
        require_positive(f, k.full("full_attention_interval"), interval);
        hp.recurrent.resize(size_t(hp.n_layer_all));
        for (int64_t il = 0; il < hp.n_layer_all; il++)
            hp.recurrent[size_t(il)] = il < hp.n_layer && (il + 1) % interval != 0;
        if (hp.arch == Arch::QWEN35MOE) {
            hp.rope_type = RopeType::IMROPE;
            hp.gdn_vhead_tiled = true;
            std::string key = k.full("rope.dimension_sections");
            const GgufValue *v = f.find(key);
            if (!v) fail("%s: missing required metadata key '%s'", f.path().c_str(), key.c_str());
            std::vector<int64_t> s = v->as_int_array(key);
            if (s.size() > 4 || s.empty())
                fail("%s: '%s' must hold 1 to 4 values, found %zu", f.path().c_str(), key.c_str(), s.size());
            int64_t sum = 0;
            for (size_t i = 0; i < s.size(); i++) {
                hp.rope_sections[i] = int32_t(s[i]);
                sum += s[i];
            }
            if (sum * 2 != hp.n_rot)
                fail("%s: '%s' sums to %lld but rope.dimension_count/2 is %lld", f.path().c_str(), key.c_str(),
                     (long long)sum, (long long)(hp.n_rot / 2));
        }
    }

    const GgufValue *vocab = f.find(k.full("vocab_size"));
    if (vocab) hp.n_vocab = vocab->as_int(k.full("vocab_size"));
    else if (const GgufValue *toks = f.find("tokenizer.ggml.tokens"))
        hp.n_vocab = int64_t(toks->count);
    else if (const GgufTensor *t = f.find_tensor("token_embd.weight"))
        hp.n_vocab = t->ne[1];
    require_positive(f, k.full("vocab_size"), hp.n_vocab);
    return hp;
}

std::string HParams::describe() const {
    std::string s = strfmt("arch %s: n_embd %lld, layers %lld", arch_name.c_str(), (long long)n_embd,
                           (long long)n_layer);
    if (n_nextn) s += strfmt(" (+%lld MTP)", (long long)n_nextn);
    s += strfmt(", vocab %lld, ctx_train %lld\n", (long long)n_vocab, (long long)n_ctx_train);
    s += strfmt("attention: heads %lld/%lld kv, head_dim %lld, rope %s theta %g on %lld dims, rms_eps %g%s\n",
                (long long)n_head, (long long)n_head_kv, (long long)head_dim_k,
                rope_type == RopeType::IMROPE ? "imrope" : "neox", double(rope_theta), (long long)n_rot,
                double(rms_eps), attn_output_gate ? ", output gate" : "");
    s += strfmt("moe: %lld experts, %lld used, ff %lld", (long long)n_expert, (long long)n_expert_used,
                (long long)n_ff_exp);
    if (n_ff_shexp) s += strfmt(", shared expert ff %lld", (long long)n_ff_shexp);
    s += "\n";
    if (has_recurrent()) {
        int64_t n_recr = 0;
        for (int64_t il = 0; il < n_layer; il++) n_recr += is_recurrent(il);
        s += strfmt("gated deltanet: %lld of %lld layers, k-heads %lld x %lld, v-heads %lld x %lld, conv %lld\n",
                    (long long)n_recr, (long long)n_layer, (long long)ssm_n_group, (long long)ssm_d_state,
                    (long long)ssm_dt_rank, (long long)gdn_head_v_dim(), (long long)ssm_conv_kernel);
    }
    return s;
}

}  // namespace strata
