// Text pieces of JSON-schema grammars: character sets written as GBNF for a JSON string's inside (escaped where
// JSON needs it) or for raw text, and JSON Schema `pattern` regular expressions (an ECMAScript subset) turned into
// GBNF. Only constructs whose language a grammar states exactly are taken; the rest is refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace strata::grammar {

using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges, inclusive

// Where the text goes: inside a JSON string literal (quote, backslash and control characters escaped), or as raw
// text, which never holds '<' (raw values sit between XML-like tags).
enum class TextMode { Json, Raw };

// GBNF for one character of the set, as the mode writes it; empty when the mode can write none of it.
std::string char_set_gbnf(CodeRanges set, TextMode mode);

// A `pattern` that cannot be turned into a grammar; the message names the construct.
struct PatternError : Error {
    using Error::Error;
};

// GBNF for the strings a JSON Schema `pattern` matches. JSON Schema searches (a match anywhere), so an end without
// its anchor (^ or $) takes any text, written as `any_char`* (a GBNF rule for one character in the mode). Classes
// such as \d and \w mean their ASCII sets, and their negations ASCII too, which every regex dialect agrees on.
// Throws PatternError for lookarounds, backreferences, word boundaries, anchors elsewhere than the ends and malformed
// patterns; counts above max_repeat.
std::string pattern_gbnf(std::string_view pattern, TextMode mode, const std::string &any_char,
                         uint32_t max_repeat = 1000);

}  // namespace strata::grammar
