// The routes' work: OpenAI chat and completions, llama-server's utility routes (tokenize, detokenize, apply-template,
// props, slots, infill), the model list and metrics. The Responses and Messages APIs are in responses.cpp and
// messages.cpp; they reuse chat_job().
#include "server/endpoints.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "format/gguf.h"
#include "runtime/engine.h"
#include "server/messages.h"
#include "server/responses.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

Answer json_answer(const ojson &body, int status) {
    Answer a;
    a.status = status;
    a.body = dump(body);
    return a;
}

Answer error_answer(ApiFamily family, const ApiError &e) {
    Answer a = json_answer(family == ApiFamily::Anthropic ? anthropic_error_body(e) : error_body(e), e.status);
    if (e.status == 503 && e.code == "overloaded") a.headers.emplace_back("Retry-After", "1");
    return a;
}

ApiError job_error(const Event &e) {
    if (e.shutting_down)
        return ApiError(503, "The server is shutting down and did not finish this request. Retry later.",
                        "server_error", {}, "shutting_down");
    return ApiError(500, "The server failed on this request: " + e.error, "server_error");
}

namespace {

// OpenAI chat and completions: the Responder's chunks as "data:" lines, then "data: [DONE]".
class OpenAIReply : public Reply {
public:
    explicit OpenAIReply(std::unique_ptr<Responder> r) : r_(std::move(r)) {}
    void add(const Event &e) override { r_->on_event(e); }
    std::string body() override { return dump(r_->body()); }
    std::string stream(const Event &e) override {
        std::string out;
        for (const ojson &c : r_->on_event(e)) out += "data: " + dump(c) + "\n\n";
        if (e.kind != Event::Kind::Text) out += "data: [DONE]\n\n";
        return out;
    }
    std::string stream_error(const ApiError &e) override {
        return "data: " + dump(error_body(e)) + "\n\ndata: [DONE]\n\n";
    }

private:
    std::unique_ptr<Responder> r_;
};

// llama-server's /infill answer: {"content", "stop", ...}; streamed as "data:" lines of {"content", "stop": false},
// ending with the "stop": true one (no [DONE], as llama-server's own routes).
class InfillReply : public Reply {
public:
    InfillReply(std::string model, bool stream) : model_(std::move(model)) { (void)stream; }
    void add(const Event &e) override {
        if (e.kind == Event::Kind::Text) content_ += e.text;
        if (e.kind == Event::Kind::Done) done_ = e;
    }
    std::string body() override { return dump(final_json(content_)); }
    std::string stream(const Event &e) override {
        if (e.kind == Event::Kind::Text)
            return e.text.empty() ? "" : "data: " + dump(ojson{{"content", e.text}, {"stop", false}}) + "\n\n";
        done_ = e;
        return "data: " + dump(final_json("")) + "\n\n";
    }
    std::string stream_error(const ApiError &e) override { return "data: " + dump(error_body(e)) + "\n\n"; }

private:
    ojson final_json(const std::string &content) const {
        const Usage &u = done_.usage;
        return {{"content", content},
                {"stop", true},
                {"stop_type", done_.finish_reason == "length" ? "limit" : "eos"},
                {"model", model_},
                {"tokens_evaluated", u.prompt_tokens},
                {"tokens_predicted", u.completion_tokens},
                {"tokens_cached", u.cached_tokens},
                {"timings",
                 {{"prompt_n", u.prompt_tokens - u.cached_tokens},
                  {"prompt_ms", u.prompt_ms},
                  {"predicted_n", u.completion_tokens},
                  {"predicted_ms", u.gen_ms}}}};
    }
    std::string model_, content_;
    Event done_;
};

const ojson *present(const ojson &o, const char *key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string string_field(const ojson &o, const char *key, bool required) {
    const ojson *v = present(o, key);
    if (!v) {
        if (required)
            throw invalid_request(std::string("Missing required parameter: '") + key + "'.", key,
                                  "missing_required_parameter");
        return {};
    }
    if (!v->is_string())
        throw invalid_request(std::string("Invalid type for '") + key + "': expected a string.", key, "invalid_type");
    return v->get<std::string>();
}

bool bool_field(const ojson &o, const char *key, bool def) {
    const ojson *v = present(o, key);
    if (!v) return def;
    if (!v->is_boolean())
        throw invalid_request(std::string("Invalid type for '") + key + "': expected a boolean.", key, "invalid_type");
    return v->get<bool>();
}

// A token's bytes as JSON: the text when it is valid UTF-8 on its own, else its bytes (as llama-server does).
ojson piece_json(const std::string &s) {
    ojson probe = s;
    try {
        (void)probe.dump();
        return probe;
    } catch (const ojson::exception &) {
        ojson bytes = ojson::array();
        for (unsigned char c : s) bytes.push_back(int(c));
        return bytes;
    }
}

int32_t token_of(const GgufFile &file, const Tokenizer &tok, const char *key, std::initializer_list<const char *> names) {
    if (const GgufValue *v = file.find(key)) {
        const int64_t id = v->as_int(key);
        if (id >= 0 && id < tok.n_vocab()) return int32_t(id);
    }
    for (const char *n : names)
        if (int32_t id = tok.find_token(n); id >= 0) return id;
    return -1;
}

}  // namespace

Endpoints::Endpoints(Engine &engine, const Tokenizer &tok, const ModelChat &chat, Scheduler &sched,
                     std::string model_id, std::string model_path)
    : engine_(engine), tok_(tok), chat_(chat), sched_(sched), model_id_(std::move(model_id)),
      model_path_(std::move(model_path)), n_ctx_(engine.config().n_ctx), n_vocab_(engine.n_vocab()),
      encoder_proto_(std::make_unique<PromptEncoder>(tok)), t_start_(std::chrono::steady_clock::now()) {
    created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count();
    const GgufFile &f = *engine.model().file;
    fim_pre_ = token_of(f, tok, "tokenizer.ggml.fim_pre_token_id", {"<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>"});
    fim_suf_ = token_of(f, tok, "tokenizer.ggml.fim_suf_token_id", {"<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>"});
    fim_mid_ = token_of(f, tok, "tokenizer.ggml.fim_mid_token_id", {"<|fim_middle|>", "<fim_middle>", "<fim-middle>"});
    fim_rep_ = token_of(f, tok, "tokenizer.ggml.fim_rep_token_id", {"<|repo_name|>", "<repo_name>"});
    fim_sep_ = token_of(f, tok, "tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>", "<file_sep>"});
}

Endpoints::~Endpoints() = default;

// ---- chat and completions ----------------------------------------------------------------------------------------

Outcome Endpoints::chat_job(ChatRequest cr, PromptEncoder &enc, ChatApi api) {
    ChatPrompt prompt = render_chat_prompt(chat_, cr, enc);
    if (int64_t(prompt.ids.size()) >= n_ctx_) throw context_error(int64_t(prompt.ids.size()), n_ctx_, "messages");
    ChatOutputParser::Options po;
    po.reasoning = true;
    po.starts_in_reasoning = prompt.opens_reasoning;
    po.tools = cr.parse_tools;
    if (cr.parse_tools) po.tool_schemas = cr.tools;
    po.forced_opening = prompt.forced_opening;
    Outcome o;
    o.stream = cr.stream;
    auto parser = std::make_unique<ChatOutputParser>(po);
    const int64_t n_prompt = int64_t(prompt.ids.size());
    if (api == ChatApi::Responses) {
        o.reply = make_responses_reply(model_id_, cr, std::move(parser), n_prompt);
    } else if (api == ChatApi::Messages) {
        o.reply = make_messages_reply(model_id_, cr, std::move(parser), n_prompt);
    } else {
        o.reply = std::make_unique<OpenAIReply>(std::make_unique<Responder>(
            Responder::Kind::Chat, model_id_, tok_, cr.stream, cr.include_usage, cr.gen.top_logprobs,
            std::move(parser)));
    }
    o.job = std::make_shared<Job>();
    o.job->prompt = std::move(prompt.ids);
    o.job->params = cr.gen;
    return o;
}

Outcome Endpoints::chat(const ojson &body) {
    PromptEncoder enc = *encoder_proto_;
    ChatRequest cr = parse_chat_request(body, enc, n_vocab_);
    return chat_job(std::move(cr), enc, ChatApi::Chat);
}

Outcome Endpoints::responses(const ojson &body) {
    PromptEncoder enc = *encoder_proto_;
    ChatRequest cr = parse_chat_request(responses_to_chat(body), enc, n_vocab_);
    return chat_job(std::move(cr), enc, ChatApi::Responses);
}

Outcome Endpoints::messages(const ojson &body) {
    PromptEncoder enc = *encoder_proto_;
    ChatRequest cr = parse_chat_request(messages_to_chat(body), enc, n_vocab_);
    return chat_job(std::move(cr), enc, ChatApi::Messages);
}

Answer Endpoints::count_tokens(const ojson &body) {
    ojson b = body;
    if (!present(b, "max_tokens")) b["max_tokens"] = 1;  // not needed for counting
    PromptEncoder enc = *encoder_proto_;
    ChatRequest cr = parse_chat_request(messages_to_chat(b), enc, n_vocab_);
    ChatPrompt prompt = render_chat_prompt(chat_, cr, enc);
    return json_answer({{"input_tokens", int64_t(prompt.ids.size())}});
}

Outcome Endpoints::completion(const ojson &body) {
    CompletionRequest cr = parse_completion_request(body, n_vocab_);
    std::vector<int32_t> ids = cr.prompt_ids.empty() ? tok_.encode(cr.prompt, true, true) : cr.prompt_ids;
    if (ids.empty()) throw invalid_request("The prompt is empty after tokenization.", "prompt");
    if (int64_t(ids.size()) >= n_ctx_) throw context_error(int64_t(ids.size()), n_ctx_, "prompt");
    std::string echo;
    if (cr.echo) echo = cr.prompt_ids.empty() ? cr.prompt : tok_.decode(cr.prompt_ids);
    Outcome o;
    o.stream = cr.stream;
    o.reply = std::make_unique<OpenAIReply>(std::make_unique<Responder>(
        Responder::Kind::Completion, model_id_, tok_, cr.stream, cr.include_usage, cr.gen.top_logprobs, nullptr, echo));
    o.job = std::make_shared<Job>();
    o.job->prompt = std::move(ids);
    o.job->params = cr.gen;
    return o;
}

// ---- llama-server's utility routes ---------------------------------------------------------------------------------

Answer Endpoints::tokenize(const ojson &body) {
    const std::string content = string_field(body, "content", true);
    const bool add_special = bool_field(body, "add_special", false);
    const bool parse_special = bool_field(body, "parse_special", true);
    const bool with_pieces = bool_field(body, "with_pieces", false);
    const std::vector<int32_t> ids = tok_.encode(content, add_special, parse_special);
    ojson tokens = ojson::array();
    for (int32_t id : ids) {
        if (with_pieces) tokens.push_back({{"id", id}, {"piece", piece_json(tok_.token_text(id))}});
        else tokens.push_back(id);
    }
    return json_answer({{"tokens", std::move(tokens)}});
}

Answer Endpoints::detokenize(const ojson &body) {
    const ojson *t = present(body, "tokens");
    if (!t) throw invalid_request("Missing required parameter: 'tokens'.", "tokens", "missing_required_parameter");
    if (!t->is_array())
        throw invalid_request("Invalid type for 'tokens': expected an array of token ids.", "tokens", "invalid_type");
    std::vector<int32_t> ids;
    for (const ojson &x : *t) {
        if (!x.is_number_integer())
            throw invalid_request("Invalid type for 'tokens': expected an array of token ids.", "tokens",
                                  "invalid_type");
        const int64_t id = x.get<int64_t>();
        if (id < 0 || id >= n_vocab_)
            throw invalid_request(strfmt("Invalid value for 'tokens': token id %lld is out of range (the vocabulary "
                                         "has %lld tokens).",
                                         (long long)id, (long long)n_vocab_),
                                  "tokens", "invalid_value");
        ids.push_back(int32_t(id));
    }
    return json_answer({{"content", tok_.decode(ids, true)}});
}

Answer Endpoints::apply_template(const ojson &body) {
    PromptEncoder enc = *encoder_proto_;
    ChatRequest cr = parse_chat_request(body, enc, n_vocab_);
    ChatPrompt p = render_chat_prompt(chat_, cr, enc);
    return json_answer({{"prompt", enc.unprotect(p.text)}});
}

Outcome Endpoints::infill(const ojson &body) {
    if (fim_pre_ < 0 || fim_suf_ < 0 || fim_mid_ < 0)
        throw invalid_request("This model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
                              "<|fim_middle|>): /infill is not available for it.",
                              {}, "fim_not_supported");
    const std::string prefix = string_field(body, "input_prefix", false);
    const std::string suffix = string_field(body, "input_suffix", false);
    const std::string start = string_field(body, "prompt", false);  // the beginning of the middle, if any
    std::vector<int32_t> ids;
    auto text = [&](const std::string &s) { tok_.encode(s, false, /*parse_special=*/false, ids); };
    if (const ojson *extra = present(body, "input_extra")) {
        if (!extra->is_array())
            throw invalid_request("Invalid type for 'input_extra': expected an array of {\"filename\", \"text\"}.",
                                  "input_extra", "invalid_type");
        // Repository context as Qwen2.5-Coder was trained on it: <|repo_name|>, then <|file_sep|>NAME\nTEXT per file.
        if (!extra->empty() && fim_rep_ >= 0 && fim_sep_ >= 0) {
            ids.push_back(fim_rep_);
            text("myproject\n");
        }
        for (size_t i = 0; i < extra->size(); i++) {
            const ojson &ch = (*extra)[i];
            const std::string p = strfmt("input_extra[%zu]", i);
            if (!ch.is_object())
                throw invalid_request("Invalid type for '" + p + "': expected an object.", p, "invalid_type");
            const std::string name = string_field(ch, "filename", false), t = string_field(ch, "text", false);
            if (fim_sep_ >= 0) {
                ids.push_back(fim_sep_);
                text(name + "\n" + t);
            } else {
                text(t);
            }
        }
        if (!extra->empty() && fim_sep_ >= 0) ids.push_back(fim_sep_);
    }
    ids.push_back(fim_pre_);
    text(prefix);
    ids.push_back(fim_suf_);
    text(suffix);
    ids.push_back(fim_mid_);
    text(start);

    ojson b = body;
    for (const char *k : {"input_prefix", "input_suffix", "input_extra", "prompt"}) b.erase(k);
    if (const ojson *n = present(body, "n_predict")) {  // llama-server's name; -1: no limit
        b.erase("n_predict");
        if (!n->is_number_integer())
            throw invalid_request("Invalid type for 'n_predict': expected an integer.", "n_predict", "invalid_type");
        if (n->get<int64_t>() >= 0 && !present(body, "max_tokens")) b["max_tokens"] = std::max<int64_t>(1, *n);
    }
    if (!present(b, "max_tokens")) b["max_tokens"] = n_ctx_;  // up to the end of the context
    b["prompt"] = ids;
    CompletionRequest cr = parse_completion_request(b, n_vocab_);
    if (int64_t(ids.size()) >= n_ctx_) throw context_error(int64_t(ids.size()), n_ctx_, "input_prefix");
    Outcome o;
    o.stream = cr.stream;
    o.reply = std::make_unique<InfillReply>(model_id_, cr.stream);
    o.job = std::make_shared<Job>();
    o.job->prompt = std::move(ids);
    o.job->params = cr.gen;
    return o;
}

Answer Endpoints::models() const {
    ojson m = {{"id", model_id_}, {"object", "model"}, {"created", created_}, {"owned_by", "strata"}};
    m["meta"] = {{"n_ctx", n_ctx_},
                 {"n_parallel", engine_.config().n_seq_max},
                 {"n_vocab", n_vocab_},
                 {"architecture", engine_.hparams().arch_name},
                 {"chat_template", chat_.has_template()}};
    return json_answer({{"object", "list"}, {"data", ojson::array({m})}});
}

Answer Endpoints::props() const {
    auto token_str = [&](int32_t id) { return id >= 0 ? tok_.token_text(id) : std::string(); };
    ojson p;
    p["default_generation_settings"] = {{"n_ctx", n_ctx_},
                                        {"params",
                                         {{"temperature", 1.0},
                                          {"top_k", 0},
                                          {"top_p", 1.0},
                                          {"min_p", 0.0},
                                          {"repeat_penalty", 1.0},
                                          {"n_predict", -1}}}};
    p["total_slots"] = engine_.config().n_seq_max;
    p["model_path"] = model_path_;
    p["model_alias"] = model_id_;
    p["chat_template"] = chat_.info().chat_template;
    p["bos_token"] = token_str(tok_.bos());
    p["eos_token"] = token_str(tok_.eos());
    p["n_vocab"] = n_vocab_;
    p["architecture"] = engine_.hparams().arch_name;
    p["modalities"] = {{"vision", false}, {"audio", false}};
    p["infill"] = fim_pre_ >= 0 && fim_suf_ >= 0 && fim_mid_ >= 0;
    p["build_info"] = "strata";
    return json_answer(p);
}

Answer Endpoints::slots() const {
    ojson out = ojson::array();
    for (const SlotState &s : sched_.stats().slots)
        out.push_back({{"id", s.id},
                       {"n_ctx", n_ctx_},
                       {"is_processing", s.running},
                       {"n_cached_tokens", s.n_cached},
                       {"n_prompt_tokens", s.n_prompt},
                       {"n_prompt_tokens_reused", s.n_prompt_reused},
                       {"n_prompt_tokens_processed", s.n_prompt_computed},
                       {"n_decoded", s.n_generated}});
    return json_answer(out);
}

// ---- metrics -------------------------------------------------------------------------------------------------------

Answer Endpoints::metrics(const HttpStats &http) const {
    const SchedulerStats s = sched_.stats();
    const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
    std::string out;
    auto metric = [&](const char *name, const char *type, const char *help, double v) {
        if (std::isnan(v))
            out += strfmt("# HELP %s %s\n# TYPE %s %s\n%s NaN\n", name, help, name, type, name);
        else
            out += strfmt("# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
    };
    out +=
        "# HELP strata_http_requests_total HTTP requests answered, by route (\"unknown\": no route) and status.\n"
        "# TYPE strata_http_requests_total counter\n";
    for (const auto &[key, n] : http.requests)
        out += strfmt("strata_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", key.first.c_str(), key.second,
                      (unsigned long long)n);
    metric("strata_http_connections_open", "gauge", "TCP connections open now.", double(http.connections_open));
    metric("strata_http_connections_refused_total", "counter",
           "Connections refused with 503 because --max-connections were open.", double(http.connections_refused));
    metric("strata_http_connections_timed_out_total", "counter",
           "Connections closed for not sending a whole request within --read-timeout.",
           double(http.connections_timed_out));
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
    metric("strata_expert_cache_hit_ratio", "gauge",
           "Expert lookups served from device memory over all lookups, the last 10 s (NaN: none).",
           s.expert_hit_ratio);
    metric("strata_expert_cpu_share", "gauge",
           "Share of the expert-cache misses the CPU computed instead of streaming them, the last 10 s (NaN: none).",
           s.expert_cpu_share);
    metric("strata_streamed_gigabytes_per_second", "gauge",
           "Weight bytes streamed to the device per second, in GB (1e9 bytes), the last 10 s.", s.streamed_gb_per_s);
    metric("strata_expert_misses_mapped_total", "counter",
           "Expert-cache misses the device's kernels read in place from the pinned host copy (in the misses above).",
           double(s.backend.mapped_misses));
    metric("strata_expert_misses_admitted_total", "counter",
           "Misses read in place then filled into a slot for later passes (admission, under the LFU policy).",
           double(s.backend.mapped_admitted));
    metric("strata_expert_favourite_fills_total", "counter",
           "Experts filled into the cache as decoding began, for the experts the prompts routed most rows to.",
           double(s.backend.favourite_fills));
    metric("strata_decode_passes_alone_total", "counter",
           "Passes of up to 16 tokens (decoding steps, short prompt tails) the device ran alone, its misses read in "
           "place, where it could also split with the CPU.",
           double(s.backend.decode_modes.alone));
    metric("strata_decode_passes_split_total", "counter",
           "Passes of up to 16 tokens split with the CPU where the device could also run them alone.",
           double(s.backend.decode_modes.split));
    metric("strata_expert_misses_on_host_total", "counter",
           "Expert-cache misses decoding computed on the CPU instead of streaming them (not in the misses above).",
           double(s.backend.hybrid.host_experts));
    metric("strata_expert_host_bytes_total", "counter", "Expert bytes the CPU read for the misses it computed.",
           double(s.backend.hybrid.host_bytes));
    metric("strata_expert_host_seconds_total", "counter", "Time the CPU spent computing experts.",
           s.backend.hybrid.host_ms / 1e3);
    metric("strata_prefetch_picks_total", "counter",
           "Routed expert picks with a next-layer prediction (STRATA_DECODE_PREFETCH=1; 0 when off).",
           double(s.backend.prefetch.picks));
    metric("strata_prefetch_predicted_total", "counter", "Routed expert picks the next-layer prediction named.",
           double(s.backend.prefetch.predicted));
    metric("strata_prefetch_filled_total", "counter", "Experts filled ahead because the prediction named them.",
           double(s.backend.prefetch.prefetched));
    metric("strata_uptime_seconds", "gauge", "Seconds since the server started.", uptime);
    Answer a;
    a.content_type = "text/plain; version=0.0.4";
    a.body = std::move(out);
    return a;
}

}  // namespace strata::server
