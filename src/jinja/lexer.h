// Lexer of the chat-template language: splits template source into text and tag tokens with jinja2's whitespace
// rules (trim_blocks, lstrip_blocks, `-`/`+` modifiers, raw blocks, one trailing newline dropped). Not the parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::jinja {

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
    Tok type = Tok::Eof;
    std::string text;  // Data text, name, operator, or the decoded string literal
    int line = 1;
    int64_t ival = 0;
    double fval = 0;
};

struct LexOptions {
    // What Hugging Face transformers uses for chat templates.
    bool trim_blocks = true;
    bool lstrip_blocks = true;
    bool keep_trailing_newline = false;
};

// Throws TemplateError (with the line) on an unterminated tag, comment, string or raw block.
std::vector<Token> lex(std::string_view source, const LexOptions &opt = {});

const char *tok_name(Tok t);

}  // namespace strata::jinja
