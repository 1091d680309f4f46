// strata quantize: rewrite a GGUF with its tensors in other types, chosen per tensor by name rules.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "format/quantize_file.h"

namespace strata::cli {

Run add_quantize(CLI::App &app) {
    struct Args {
        std::string in, out, default_type = "Q8_0";
        std::vector<std::string> rules;
        int threads = 0;
        bool quantize_1d = false, allow_requantize = false;
    };
    auto a = std::make_shared<Args>();
    CLI::App *sub = app.add_subcommand("quantize", "Convert a GGUF file's tensors to other types");
    sub->add_option("input", a->in, "Input GGUF file")->required();
    sub->add_option("output", a->out, "Output GGUF file")->required();
    sub->add_option("--rule", a->rules,
                    "REGEX=TYPE: tensors whose name matches REGEX get TYPE (first matching rule wins); repeatable");
    sub->add_option("--default-type", a->default_type, "Type for tensors no rule matches")->capture_default_str();
    sub->add_option("-t,--threads", a->threads, "Worker threads (0: all)")->check(threads_range());
    sub->add_flag("--quantize-1d", a->quantize_1d, "Also convert 1-D tensors (norms, biases); off as in llama.cpp");
    sub->add_flag("--allow-requantize", a->allow_requantize,
                  "Convert tensors that are already quantized to another quantized type (lossy twice)");
    return [a] {
        QuantizeOptions opt;
        std::optional<DType> def = dtype_from_name(a->default_type);
        if (!def) usage_fail("--default-type: unknown type '%s'", a->default_type.c_str());
        opt.default_type = *def;
        for (const std::string &r : a->rules) opt.rules.push_back(parse_quantize_rule(r));
        opt.n_threads = a->threads;
        opt.keep_1d = !a->quantize_1d;
        opt.allow_requantize = a->allow_requantize;
        auto t0 = std::chrono::steady_clock::now();
        QuantizeReport rep = quantize_file(a->in, a->out, opt);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("strata: quantized %zu of %zu tensors: %.2f MiB -> %.2f MiB in %.2f s\n", rep.n_converted,
                    rep.n_tensors, double(rep.bytes_in) / (1 << 20), double(rep.bytes_out) / (1 << 20), s);
        return 0;
    };
}

}  // namespace strata::cli
