// strata serve: flags, the model, the scheduler, and the HTTP server (src/server/http.h) until SIGTERM or SIGINT.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/usage.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "server/endpoints.h"
#include "server/http.h"
#include "server/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

using namespace strata::server;

Run add_serve(CLI::App &app) {
    struct Args {
        std::string model, alias, kv_type = "f16", expert_profile;
        int parallel = 4, threads = 0, queue = 64, checkpoints = 8;
        int64_t ctx = 4096, batch = 512;
        bool no_prefix_reuse = false;
        HttpConfig http;
        DeviceOptions dev;
    };
    auto a = std::make_shared<Args>();
    HttpConfig &h = a->http;
    CLI::App *sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
    sub->add_option("-m,--model", a->model, "GGUF model file")->required();
    sub->add_option("--host", h.host, "Address to listen on (loopback by default)")->capture_default_str();
    sub->add_option("--port", h.port, "Port to listen on (0: any free port)")->capture_default_str();
    sub->add_option("--parallel", a->parallel, "Requests generated at once (sequence slots)")->capture_default_str();
    sub->add_option("-c,--ctx-size", a->ctx, "Context size per request, in tokens")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("-b,--batch", a->batch, "Tokens per engine step (prompt chunk size)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("-t,--threads", a->threads, "CPU threads (0: all)")->check(threads_range());
    sub->add_option("--api-key", h.api_key, "Require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on the API");
    sub->add_option("--alias", a->alias, "Model name shown by the API (default: the file name)");
    sub->add_option("--queue", a->queue, "Requests that may wait for a slot; more get 503")->capture_default_str();
    sub->add_option("--http-threads", h.workers, "Threads that check request bodies and tokenize prompts")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--max-body", h.max_body, "Largest request body in bytes")->capture_default_str();
    sub->add_option("--max-connections", h.max_connections, "Open connections served at once; more get 503")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--read-timeout", h.read_timeout_s,
                    "Seconds a connection has to send a whole request (and the longest keep-alive idle time)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    sub->add_option("--keep-alive-requests", h.keep_alive_requests, "Requests per connection before it is closed")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--shutdown-grace", h.shutdown_grace_s,
                    "Seconds running requests may go on after SIGTERM/SIGINT before they are ended")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--kv-type", a->kv_type, "KV cache type: f16, q8_0 or f32")->capture_default_str();
    sub->add_option("--checkpoints", a->checkpoints, "Recurrent-state checkpoints kept per slot (prefix reuse)")
        ->capture_default_str();
    sub->add_flag("--no-prefix-reuse", a->no_prefix_reuse, "Always compute the whole prompt");
    add_device_options(sub, a->dev);
    add_expert_profile_option(sub, a->expert_profile);

    return [a] {
        if (a->parallel < 1) usage_fail("--parallel must be at least 1 (got %d)", a->parallel);
        if (a->queue < 0) usage_fail("--queue must be >= 0 (got %d)", a->queue);
        if (a->http.port < 0 || a->http.port > 65535) usage_fail("--port must be in 0..65535 (got %d)", a->http.port);
        // First, before any thread exists: SIGTERM and SIGINT are then blocked in every thread (the engine's
        // workers included) and wait for the server's shutdown, instead of killing the process.
        block_stop_signals();
        EngineConfig cfg;
        cfg.n_threads = a->threads;
        cfg.n_seq_max = a->parallel;
        cfg.n_ctx = a->ctx;
        cfg.n_batch = a->batch;
        cfg.kv_type = parse_kv_type(a->kv_type);
        std::fprintf(stderr, "strata: loading %s\n", a->model.c_str());
        apply_device_options(a->dev, cfg);
        std::unique_ptr<Engine> eng = make_engine(a->model, cfg);
        for (const std::string &w : eng->model().warnings) std::fprintf(stderr, "strata: warning: %s\n", w.c_str());
        if (!eng->model().file->find("tokenizer.ggml.model"))
            fail("%s has no tokenizer: it cannot be served", a->model.c_str());
        std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*eng->model().file);
        load_expert_profile(a->expert_profile, *eng);
        ModelChat chat(*eng->model().file, a->model);
        if (!chat.notice().empty()) std::fprintf(stderr, "strata: %s\n", chat.notice().c_str());
        const std::string model_id = a->alias.empty() ? std::filesystem::path(a->model).filename().string() : a->alias;

        SchedulerConfig sc;
        sc.max_queue = a->queue;
        sc.max_checkpoints = a->checkpoints;
        sc.prefix_reuse = !a->no_prefix_reuse;
        if (const char *t = std::getenv("STRATA_TEST_FAIL_TOKEN")) {
            sc.fail_token = int32_t(std::atoi(t));
            std::fprintf(stderr, "strata: test hook: requests fail when token %d reaches the engine\n", sc.fail_token);
        }
        Scheduler sched(*eng, *tok, sc);
        Endpoints endpoints(*eng, *tok, chat, sched, model_id, a->model);
        HttpServer server(a->http, endpoints, sched);  // fails here when the port is taken
        sched.start();
        std::fprintf(stderr, "strata: serving %s at http://%s:%d (%d parallel, context %lld)\n", model_id.c_str(),
                     a->http.host.c_str(), server.port(), a->parallel, (long long)a->ctx);
        std::fflush(stderr);
        server.run();  // until SIGTERM/SIGINT; the scheduler has stopped when it returns
        save_expert_profile(a->expert_profile, *eng);
        return 0;
    };
}

}  // namespace strata::cli
