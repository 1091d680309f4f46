// Character sets as GBNF and JSON Schema `pattern` regular expressions as GBNF (pattern.h says what is taken).
#include "grammar/pattern.h"

#include <algorithm>

#include "grammar/grammar.h"
#include "tokenizer/utf8.h"

namespace strata::grammar {

namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;

CodeRanges normalize(CodeRanges r) {
    std::sort(r.begin(), r.end());
    CodeRanges out;
    for (auto [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
        else out.push_back({lo, hi});
    }
    return out;
}

CodeRanges complement(const CodeRanges &r, uint32_t max = kMaxCp) {
    CodeRanges out;
    uint32_t next = 0;
    for (auto [lo, hi] : normalize(r)) {
        if (lo > max) break;
        if (lo > next) out.push_back({next, lo - 1});
        next = hi + 1;
    }
    if (next <= max) out.push_back({next, max});
    return out;
}

// r without the code points of cut.
CodeRanges minus(const CodeRanges &r, const CodeRanges &cut) {
    CodeRanges keep = complement(cut);
    CodeRanges out;
    for (auto [a, b] : normalize(r))
        for (auto [c, d] : keep) {
            const uint32_t lo = std::max(a, c), hi = std::min(b, d);
            if (lo <= hi) out.push_back({lo, hi});
        }
    return normalize(out);
}

bool contains(const CodeRanges &r, uint32_t cp) {
    return std::any_of(r.begin(), r.end(), [&](auto p) { return p.first <= cp && cp <= p.second; });
}

std::string class_char(uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return std::string(1, char(cp));
    if (cp < 0x100) return strfmt("\\x%02X", cp);
    if (cp < 0x10000) return strfmt("\\u%04X", cp);
    return strfmt("\\U%08X", cp);
}

std::string class_gbnf(const CodeRanges &r) {
    std::string out = "[";
    for (auto [lo, hi] : r) {
        out += class_char(lo);
        if (hi > lo + 1) out += '-';
        if (hi > lo) out += class_char(hi);
    }
    return out + "]";
}

// How JSON writes a character that cannot appear raw in a string.
std::string json_escape(uint32_t cp) {
    switch (cp) {
        case '"': return "\\\"";
        case '\\': return "\\\\";
        case '\b': return "\\b";
        case '\f': return "\\f";
        case '\n': return "\\n";
        case '\r': return "\\r";
        case '\t': return "\\t";
        default: return strfmt("\\u%04x", cp);
    }
}

}  // namespace

std::string char_set_gbnf(CodeRanges set, TextMode mode) {
    set = minus(normalize(std::move(set)), {{0xD800, 0xDFFF}});
    std::vector<std::string> parts;
    if (mode == TextMode::Json) {
        const CodeRanges special = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
        const CodeRanges raw = minus(set, special);
        if (!raw.empty()) parts.push_back(class_gbnf(raw));
        for (auto [lo, hi] : set)
            for (uint32_t cp = lo; cp <= hi && cp <= 0x5C; cp++)
                if (contains(special, cp)) parts.push_back(gbnf_literal(json_escape(cp)));
    } else {
        const CodeRanges raw = minus(set, {{'<', '<'}});
        if (!raw.empty()) parts.push_back(class_gbnf(raw));
    }
    if (parts.empty()) return {};
    if (parts.size() == 1) return parts[0];
    std::string out = "(";
    for (size_t i = 0; i < parts.size(); i++) out += (i ? " | " : "") + parts[i];
    return out + ")";
}

namespace {

// ECMAScript regular expressions, the subset a grammar states exactly: literals, escapes, classes, `.`, groups,
// alternation and greedy or lazy quantifiers (the language is the same either way).
class RegexParser {
  public:
    RegexParser(std::string_view p, TextMode mode, const std::string &any, uint32_t max_repeat)
        : p_(p), mode_(mode), any_(any), max_repeat_(max_repeat) {}

    std::string parse() {
        std::vector<std::string> branches;
        for (;;) {
            bool anchored_start = false, anchored_end = false;
            if (peek('^')) {
                i_++;
                anchored_start = true;
            }
            std::string body = parse_concat(0, &anchored_end);
            std::string b;
            if (!anchored_start) b += "(" + any_ + ")* ";
            b += body.empty() ? "\"\"" : body;
            if (!anchored_end) b += " (" + any_ + ")*";
            branches.push_back(b);
            if (i_ < p_.size() && p_[i_] == '|') {
                i_++;
                continue;
            }
            break;
        }
        if (i_ < p_.size()) error(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
        if (branches.size() == 1) return branches[0];
        std::string out = "(";
        for (size_t k = 0; k < branches.size(); k++) out += (k ? " | " : "") + branches[k];
        return out + ")";
    }

  private:
    [[noreturn]] void error(const std::string &what) const {
        throw PatternError(strfmt("%s at offset %zu of the pattern", what.c_str(), i_));
    }
    bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }

    std::string parse_alt(int depth) {
        if (depth > 64) error("groups nested too deeply");
        std::vector<std::string> branches;
        for (;;) {
            std::string body = parse_concat(depth, nullptr);
            branches.push_back(body.empty() ? "\"\"" : body);
            if (peek('|')) {
                i_++;
                continue;
            }
            break;
        }
        if (branches.size() == 1) return branches[0];
        std::string out = "(";
        for (size_t k = 0; k < branches.size(); k++) out += (k ? " | " : "") + branches[k];
        return out + ")";
    }

    // Items up to '|', ')' or the end. At the top level (end_anchor set), a '$' just before those ends it.
    std::string parse_concat(int depth, bool *end_anchor) {
        std::string out;
        while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
            if (p_[i_] == '$') {
                const bool last = i_ + 1 == p_.size() || p_[i_ + 1] == '|' || (depth > 0 && p_[i_ + 1] == ')');
                if (end_anchor && last && depth == 0) {
                    i_++;
                    *end_anchor = true;
                    break;
                }
                error("'$' is supported only at the end of the pattern");
            }
            if (p_[i_] == '^') error("'^' is supported only at the start of the pattern");
            std::string atom = parse_atom(depth);
            atom = parse_quantifier(std::move(atom));
            if (!atom.empty()) out += (out.empty() ? "" : " ") + atom;
        }
        return out;
    }

    std::string set_atom(const CodeRanges &set) {
        const std::string s = char_set_gbnf(set, mode_);
        if (s.empty()) error("a character the text cannot hold here");
        return s;
    }

    uint32_t hex(size_t n) {
        uint32_t v = 0;
        for (size_t k = 0; k < n; k++) {
            if (i_ >= p_.size() || !std::isxdigit(uint8_t(p_[i_]))) error("malformed escape");
            const char c = p_[i_++];
            v = v * 16 + uint32_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        return v;
    }

    // After a backslash: a class (\d, \w, \s and negations, into `set`, returning true) or one character.
    bool escape(CodeRanges &set, uint32_t &cp, bool in_class) {
        if (i_ >= p_.size()) error("the pattern ends with a backslash");
        const char e = p_[i_++];
        switch (e) {
            case 'd': set = {{'0', '9'}}; return true;
            case 'w': set = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; return true;
            case 's': set = {{'\t', '\r'}, {' ', ' '}}; return true;
            // The negations as ASCII: dialects disagree on which other characters are digits, word or space.
            case 'D': set = {{' ', '/'}, {':', '~'}}; return true;
            case 'W': set = {{' ', '/'}, {':', '@'}, {'[', '^'}, {'`', '`'}, {'{', '~'}}; return true;
            case 'S': set = {{'!', '~'}}; return true;
            case 't': cp = '\t'; return false;
            case 'n': cp = '\n'; return false;
            case 'r': cp = '\r'; return false;
            case 'f': cp = '\f'; return false;
            case 'v': cp = '\v'; return false;
            case '0':
                if (i_ < p_.size() && std::isdigit(uint8_t(p_[i_]))) error("octal escapes are not supported");
                cp = 0;
                return false;
            case 'x': cp = hex(2); return false;
            case 'u':
                if (peek('{')) error("\\u{...} escapes are not supported");
                cp = hex(4);
                if (cp >= 0xD800 && cp <= 0xDFFF) error("surrogate escapes are not supported");
                return false;
            case 'b':
                if (in_class) {
                    cp = '\b';
                    return false;
                }
                error("word boundaries (\\b) are not supported");
            case 'B': error("word boundaries (\\B) are not supported");
            case 'k': error("backreferences are not supported");
            case 'p': case 'P': error("Unicode property escapes are not supported");
            case 'c': error("control escapes (\\c) are not supported");
            default:
                if (e >= '1' && e <= '9') error("backreferences are not supported");
                if (std::isalnum(uint8_t(e))) error(strfmt("unknown escape '\\%c'", e));
                cp = uint8_t(e);  // an escaped punctuation character stands for itself
                return false;
        }
    }

    uint32_t literal_char() {
        const size_t n = tok::utf8_seq_len(p_, i_);
        if (n == 0) error("the pattern is not valid UTF-8");
        const uint32_t cp = tok::utf8_decode(p_, i_, n);
        i_ += n;
        return cp;
    }

    std::string parse_class() {
        i_++;  // '['
        bool negated = false;
        if (peek('^')) {
            negated = true;
            i_++;
        }
        CodeRanges set;
        bool class_escapes = false;
        while (i_ < p_.size() && p_[i_] != ']') {
            CodeRanges sub;
            uint32_t lo = 0;
            if (p_[i_] == '\\') {
                i_++;
                if (escape(sub, lo, true)) {
                    set.insert(set.end(), sub.begin(), sub.end());
                    class_escapes = true;
                    continue;
                }
            } else {
                lo = literal_char();
            }
            uint32_t hi = lo;
            if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
                i_++;
                if (p_[i_] == '\\') {
                    i_++;
                    if (escape(sub, hi, true)) error("a class escape cannot end a range");
                } else {
                    hi = literal_char();
                }
                if (hi < lo) error("a backwards range in a character class");
            }
            set.push_back({lo, hi});
        }
        if (i_ >= p_.size()) error("unterminated character class");
        i_++;
        // A negated class with \d, \w or \s in it is taken within ASCII, for the reason above, and without
        // U+001C-U+001F, which Python's \s holds and ECMAScript's does not.
        if (negated && class_escapes) set.push_back({0x1C, 0x1F});
        if (negated) set = complement(set, class_escapes ? 0x7F : kMaxCp);
        if (normalize(set).empty()) error("a character class that matches nothing");
        return set_atom(set);
    }

    std::string parse_atom(int depth) {
        const char c = p_[i_];
        if (c == '(') {
            i_++;
            if (peek('?')) {
                i_++;
                if (peek(':')) {
                    i_++;
                } else if (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
                    const size_t gt = p_.find('>', i_);
                    if (gt == std::string_view::npos) error("unterminated group name");
                    i_ = gt + 1;
                } else {
                    error("lookahead and lookbehind groups are not supported");
                }
            }
            std::string inner = parse_alt(depth + 1);
            if (!peek(')')) error("unbalanced '('");
            i_++;
            if (inner.empty()) inner = "\"\"";
            return std::string("(") + inner + ")";
        }
        if (c == '[') return parse_class();
        if (c == '.') {
            i_++;
            return set_atom(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
        }
        if (c == '\\') {
            i_++;
            CodeRanges set;
            uint32_t cp = 0;
            if (escape(set, cp, false)) return set_atom(set);
            return set_atom({{cp, cp}});
        }
        if (c == '*' || c == '+' || c == '?') error("nothing to repeat");
        if (c == '{' && quantifier_follows()) error("nothing to repeat");
        const uint32_t cp = literal_char();
        return set_atom({{cp, cp}});
    }

    // Whether '{' at i_ starts a {n}, {n,} or {n,m} quantifier (otherwise it is a literal brace).
    bool quantifier_follows() const {
        size_t k = i_ + 1;
        const size_t digits = k;
        while (k < p_.size() && std::isdigit(uint8_t(p_[k]))) k++;
        if (k == digits) return false;
        if (k < p_.size() && p_[k] == ',') {
            k++;
            while (k < p_.size() && std::isdigit(uint8_t(p_[k]))) k++;
        }
        return k < p_.size() && p_[k] == '}';
    }

    uint32_t number() {
        uint64_t v = 0;
        while (i_ < p_.size() && std::isdigit(uint8_t(p_[i_]))) {
            v = v * 10 + uint64_t(p_[i_++] - '0');
            if (v > max_repeat_) error(strfmt("repetition counts above %u are not supported", max_repeat_));
        }
        return uint32_t(v);
    }

    std::string parse_quantifier(std::string atom) {
        if (i_ >= p_.size()) return atom;
        std::string q;
        const char c = p_[i_];
        if (c == '*' || c == '+' || c == '?') {
            q = std::string(1, c);
            i_++;
        } else if (c == '{' && quantifier_follows()) {
            i_++;
            const uint32_t lo = number();
            uint32_t hi = lo;
            bool unbounded = false;
            if (peek(',')) {
                i_++;
                if (peek('}')) unbounded = true;
                else hi = number();
            }
            i_++;  // '}'
            if (!unbounded && hi < lo) error("a backwards repetition count");
            q = unbounded ? strfmt("{%u,}", lo) : lo == hi ? strfmt("{%u}", lo) : strfmt("{%u,%u}", lo, hi);
        } else {
            return atom;
        }
        if (peek('?')) i_++;  // lazy: the same language
        if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' ||
                               (p_[i_] == '{' && quantifier_follows())))
            error("nothing to repeat");
        std::string out = "(";
        out += atom;
        out += ")";
        return out + q;
    }

    std::string_view p_;
    TextMode mode_;
    std::string any_;
    uint32_t max_repeat_;
    size_t i_ = 0;
};

}  // namespace

std::string pattern_gbnf(std::string_view pattern, TextMode mode, const std::string &any_char, uint32_t max_repeat) {
    return RegexParser(pattern, mode, any_char, max_repeat).parse();
}

}  // namespace strata::grammar
