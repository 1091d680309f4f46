// read_vocab_spec / Tokenizer::from_gguf: the tokenizer.ggml.* keys of a model file as a VocabSpec. Only which
// keys exist and what type they hold is checked here; what the values mean is checked by Tokenizer::init.
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

#include "core/error.h"

namespace strata {

namespace {

int32_t read_id(const GgufFile &f, const char *key) {
    const GgufValue *v = f.find(key);
    if (!v) return -1;
    const int64_t id = v->as_int(key);
    // Some converters write -1 (or its u32 image) for "no such token".
    if (id == -1 || id == int64_t(UINT32_MAX)) return -1;
    if (id < 0 || id > INT32_MAX) fail("%s = %lld is not a token id", key, (long long)id);
    return int32_t(id);
}

std::optional<bool> read_flag(const GgufFile &f, const char *key) {
    const GgufValue *v = f.find(key);
    if (!v) return std::nullopt;
    return v->as_bool(key);
}

std::vector<std::string> read_strings(const GgufFile &f, const char *key) {
    const auto &arr = f.get(key).as_string_array(key);
    return std::vector<std::string>(arr.begin(), arr.end());
}

}  // namespace

VocabSpec read_vocab_spec(const GgufFile &f) {
    VocabSpec s;
    s.model = std::string(f.get("tokenizer.ggml.model").as_string("tokenizer.ggml.model"));
    if (s.model == "gpt2") {
        const GgufValue *pre = f.find("tokenizer.ggml.pre");
        if (!pre) fail("tokenizer.ggml.pre is missing: a gpt2 tokenizer needs its pre-tokenizer named");
        s.pre = std::string(pre->as_string("tokenizer.ggml.pre"));
    }
    s.tokens = read_strings(f, "tokenizer.ggml.tokens");
    if (const GgufValue *v = f.find("tokenizer.ggml.token_type")) {
        const std::vector<int64_t> types = v->as_int_array("tokenizer.ggml.token_type");
        s.types.reserve(types.size());
        for (size_t i = 0; i < types.size(); i++) {
            if (types[i] < 0 || types[i] > 6)
                fail("tokenizer.ggml.token_type[%zu] = %lld is not a token type (0..6)", i, (long long)types[i]);
            s.types.push_back(int32_t(types[i]));
        }
    }
    if (const GgufValue *v = f.find("tokenizer.ggml.scores")) {
        const std::vector<double> scores = v->as_float_array("tokenizer.ggml.scores");
        s.scores.assign(scores.begin(), scores.end());
    }
    if (f.find("tokenizer.ggml.merges")) {
        s.merges = read_strings(f, "tokenizer.ggml.merges");
    } else if (s.model == "gpt2") {
        fail("tokenizer.ggml.merges is missing: a gpt2 tokenizer needs its merges");
    }
    s.bos = read_id(f, "tokenizer.ggml.bos_token_id");
    s.eos = read_id(f, "tokenizer.ggml.eos_token_id");
    s.eot = read_id(f, "tokenizer.ggml.eot_token_id");
    s.eom = read_id(f, "tokenizer.ggml.eom_token_id");
    s.unk = read_id(f, "tokenizer.ggml.unknown_token_id");
    s.pad = read_id(f, "tokenizer.ggml.padding_token_id");
    s.add_bos = read_flag(f, "tokenizer.ggml.add_bos_token");
    s.add_eos = read_flag(f, "tokenizer.ggml.add_eos_token");
    s.add_space_prefix = read_flag(f, "tokenizer.ggml.add_space_prefix");
    return s;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile &f) {
    return from_spec(read_vocab_spec(f));
}

}  // namespace strata
