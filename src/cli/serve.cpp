// strata serve: an OpenAI-compatible HTTP server (chat completions, completions, models, health, metrics and a chat
// page) over one model. Handler threads check requests and wait on their jobs; the scheduler thread runs the engine.
#include <httplib.h>
#include <pthread.h>
#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/usage.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "server/api.h"
#include "server/connection.h"
#include "server/scheduler.h"
#include "server/text.h"
#include "server/webpage.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

using namespace strata::server;

namespace {

// Requests answered, by endpoint and status, for /metrics.
class HttpCounters {
  public:
    void add(const std::string &endpoint, int status) {
        std::lock_guard<std::mutex> lock(mu_);
        counts_[{endpoint, status}]++;
    }
    std::map<std::pair<std::string, int>, uint64_t> snapshot() const {
        std::lock_guard<std::mutex> lock(mu_);
        return counts_;
    }

  private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> counts_;
};

void send_error(httplib::Response &res, const ApiError &e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
}

// How often a handler waiting for its job looks at the job's events and at its client's connection.
constexpr auto kPollInterval = std::chrono::milliseconds(100);
// Silence after which a stream gets a comment line, for proxies that close connections they think idle.
constexpr auto kStreamKeepAlive = std::chrono::seconds(15);

// A queued job seen from its HTTP handler: its events, as long as its client is there. A client that has gone away
// is noticed by looking at its socket, never by writing to it, because nothing may be sent before the status is
// known: a request that fails before its first token (or, when not streaming, before its end) gets its real status.
class JobWaiter {
  public:
    JobWaiter(std::shared_ptr<Job> job, Scheduler &sched, ClientConnection client)
        : job_(std::move(job)), sched_(sched), client_(client) {}
    ~JobWaiter() { cancel(); }

    // Waits for the next event while the client is there; false once it has gone (the job is then cancelled).
    bool next(Event &e) {
        while (!poll(e))
            if (gone_) return false;
        return true;
    }
    // Waits one poll interval: true with an event; false without one (gone() tells whether the client has left).
    // The client is looked at every interval, also while events keep coming.
    bool poll(Event &e) {
        const bool got = job_->out.pop(e, kPollInterval);
        const auto now = std::chrono::steady_clock::now();
        if (now - last_look_ >= kPollInterval) {
            last_look_ = now;
            if (!client_.alive()) {
                gone_ = true;
                cancel();
                return false;
            }
        }
        return got;
    }
    bool gone() const { return gone_; }
    // Stops the job (a no-op once it has finished): the scheduler frees its slot at the next step.
    void cancel() {
        if (!job_->finished) {
            job_->cancelled = true;
            sched_.notify();
        }
    }

  private:
    std::shared_ptr<Job> job_;
    Scheduler &sched_;
    ClientConnection client_;
    std::chrono::steady_clock::time_point last_look_ = std::chrono::steady_clock::now();
    bool gone_ = false;
};

// The answer to a job that failed in the scheduler or the engine: 503 when the server stopped under it (the request
// may succeed elsewhere or later), 500 when it failed.
ApiError job_error(const Event &e) {
    if (e.shutting_down)
        return ApiError(503, "The server is shutting down and did not finish this request. Retry later.",
                        "server_error", {}, "shutting_down");
    return ApiError(500, "The server failed on this request: " + e.error, "server_error");
}

// The status logged for a request whose client left before the answer (nginx's "client closed request"); the
// client never reads it.
void client_gone(httplib::Response &res) {
    send_error(res, ApiError(499, "The client closed the connection before the answer was ready.",
                             "invalid_request_error", {}, "client_closed_request"));
}

// Not streaming: one body, with its status, once the job has ended.
void answer_whole(JobWaiter &waiter, Responder &responder, httplib::Response &res) {
    for (Event e; waiter.next(e);) {
        if (e.kind == Event::Kind::Error) return send_error(res, job_error(e));
        responder.on_event(e);
        if (e.kind == Event::Kind::Done) return res.set_content(dump(responder.body()), "application/json");
    }
    client_gone(res);
}

std::string sse_events(Responder &responder, const Event &e) {
    std::string out;
    if (e.kind == Event::Kind::Error)
        out = "data: " + dump(error_body(job_error(e))) + "\n\n";
    else
        for (const ojson &c : responder.on_event(e)) out += "data: " + dump(c) + "\n\n";
    if (e.kind != Event::Kind::Text) out += "data: [DONE]\n\n";
    return out;
}

// Streaming: the status and the first chunks once the first event is known (an error then still gets its status),
// then server-sent events as they come; a failure after that can only be an error event in the stream.
void answer_stream(std::shared_ptr<JobWaiter> waiter, std::shared_ptr<Responder> responder, httplib::Response &res) {
    Event first;
    if (!waiter->next(first)) return client_gone(res);
    if (first.kind == Event::Kind::Error) return send_error(res, job_error(first));
    struct State {
        std::string first_chunks;  // written by the provider's first call
        bool first_ends = false, started = false;
        std::chrono::steady_clock::time_point last_write;
    };
    auto st = std::make_shared<State>();
    st->first_chunks = sse_events(*responder, first);
    st->first_ends = first.kind != Event::Kind::Text;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [waiter, responder, st](size_t, httplib::DataSink &sink) {
            std::string out;
            bool end = false;
            if (!st->started) {
                st->started = true;
                out = std::move(st->first_chunks);
                end = st->first_ends;
            } else if (Event e; waiter->poll(e)) {
                out = sse_events(*responder, e);
                end = e.kind != Event::Kind::Text;
            } else if (waiter->gone()) {
                return false;
            } else if (std::chrono::steady_clock::now() - st->last_write >= kStreamKeepAlive) {
                out = ": keep-alive\n\n";
            }
            if (!out.empty()) {
                if (!sink.write(out.data(), out.size())) {
                    waiter->cancel();
                    return false;
                }
                st->last_write = std::chrono::steady_clock::now();
            }
            if (end) sink.done();
            return true;
        },
        [waiter](bool) { waiter->cancel(); });
}

std::string metrics_text(const SchedulerStats &s, const HttpCounters &http, double uptime) {
    std::string out;
    auto metric = [&](const char *name, const char *type, const char *help, double v) {
        out += strfmt("# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    };
    out +=
        "# HELP strata_http_requests_total HTTP requests answered, by endpoint and status.\n"
        "# TYPE strata_http_requests_total counter\n";
    for (const auto &[key, n] : http.snapshot())
        out += strfmt("strata_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", key.first.c_str(), key.second,
                      (unsigned long long)n);
    metric("strata_requests_finished_total", "counter", "Generation requests that finished.", double(s.jobs_done));
    metric("strata_requests_cancelled_total", "counter", "Generation requests cancelled by their client.",
           double(s.jobs_cancelled));
    metric("strata_requests_failed_total", "counter", "Generation requests that failed in the engine.",
           double(s.jobs_failed));
    metric("strata_requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.",
           double(s.jobs_rejected));
    metric("strata_requests_running", "gauge", "Requests being generated now.", double(s.running));
    metric("strata_queue_depth", "gauge", "Requests waiting for a sequence slot.", double(s.queued));
    metric("strata_prompt_tokens_total", "counter", "Prompt tokens of all requests.", double(s.prompt_tokens));
    metric("strata_prompt_tokens_reused_total", "counter", "Prompt tokens taken from the prefix cache.",
           double(s.prompt_tokens_reused));
    metric("strata_prompt_tokens_computed_total", "counter", "Prompt tokens run through the model.",
           double(s.prompt_tokens_computed));
    metric("strata_generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
    metric("strata_generation_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.",
           s.gen_tokens_per_s);
    metric("strata_prompt_tokens_per_second", "gauge", "Prompt tokens computed per second over the last 10 s.",
           s.prompt_tokens_per_s);
    metric("strata_steps_total", "counter", "Engine steps (one batched forward call each).", double(s.steps));
    metric("strata_step_tokens_total", "counter", "Tokens in all engine steps.", double(s.step_tokens));
    metric("strata_busy_seconds_total", "counter", "Seconds spent in engine steps.", s.busy_seconds);
    metric("strata_kv_cache_tokens_active", "gauge", "Cache positions held by running requests.",
           double(s.kv_tokens_active));
    metric("strata_kv_cache_tokens_cached", "gauge", "Cache positions held, including finished requests' prefixes.",
           double(s.kv_tokens_cached));
    metric("strata_kv_cache_capacity_tokens", "gauge", "Cache positions in all slots.", double(s.kv_capacity));
    metric("strata_kv_cache_usage_ratio", "gauge", "Share of the cache held by running requests.",
           s.kv_capacity > 0 ? double(s.kv_tokens_active) / double(s.kv_capacity) : 0.0);
    metric("strata_state_checkpoints_taken_total", "counter", "Recurrent-state checkpoints taken.",
           double(s.checkpoints_taken));
    metric("strata_state_checkpoints_restored_total", "counter", "Recurrent-state checkpoints restored for reuse.",
           double(s.checkpoints_restored));
    metric("strata_expert_cache_hits_total", "counter",
           "Expert lookups served from device memory (0 when the backend holds every expert).",
           double(s.backend.expert_cache_hits));
    metric("strata_expert_cache_misses_total", "counter", "Expert lookups that had to stream the expert in.",
           double(s.backend.expert_cache_misses));
    metric("strata_bytes_streamed_total", "counter", "Weight bytes streamed to the device.",
           double(s.backend.bytes_streamed));
    metric("strata_uptime_seconds", "gauge", "Seconds since the server started.", uptime);
    return out;
}

}  // namespace

Run add_serve(CLI::App &app) {
    struct Args {
        std::string model, host = "127.0.0.1", api_key, alias, kv_type = "f16";
        int port = 8080, parallel = 4, threads = 0, queue = 64, http_threads = 0, checkpoints = 8;
        int64_t ctx = 4096, batch = 512;
        size_t max_body = size_t(8) << 20;
        bool no_prefix_reuse = false;
        DeviceOptions dev;
    };
    auto a = std::make_shared<Args>();
    CLI::App *sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
    sub->add_option("-m,--model", a->model, "GGUF model file")->required();
    sub->add_option("--host", a->host, "Address to listen on (loopback by default)")->capture_default_str();
    sub->add_option("--port", a->port, "Port to listen on (0: any free port)")->capture_default_str();
    sub->add_option("--parallel", a->parallel, "Requests generated at once (sequence slots)")->capture_default_str();
    sub->add_option("-c,--ctx-size", a->ctx, "Context size per request, in tokens")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("-b,--batch", a->batch, "Tokens per engine step (prompt chunk size)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("-t,--threads", a->threads, "CPU threads (0: all)")->check(threads_range());
    sub->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on the API");
    sub->add_option("--alias", a->alias, "Model name shown by the API (default: the file name)");
    sub->add_option("--queue", a->queue, "Requests that may wait for a slot; more get 503")->capture_default_str();
    sub->add_option("--http-threads", a->http_threads, "HTTP worker threads (0: parallel + queue + 16)");
    sub->add_option("--max-body", a->max_body, "Largest request body in bytes")->capture_default_str();
    sub->add_option("--kv-type", a->kv_type, "KV cache type: f16, q8_0 or f32")->capture_default_str();
    sub->add_option("--checkpoints", a->checkpoints, "Recurrent-state checkpoints kept per slot (prefix reuse)")
        ->capture_default_str();
    sub->add_flag("--no-prefix-reuse", a->no_prefix_reuse, "Always compute the whole prompt");
    add_device_options(sub, a->dev);

    return [a] {
        if (a->parallel < 1) usage_fail("--parallel must be at least 1 (got %d)", a->parallel);
        if (a->queue < 0) usage_fail("--queue must be >= 0 (got %d)", a->queue);
        if (a->port < 0 || a->port > 65535) usage_fail("--port must be in 0..65535 (got %d)", a->port);
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
        ModelChat chat(*eng->model().file, a->model);
        if (!chat.notice().empty()) std::fprintf(stderr, "strata: %s\n", chat.notice().c_str());
        const PromptEncoder encoder_proto(*tok);
        const std::string model_id = a->alias.empty() ? std::filesystem::path(a->model).filename().string() : a->alias;
        const int64_t n_ctx = a->ctx, n_vocab = eng->n_vocab();
        const auto t_start = std::chrono::steady_clock::now();
        const int64_t created =
            std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();

        // Signals: SIGINT/SIGTERM stop the server (handled by a thread), a client gone mid-write is not fatal.
        std::signal(SIGPIPE, SIG_IGN);
        sigset_t stop_signals;
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGINT);
        sigaddset(&stop_signals, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

        SchedulerConfig sc;
        sc.max_queue = a->queue;
        sc.max_checkpoints = a->checkpoints;
        sc.prefix_reuse = !a->no_prefix_reuse;
        if (const char *t = std::getenv("STRATA_TEST_FAIL_TOKEN")) {
            sc.fail_token = int32_t(std::atoi(t));
            std::fprintf(stderr, "strata: test hook: requests fail when token %d reaches the engine\n", sc.fail_token);
        }
        Scheduler sched(*eng, *tok, sc);
        sched.start();

        httplib::Server svr;
        const int n_http = a->http_threads > 0 ? a->http_threads : a->parallel + a->queue + 16;
        svr.new_task_queue = [n_http] { return new httplib::ThreadPool(size_t(n_http)); };
        svr.set_payload_max_length(a->max_body);
        svr.set_keep_alive_timeout(5);
        svr.set_read_timeout(60);
        svr.set_write_timeout(60);

        HttpCounters counters;
        svr.set_logger(
            [&](const httplib::Request &req, const httplib::Response &res) { counters.add(req.path, res.status); });
        svr.set_error_handler(
            httplib::Server::HandlerWithResponse([](const httplib::Request &req, httplib::Response &res) {
                if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours already
                std::string msg, code;
                switch (res.status) {
                    case 404:
                        msg = "Unknown request URL: " + req.method + " " + req.path + ".";
                        code = "unknown_url";
                        break;
                    case 413:
                        msg = "The request body is too large.";
                        code = "request_too_large";
                        break;
                    default:
                        msg = strfmt("The request could not be handled (HTTP %d).", res.status);
                }
                res.set_content(dump(error_body(ApiError(res.status, msg, "invalid_request_error", {}, code))),
                                "application/json");
                return httplib::Server::HandlerResponse::Handled;
            }));
        svr.set_exception_handler([](const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
            std::string what = "unknown error";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception &e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, ApiError(500, "Internal server error: " + what, "server_error"));
        });

        auto authorized = [&](const httplib::Request &req, httplib::Response &res) {
            if (a->api_key.empty()) return true;
            if (req.get_header_value("Authorization") == "Bearer " + a->api_key) return true;
            send_error(res, ApiError(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer KEY'.",
                                     "invalid_request_error", {}, "invalid_api_key"));
            return false;
        };

        // Queues a job and answers with its events: server-sent events when streaming, one JSON body otherwise.
        auto run_job = [&](const httplib::Request &req, std::shared_ptr<Job> job, std::shared_ptr<Responder> responder,
                           bool stream, httplib::Response &res) {
            if (!sched.submit(job)) {
                res.set_header("Retry-After", "1");
                send_error(res, ApiError(503, "The server is overloaded: too many requests are waiting. Retry later.",
                                         "server_error", {}, "overloaded"));
                return;
            }
            auto waiter = std::make_shared<JobWaiter>(
                job, sched, ClientConnection(req.local_addr, req.local_port, req.remote_addr, req.remote_port));
            if (stream)
                answer_stream(waiter, responder, res);
            else
                answer_whole(*waiter, *responder, res);
        };

        auto chat_handler = [&](const httplib::Request &req, httplib::Response &res) {
            if (!authorized(req, res)) return;
            try {
                const ojson body = parse_body(req.body);
                PromptEncoder enc = encoder_proto;
                ChatRequest cr = parse_chat_request(body, enc, n_vocab);
                ChatPrompt prompt = render_chat_prompt(chat, cr, enc);
                if (int64_t(prompt.ids.size()) >= n_ctx)
                    throw context_error(int64_t(prompt.ids.size()), n_ctx, "messages");
                ChatOutputParser::Options po;
                po.reasoning = true;
                po.starts_in_reasoning = prompt.opens_reasoning;
                po.tools = cr.parse_tools;
                if (cr.parse_tools) po.tool_schemas = cr.tools;
                po.forced_opening = prompt.forced_opening;
                auto responder =
                    std::make_shared<Responder>(Responder::Kind::Chat, model_id, *tok, cr.stream, cr.include_usage,
                                                cr.gen.top_logprobs, std::make_unique<ChatOutputParser>(po));
                auto job = std::make_shared<Job>();
                job->prompt = std::move(prompt.ids);
                job->params = cr.gen;
                run_job(req, job, responder, cr.stream, res);
            } catch (const ApiError &e) {
                send_error(res, e);
            } catch (const std::exception &e) {
                send_error(res, ApiError(500, std::string("Internal server error: ") + e.what(), "server_error"));
            }
        };
        auto completion_handler = [&](const httplib::Request &req, httplib::Response &res) {
            if (!authorized(req, res)) return;
            try {
                const ojson body = parse_body(req.body);
                CompletionRequest cr = parse_completion_request(body, n_vocab);
                std::vector<int32_t> ids = cr.prompt_ids.empty() ? tok->encode(cr.prompt, true, true) : cr.prompt_ids;
                if (ids.empty()) throw invalid_request("The prompt is empty after tokenization.", "prompt");
                if (int64_t(ids.size()) >= n_ctx) throw context_error(int64_t(ids.size()), n_ctx, "prompt");
                std::string echo;
                if (cr.echo) echo = cr.prompt_ids.empty() ? cr.prompt : tok->decode(cr.prompt_ids);
                auto responder = std::make_shared<Responder>(Responder::Kind::Completion, model_id, *tok, cr.stream,
                                                             cr.include_usage, cr.gen.top_logprobs, nullptr, echo);
                auto job = std::make_shared<Job>();
                job->prompt = std::move(ids);
                job->params = cr.gen;
                run_job(req, job, responder, cr.stream, res);
            } catch (const ApiError &e) {
                send_error(res, e);
            } catch (const std::exception &e) {
                send_error(res, ApiError(500, std::string("Internal server error: ") + e.what(), "server_error"));
            }
        };
        auto models_handler = [&](const httplib::Request &req, httplib::Response &res) {
            if (!authorized(req, res)) return;
            ojson m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "strata"}};
            m["meta"] = {{"n_ctx", n_ctx},
                         {"n_parallel", a->parallel},
                         {"n_vocab", n_vocab},
                         {"architecture", eng->hparams().arch_name},
                         {"chat_template", chat.has_template()}};
            res.set_content(dump(ojson{{"object", "list"}, {"data", ojson::array({m})}}), "application/json");
        };

        svr.Post("/v1/chat/completions", chat_handler);
        svr.Post("/chat/completions", chat_handler);
        svr.Post("/v1/completions", completion_handler);
        svr.Post("/completions", completion_handler);
        svr.Get("/v1/models", models_handler);
        svr.Get("/models", models_handler);
        svr.Get("/health", [&](const httplib::Request &, httplib::Response &res) {
            res.set_content(R"({"status":"ok"})", "application/json");
        });
        svr.Get("/metrics", [&](const httplib::Request &req, httplib::Response &res) {
            if (!authorized(req, res)) return;
            const double up = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
            res.set_content(metrics_text(sched.stats(), counters, up), "text/plain; version=0.0.4");
        });
        svr.Get("/", [&](const httplib::Request &, httplib::Response &res) {
            res.set_content(web_page(), "text/html; charset=utf-8");
        });

        int port = a->port;
        if (port == 0) {
            port = svr.bind_to_any_port(a->host);
            if (port < 0) fail("cannot listen on %s", a->host.c_str());
        } else if (!svr.bind_to_port(a->host, port)) {
            fail("cannot listen on %s:%d (in use, or not an address of this machine)", a->host.c_str(), port);
        }
        std::thread signals([&] {
            int sig = 0;
            sigwait(&stop_signals, &sig);
            if (sig != 0) std::fprintf(stderr, "strata: stopping (signal %d)\n", sig);
            svr.stop();
        });
        std::fprintf(stderr, "strata: serving %s at http://%s:%d (%d parallel, context %lld)\n", model_id.c_str(),
                     a->host.c_str(), port, a->parallel, (long long)n_ctx);
        std::fflush(stderr);
        const bool ok = svr.listen_after_bind();
        // Let the signal thread go if listening ended some other way.
        pthread_kill(signals.native_handle(), SIGTERM);
        signals.join();
        sched.stop();
        return ok ? 0 : 1;
    };
}

}  // namespace strata::cli
