// strata perplexity: a text file through the model's tokenizer, scored in windows with llama.cpp's conventions
// (runtime/perplexity.h); the running perplexity after each window, the final figure with its standard error.
#include <CLI/CLI.hpp>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/usage.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

Run add_perplexity(CLI::App &app) {
    struct Args {
        std::string model, text_file, kv_type = "f16";
        DeviceOptions dev;
        int64_t ctx = 512, stride = 0, chunks = 0, batch = 0;
        int threads = 0;
        bool json = false;
    };
    auto a = std::make_shared<Args>();
    CLI::App *sub = app.add_subcommand(
        "perplexity", "Perplexity of a text: windows of --ctx tokens, the second half of each scored (llama.cpp's way)");
    sub->add_option("-m,--model", a->model, "GGUF model file")->required();
    sub->add_option("-f,--file", a->text_file, "Text file to score")->required();
    sub->add_option("-c,--ctx", a->ctx, "Tokens per window")->capture_default_str()->check(at_least(2));
    sub->add_option("--stride", a->stride,
                    "Overlapping windows every N tokens, each scoring its last N predictions (0: disjoint windows)")
        ->capture_default_str()
        ->check(at_least(0));
    sub->add_option("--chunks", a->chunks, "Score at most this many windows (0: all)")
        ->capture_default_str()
        ->check(at_least(0));
    sub->add_option("-b,--batch", a->batch, "Tokens per forward pass (0: a window at a time)")
        ->capture_default_str()
        ->check(at_least(0));
    sub->add_option("-t,--threads", a->threads, "CPU threads (0: all)")->check(threads_range());
    sub->add_option("--kv-type", a->kv_type, "KV cache type: f16, q8_0 or f32")->capture_default_str();
    add_device_options(sub, a->dev);
    sub->add_flag("--json", a->json, "Print one JSON object instead of the running figures");

    return [a] {
        std::ifstream in(a->text_file, std::ios::binary);
        if (!in) fail("--file: cannot read '%s'", a->text_file.c_str());
        std::stringstream ss;
        ss << in.rdbuf();
        const std::string text = ss.str();

        EngineConfig cfg;
        cfg.n_threads = a->threads;
        cfg.n_ctx = a->ctx;
        cfg.n_batch = a->batch > 0 ? std::min(a->batch, a->ctx) : a->ctx;
        cfg.kv_type = parse_kv_type(a->kv_type);
        apply_device_options(a->dev, cfg);
        std::fprintf(stderr, "strata: loading %s\n", a->model.c_str());
        std::unique_ptr<Engine> eng = make_engine(a->model, cfg);
        if (!eng->model().file->find("tokenizer.ggml.model"))
            fail("%s has no tokenizer: perplexity needs one to read the text", a->model.c_str());
        std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*eng->model().file);
        // The text is data: control-token spellings in it are plain text.
        std::vector<int32_t> ids;
        tok->encode(text, /*add_special=*/false, /*parse_special=*/false, ids);

        PerplexityOptions o;
        o.ctx = a->ctx;
        o.stride = a->stride;
        o.max_windows = a->chunks;
        o.bos = tok->add_bos() ? tok->bos() : -1;
        const std::vector<PplWindow> windows = perplexity_windows(int64_t(ids.size()), o);
        std::fprintf(stderr, "strata: %zu tokens, %zu windows of %lld on %s\n", ids.size(), windows.size(),
                     (long long)o.ctx, eng->backend().name().c_str());

        const bool tty = isatty(2);
        const auto t0 = std::chrono::steady_clock::now();
        auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
        const PerplexityResult r = perplexity(*eng, ids, o, [&](int64_t done, int64_t total, double ppl) {
            if (!a->json) {  // llama.cpp's running figures: [1]12.3456,[2]...
                std::printf("[%lld]%.4f,", (long long)done, ppl);
                std::fflush(stdout);
            }
            if (tty) {
                const int w = 30, fill = int(done * w / total);
                std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld windows, %.0f tok/s", fill,
                             "##############################", w - fill, "", (long long)done, (long long)total,
                             double(done * o.ctx) / seconds());
                if (done == total) std::fprintf(stderr, "\n");
            }
        });
        const double secs = seconds();
        if (a->json) {
            nlohmann::json j;
            j["model"] = a->model;
            j["file"] = a->text_file;
            j["backend"] = eng->backend().name();
            j["tokens"] = ids.size();
            j["ctx"] = o.ctx;
            j["stride"] = o.stride;
            j["windows"] = r.running.size();
            j["bos_replaced"] = o.bos >= 0;
            j["scored"] = r.n_scored;
            j["nll_mean"] = r.nll_mean;
            j["ppl"] = r.ppl;
            j["ppl_stderr"] = r.ppl_stderr;
            j["running"] = r.running;
            j["seconds"] = secs;
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("\nFinal estimate: PPL = %.4f +/- %.4f (%lld tokens scored in %zu windows, %.1f s)\n", r.ppl,
                        r.ppl_stderr, (long long)r.n_scored, r.running.size(), secs);
        }
        return 0;
    };
}

}  // namespace strata::cli
