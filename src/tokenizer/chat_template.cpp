// Chat templates: the transformers-compatible render context, the plain fallback, and reading the template and
// special tokens from a GGUF file. Not the template language (jinja*.cpp).
#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "format/gguf.h"

namespace strata {

ChatTemplate ChatTemplate::parse(std::string source, std::string name) {
    ChatTemplate t;
    t.tmpl_ = jinja::Template::parse(source, std::move(name));
    t.source_ = std::move(source);
    return t;
}

std::string render_chat(const ChatTemplate &tmpl, const nlohmann::ordered_json &messages,
                        const nlohmann::ordered_json &tools, bool add_generation_prompt, const std::string &bos_token,
                        const std::string &eos_token, const nlohmann::ordered_json &extra_context) {
    if (!messages.is_array()) throw Error(tmpl.name() + ": messages must be a JSON array");
    if (!tools.is_null() && !tools.is_array()) throw Error(tmpl.name() + ": tools must be a JSON array");
    if (!extra_context.is_null() && !extra_context.is_object())
        throw Error(tmpl.name() + ": the extra template variables must be a JSON object");
    nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
    ctx["messages"] = messages;
    ctx["tools"] = tools;
    ctx["documents"] = nullptr;
    ctx["add_generation_prompt"] = add_generation_prompt;
    ctx["bos_token"] = bos_token;
    ctx["eos_token"] = eos_token;
    if (extra_context.is_object())
        for (auto it = extra_context.begin(); it != extra_context.end(); ++it) ctx[it.key()] = it.value();
    return tmpl.render(ctx);
}

const char *const kPlainFallbackNotice =
    "this model file has no chat template (tokenizer.chat_template); using strata's plain \"Role: content\" "
    "fallback, which the model was not trained on: replies may be poor";

static std::string text_of(const nlohmann::ordered_json &content) {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_null()) return "";
    if (content.is_array()) {
        std::string out;
        for (const auto &part : content) {
            if (part.is_string()) out += part.get<std::string>();
            else if (part.is_object() && part.contains("text") && part["text"].is_string())
                out += part["text"].get<std::string>();
        }
        return out;
    }
    return content.dump();
}

std::string render_plain_fallback(const nlohmann::ordered_json &messages, bool add_generation_prompt,
                                  const std::string &bos_token) {
    if (!messages.is_array()) throw Error("messages must be a JSON array");
    std::string out = bos_token;
    for (const auto &m : messages) {
        if (!m.is_object()) throw Error("each message must be a JSON object");
        std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "user";
        if (!role.empty() && role[0] >= 'a' && role[0] <= 'z') role[0] = char(role[0] - 32);
        out += role;
        out += ": ";
        if (m.contains("content")) out += text_of(m["content"]);
        if (m.contains("tool_calls") && m["tool_calls"].is_array())
            for (const auto &call : m["tool_calls"]) {
                out.push_back('\n');
                out += call.dump();
            }
        out += "\n\n";
    }
    if (add_generation_prompt) out += "Assistant:";
    return out;
}

static std::string token_text(const GgufFile &file, const char *id_key) {
    const GgufValue *id = file.find(id_key);
    const GgufValue *tokens = file.find("tokenizer.ggml.tokens");
    if (!id || !tokens) return "";
    uint64_t i = id->as_uint(id_key);
    const auto &texts = tokens->as_string_array("tokenizer.ggml.tokens");
    return i < texts.size() ? std::string(texts[i]) : std::string();
}

GgufChatInfo read_chat_info(const GgufFile &file) {
    GgufChatInfo info;
    if (const GgufValue *t = file.find("tokenizer.chat_template"))
        info.chat_template = std::string(t->as_string("tokenizer.chat_template"));
    info.bos_token = token_text(file, "tokenizer.ggml.bos_token_id");
    info.eos_token = token_text(file, "tokenizer.ggml.eos_token_id");
    return info;
}

ModelChat::ModelChat(const GgufFile &file, const std::string &name) : info_(read_chat_info(file)) {
    if (info_.chat_template.empty()) notice_ = name + ": " + kPlainFallbackNotice;
    else tmpl_ = ChatTemplate::parse(info_.chat_template, name + ":tokenizer.chat_template");
}

std::string ModelChat::render(const nlohmann::ordered_json &messages, const nlohmann::ordered_json &tools,
                              bool add_generation_prompt, const nlohmann::ordered_json &extra_context) const {
    if (!tmpl_) return render_plain_fallback(messages, add_generation_prompt, info_.bos_token);
    return render_chat(*tmpl_, messages, tools, add_generation_prompt, info_.bos_token, info_.eos_token,
                       extra_context);
}

}  // namespace strata
