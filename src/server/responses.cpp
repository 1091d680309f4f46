// OpenAI's Responses API over the chat machinery: request items to chat messages, the output parser's deltas to
// output items (reasoning, message, function_call) and to the Responses stream events.
#include "server/responses.h"

#include <chrono>
#include <random>

#include "core/error.h"

namespace strata::server {

namespace {

const ojson *present(const ojson &o, const char *key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}

ApiError wrong(const std::string &param, const std::string &expected) {
    return invalid_request("Invalid type for '" + param + "': expected " + expected + ".", param, "invalid_type");
}

std::string text_of(const ojson &content, const std::string &param) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) throw wrong(param, "a string or an array of content parts");
    std::string out;
    for (size_t i = 0; i < content.size(); i++) {
        const ojson &p = content[i];
        const std::string pp = strfmt("%s[%zu]", param.c_str(), i);
        if (!p.is_object()) throw wrong(pp, "an object");
        const std::string type = p.value("type", "");
        if (type != "input_text" && type != "output_text" && type != "text")
            throw invalid_request("Invalid value for '" + pp + ".type': content parts of type '" + type +
                                      "' are not supported (text only).",
                                  pp + ".type", "invalid_value");
        const ojson *t = present(p, "text");
        if (!t || !t->is_string()) throw wrong(pp + ".text", "a string");
        out += t->get<std::string>();
    }
    return out;
}

std::string random_id(const char *prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    std::string id = prefix;
    for (int i = 0; i < 24; i++) id += alphabet[rng() % (sizeof(alphabet) - 1)];
    return id;
}

}  // namespace

ojson responses_to_chat(const ojson &body) {
    for (const char *k : {"previous_response_id", "conversation", "prompt"})
        if (present(body, k))
            throw invalid_request(std::string("'") + k +
                                      "' is not supported: this server stores no responses; send the whole "
                                      "conversation in 'input'.",
                                  k, "unsupported_parameter");
    if (body.value("background", false))
        throw invalid_request("'background' is not supported.", "background", "unsupported_parameter");
    ojson chat = ojson::object();
    for (const char *k : {"model", "temperature", "top_p", "stream", "top_k", "min_p", "seed", "repetition_penalty",
                          "presence_penalty", "frequency_penalty", "chat_template_kwargs"})
        if (auto it = body.find(k); it != body.end()) chat[k] = *it;
    if (const ojson *m = present(body, "max_output_tokens")) {
        if (!m->is_number_integer() || m->get<int64_t>() < 1)
            throw invalid_request("Invalid value for 'max_output_tokens': expected an integer of at least 1.",
                                  "max_output_tokens", "invalid_value");
        chat["max_tokens"] = *m;
    }
    if (const ojson *t = present(body, "text")) {
        if (!t->is_object()) throw wrong("text", "an object");
        if (const ojson *f = present(*t, "format"); f && (!f->is_object() || f->value("type", "text") != "text"))
            throw invalid_request("Invalid value for 'text.format': only {\"type\": \"text\"} is supported.",
                                  "text.format", "invalid_value");
    }

    ojson messages = ojson::array();
    if (const ojson *ins = present(body, "instructions")) {
        if (!ins->is_string()) throw wrong("instructions", "a string");
        messages.push_back({{"role", "system"}, {"content", *ins}});
    }
    const ojson *input = present(body, "input");
    if (!input) throw invalid_request("Missing required parameter: 'input'.", "input", "missing_required_parameter");
    std::string reasoning;  // a reasoning item, for the assistant turn that follows it
    auto assistant = [&]() -> ojson & {
        if (messages.empty() || messages.back()["role"] != "assistant") {
            messages.push_back({{"role", "assistant"}, {"content", ""}});
            if (!reasoning.empty()) messages.back()["reasoning_content"] = reasoning;
            reasoning.clear();
        }
        return messages.back();
    };
    if (input->is_string()) {
        messages.push_back({{"role", "user"}, {"content", *input}});
    } else if (input->is_array()) {
        for (size_t i = 0; i < input->size(); i++) {
            const ojson &it = (*input)[i];
            const std::string p = strfmt("input[%zu]", i);
            if (!it.is_object()) throw wrong(p, "an object");
            const std::string type = it.value("type", "message");
            if (type == "message") {
                const std::string role = it.value("role", "");
                if (role != "user" && role != "assistant" && role != "system" && role != "developer")
                    throw invalid_request("Invalid value for '" + p + ".role': expected user, assistant, system or "
                                          "developer.", p + ".role", "invalid_value");
                const ojson *c = present(it, "content");
                if (!c) throw invalid_request("Missing required parameter: '" + p + ".content'.", p + ".content",
                                              "missing_required_parameter");
                const std::string text = text_of(*c, p + ".content");
                if (role == "assistant") {
                    ojson &a = assistant();
                    a["content"] = a["content"].get<std::string>() + text;
                } else {
                    messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
                }
            } else if (type == "function_call") {
                for (const char *k : {"call_id", "name", "arguments"})
                    if (!present(it, k) || !it[k].is_string()) throw wrong(p + "." + k, "a string");
                ojson &a = assistant();
                if (!a.contains("tool_calls")) a["tool_calls"] = ojson::array();
                a["tool_calls"].push_back({{"id", it["call_id"]},
                                           {"type", "function"},
                                           {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}});
            } else if (type == "function_call_output") {
                if (!present(it, "call_id") || !it["call_id"].is_string()) throw wrong(p + ".call_id", "a string");
                const ojson *o = present(it, "output");
                if (!o) throw invalid_request("Missing required parameter: '" + p + ".output'.", p + ".output",
                                              "missing_required_parameter");
                messages.push_back(
                    {{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", text_of(*o, p + ".output")}});
            } else if (type == "reasoning") {
                if (const ojson *c = present(it, "content"); c && c->is_array())
                    for (const ojson &part : *c)
                        if (part.is_object() && part.value("type", "") == "reasoning_text")
                            reasoning += part.value("text", "");
            } else {
                throw invalid_request("Invalid value for '" + p + ".type': input items of type '" + type +
                                          "' are not supported (message, function_call, function_call_output, "
                                          "reasoning).",
                                      p + ".type", "invalid_value");
            }
        }
    } else {
        throw wrong("input", "a string or an array of input items");
    }
    chat["messages"] = std::move(messages);

    if (const ojson *tools = present(body, "tools")) {
        if (!tools->is_array()) throw wrong("tools", "an array");
        ojson out = ojson::array();
        for (size_t i = 0; i < tools->size(); i++) {
            const ojson &t = (*tools)[i];
            const std::string p = strfmt("tools[%zu]", i);
            if (!t.is_object()) throw wrong(p, "an object");
            if (t.value("type", "function") != "function")
                throw invalid_request("Invalid value for '" + p + ".type': only 'function' tools are supported.",
                                      p + ".type", "invalid_value");
            ojson fn = ojson::object();
            for (const char *k : {"name", "description", "parameters"})
                if (auto f = t.find(k); f != t.end()) fn[k] = *f;
            out.push_back({{"type", "function"}, {"function", fn}});
        }
        chat["tools"] = std::move(out);
    }
    if (const ojson *tc = present(body, "tool_choice")) {
        if (tc->is_object() && tc->value("type", "") == "function")
            chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc->value("name", "")}}}};
        else
            chat["tool_choice"] = *tc;
    }
    if (const ojson *r = present(body, "reasoning"); r && r->is_object() && r->value("effort", "") == "none") {
        if (!chat.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = ojson::object();
        chat["chat_template_kwargs"]["enable_thinking"] = false;
    }
    return chat;
}

namespace {

// The output as items, built from the parser's deltas; in a stream, each change is an event.
class ResponsesReply : public Reply {
public:
    ResponsesReply(std::string model, const ChatRequest &req, std::unique_ptr<ChatOutputParser> parser,
                   int64_t n_prompt)
        : model_(std::move(model)), parser_(std::move(parser)), stream_(req.stream), n_prompt_(n_prompt) {
        id_ = random_id("resp_");
        created_ = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
        temperature_ = req.gen.sampling.temperature;
        top_p_ = req.gen.sampling.top_p;
        max_output_ = req.gen.max_tokens;
        tools_ = ojson::array();
        if (req.parse_tools)
            for (const ojson &t : req.tools) {
                ojson f = t["function"];
                f["type"] = "function";
                if (!f.contains("strict")) f["strict"] = false;
                if (!f.contains("parameters")) f["parameters"] = ojson::object();
                tools_.push_back(f);
            }
    }

    void add(const Event &e) override { take(e); }
    std::string body() override { return dump(response("completed")); }
    std::string stream(const Event &e) override {
        if (!started_) {
            started_ = true;
            emit("response.created", {{"response", response("in_progress")}});
            emit("response.in_progress", {{"response", response("in_progress")}});
        }
        take(e);
        std::string out = std::move(events_);
        events_.clear();
        return out;
    }
    std::string stream_error(const ApiError &e) override {
        emit("error", {{"code", e.code.empty() ? ojson() : ojson(e.code)}, {"message", e.what()}, {"param", nullptr}});
        ojson r = response("failed");
        r["error"] = {{"code", e.code.empty() ? "server_error" : e.code}, {"message", e.what()}};
        emit("response.failed", {{"response", r}});
        std::string out = std::move(events_);
        events_.clear();
        return out;
    }

private:
    enum class Kind { None, Reasoning, Message, Call };

    void emit(const char *type, ojson fields) {
        if (!stream_) return;
        ojson ev = {{"type", type}, {"sequence_number", seq_++}};
        for (auto it = fields.begin(); it != fields.end(); ++it) ev[it.key()] = it.value();
        events_ += std::string("event: ") + type + "\ndata: " + dump(ev) + "\n\n";
    }

    ojson item_json(size_t i, const char *status) const {
        const Item &it = items_[i];
        switch (it.kind) {
            case Kind::Reasoning:
                return {{"id", it.id},
                        {"type", "reasoning"},
                        {"summary", ojson::array()},
                        {"content", ojson::array({{{"type", "reasoning_text"}, {"text", it.text}}})},
                        {"status", status}};
            case Kind::Message:
                return {{"id", it.id},
                        {"type", "message"},
                        {"status", status},
                        {"role", "assistant"},
                        {"content", ojson::array({text_part(it.text)})}};
            default:
                return {{"id", it.id},   {"type", "function_call"}, {"status", status},
                        {"call_id", it.call_id}, {"name", it.name},          {"arguments", it.text}};
        }
    }
    static ojson text_part(const std::string &text) {
        return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
    }
    static ojson reasoning_part(const std::string &text) { return {{"type", "reasoning_text"}, {"text", text}}; }

    void close_item() {
        if (items_.empty() || closed_) return;
        closed_ = true;
        const size_t i = items_.size() - 1;
        const Item &it = items_[i];
        if (it.kind == Kind::Message) {
            emit("response.output_text.done", {{"item_id", it.id}, {"output_index", i}, {"content_index", 0},
                                               {"text", it.text}, {"logprobs", ojson::array()}});
            emit("response.content_part.done",
                 {{"item_id", it.id}, {"output_index", i}, {"content_index", 0}, {"part", text_part(it.text)}});
        } else if (it.kind == Kind::Reasoning) {
            emit("response.reasoning_text.done",
                 {{"item_id", it.id}, {"output_index", i}, {"content_index", 0}, {"text", it.text}});
            emit("response.content_part.done",
                 {{"item_id", it.id}, {"output_index", i}, {"content_index", 0}, {"part", reasoning_part(it.text)}});
        } else {
            emit("response.function_call_arguments.done",
                 {{"item_id", it.id}, {"output_index", i}, {"name", it.name}, {"arguments", it.text}});
        }
        emit("response.output_item.done", {{"output_index", i}, {"item", item_json(i, "completed")}});
    }

    void open_item(Kind kind, std::string call_id = {}, std::string name = {}) {
        close_item();
        Item it;
        it.kind = kind;
        it.id = random_id(kind == Kind::Reasoning ? "rs_" : kind == Kind::Message ? "msg_" : "fc_");
        it.call_id = std::move(call_id);
        it.name = std::move(name);
        items_.push_back(std::move(it));
        closed_ = false;
        const size_t i = items_.size() - 1;
        ojson item = item_json(i, "in_progress");
        if (kind == Kind::Message) item["content"] = ojson::array();
        if (kind == Kind::Reasoning) item["content"] = ojson::array();
        emit("response.output_item.added", {{"output_index", i}, {"item", item}});
        if (kind == Kind::Message)
            emit("response.content_part.added",
                 {{"item_id", items_[i].id}, {"output_index", i}, {"content_index", 0}, {"part", text_part("")}});
        if (kind == Kind::Reasoning)
            emit("response.content_part.added", {{"item_id", items_[i].id}, {"output_index", i}, {"content_index", 0},
                                                 {"part", reasoning_part("")}});
    }

    void append(Kind kind, const std::string &text) {
        if (text.empty()) return;
        if (items_.empty() || closed_ || items_.back().kind != kind) open_item(kind);
        Item &it = items_.back();
        it.text += text;
        const size_t i = items_.size() - 1;
        if (kind == Kind::Message)
            emit("response.output_text.delta", {{"item_id", it.id}, {"output_index", i}, {"content_index", 0},
                                                {"delta", text}, {"logprobs", ojson::array()}});
        else
            emit("response.reasoning_text.delta",
                 {{"item_id", it.id}, {"output_index", i}, {"content_index", 0}, {"delta", text}});
    }

    void take(const Event &e) {
        if (e.kind == Event::Kind::Error) return;
        const ChatOutputParser::Delta d = e.kind == Event::Kind::Done ? parser_->finish() : parser_->push(e.text);
        append(Kind::Reasoning, d.reasoning);
        append(Kind::Message, d.content);
        for (const ToolCallDelta &c : d.tool_calls) {
            if (!c.id.empty()) open_item(Kind::Call, c.id, c.name);
            Item &it = items_.back();
            if (c.arguments.empty()) continue;
            it.text += c.arguments;
            emit("response.function_call_arguments.delta",
                 {{"item_id", it.id}, {"output_index", items_.size() - 1}, {"delta", c.arguments}});
        }
        if (e.kind == Event::Kind::Done) {
            for (Item &it : items_)
                if (it.kind == Kind::Call && it.text.empty()) it.text = "{}";
            close_item();
            usage_ = e.usage;
            incomplete_ = e.finish_reason == "length";
            ojson r = response(incomplete_ ? "incomplete" : "completed");
            emit(incomplete_ ? "response.incomplete" : "response.completed", {{"response", r}});
        }
    }

    ojson response(const char *status) const {
        ojson out = ojson::array();
        const bool done = std::string(status) != "in_progress";
        for (size_t i = 0; i < items_.size(); i++) out.push_back(item_json(i, done ? "completed" : "in_progress"));
        const bool incomplete = done && incomplete_;
        ojson r = {{"id", id_},
                   {"object", "response"},
                   {"created_at", created_},
                   {"status", incomplete ? "incomplete" : status},
                   {"error", nullptr},
                   {"incomplete_details", incomplete ? ojson{{"reason", "max_output_tokens"}} : ojson()},
                   {"instructions", nullptr},
                   {"max_output_tokens", max_output_ > 0 ? ojson(max_output_) : ojson()},
                   {"model", model_},
                   {"output", done ? out : ojson::array()},
                   {"parallel_tool_calls", true},
                   {"previous_response_id", nullptr},
                   {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                   {"store", false},
                   {"temperature", temperature_},
                   {"text", {{"format", {{"type", "text"}}}}},
                   {"tool_choice", "auto"},
                   {"tools", tools_},
                   {"top_p", top_p_},
                   {"truncation", "disabled"},
                   {"metadata", ojson::object()}};
        if (done) {
            r["usage"] = {{"input_tokens", usage_.prompt_tokens > 0 ? usage_.prompt_tokens : n_prompt_},
                          {"input_tokens_details", {{"cached_tokens", usage_.cached_tokens}, {"cache_write_tokens", 0}}},
                          {"output_tokens", usage_.completion_tokens},
                          {"output_tokens_details", {{"reasoning_tokens", 0}}},
                          {"total_tokens", (usage_.prompt_tokens > 0 ? usage_.prompt_tokens : n_prompt_) +
                                               usage_.completion_tokens}};
        }
        return r;
    }

    struct Item {
        Kind kind = Kind::None;
        std::string id, call_id, name, text;
    };
    std::string model_, id_;
    std::unique_ptr<ChatOutputParser> parser_;
    bool stream_, started_ = false, closed_ = false, incomplete_ = false;
    int64_t n_prompt_, created_ = 0, max_output_ = -1, seq_ = 0;
    double temperature_ = 1, top_p_ = 1;
    ojson tools_;
    std::vector<Item> items_;
    std::string events_;
    Usage usage_;
};

}  // namespace

std::unique_ptr<Reply> make_responses_reply(const std::string &model, const ChatRequest &req,
                                            std::unique_ptr<ChatOutputParser> parser, int64_t n_prompt) {
    return std::make_unique<ResponsesReply>(model, req, std::move(parser), n_prompt);
}

}  // namespace strata::server
