// strata run: load a model, read a prompt (text through the file's tokenizer, or token ids), generate, and
// stream the tokens as they come; a stats line at the end.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/usage.h"
#include "core/error.h"
#include "core/threads.h"
#include "core/units.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

namespace {

// The expert cache while generating, for the summary line: hits over lookups, the share of the misses the host
// computed and of those the device read in place from host memory (mapped misses), the experts filled for the
// prompts' favourites as decoding began, expert bytes moved per second, none where the cache saw no lookups (every
// expert resident, the CPU);
// and how often the next-layer prediction was right where it ran.
std::string decode_cache_note(const ExpertCacheStats &a, const ExpertCacheStats &b, double seconds) {
    const uint64_t hits = b.expert_cache_hits - a.expert_cache_hits,
                   copied = b.expert_cache_misses - a.expert_cache_misses,
                   host = b.hybrid.host_experts - a.hybrid.host_experts;
    const uint64_t lookups = hits + copied + host;
    const uint64_t picks = b.prefetch.picks - a.prefetch.picks, predicted = b.prefetch.predicted - a.prefetch.predicted;
    std::string out;
    if (picks)  // STRATA_DECODE_PREFETCH=1, counted on every backend
        out += strfmt(" | next-layer prediction %.1f%% of %llu picks", 100.0 * double(predicted) / double(picks),
                      (unsigned long long)picks);
    if (lookups == 0) return out;
    out += strfmt(" | expert cache %.1f%% hits", 100.0 * double(hits) / double(lookups));
    if (copied + host > 0 && b.hybrid_on)
        out += strfmt(", %.1f%% of misses on the CPU", 100.0 * double(host) / double(copied + host));
    const uint64_t mapped = b.mapped_misses - a.mapped_misses;
    if (mapped > 0 && copied + host > 0)
        out += strfmt(", %.1f%% read in place", 100.0 * double(mapped) / double(copied + host));
    const uint64_t alone = b.decode_modes.alone - a.decode_modes.alone,
                   split = b.decode_modes.split - a.decode_modes.split;
    if (const uint64_t fav = b.favourite_fills - a.favourite_fills; fav > 0)  // moe_schedule.h, the prompts' favourites
        out += strfmt(", %llu favourites filled", (unsigned long long)fav);
    if (alone + split > 0)  // the decode mode (strata/decode_mode.h)
        out += strfmt(", passes %llu alone / %llu split", (unsigned long long)alone, (unsigned long long)split);
    if (seconds > 0) out += strfmt(", %.1f GB/s streamed", double(b.bytes_streamed - a.bytes_streamed) / seconds / 1e9);
    return out;
}

std::vector<int32_t> parse_token_list(const std::string &s) {
    std::vector<int32_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        if (a == std::string::npos) usage_fail("--tokens: empty entry in '%s'", s.c_str());
        item = item.substr(a, b - a + 1);
        char *end = nullptr;
        long v = std::strtol(item.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > INT32_MAX) usage_fail("--tokens: '%s' is not a token id", item.c_str());
        out.push_back(int32_t(v));
    }
    if (out.empty()) usage_fail("--tokens: no token ids given");
    return out;
}

// A progress bar on stderr for long loads (only on a terminal, only for files worth it).
std::function<void(uint64_t, uint64_t)> progress_bar(const char *label) {
    if (!isatty(2)) return nullptr;
    return [label, last = -1](uint64_t done, uint64_t total) mutable {
        if (total < (uint64_t(1) << 30)) return;
        const int pct = int(100 * done / total);
        if (pct == last) return;
        last = pct;
        const int w = 40, fill = pct * w / 100;
        std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% of %.1f GiB", label, fill, "########################################",
                     w - fill, "", pct, double(total) / double(1u << 30));
        if (done == total) std::fprintf(stderr, "\n");
        std::fflush(stderr);
    };
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Run add_run(CLI::App &app) {
    struct Args {
        std::string model, prompt, prompt_file, tokens, kv_type = "f16", dump_pattern, dump_dir = ".", output_format,
            routing_trace, expert_profile;
        DeviceOptions dev;
        int n_predict = 128, threads = 0;
        int64_t ctx = 4096, batch = 512;
        SamplerParams sp;
        std::string system;
        bool ignore_eos = false, chat = false;
    };
    auto a = std::make_shared<Args>();
    CLI::App *sub = app.add_subcommand("run", "Generate text from a prompt");
    sub->add_option("-m,--model", a->model, "GGUF model file")->required();
    sub->add_option("-p,--prompt", a->prompt, "Prompt text");
    sub->add_option("-f,--file", a->prompt_file, "Read the prompt from a file");
    sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids (no tokenizer needed)");
    sub->add_option("--output-format", a->output_format,
                    "What to print: text (the default for a text prompt; needs the file's tokenizer) or ids (the "
                    "default with --tokens: the generated token ids)")
        ->check(CLI::IsMember({"text", "ids"}));
    sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate")->capture_default_str()->check(at_least(0));
    sub->add_option("-t,--threads", a->threads, "CPU threads (0: all)")->check(threads_range());
    sub->add_option("-c,--ctx-size", a->ctx, "Context size in tokens")->capture_default_str()->check(at_least(1));
    sub->add_option("-b,--batch", a->batch, "Tokens per forward pass while reading the prompt")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--kv-type", a->kv_type, "KV cache type: f16, q8_0 or f32")->capture_default_str();
    add_device_options(sub, a->dev);
    sub->add_option("--temp", a->sp.temperature, "Temperature (0: greedy)")->capture_default_str();
    sub->add_option("--top-k", a->sp.top_k, "Top-k (0: off)")->capture_default_str();
    sub->add_option("--top-p", a->sp.top_p, "Top-p (1: off)")->capture_default_str();
    sub->add_option("--min-p", a->sp.min_p, "Min-p (0: off)")->capture_default_str();
    sub->add_option("--repeat-penalty", a->sp.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
    sub->add_option("--presence-penalty", a->sp.presence_penalty, "Presence penalty")->capture_default_str();
    sub->add_option("--frequency-penalty", a->sp.frequency_penalty, "Frequency penalty")->capture_default_str();
    sub->add_option("--repeat-last-n", a->sp.repeat_last_n, "Window for penalties")->capture_default_str();
    sub->add_option("-s,--seed", a->sp.seed, "Random seed")->capture_default_str();
    sub->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-generation tokens");
    sub->add_flag("--chat", a->chat,
                  "Chat through the file's template: the prompt is a user message; without a prompt, read one user "
                  "turn per line from stdin");
    sub->add_option("--system", a->system, "System message for --chat");
    sub->add_option("--dump", a->dump_pattern,
                    "Write named intermediates matching this regex (e.g. 'blk\\.3\\..*') as .f32 files");
    sub->add_option("--dump-dir", a->dump_dir, "Directory for --dump files")->capture_default_str();
    add_routing_trace_option(sub, a->routing_trace);
    add_expert_profile_option(sub, a->expert_profile);

    return [a] {
        int n_prompt_sources = !a->prompt.empty() + !a->prompt_file.empty() + !a->tokens.empty();
        if (n_prompt_sources > 1) usage_fail("give only one of --prompt, --file or --tokens");
        if (n_prompt_sources == 0 && !a->chat) usage_fail("give a prompt: --prompt, --file or --tokens (or --chat)");
        if (a->chat && !a->tokens.empty()) usage_fail("--chat takes text, not --tokens");
        if (!a->system.empty() && !a->chat) usage_fail("--system needs --chat");
        // Token ids in, token ids out, unless text is asked for.
        const bool print_ids = a->output_format.empty() ? !a->tokens.empty() : a->output_format == "ids";
        if (print_ids && a->chat) usage_fail("--chat prints text, not --output-format ids");
        validate(a->sp);

        const std::vector<int32_t> prompt_ids =
            a->tokens.empty() ? std::vector<int32_t>() : parse_token_list(a->tokens);
        std::string text = a->prompt;
        if (!a->prompt_file.empty()) {
            std::ifstream in(a->prompt_file, std::ios::binary);
            if (!in) fail("--file: cannot read '%s'", a->prompt_file.c_str());
            std::stringstream ss;
            ss << in.rdbuf();
            text = ss.str();
        }

        EngineConfig cfg;
        cfg.n_threads = a->threads;
        cfg.n_ctx = a->ctx;
        cfg.n_batch = a->batch;
        cfg.kv_type = parse_kv_type(a->kv_type);
        apply_device_options(a->dev, cfg);
        std::fprintf(stderr, "strata: loading %s\n", a->model.c_str());
        cfg.load_progress = progress_bar("strata: reading weights");
        auto t_load = std::chrono::steady_clock::now();
        std::unique_ptr<Engine> eng = make_engine(a->model, cfg);
        for (const std::string &w : eng->model().warnings) std::fprintf(stderr, "strata: warning: %s\n", w.c_str());
        std::fprintf(stderr, "strata: %s loaded in %.2f s on %s (%s of weights)\n", eng->hparams().arch_name.c_str(),
                     seconds_since(t_load), eng->backend().name().c_str(),
                     format_bytes(eng->model().weight_bytes).c_str());

        std::unique_ptr<Tokenizer> tok;
        if (eng->model().file->find("tokenizer.ggml.model")) tok = Tokenizer::from_gguf(*eng->model().file);
        if (!tok && a->tokens.empty()) fail("%s has no tokenizer; give the prompt as --tokens", a->model.c_str());
        if (!tok && !print_ids) fail("%s has no tokenizer: it can only print token ids", a->model.c_str());
        std::unique_ptr<ModelChat> chat;
        if (a->chat) {
            chat = std::make_unique<ModelChat>(*eng->model().file, a->model);
            if (!chat->notice().empty()) std::fprintf(stderr, "strata: %s\n", chat->notice().c_str());
        }

        Tracer tracer;
        std::regex dump_re;
        int64_t dump_step = 0;
        if (!a->dump_pattern.empty()) {
            try {
                dump_re = std::regex(a->dump_pattern);
            } catch (const std::regex_error &e) {
                usage_fail("--dump: bad regular expression '%s': %s", a->dump_pattern.c_str(), e.what());
            }
            tracer.want = [&](const std::string &name) { return std::regex_search(name, dump_re); };
            tracer.sink = [&](const std::string &name, int64_t rows, int64_t cols, const float *data) {
                std::string path = strfmt("%s/%04lld-%s-%lldx%lld.f32", a->dump_dir.c_str(), (long long)dump_step,
                                          name.c_str(), (long long)rows, (long long)cols);
                std::ofstream out(path, std::ios::binary);
                if (!out) fail("--dump: cannot write '%s'", path.c_str());
                out.write(reinterpret_cast<const char *>(data), std::streamsize(rows * cols * 4));
            };
            eng->set_tracer(&tracer);
        }

        load_expert_profile(a->expert_profile, *eng);
        std::unique_ptr<RoutingTraceWriter> trace = open_routing_trace(a->routing_trace, *eng);
        Sampler sampler(a->sp);
        const int32_t seq = eng->new_sequence();
        std::vector<int32_t> in_cache;  // the tokens the sequence holds
        std::vector<std::vector<float>> logits;

        // Feeds `tokens` after what the cache holds (dropping the cache when it is not a prefix), then generates
        // and streams up to n_predict tokens; returns the generated text.
        auto turn = [&](const std::vector<int32_t> &tokens, bool echo_prompt) {
            size_t common = 0;
            while (common < in_cache.size() && common < tokens.size() && in_cache[common] == tokens[common]) common++;
            if (common < in_cache.size()) {  // diverged: start the sequence over
                eng->drop(seq);
                if (eng->new_sequence() != seq) fail("internal: sequence slot changed");
                in_cache.clear();
                common = 0;
            }
            if (common == tokens.size()) {  // nothing new: re-read the last token to get its logits
                eng->drop(seq);
                eng->new_sequence();
                in_cache.clear();
                common = 0;
            }
            std::vector<int32_t> fresh(tokens.begin() + int64_t(common), tokens.end());
            if (int64_t(tokens.size()) + a->n_predict > a->ctx)
                fail("the prompt (%zu tokens) plus --n-predict (%d) exceed the context size %lld; raise --ctx-size",
                     tokens.size(), a->n_predict, (long long)a->ctx);
            if (echo_prompt && !print_ids) std::fputs(tok->decode(tokens).c_str(), stdout);
            std::fflush(stdout);

            auto t_prompt = std::chrono::steady_clock::now();
            eng->decode({{seq, fresh, false}}, logits);
            const double prompt_s = seconds_since(t_prompt);
            in_cache = tokens;

            std::unique_ptr<StreamDecoder> stream;
            if (!print_ids) stream = std::make_unique<StreamDecoder>(*tok);
            std::string reply;
            const ExpertCacheStats cache0 = eng->expert_stats();
            auto t_gen = std::chrono::steady_clock::now();
            int n_gen = 0;
            auto emit = [&](int32_t next) {
                if (stream) {
                    std::string piece = stream->push(next);
                    reply += piece;
                    std::fputs(piece.c_str(), stdout);
                } else {
                    std::printf("%s%d", n_gen ? " " : "", next);
                }
                std::fflush(stdout);
            };
            auto is_end = [&](int32_t t) { return !a->ignore_eos && tok && tok->is_eog(t); };
            // Greedy picks without a dump: the first from the prompt's logits, the rest made on the device, the next
            // step under way while one is printed (Engine::decode_greedy). The same tokens, fed as the loop below.
            const bool on_device = sampler.picks_argmax() && a->dump_pattern.empty();
            if (on_device && a->n_predict > 0) {
                const int32_t first = sampler.sample(logits[0].data(), eng->n_vocab(), in_cache);
                in_cache.push_back(first);
                if (is_end(first)) {
                    n_gen = 1;
                    eng->decode({{seq, {first}, false}}, logits);
                } else if (a->n_predict == 1) {
                    emit(first);
                    n_gen = 1;
                    in_cache.pop_back();  // not fed to the model
                } else {
                    emit(first);
                    n_gen = 1;
                    bool ended = false;  // an end-of-generation token came: the step that feeds it is the last
                    eng->decode_greedy({{seq, {first}, false}}, a->n_predict,
                                       [&](int64_t, const std::vector<int32_t> &ids) {
                                           if (ended) return false;
                                           const int32_t next = ids[0];
                                           in_cache.push_back(next);
                                           if (is_end(next)) {
                                               n_gen++;
                                               return ended = true;
                                           }
                                           emit(next);
                                           n_gen++;
                                           if (n_gen < a->n_predict) return true;
                                           in_cache.pop_back();  // not fed to the model
                                           return false;
                                       });
                }
            }
            for (; n_gen < a->n_predict && !on_device; n_gen++) {
                dump_step++;
                int32_t next = sampler.sample(logits[0].data(), eng->n_vocab(), in_cache);
                if (is_end(next)) {
                    n_gen++;
                    in_cache.push_back(next);
                    eng->decode({{seq, {next}, false}}, logits);
                    break;
                }
                emit(next);
                in_cache.push_back(next);
                if (n_gen + 1 < a->n_predict) eng->decode({{seq, {next}, false}}, logits);
                else in_cache.pop_back();  // not fed to the model
            }
            if (stream) {
                std::string rest = stream->flush();
                reply += rest;
                std::fputs(rest.c_str(), stdout);
            }
            std::printf("\n");
            std::fflush(stdout);
            const double gen_s = seconds_since(t_gen);
            std::fprintf(stderr, "strata: prompt %zu tokens, %.1f tok/s | generated %d tokens, %.1f tok/s%s\n",
                         fresh.size(), double(fresh.size()) / prompt_s, n_gen, n_gen > 0 ? double(n_gen) / gen_s : 0.0,
                         decode_cache_note(cache0, eng->expert_stats(), gen_s).c_str());
            return reply;
        };

        if (!a->chat) {
            std::vector<int32_t> prompt = !a->tokens.empty()
                                              ? prompt_ids
                                              : tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
            if (prompt.empty()) fail("the prompt is empty after tokenization");
            turn(prompt, true);
            close_routing_trace(trace, a->routing_trace, *eng);
            save_expert_profile(a->expert_profile, *eng);
            return 0;
        }

        nlohmann::ordered_json messages = nlohmann::ordered_json::array();
        if (!a->system.empty()) messages.push_back({{"role", "system"}, {"content", a->system}});
        auto chat_turn = [&](const std::string &user) {
            messages.push_back({{"role", "user"}, {"content", user}});
            std::string rendered = chat->render(messages, nlohmann::ordered_json(), true);
            // Special tokens in the rendered text are parsed as such: the template's own, and any the user typed
            // (acceptable for a local terminal; the server must keep user text from forging them).
            std::string reply = turn(tok->encode(rendered, false, true), false);
            messages.push_back({{"role", "assistant"}, {"content", reply}});
        };
        if (!text.empty()) {
            chat_turn(text);
            close_routing_trace(trace, a->routing_trace, *eng);
            save_expert_profile(a->expert_profile, *eng);
            return 0;
        }
        std::string line;
        while (std::fprintf(stderr, "> "), std::getline(std::cin, line)) {
            if (line.empty()) continue;
            chat_turn(line);
        }
        close_routing_trace(trace, a->routing_trace, *eng);
        save_expert_profile(a->expert_profile, *eng);
        return 0;
    };
}

}  // namespace strata::cli
