// Public entry point of the chat-template language: parse and render, turning internal errors into
// strata::Error messages that name the template and line. Not the lexer, parser or evaluator.
#include "jinja/jinja.h"

#include "core/error.h"
#include "jinja/interp.h"

namespace strata::jinja {

static std::string where(const std::string &name, int line) {
    return line > 0 ? name + ":" + std::to_string(line) : name;
}

Template Template::parse(const std::string &source, std::string name) {
    Template t;
    t.name_ = std::move(name);
    try {
        t.body_ = std::make_shared<const Body>(jinja::parse(source));
    } catch (const TemplateError &e) {
        throw Error(where(t.name_, e.line) + ": syntax error: " + e.message);
    }
    return t;
}

std::string Template::render(const nlohmann::ordered_json &context) const {
    if (!context.is_object() && !context.is_null()) throw Error(name_ + ": the render context must be a JSON object");
    // The builtin globals sit below the context, as jinja2's environment globals sit below render arguments.
    static const ScopeP builtins = Interp::builtin_globals();
    auto globals = std::make_shared<Scope>();
    globals->parent = builtins;
    try {
        if (context.is_object())
            for (auto it = context.begin(); it != context.end(); ++it)
                globals->vars[it.key()] = Value::from_json(it.value());
        Interp in(globals);
        return in.run(*body_);
    } catch (const TemplateError &e) {
        throw Error(where(name_, e.line) + ": " + e.message);
    }
}

}  // namespace strata::jinja
