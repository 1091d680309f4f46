// strata tokenize -m FILE.gguf [--pieces] [--no-special] [--no-bos]: the token ids a model sees for the text on
// standard input, so users can check prompts and templates. Reads only the file's metadata, never its tensors.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace strata::cli {

namespace {

std::string read_all_stdin() {
    std::string text;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) text.append(buf, n);
    if (std::ferror(stdin)) fail("reading standard input failed");
    return text;
}

// A token's bytes on one line: whole UTF-8 characters as they are, control characters, backslash and bytes
// that are not (or only part of) a character as escapes, so each token stays on its own line and shows exactly
// the bytes it stands for.
std::string escaped(std::string_view s) {
    std::string out;
    for (size_t pos = 0; pos < s.size();) {
        const auto c = uint8_t(s[pos]);
        const size_t n = tok::utf8_seq_len(s, pos);
        if (n > 1) {
            out.append(s.data() + pos, n);
            pos += n;
            continue;
        }
        if (c == '\\')
            out += "\\\\";
        else if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20 || c >= 0x7F)
            out += strfmt("\\x%02x", c);
        else
            out += char(c);
        pos++;
    }
    return out;
}

}  // namespace

Run add_tokenize(CLI::App &app) {
    struct Options {
        std::string model;
        bool pieces = false, no_special = false, no_bos = false;
    };
    auto opt = std::make_shared<Options>();
    CLI::App *sub = app.add_subcommand(
        "tokenize",
        "Print the token ids of the text on standard input, as the model's tokenizer produces them. The "
        "text is taken exactly as read, a final newline included (use printf or echo -n to leave it out)");
    sub->add_option("-m,--model", opt->model, "GGUF model (or vocabulary-only) file")->required();
    sub->add_flag("--pieces", opt->pieces,
                  "One token per line: id, a tab, and the text it stands for (\\n, \\t, \\\\ and \\xNN escapes for "
                  "control characters and for bytes that are only part of a character)");
    sub->add_flag("--no-special", opt->no_special,
                  "Treat control-token spellings such as <|im_start|> in the text as plain text, as user input is");
    sub->add_flag("--no-bos", opt->no_bos, "Do not add the BOS token the file asks for (add_bos_token)");
    return [opt] {
        std::unique_ptr<GgufFile> file = GgufFile::open(opt->model);
        std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(*file);
        const std::string text = read_all_stdin();
        const size_t bad = tok::utf8_first_invalid(text);
        if (bad < text.size())
            std::fprintf(stderr,
                         "strata: warning: the input is not valid UTF-8 (byte %zu); such bytes are tokenized one "
                         "by one\n",
                         bad);

        std::vector<int32_t> ids;
        if (!opt->no_bos && tok->add_bos()) ids.push_back(tok->bos());
        tok->encode(text, /*add_special=*/false, /*parse_special=*/!opt->no_special, ids);
        if (tok->add_eos()) ids.push_back(tok->eos());

        std::string out;
        if (opt->pieces) {
            for (int32_t id : ids) out += std::to_string(id) + '\t' + escaped(tok->token_text(id)) + '\n';
        } else {
            for (size_t i = 0; i < ids.size(); i++) {
                if (i) out += ' ';
                out += std::to_string(ids[i]);
            }
            out += '\n';
        }
        if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0)
            fail("writing standard output failed");
        return 0;
    };
}

}  // namespace strata::cli
