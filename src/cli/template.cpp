// strata template: render a chat template for a conversation and print the prompt exactly, for users debugging a
// template. The template comes from a GGUF file (-m) or a Jinja file (--file). Not used for generation itself.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/chat_template.h"

namespace strata::cli {

namespace {

struct Options {
    std::string model, file, messages, tools, context;
    std::vector<std::string> vars;
    std::optional<std::string> bos, eos;
    bool add_generation_prompt = false;
};

std::string read_file(const std::string &path, const char *what) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(std::string("cannot open ") + what + " " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

nlohmann::ordered_json read_json(const std::string &path, const char *what) {
    std::string text = read_file(path, what);
    try {
        return nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception &e) {
        throw Error(std::string(what) + " " + path + " is not valid JSON: " + e.what());
    }
}

int run(const Options &o) {
    std::string source, name, bos, eos;
    if (!o.model.empty()) {
        auto file = GgufFile::open(o.model);
        GgufChatInfo info = read_chat_info(*file);
        bos = info.bos_token;
        eos = info.eos_token;
        if (info.chat_template.empty()) {
            nlohmann::ordered_json messages = read_json(o.messages, "messages file");
            std::fprintf(stderr, "strata: %s: %s\n", o.model.c_str(), kPlainFallbackNotice);
            std::string out = render_plain_fallback(messages, o.add_generation_prompt, o.bos.value_or(bos));
            std::fwrite(out.data(), 1, out.size(), stdout);
            return 0;
        }
        source = std::move(info.chat_template);
        name = o.model + ":tokenizer.chat_template";
    } else {
        source = read_file(o.file, "template file");
        name = o.file;
    }
    if (o.bos) bos = *o.bos;
    if (o.eos) eos = *o.eos;

    nlohmann::ordered_json messages = read_json(o.messages, "messages file");
    nlohmann::ordered_json tools = o.tools.empty() ? nlohmann::ordered_json() : read_json(o.tools, "tools file");
    nlohmann::ordered_json extra = o.context.empty() ? nlohmann::ordered_json::object() : read_json(o.context, "context file");
    if (!extra.is_object()) throw Error("context file " + o.context + " must hold a JSON object");
    for (const std::string &kv : o.vars) {
        size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) throw Error("--var wants NAME=JSON, got '" + kv + "'");
        std::string value = kv.substr(eq + 1);
        try {
            extra[kv.substr(0, eq)] = nlohmann::ordered_json::parse(value);
        } catch (const nlohmann::json::exception &) {
            extra[kv.substr(0, eq)] = value;  // not JSON: take it as a string (--var reasoning_effort=high)
        }
    }

    ChatTemplate tmpl = ChatTemplate::parse(std::move(source), std::move(name));
    std::string out = render_chat(tmpl, messages, tools, o.add_generation_prompt, bos, eos, extra);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

}  // namespace

Run add_template(CLI::App &app) {
    auto o = std::make_shared<Options>();
    CLI::App *sub = app.add_subcommand(
        "template", "Render a chat template for a conversation and print the prompt (for debugging templates)");
    auto *m = sub->add_option("-m,--model", o->model, "GGUF file whose tokenizer.chat_template to render")
                  ->check(CLI::ExistingFile);
    auto *f = sub->add_option("--file", o->file, "Jinja template file to render instead of a model's")
                  ->check(CLI::ExistingFile);
    m->excludes(f);
    f->excludes(m);
    sub->add_option("--messages", o->messages, "JSON file: the list of messages")->required()->check(CLI::ExistingFile);
    sub->add_option("--tools", o->tools, "JSON file: the list of tool definitions")->check(CLI::ExistingFile);
    sub->add_option("--context", o->context, "JSON file: an object of extra template variables (enable_thinking, ...)")
        ->check(CLI::ExistingFile);
    sub->add_option("--var", o->vars, "Extra template variable NAME=JSON (repeatable), e.g. enable_thinking=false");
    sub->add_flag("--add-generation-prompt", o->add_generation_prompt, "End with the assistant turn's opening");
    sub->add_option_function<std::string>("--bos", [o](const std::string &s) { o->bos = s; },
                                          "bos_token text (default: the model's, or empty with --file)");
    sub->add_option_function<std::string>("--eos", [o](const std::string &s) { o->eos = s; },
                                          "eos_token text (default: the model's, or empty with --file)");
    return [o, sub] {
        if (o->model.empty() && o->file.empty()) {
            std::fprintf(stderr, "strata template: give -m FILE.gguf or --file T.jinja\n%s", sub->help().c_str());
            return 2;
        }
        return run(*o);
    };
}

}  // namespace strata::cli
