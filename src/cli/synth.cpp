// strata synth: write a synthetic model with the shapes of a released one and seeded random weights.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"
#include "synth/synth.h"

namespace strata::cli {

Run add_synth(CLI::App &app) {
    struct Args {
        SynthOptions opt;
        std::string out, type = "Q4_K", dense_type = "Q8_0", mixed_down;
        bool quiet = false;
    };
    auto a = std::make_shared<Args>();
    std::string presets;
    for (const std::string &p : synth_presets()) presets += (presets.empty() ? "" : ", ") + p;
    CLI::App *sub = app.add_subcommand("synth", "Write a synthetic model (real shapes, random weights)");
    sub->add_option("--preset", a->opt.preset, "Model shape: " + presets)->capture_default_str();
    sub->add_option("--type", a->type, "Type of the routed experts")->capture_default_str();
    sub->add_option("--dense-type", a->dense_type, "Type of the other matrices")->capture_default_str();
    sub->add_option("--mixed-down", a->mixed_down,
                    "Type of the routed experts' down matrices in the first and last eighth of the layers and every "
                    "third layer between (as llama.cpp's Q4_K_M gives Q6_K): layers whose experts differ in size");
    sub->add_option("--seed", a->opt.seed, "Seed of the weights")->capture_default_str();
    sub->add_option("--route-skew", a->opt.route_skew,
                    "Zipf exponent S of expert popularity: the expert of rank r is routed to about in proportion to "
                    "1/r^S (0: as random routers route, nearly uniform)")
        ->capture_default_str();
    sub->add_option("--vocab", a->opt.vocab_file, "Copy the tokenizer of this GGUF file (sets the vocabulary size)");
    sub->add_option("-t,--threads", a->opt.n_threads, "Worker threads (0: all)");
    sub->add_option("-o,--output", a->out, "Output GGUF file")->required();
    sub->add_flag("--quiet", a->quiet, "Print nothing on success");
    return [a] {
        auto parse = [](const std::string &flag, const std::string &s) {
            std::optional<DType> t = dtype_from_name(s);
            if (!t) usage_fail("%s: unknown type '%s'", flag.c_str(), s.c_str());
            return *t;
        };
        a->opt.expert_type = parse("--type", a->type);
        a->opt.dense_type = parse("--dense-type", a->dense_type);
        if (!a->mixed_down.empty()) a->opt.mixed_down_type = parse("--mixed-down", a->mixed_down);
        if (!std::isfinite(a->opt.route_skew) || a->opt.route_skew < 0)
            usage_fail("--route-skew: expected a number >= 0, got %g", double(a->opt.route_skew));
        auto t0 = std::chrono::steady_clock::now();
        SynthReport r = write_synthetic_model(a->opt, a->out);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!a->quiet)
            std::printf("strata: wrote %s: %s, %zu tensors, %.2f GiB in %.1f s\n", a->out.c_str(),
                        a->opt.preset.c_str(), r.n_tensors, double(r.bytes) / double(1u << 30), s);
        return 0;
    };
}

}  // namespace strata::cli
