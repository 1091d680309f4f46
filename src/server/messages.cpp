// Anthropic's Messages API over the chat machinery: content blocks to chat messages, the output parser's deltas to
// thinking, text and tool_use blocks and to Anthropic's stream events.
#include "server/messages.h"

#include <algorithm>
#include <random>

#include "core/error.h"

namespace strata::server {

namespace {

const ojson *present(const ojson &o, const char *key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}

ApiError wrong(const std::string &param, const std::string &expected) {
    return invalid_request(param + ": expected " + expected + ".", param, "invalid_type");
}

std::string random_id(const char *prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id = prefix;
    for (int i = 0; i < 24; i++) id += alphabet[rng() % (sizeof(alphabet) - 1)];
    return id;
}

// The text of a string or of an array of text blocks (system prompts, tool results).
std::string blocks_text(const ojson &c, const std::string &param) {
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) throw wrong(param, "a string or an array of text blocks");
    std::string out;
    for (size_t i = 0; i < c.size(); i++) {
        const std::string p = strfmt("%s.%zu", param.c_str(), i);
        if (!c[i].is_object() || c[i].value("type", "") != "text")
            throw invalid_request(p + ": only text blocks are supported here.", p, "invalid_value");
        const ojson *t = present(c[i], "text");
        if (!t || !t->is_string()) throw wrong(p + ".text", "a string");
        out += t->get<std::string>();
    }
    return out;
}

}  // namespace

ojson anthropic_error_body(const ApiError &e) {
    const char *type = "api_error";
    switch (e.status) {
        case 400: case 405: case 415: type = "invalid_request_error"; break;
        case 401: type = "authentication_error"; break;
        case 403: type = "permission_error"; break;
        case 404: type = "not_found_error"; break;
        case 413: type = "request_too_large"; break;
        case 429: type = "rate_limit_error"; break;
        case 503: type = "overloaded_error"; break;
        default: break;
    }
    return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

ojson messages_to_chat(const ojson &body) {
    ojson chat = ojson::object();
    for (const char *k : {"model", "temperature", "top_p", "top_k", "stream", "min_p", "seed", "repetition_penalty",
                          "chat_template_kwargs"})
        if (auto it = body.find(k); it != body.end()) chat[k] = *it;
    const ojson *max = present(body, "max_tokens");
    if (!max) throw invalid_request("max_tokens: Field required", "max_tokens", "missing_required_parameter");
    chat["max_tokens"] = *max;
    if (const ojson *st = present(body, "stop_sequences")) chat["stop"] = *st;

    ojson messages = ojson::array();
    if (const ojson *sys = present(body, "system"))
        messages.push_back({{"role", "system"}, {"content", blocks_text(*sys, "system")}});
    const ojson *msgs = present(body, "messages");
    if (!msgs) throw invalid_request("messages: Field required", "messages", "missing_required_parameter");
    if (!msgs->is_array()) throw wrong("messages", "an array");
    for (size_t i = 0; i < msgs->size(); i++) {
        const ojson &m = (*msgs)[i];
        const std::string p = strfmt("messages.%zu", i);
        if (!m.is_object()) throw wrong(p, "an object");
        const std::string role = m.value("role", "");
        if (role != "user" && role != "assistant")
            throw invalid_request(p + ".role: expected 'user' or 'assistant'.", p + ".role", "invalid_value");
        const ojson *c = present(m, "content");
        if (!c) throw invalid_request(p + ".content: Field required", p + ".content", "missing_required_parameter");
        if (c->is_string()) {
            messages.push_back({{"role", role}, {"content", *c}});
            continue;
        }
        if (!c->is_array()) throw wrong(p + ".content", "a string or an array of content blocks");
        ojson msg = {{"role", role}, {"content", ""}};
        std::string text, thinking;
        ojson calls = ojson::array();
        for (size_t j = 0; j < c->size(); j++) {
            const ojson &b = (*c)[j];
            const std::string bp = strfmt("%s.content.%zu", p.c_str(), j);
            if (!b.is_object()) throw wrong(bp, "an object");
            const std::string type = b.value("type", "");
            if (type == "text") {
                const ojson *t = present(b, "text");
                if (!t || !t->is_string()) throw wrong(bp + ".text", "a string");
                text += t->get<std::string>();
            } else if (type == "thinking" && role == "assistant") {
                thinking += b.value("thinking", "");
            } else if (type == "redacted_thinking" && role == "assistant") {
            } else if (type == "tool_use" && role == "assistant") {
                const ojson *in = present(b, "input");
                if (!present(b, "id") || !b["id"].is_string()) throw wrong(bp + ".id", "a string");
                if (!present(b, "name") || !b["name"].is_string()) throw wrong(bp + ".name", "a string");
                calls.push_back({{"id", b["id"]},
                                 {"type", "function"},
                                 {"function", {{"name", b["name"]}, {"arguments", dump(in ? *in : ojson::object())}}}});
            } else if (type == "tool_result" && role == "user") {
                if (!present(b, "tool_use_id") || !b["tool_use_id"].is_string())
                    throw wrong(bp + ".tool_use_id", "a string");
                const ojson *rc = present(b, "content");
                std::string result = rc ? blocks_text(*rc, bp + ".content") : "";
                if (b.value("is_error", false)) result = "Error: " + result;
                messages.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
            } else {
                throw invalid_request(bp + ".type: content blocks of type '" + type + "' are not supported in " +
                                          role + " messages.",
                                      bp + ".type", "invalid_value");
            }
        }
        if (!text.empty() || !calls.empty() || !thinking.empty()) {
            msg["content"] = text;
            if (!thinking.empty()) msg["reasoning_content"] = thinking;
            if (!calls.empty()) msg["tool_calls"] = calls;
            messages.push_back(std::move(msg));
        }
    }
    chat["messages"] = std::move(messages);

    if (const ojson *tools = present(body, "tools")) {
        if (!tools->is_array()) throw wrong("tools", "an array");
        ojson out = ojson::array();
        for (size_t i = 0; i < tools->size(); i++) {
            const ojson &t = (*tools)[i];
            const std::string p = strfmt("tools.%zu", i);
            if (!t.is_object()) throw wrong(p, "an object");
            if (const std::string type = t.value("type", "custom"); type != "custom")
                throw invalid_request(p + ".type: server tools ('" + type + "') are not supported; only client tools "
                                          "with an input_schema.",
                                      p + ".type", "invalid_value");
            ojson fn = {{"name", t.value("name", "")}};
            if (t.contains("description")) fn["description"] = t["description"];
            if (const ojson *s = present(t, "input_schema")) fn["parameters"] = *s;
            out.push_back({{"type", "function"}, {"function", fn}});
        }
        chat["tools"] = std::move(out);
    }
    if (const ojson *tc = present(body, "tool_choice")) {
        if (!tc->is_object()) throw wrong("tool_choice", "an object");
        const std::string type = tc->value("type", "auto");
        if (type == "auto" || type == "none") chat["tool_choice"] = type;
        else if (type == "any") chat["tool_choice"] = "required";
        else if (type == "tool")
            chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc->value("name", "")}}}};
        else
            throw invalid_request("tool_choice.type: expected auto, any, tool or none.", "tool_choice.type",
                                  "invalid_value");
    }
    if (const ojson *th = present(body, "thinking")) {
        if (!th->is_object()) throw wrong("thinking", "an object");
        const std::string type = th->value("type", "");
        if (type != "enabled" && type != "disabled")
            throw invalid_request("thinking.type: expected 'enabled' or 'disabled'.", "thinking.type", "invalid_value");
        if (!chat.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = ojson::object();
        chat["chat_template_kwargs"]["enable_thinking"] = type == "enabled";
    }
    return chat;
}

namespace {

// Content blocks built from the parser's deltas; in a stream, each change is an event.
class MessagesReply : public Reply {
public:
    MessagesReply(std::string model, const ChatRequest &req, std::unique_ptr<ChatOutputParser> parser,
                  int64_t n_prompt)
        : model_(std::move(model)), parser_(std::move(parser)), stream_(req.stream), n_prompt_(n_prompt) {
        id_ = random_id("msg_");
    }

    ApiFamily family() const override { return ApiFamily::Anthropic; }
    void add(const Event &e) override { take(e); }
    std::string body() override { return dump(message(true)); }
    std::string stream(const Event &e) override {
        if (!started_) {
            started_ = true;
            emit("message_start", {{"message", message(false)}});
        }
        take(e);
        std::string out = std::move(events_);
        events_.clear();
        return out;
    }
    std::string stream_error(const ApiError &e) override {
        ojson err = anthropic_error_body(e);
        return "event: error\ndata: " + dump(err) + "\n\n";
    }

private:
    enum class Kind { Thinking, Text, Tool };
    struct Block {
        Kind kind;
        std::string text, id, name;  // text: thinking, text, or the tool's input as JSON text
    };

    void emit(const char *type, ojson fields) {
        if (!stream_) return;
        ojson ev = {{"type", type}};
        for (auto it = fields.begin(); it != fields.end(); ++it) ev[it.key()] = it.value();
        events_ += std::string("event: ") + type + "\ndata: " + dump(ev) + "\n\n";
    }

    static ojson tool_input(const std::string &args) {
        ojson in = ojson::parse(args.empty() ? "{}" : args, nullptr, false);
        return in.is_object() ? in : ojson::object();
    }

    ojson block_json(const Block &b, bool whole) const {
        switch (b.kind) {
            case Kind::Thinking:
                return {{"type", "thinking"}, {"thinking", whole ? b.text : ""}, {"signature", ""}};
            case Kind::Text: return {{"type", "text"}, {"text", whole ? b.text : ""}};
            default:
                return {{"type", "tool_use"}, {"id", b.id}, {"name", b.name},
                        {"input", whole ? tool_input(b.text) : ojson::object()}};
        }
    }

    void close_block() {
        if (blocks_.empty() || closed_) return;
        closed_ = true;
        emit("content_block_stop", {{"index", blocks_.size() - 1}});
    }
    void open_block(Kind kind, std::string id = {}, std::string name = {}) {
        close_block();
        blocks_.push_back({kind, {}, std::move(id), std::move(name)});
        closed_ = false;
        emit("content_block_start", {{"index", blocks_.size() - 1}, {"content_block", block_json(blocks_.back(), false)}});
    }
    void append(Kind kind, const std::string &text) {
        if (text.empty()) return;
        if (blocks_.empty() || closed_ || blocks_.back().kind != kind) open_block(kind);
        blocks_.back().text += text;
        ojson delta = kind == Kind::Thinking ? ojson{{"type", "thinking_delta"}, {"thinking", text}}
                                             : ojson{{"type", "text_delta"}, {"text", text}};
        emit("content_block_delta", {{"index", blocks_.size() - 1}, {"delta", delta}});
    }

    void take(const Event &e) {
        if (e.kind == Event::Kind::Error) return;
        const ChatOutputParser::Delta d = e.kind == Event::Kind::Done ? parser_->finish() : parser_->push(e.text);
        append(Kind::Thinking, d.reasoning);
        append(Kind::Text, d.content);
        for (const ToolCallDelta &c : d.tool_calls) {
            if (!c.id.empty()) open_block(Kind::Tool, "toolu_" + c.id.substr(c.id.find('_') + 1), c.name);
            if (c.arguments.empty()) continue;
            blocks_.back().text += c.arguments;
            emit("content_block_delta", {{"index", blocks_.size() - 1},
                                         {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}});
        }
        if (e.kind == Event::Kind::Done) {
            close_block();
            usage_ = e.usage;
            const bool tools = std::any_of(blocks_.begin(), blocks_.end(), [](const Block &b) { return b.kind == Kind::Tool; });
            stop_ = e.finish_reason == "length" ? "max_tokens" : tools ? "tool_use" : "end_turn";
            emit("message_delta", {{"delta", {{"stop_reason", stop_}, {"stop_sequence", nullptr}}},
                                   {"usage", {{"output_tokens", usage_.completion_tokens}}}});
            emit("message_stop", ojson::object());
        }
    }

    ojson message(bool done) const {
        ojson content = ojson::array();
        if (done)
            for (const Block &b : blocks_) content.push_back(block_json(b, true));
        const int64_t in = usage_.prompt_tokens > 0 ? usage_.prompt_tokens : n_prompt_;
        return {{"id", id_},
                {"type", "message"},
                {"role", "assistant"},
                {"model", model_},
                {"content", content},
                {"stop_reason", done ? ojson(stop_) : ojson()},
                {"stop_sequence", nullptr},
                {"usage",
                 {{"input_tokens", in - usage_.cached_tokens},
                  {"cache_read_input_tokens", usage_.cached_tokens},
                  {"cache_creation_input_tokens", 0},
                  {"output_tokens", done ? usage_.completion_tokens : 0}}}};
    }

    std::string model_, id_, stop_ = "end_turn";
    std::unique_ptr<ChatOutputParser> parser_;
    bool stream_, started_ = false, closed_ = false;
    int64_t n_prompt_;
    std::vector<Block> blocks_;
    std::string events_;
    Usage usage_;
};

}  // namespace

std::unique_ptr<Reply> make_messages_reply(const std::string &model, const ChatRequest &req,
                                           std::unique_ptr<ChatOutputParser> parser, int64_t n_prompt) {
    return std::make_unique<MessagesReply>(model, req, std::move(parser), n_prompt);
}

}  // namespace strata::server
