// Writes the fuzzing seed corpus into a folder: small valid files with every value type, every tensor type,
// custom alignments, no tensors, and a vocabulary-like string array. Mutations of valid files reach deep into the
// parser far sooner than random bytes do.
#include <cstdio>
#include <string>

#include "../tests/cpp/gguf_samples.h"
#include "core/error.h"

using namespace strata;
using namespace strata::testing;

namespace {

GgufWriter every_tensor_type() {
    GgufWriter w;
    w.add_string("general.architecture", "seed");
    size_t n = 0;
    const DTypeInfo *types = dtype_all(&n);
    for (size_t i = 0; i < n; i++)
        add_sample_tensor(w, i, ("t." + std::string(types[i].name)).c_str(), types[i].type,
                          {int64_t(types[i].block_size), 2});
    return w;
}

GgufWriter vocabulary() {
    GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int i = 0; i < 300; i++) {
        std::string prefix = i < 256 ? std::string(1, char(33 + i % 90)) : "\xc4\xa0tok";  // "Ġtok": byte-level BPE
        tokens.push_back(prefix + std::to_string(i));
        types.push_back(i % 7 == 0 ? 3 : 1);
    }
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_array("tokenizer.ggml.token_type", GgufType::I32, types.data(), types.size());
    w.add_u32("tokenizer.ggml.eos_token_id", 7);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}\n{% endfor %}");
    return w;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: gguf_fuzz_seeds DIR\n");
        return 2;
    }
    std::string dir = argv[1];
    try {
        sample_tiny().write(dir + "/tiny.gguf");
        sample_every_value().write(dir + "/every_value.gguf");
        sample_every_value(64).write(dir + "/every_value_align64.gguf");
        sample_every_value(1).write(dir + "/every_value_align1.gguf");
        every_tensor_type().write(dir + "/every_tensor_type.gguf");
        vocabulary().write(dir + "/vocabulary.gguf");
        GgufWriter empty;
        empty.write(dir + "/empty.gguf");
    } catch (const Error &e) {
        std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
