// Chat templates: a model's tokenizer.chat_template (Jinja2) rendered with a conversation the way Hugging Face
// transformers' apply_chat_template renders it, plus a clearly labelled plain fallback for files without one.
// Not the template language itself (jinja.h) and not tokenization.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "jinja/jinja.h"

namespace strata {

class GgufFile;

class ChatTemplate {
public:
    // Throws strata::Error "NAME:LINE: syntax error: ..." when the template does not parse.
    static ChatTemplate parse(std::string source, std::string name);

    // Renders with an arbitrary context object (template variables). Key order is kept (ordered_json), because
    // templates print tool schemas with tojson and Python keeps dict insertion order.
    std::string render(const nlohmann::ordered_json &context) const { return tmpl_.render(context); }

    const std::string &source() const { return source_; }
    const std::string &name() const { return tmpl_.name(); }

private:
    std::string source_;
    jinja::Template tmpl_;
};

// The variables transformers passes: messages, tools (None when there are none), documents (None),
// add_generation_prompt, bos_token, eos_token; then `extra_context` (e.g. enable_thinking), which may add or
// override variables. Null `tools` is passed as None (no tools); an empty array is passed as an empty list, as
// transformers does.
std::string render_chat(const ChatTemplate &tmpl, const nlohmann::ordered_json &messages,
                        const nlohmann::ordered_json &tools, bool add_generation_prompt, const std::string &bos_token,
                        const std::string &eos_token,
                        const nlohmann::ordered_json &extra_context = nlohmann::ordered_json::object());

// Fallback for a model file without tokenizer.chat_template: "bos" then "Role: content\n\n" per message (text
// parts of list contents joined; tool calls as JSON) and "Assistant:" when add_generation_prompt. The model was not
// trained on this format; callers should say so (kPlainFallbackNotice).
std::string render_plain_fallback(const nlohmann::ordered_json &messages, bool add_generation_prompt,
                                  const std::string &bos_token);
extern const char *const kPlainFallbackNotice;

// What a GGUF file says about chatting: its template (empty when absent) and its bos/eos token texts (empty when
// the ids are absent or out of range).
struct GgufChatInfo {
    std::string chat_template;
    std::string bos_token;
    std::string eos_token;
};
GgufChatInfo read_chat_info(const GgufFile &file);

// A model's chat formatting, parsed once (for `strata run --chat` and the server): the file's template when it has
// one, else the plain fallback. Callers print `notice()` (non-empty only for the fallback) once to the user.
class ModelChat {
public:
    // `name` labels the template in error messages (usually the model path). Throws strata::Error when the file's
    // template does not parse.
    ModelChat(const GgufFile &file, const std::string &name);

    bool has_template() const { return tmpl_.has_value(); }
    const std::string &notice() const { return notice_; }
    const GgufChatInfo &info() const { return info_; }

    std::string render(const nlohmann::ordered_json &messages, const nlohmann::ordered_json &tools,
                       bool add_generation_prompt,
                       const nlohmann::ordered_json &extra_context = nlohmann::ordered_json::object()) const;

private:
    GgufChatInfo info_;
    std::optional<ChatTemplate> tmpl_;
    std::string notice_;
};

}  // namespace strata
