// Rewrites a GGUF file with its tensors converted to other types, chosen per tensor by name rules. Metadata is
// copied unchanged except general.file_type. Used by `strata quantize` and by the golden-model tooling.
#pragma once

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "format/dtype.h"

namespace strata {

struct QuantizeRule {
    std::string pattern;  // ECMAScript regex, searched in the tensor name
    DType type;
};

struct QuantizeOptions {
    std::vector<QuantizeRule> rules;  // first match wins
    DType default_type = DType::Q8_0;
    bool keep_1d = true;  // vectors (norms, biases, ssm_a, dt_bias) stay as they are, as llama.cpp keeps them
    // A tensor already in a quantized type converted to another one loses precision twice; without this,
    // quantize_file refuses to (naming the tensor) rather than do it unasked.
    bool allow_requantize = false;
    int n_threads = 0;  // 0: all hardware threads
};

class GgufWriter;
struct GgufKV;
// Adds a metadata pair read from one file to a writer, same key, type and value.
void gguf_copy_kv(GgufWriter &w, const GgufKV &kv);

// Parses "REGEX=TYPE" (the last '=' splits). Throws strata::Error naming the bad part.
QuantizeRule parse_quantize_rule(const std::string &text);

// The type a tensor gets under the options: the first matching rule's type, else the default; the tensor keeps
// its own type when it is 1-D (and keep_1d), when its row length is not a multiple of the target's block size,
// or when the target type has no reference quantizer.
DType choose_quantized_type(const QuantizeOptions &opt, const std::string &name, DType current, int n_dims,
                            int64_t ne0);

struct QuantizeReport {
    uint64_t bytes_in = 0, bytes_out = 0;
    size_t n_tensors = 0, n_converted = 0;
};

// Writes the converted file to out_path through a temporary file renamed into place at the end (a failed or
// interrupted run leaves no file under out_path). Refuses an out_path that is in_path (the same file, by device and
// inode, also through links), and, without allow_requantize, converting a quantized tensor to another quantized type.
QuantizeReport quantize_file(const std::string &in_path, const std::string &out_path, const QuantizeOptions &opt);

}  // namespace strata
