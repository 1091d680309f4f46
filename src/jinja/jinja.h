// Public entry point of the chat-template language, a Jinja2 subset rendered the way Hugging Face transformers
// renders chat templates (jinja2 sandbox, trim_blocks and lstrip_blocks on, its tojson). Parse once, render many
// times. Not chat-specific: ChatTemplate (chat_template.h) supplies the conversation context.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace strata::jinja {

struct Stmt;

class Template {
public:
    // Throws strata::Error "NAME:LINE: message" for a syntax error, an unknown filter or test, ...
    static Template parse(const std::string &source, std::string name);

    // Renders with `context` (a JSON object: its keys become template variables) over the builtin globals
    // (range, namespace, dict, cycler, joiner, raise_exception, strftime_now). Throws strata::Error naming the
    // template line for a runtime error or raise_exception. Key order of objects is kept, as in Python dicts.
    std::string render(const nlohmann::ordered_json &context) const;

    const std::string &name() const { return name_; }

private:
    std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
    std::string name_;
};

}  // namespace strata::jinja
