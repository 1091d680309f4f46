// Request checking and response building for /v1/chat/completions and /v1/completions.
#include "server/api.h"

#include <chrono>
#include <cmath>
#include <random>

#include "core/error.h"
#include "grammar/constraint.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

ApiError invalid_request(std::string message, std::string param, std::string code) {
    return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}

ojson error_body(const ApiError &e) {
    ojson err = ojson::object();
    err["message"] = e.what();
    err["type"] = e.type;
    err["param"] = e.param.empty() ? ojson() : ojson(e.param);
    err["code"] = e.code.empty() ? ojson() : ojson(e.code);
    return ojson{{"error", err}};
}

std::string dump(const ojson &j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson parse_body(const std::string &body) {
    ojson j = ojson::parse(body, nullptr, false);
    if (j.is_discarded())
        throw invalid_request("We could not parse the JSON body of your request. The body must be a JSON object.",
                              {}, "invalid_json");
    if (!j.is_object()) throw invalid_request("The request body must be a JSON object.", {}, "invalid_json");
    return j;
}

ApiError context_error(int64_t n_prompt, int64_t n_ctx, const char *param) {
    return invalid_request(strfmt("This model's maximum context length is %lld tokens. However, your %s resulted in "
                                  "%lld tokens. Please reduce the length of the %s.",
                                  (long long)n_ctx, param, (long long)n_prompt, param),
                           param, "context_length_exceeded");
}

namespace {

const char *type_name(const ojson &v) {
    switch (v.type()) {
        case ojson::value_t::null: return "null";
        case ojson::value_t::boolean: return "a boolean";
        case ojson::value_t::string: return "a string";
        case ojson::value_t::array: return "an array";
        case ojson::value_t::object: return "an object";
        default: return "a number";
    }
}

ApiError wrong_type(const std::string &param, const char *expected, const ojson &got) {
    return invalid_request(
        strfmt("Invalid type for '%s': expected %s, but got %s instead.", param.c_str(), expected, type_name(got)),
        param, "invalid_type");
}

ApiError bad_value(const std::string &param, const std::string &why) {
    return invalid_request(strfmt("Invalid value for '%s': %s", param.c_str(), why.c_str()), param,
                           "invalid_value");
}

// Present and not null.
const ojson *field(const ojson &o, const char *key) {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return nullptr;
    return &*it;
}

bool get_bool(const ojson &o, const char *key, bool def) {
    const ojson *v = field(o, key);
    if (!v) return def;
    if (!v->is_boolean()) throw wrong_type(key, "a boolean", *v);
    return v->get<bool>();
}

double get_number(const ojson &o, const char *key, double def, double lo, double hi) {
    const ojson *v = field(o, key);
    if (!v) return def;
    if (!v->is_number()) throw wrong_type(key, "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) throw bad_value(key, strfmt("expected a number in [%g, %g], got %g", lo, hi, x));
    return x;
}

int64_t get_int(const ojson &o, const char *key, int64_t def, int64_t lo, int64_t hi) {
    const ojson *v = field(o, key);
    if (!v) return def;
    if (!v->is_number_integer()) {
        // 2.0 is an integer too, as JSON clients may send it.
        if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
            std::fabs(v->get<double>()) < 9e15)
            return get_int(ojson{{key, int64_t(v->get<double>())}}, key, def, lo, hi);
        throw wrong_type(key, "an integer", *v);
    }
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
    if (x < lo || x > hi)
        throw bad_value(key, strfmt("expected an integer in [%lld, %lld], got %lld", (long long)lo, (long long)hi,
                                    (long long)x));
    return x;
}

std::string get_string(const ojson &o, const char *key, const std::string &def = {}) {
    const ojson *v = field(o, key);
    if (!v) return def;
    if (!v->is_string()) throw wrong_type(key, "a string", *v);
    return v->get<std::string>();
}

// Fields of llama-server and other servers that change what is generated and that this server does not implement:
// refused unless they ask for nothing (their "off" value), since ignoring them would silently answer another
// question. Fields nobody implements are ignored, as clients send extras.
void refuse_unsupported(const ojson &body) {
    struct Off {
        const char *key;
        double off;
    };
    static const Off fields[] = {{"n_probs", 0},         {"mirostat", 0},       {"typical_p", 1},
                                 {"tfs_z", 1},           {"dynatemp_range", 0}, {"xtc_probability", 0},
                                 {"dry_multiplier", 0},  {"top_n_sigma", -1},   {"n_indent", 0}};
    for (const Off &f : fields) {
        const ojson *v = field(body, f.key);
        if (!v) continue;
        if (v->is_number() && v->get<double>() == f.off) continue;
        throw invalid_request(strfmt("'%s' is not supported by this server (it would change what is generated); "
                                     "leave it out.",
                                     f.key),
                              f.key, "unsupported_parameter");
    }
    for (const char *k : {"samplers", "id_slot", "lora", "image_data", "audio", "modalities", "prediction"})
        if (field(body, k))
            throw invalid_request(strfmt("'%s' is not supported by this server; leave it out.", k), k,
                                  "unsupported_parameter");
}

void parse_common(const ojson &body, CommonRequest &r, int64_t n_vocab, bool chat) {
    refuse_unsupported(body);
    get_string(body, "model");  // any name is accepted: one model is served
    if (get_int(body, "n", 1, 1, 128) != 1) throw bad_value("n", "only n=1 is supported");
    if (get_int(body, "best_of", 1, 1, 128) != 1) throw bad_value("best_of", "only best_of=1 is supported");
    r.stream = get_bool(body, "stream", false);
    if (const ojson *so = field(body, "stream_options")) {
        if (!so->is_object()) throw wrong_type("stream_options", "an object", *so);
        r.include_usage = get_bool(*so, "include_usage", false);
    }
    SamplerParams &sp = r.gen.sampling;
    sp.temperature = float(get_number(body, "temperature", 1.0, 0.0, 2.0));
    sp.top_p = float(get_number(body, "top_p", 1.0, 0.0, 1.0));
    if (sp.top_p <= 0) {  // nothing but the most likely token
        sp.top_p = 1.0f;
        sp.temperature = 0.0f;
    }
    sp.top_k = int32_t(get_int(body, "top_k", 0, -1, 1 << 30));
    sp.min_p = float(get_number(body, "min_p", 0.0, 0.0, 1.0));
    sp.presence_penalty = float(get_number(body, "presence_penalty", 0.0, -2.0, 2.0));
    sp.frequency_penalty = float(get_number(body, "frequency_penalty", 0.0, -2.0, 2.0));
    sp.repeat_penalty = float(get_number(body, "repetition_penalty", 1.0, 1e-3, 100.0));
    sp.repeat_last_n = 1 << 30;  // penalties see the whole completion
    if (field(body, "seed")) sp.seed = uint64_t(get_int(body, "seed", 0, INT64_MIN, INT64_MAX));
    else sp.seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);

    // max_completion_tokens (chat) wins over the older max_tokens.
    int64_t max_tokens = get_int(body, "max_tokens", chat ? -1 : 16, 1, INT32_MAX);
    if (chat) max_tokens = get_int(body, "max_completion_tokens", max_tokens, 1, INT32_MAX);
    r.gen.max_tokens = max_tokens;

    if (const ojson *st = field(body, "stop")) {
        if (st->is_string()) {
            r.gen.stop.push_back(st->get<std::string>());
        } else if (st->is_array()) {
            if (st->size() > 4) throw bad_value("stop", "at most 4 stop sequences");
            for (const ojson &s : *st) {
                if (!s.is_string()) throw wrong_type("stop", "a string or an array of strings", s);
                r.gen.stop.push_back(s.get<std::string>());
            }
        } else {
            throw wrong_type("stop", "a string or an array of strings", *st);
        }
    }
    if (const ojson *lb = field(body, "logit_bias")) {
        if (!lb->is_object()) throw wrong_type("logit_bias", "an object", *lb);
        for (auto it = lb->begin(); it != lb->end(); ++it) {
            char *end = nullptr;
            const long id = std::strtol(it.key().c_str(), &end, 10);
            if (it.key().empty() || *end || id < 0 || id >= n_vocab)
                throw bad_value("logit_bias", "'" + it.key() + "' is not a token id of this model");
            if (!it.value().is_number()) throw wrong_type("logit_bias", "numbers as values", it.value());
            const double b = it.value().get<double>();
            if (!(b >= -100 && b <= 100)) throw bad_value("logit_bias", "biases must be in [-100, 100]");
            r.gen.logit_bias.emplace_back(int32_t(id), float(b));
        }
    }
    try {
        validate(sp);
    } catch (const Error &e) {
        throw invalid_request(e.what());
    }
}

// Text of a message's content: a string, or the text parts of an array.
std::string content_text(const ojson &content, const std::string &param) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) throw wrong_type(param, "a string or an array of content parts", content);
    std::string out;
    for (const ojson &part : content) {
        if (!part.is_object()) throw wrong_type(param, "content parts as objects", part);
        const std::string type = get_string(part, "type");
        if (type != "text")
            throw bad_value(param, "content parts of type '" + type + "' are not supported (text only)");
        const ojson *t = field(part, "text");
        if (!t || !t->is_string()) throw wrong_type(param + ".text", "a string", t ? *t : ojson());
        out += t->get<std::string>();
    }
    return out;
}

}  // namespace

ChatRequest parse_chat_request(const ojson &body, PromptEncoder &enc, int64_t n_vocab) {
    ChatRequest r;
    parse_common(body, r, n_vocab, true);
    r.output_format = parse_output_format(body);  // a constraint once the template is known (render_chat_prompt)
    r.logprobs = get_bool(body, "logprobs", false);
    const int64_t top = get_int(body, "top_logprobs", -1, 0, 20);
    if (top >= 0 && !r.logprobs) throw bad_value("top_logprobs", "logprobs must be true to use top_logprobs");
    if (r.logprobs) r.gen.top_logprobs = int32_t(std::max<int64_t>(top, 0));

    const ojson *msgs = field(body, "messages");
    if (!msgs) throw invalid_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter");
    if (!msgs->is_array()) throw wrong_type("messages", "an array", *msgs);
    if (msgs->empty()) throw bad_value("messages", "expected at least one message");
    for (size_t i = 0; i < msgs->size(); i++) {
        const ojson &m = (*msgs)[i];
        const std::string p = strfmt("messages[%zu]", i);
        if (!m.is_object()) throw wrong_type(p, "an object", m);
        const ojson *role_v = field(m, "role");
        if (!role_v) throw invalid_request("Missing required parameter: '" + p + ".role'.", p + ".role",
                                           "missing_required_parameter");
        if (!role_v->is_string()) throw wrong_type(p + ".role", "a string", *role_v);
        std::string role = role_v->get<std::string>();
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant" && role != "tool")
            throw bad_value(p + ".role", "'" + role + "' is not one of 'system', 'developer', 'user', 'assistant', 'tool'");
        ojson out = ojson::object();
        out["role"] = role;
        const ojson *content = field(m, "content");
        const ojson *calls = field(m, "tool_calls");
        if (!content && !(role == "assistant" && calls))
            throw invalid_request("Missing required parameter: '" + p + ".content'.", p + ".content",
                                  "missing_required_parameter");
        std::string text = content ? content_text(*content, p + ".content") : std::string();
        out["content"] = role == "assistant" ? text : enc.protect(text);
        if (role == "assistant") {
            if (const ojson *rc = field(m, "reasoning_content")) {
                if (!rc->is_string()) throw wrong_type(p + ".reasoning_content", "a string", *rc);
                out["reasoning_content"] = *rc;
            }
            if (calls) {
                if (!calls->is_array()) throw wrong_type(p + ".tool_calls", "an array", *calls);
                ojson tc = ojson::array();
                for (const ojson &c : *calls) {
                    if (!c.is_object()) throw wrong_type(p + ".tool_calls", "an array of objects", c);
                    const ojson *fn = field(c, "function");
                    if (!fn || !fn->is_object())
                        throw wrong_type(p + ".tool_calls.function", "an object", fn ? *fn : ojson());
                    const std::string name = get_string(*fn, "name");
                    if (name.empty())
                        throw invalid_request("Missing required parameter: '" + p + ".tool_calls.function.name'.",
                                              p + ".tool_calls.function.name", "missing_required_parameter");
                    ojson args = ojson::object();
                    if (const ojson *a = field(*fn, "arguments")) {
                        if (a->is_string()) {  // templates want the object; keep text that is not one as text
                            ojson parsed = ojson::parse(a->get<std::string>(), nullptr, false);
                            args = parsed.is_object() ? parsed : *a;
                        } else if (a->is_object()) {
                            args = *a;
                        } else {
                            throw wrong_type(p + ".tool_calls.function.arguments", "a string", *a);
                        }
                    }
                    ojson call = {{"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
                    if (const ojson *id = field(c, "id")) call["id"] = *id;
                    tc.push_back(std::move(call));
                }
                out["tool_calls"] = std::move(tc);
            }
        }
        if (role == "tool") {
            if (const ojson *id = field(m, "tool_call_id")) out["tool_call_id"] = *id;
        }
        if (const ojson *name = field(m, "name"))
            if (name->is_string()) out["name"] = *name;
        r.messages.push_back(std::move(out));
    }

    std::string choice = "auto", named;  // named: the function of {"type": "function", "function": {"name": ...}}
    if (const ojson *tc = field(body, "tool_choice")) {
        if (tc->is_string()) {
            choice = tc->get<std::string>();
            if (choice != "none" && choice != "auto" && choice != "required")
                throw bad_value("tool_choice", "expected 'none', 'auto', 'required' or a function");
        } else if (tc->is_object()) {
            if (get_string(*tc, "type", "function") != "function")
                throw bad_value("tool_choice.type", "only 'function' can be chosen");
            const ojson *fn = field(*tc, "function");
            if (!fn || !fn->is_object()) throw wrong_type("tool_choice.function", "an object", fn ? *fn : ojson());
            named = get_string(*fn, "name");
            if (named.empty())
                throw invalid_request("Missing required parameter: 'tool_choice.function.name'.",
                                      "tool_choice.function.name", "missing_required_parameter");
            choice = "function";
        } else {
            throw wrong_type("tool_choice", "a string or an object", *tc);
        }
    }
    const ojson *tools = field(body, "tools");
    if (tools) {
        if (!tools->is_array()) throw wrong_type("tools", "an array", *tools);
        for (size_t i = 0; i < tools->size(); i++) {
            const ojson &t = (*tools)[i];
            const std::string p = strfmt("tools[%zu]", i);
            if (!t.is_object()) throw wrong_type(p, "an object", t);
            if (get_string(t, "type", "function") != "function")
                throw bad_value(p + ".type", "only 'function' tools are supported");
            const ojson *fn = field(t, "function");
            if (!fn || !fn->is_object()) throw wrong_type(p + ".function", "an object", fn ? *fn : ojson());
            if (get_string(*fn, "name").empty())
                throw invalid_request("Missing required parameter: '" + p + ".function.name'.", p + ".function.name",
                                      "missing_required_parameter");
            if (const ojson *params = field(*fn, "parameters"); params && !params->is_object())
                throw wrong_type(p + ".function.parameters", "a JSON Schema object", *params);
        }
        if (!tools->empty() && choice != "none") {
            r.tools = *tools;
            r.parse_tools = true;
        }
    }
    if (choice == "required" || choice == "function") {
        if (!r.parse_tools)
            throw bad_value("tool_choice", "'tool_choice' is only allowed when 'tools' are specified.");
        if (choice == "function" && std::none_of(tools->begin(), tools->end(), [&](const ojson &t) {
                return t["function"]["name"] == named;
            }))
            throw bad_value("tool_choice", "no function named '" + named + "' in 'tools'.");
        r.force_tool_call = true;
        // "required" with one tool can only call that one: name it, so the model writes just the arguments.
        if (choice == "function") r.forced_tool = named;
        else if (tools->size() == 1) r.forced_tool = (*tools)[0]["function"]["name"].get<std::string>();
    }
    if (const ojson *kw = field(body, "chat_template_kwargs")) {
        if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
        r.template_kwargs = *kw;
    }
    return r;
}

CompletionRequest parse_completion_request(const ojson &body, int64_t n_vocab) {
    CompletionRequest r;
    parse_common(body, r, n_vocab, false);
    r.gen.constraint = output_constraint(parse_output_format(body));  // response_format, grammar, json_schema
    r.echo = get_bool(body, "echo", false);
    r.logprobs = int32_t(get_int(body, "logprobs", -1, 0, 20));
    r.gen.top_logprobs = r.logprobs;
    if (field(body, "suffix")) throw bad_value("suffix", "suffix is not supported");
    const ojson *p = field(body, "prompt");
    if (!p) throw invalid_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
    auto ids_of = [&](const ojson &a) {
        std::vector<int32_t> ids;
        for (const ojson &x : a) {
            if (!x.is_number_integer()) throw wrong_type("prompt", "a string or an array of token ids", x);
            const int64_t id = x.get<int64_t>();
            if (id < 0 || id >= n_vocab) throw bad_value("prompt", strfmt("token id %lld is out of range", (long long)id));
            ids.push_back(int32_t(id));
        }
        return ids;
    };
    if (p->is_string()) {
        r.prompt = p->get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_string()) {
        if (p->size() != 1) throw bad_value("prompt", "only one prompt per request is supported");
        r.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_array()) {
        if (p->size() != 1) throw bad_value("prompt", "only one prompt per request is supported");
        r.prompt_ids = ids_of((*p)[0]);
    } else if (p->is_array()) {
        r.prompt_ids = ids_of(*p);
    } else {
        throw wrong_type("prompt", "a string or an array of token ids", *p);
    }
    if (r.prompt.empty() && r.prompt_ids.empty()) throw bad_value("prompt", "the prompt is empty");
    return r;
}

namespace {
// An empty reasoning block, as templates write one with thinking off.
void close_reasoning(std::string &text) {
    if (prompt_opens_reasoning(text)) text += std::string(text.ends_with('\n') ? "\n" : "") + "</think>\n\n";
}

// The prompt goes on inside a call, as the template's format writes one. The function's name comes from the request:
// protected like message text, so a name cannot forge control tokens.
void start_forced_call(ChatPrompt &p, const ModelChat &chat, const std::string &name, PromptEncoder &enc) {
    const ToolFormat format = tool_format_of(chat.info().chat_template);
    close_reasoning(p.text);
    p.text += "<tool_call>" + forced_call_opening(format, enc.protect(name));
    p.forced_opening = forced_call_opening(format, name);
}
}  // namespace

ChatPrompt render_chat_prompt(const ModelChat &chat, ChatRequest &req, PromptEncoder &enc) {
    ChatPrompt p;
    try {
        p.text = chat.render(req.messages, req.tools, true, req.template_kwargs);
    } catch (const Error &e) {
        throw invalid_request(std::string("The chat template could not render these messages: ") + e.what(),
                              "messages");
    }
    if (req.force_tool_call) start_forced_call(p, chat, req.forced_tool, enc);
    // Constrained decoding (server/constraint_fields.h).
    req.gen.constraint = chat_constraint(req.output_format, req.parse_tools ? req.tools : ojson(),
                                         tool_format_of(chat.info().chat_template), req.force_tool_call,
                                         req.forced_tool, prompt_opens_reasoning(p.text));
    if (req.gen.constraint && req.gen.constraint->trigger.empty()) close_reasoning(p.text);
    p.ids = enc.encode(p.text, false);
    p.opens_reasoning = prompt_opens_reasoning(p.text);
    if (p.ids.empty()) throw bad_value("messages", "the rendered prompt is empty");
    return p;
}

// ---- Responder ---------------------------------------------------------------------------------------------------

namespace {
std::string random_id(const char *prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id = prefix;
    for (int i = 0; i < 24; i++) id += alphabet[rng() % (sizeof(alphabet) - 1)];
    return id;
}

ojson usage_json(const Usage &u) {
    ojson j = {{"prompt_tokens", u.prompt_tokens},
               {"completion_tokens", u.completion_tokens},
               {"total_tokens", u.prompt_tokens + u.completion_tokens},
               {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
    return j;
}

ojson timings_json(const Usage &u) {
    return {{"prompt_n", u.prompt_tokens - u.cached_tokens},
            {"prompt_ms", u.prompt_ms},
            {"predicted_n", u.completion_tokens},
            {"predicted_ms", u.gen_ms},
            {"predicted_per_second", u.gen_ms > 0 ? double(u.completion_tokens) * 1e3 / u.gen_ms : 0.0}};
}

ojson tool_call_json(const ToolCall &c) {
    return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// A streamed piece of a call, as OpenAI streams them: the first one with the call's id, type and name, later ones
// with arguments text only.
ojson tool_call_delta_json(const ToolCallDelta &c) {
    ojson j = {{"index", c.index}};
    if (!c.id.empty()) {
        j["id"] = c.id;
        j["type"] = "function";
        j["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
        j["function"] = {{"arguments", c.arguments}};
    }
    return j;
}
}  // namespace

Responder::Responder(Kind kind, std::string model, const Tokenizer &tok, bool stream, bool include_usage,
                     int32_t top_logprobs, std::unique_ptr<ChatOutputParser> parser, std::string echo_prefix)
    : kind_(kind), model_(std::move(model)), tok_(tok), stream_(stream), include_usage_(include_usage),
      top_logprobs_(top_logprobs), parser_(std::move(parser)) {
    id_ = random_id(kind == Kind::Chat ? "chatcmpl-" : "cmpl-");
    created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count();
    text_ = std::move(echo_prefix);
    if (kind_ == Kind::Completion)
        logprobs_ = {{"tokens", ojson::array()},
                     {"token_logprobs", ojson::array()},
                     {"top_logprobs", ojson::array()},
                     {"text_offset", ojson::array()}};
    else
        logprobs_ = {{"content", ojson::array()}};
}

ojson Responder::chunk(ojson choice) const {
    ojson c = {{"id", id_},
               {"object", kind_ == Kind::Chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"system_fingerprint", "strata"}};
    c["choices"] = ojson::array({std::move(choice)});
    if (include_usage_) c["usage"] = nullptr;
    return c;
}

ojson Responder::logprob_entry(const TokenLogprob &t) const {
    auto bytes_of = [](const std::string &s) {
        ojson b = ojson::array();
        for (unsigned char ch : s) b.push_back(int(ch));
        return b;
    };
    const std::string text = tok_.token_text(t.id);
    ojson e = {{"token", text}, {"logprob", t.logprob}, {"bytes", bytes_of(text)}};
    ojson top = ojson::array();
    for (auto [id, lp] : t.top) {
        const std::string s = tok_.token_text(id);
        top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
    }
    e["top_logprobs"] = std::move(top);
    return e;
}

void Responder::add_logprobs(const std::vector<TokenLogprob> &lp, size_t text_offset) {
    for (const TokenLogprob &t : lp) {
        if (kind_ == Kind::Chat) {
            logprobs_["content"].push_back(logprob_entry(t));
        } else {
            const std::string text = tok_.token_text(t.id);
            logprobs_["tokens"].push_back(text);
            logprobs_["token_logprobs"].push_back(t.logprob);
            ojson top = ojson::object();
            for (auto [id, l] : t.top) top[tok_.token_text(id)] = l;
            logprobs_["top_logprobs"].push_back(std::move(top));
            logprobs_["text_offset"].push_back(text_offset);
            text_offset += text.size();
        }
    }
}

std::vector<ojson> Responder::on_event(const Event &e) {
    std::vector<ojson> out;
    const bool want_lp = top_logprobs_ >= 0;
    if (kind_ == Kind::Chat && stream_ && !sent_role_) {
        sent_role_ = true;
        out.push_back(chunk({{"index", 0},
                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                             {"logprobs", nullptr},
                             {"finish_reason", nullptr}}));
    }
    if (e.kind == Event::Kind::Text || e.kind == Event::Kind::Done) {
        ChatOutputParser::Delta d;
        if (kind_ == Kind::Chat) {
            if (parser_) d = e.kind == Event::Kind::Text ? parser_->push(e.text) : parser_->finish();
            else d.content = e.text;
        } else {
            d.content = e.text;
        }
        const size_t offset = text_.size();
        text_ += d.content;
        reasoning_ += d.reasoning;
        for (const ToolCallDelta &c : d.tool_calls) {
            if (!c.id.empty()) calls_.push_back({c.id, c.name, {}});
            STRATA_ASSERT(c.index + 1 == calls_.size());  // pieces of the last call begun
            calls_.back().arguments += c.arguments;
        }
        ojson lp_delta;
        if (want_lp && !e.tokens.empty()) {
            const size_t before = kind_ == Kind::Chat ? logprobs_["content"].size() : logprobs_["tokens"].size();
            add_logprobs(e.tokens, offset);
            if (stream_) {
                if (kind_ == Kind::Chat) {
                    lp_delta = {{"content", ojson::array()}};
                    for (size_t i = before; i < logprobs_["content"].size(); i++)
                        lp_delta["content"].push_back(logprobs_["content"][i]);
                } else {
                    lp_delta = ojson::object();
                    for (const char *k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
                        lp_delta[k] = ojson::array();
                        for (size_t i = before; i < logprobs_[k].size(); i++) lp_delta[k].push_back(logprobs_[k][i]);
                    }
                }
            }
        }
        if (stream_ && (!d.empty() || !lp_delta.is_null())) {
            if (kind_ == Kind::Chat) {
                ojson delta = ojson::object();
                if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
                if (!d.content.empty()) delta["content"] = d.content;
                if (!d.tool_calls.empty()) {
                    delta["tool_calls"] = ojson::array();
                    for (const ToolCallDelta &c : d.tool_calls) delta["tool_calls"].push_back(tool_call_delta_json(c));
                }
                out.push_back(chunk({{"index", 0}, {"delta", delta}, {"logprobs", lp_delta}, {"finish_reason", nullptr}}));
            } else {
                out.push_back(chunk({{"text", d.content}, {"index", 0}, {"logprobs", lp_delta}, {"finish_reason", nullptr}}));
            }
        }
    }
    if (e.kind == Event::Kind::Done) {
        done_ = true;
        usage_ = e.usage;
        finish_ = e.finish_reason;
        if (!calls_.empty() && finish_ == "stop") finish_ = "tool_calls";
        if (stream_) {
            ojson last = kind_ == Kind::Chat
                             ? ojson{{"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", finish_}}
                             : ojson{{"text", ""}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_}};
            ojson c = chunk(std::move(last));
            c["timings"] = timings_json(usage_);
            out.push_back(std::move(c));
            if (include_usage_) {
                ojson u = chunk(ojson());
                u["choices"] = ojson::array();
                u["usage"] = usage_json(usage_);
                out.push_back(std::move(u));
            }
        }
    }
    return out;
}

ojson Responder::body() const {
    ojson choice = ojson::object();
    choice["index"] = 0;
    if (kind_ == Kind::Chat) {
        ojson msg = {{"role", "assistant"}};
        msg["content"] = text_.empty() && !calls_.empty() ? ojson() : ojson(text_);
        if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
        if (!calls_.empty()) {
            msg["tool_calls"] = ojson::array();
            for (const ToolCall &c : calls_) msg["tool_calls"].push_back(tool_call_json(c));
        }
        choice["message"] = std::move(msg);
    } else {
        choice["text"] = text_;
    }
    choice["logprobs"] = top_logprobs_ >= 0 ? logprobs_ : ojson();
    choice["finish_reason"] = finish_;
    ojson b = {{"id", id_},
               {"object", kind_ == Kind::Chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_},
               {"system_fingerprint", "strata"}};
    b["choices"] = ojson::array({std::move(choice)});
    b["usage"] = usage_json(usage_);
    b["timings"] = timings_json(usage_);
    return b;
}

}  // namespace strata::server
