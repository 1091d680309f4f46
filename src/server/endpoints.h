// What each route of `strata serve` does with a request, without the transport: a request body becomes either an
// answer at once (tokenize, props, errors...) or a job for the scheduler with a Reply that turns the job's events into
// the answer in the route's API shape (OpenAI chat and completions, OpenAI Responses, Anthropic Messages, llama-server
// infill). The HTTP layer (http.h) calls these; POST routes run on its worker threads, GET routes on its event thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/api.h"
#include "server/scheduler.h"

namespace strata {
class Engine;
class Tokenizer;
class ModelChat;
}  // namespace strata

namespace strata::server {

// Which error shape a route answers with: OpenAI's {"error": {message, type, param, code}} or Anthropic's
// {"type": "error", "error": {type, message}}.
enum class ApiFamily { OpenAI, Anthropic };

// An answer sent as it is.
struct Answer {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
};
Answer json_answer(const ojson &body, int status = 200);
Answer error_answer(ApiFamily family, const ApiError &e);

// A job's events turned into one API's answer. Not streaming: add() takes every event, body() is the answer once
// Done came. Streaming: stream() gives the server-sent-event bytes an event adds (after Done, the end of the
// stream); a failure once the stream has begun can only be stream_error()'s bytes.
class Reply {
public:
    virtual ~Reply() = default;
    virtual void add(const Event &e) = 0;
    virtual std::string body() = 0;
    virtual std::string stream(const Event &e) = 0;
    virtual std::string stream_error(const ApiError &e) = 0;
    virtual ApiFamily family() const { return ApiFamily::OpenAI; }
};

// What a POST route makes of a request: an answer now (job null), or a job whose events become the answer.
struct Outcome {
    Answer answer;
    std::shared_ptr<Job> job;
    std::unique_ptr<Reply> reply;
    bool stream = false;
};

// The error for a job that failed in the scheduler or the engine: 503 shutting_down when the server stopped under
// it (the request may succeed elsewhere or later), 500 when it failed.
ApiError job_error(const Event &e);

// HTTP requests answered, by route and status (for /metrics), and the connection counters.
struct HttpStats {
    std::map<std::pair<std::string, int>, uint64_t> requests;
    int64_t connections_open = 0;
    uint64_t connections_refused = 0;    // over --max-connections
    uint64_t connections_timed_out = 0;  // closed for not sending a whole request within --read-timeout
};

class Endpoints {
public:
    Endpoints(Engine &engine, const Tokenizer &tok, const ModelChat &chat, Scheduler &sched, std::string model_id,
              std::string model_path);
    ~Endpoints();

    // POST routes (worker threads). Bad requests throw ApiError.
    Outcome chat(const ojson &body);
    Outcome completion(const ojson &body);
    Outcome responses(const ojson &body);
    Outcome messages(const ojson &body);
    Answer count_tokens(const ojson &body);  // Anthropic's /v1/messages/count_tokens
    Outcome infill(const ojson &body);
    Answer tokenize(const ojson &body);
    Answer detokenize(const ojson &body);
    Answer apply_template(const ojson &body);

    // GET routes (event thread): quick.
    Answer models() const;
    Answer props() const;
    Answer slots() const;
    Answer metrics(const HttpStats &http) const;

    const std::string &model_id() const { return model_id_; }

private:
    enum class ChatApi { Chat, Responses, Messages };
    Outcome chat_job(ChatRequest cr, PromptEncoder &enc, ChatApi api);

    Engine &engine_;
    const Tokenizer &tok_;
    const ModelChat &chat_;
    Scheduler &sched_;
    std::string model_id_, model_path_;
    int64_t n_ctx_, n_vocab_, created_;
    std::unique_ptr<PromptEncoder> encoder_proto_;
    std::chrono::steady_clock::time_point t_start_;
    // Fill-in-the-middle tokens of the vocabulary (-1: none).
    int32_t fim_pre_ = -1, fim_suf_ = -1, fim_mid_ = -1, fim_rep_ = -1, fim_sep_ = -1;
};

}  // namespace strata::server
