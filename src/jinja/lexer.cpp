// Lexer of the chat-template language. Whitespace handling follows jinja2 exactly because prompts must match
// byte for byte: `{%-` strips all whitespace before a tag, `-%}` all after it; with trim_blocks the first newline
// after a block or comment tag goes; with lstrip_blocks the spaces and tabs between a line start and a block or
// comment tag go (not before `{{`, and not with `{%+`). Not the parser.
#include "jinja/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "jinja/value.h"

namespace strata::jinja {

const char *tok_name(Tok t) {
    switch (t) {
    case Tok::Data: return "template data";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::Name: return "name";
    case Tok::String: return "string";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    case Tok::Op: return "operator";
    case Tok::Eof: return "end of template";
    }
    return "token";
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip() with no argument (all Unicode whitespace).
std::string rstrip_py(std::string_view s) {
    std::u32string cps = decode_utf8(s);
    size_t n = cps.size();
    while (n > 0 && is_py_space(cps[n - 1])) n--;
    cps.resize(n);
    return encode_utf8(cps);
}

// Length of the run of Python whitespace at the start of s (in bytes).
size_t ws_prefix(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            if (!is_py_space(c)) break;
            i++;
            continue;
        }
        size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        std::u32string cp = decode_utf8(s.substr(i, n));
        if (cp.size() != 1 || !is_py_space(cp[0])) break;
        i += n;
    }
    return i;
}

bool all_py_space(std::string_view s) { return !s.empty() && ws_prefix(s) == s.size(); }

int count_nl(std::string_view s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (unsigned char)c >= 0x80; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Decode a string literal's body with Python's escape rules (jinja2 runs it through "unicode-escape").
std::string unescape(std::string_view body, int line) {
    std::string out;
    for (size_t i = 0; i < body.size(); i++) {
        char c = body[i];
        if (c != '\\' || i + 1 >= body.size()) {
            out.push_back(c);
            continue;
        }
        char e = body[++i];
        switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
            size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            char32_t cp = 0;
            for (size_t k = 0; k < n; k++) {
                int h = i + 1 + k < body.size() ? hexval(body[i + 1 + k]) : -1;
                if (h < 0) throw_error_at(line, std::string("truncated \\") + e + " escape in string literal");
                cp = cp * 16 + char32_t(h);
            }
            if (cp > 0x10FFFF) throw_error_at(line, "illegal Unicode character in string literal");
            append_utf8(out, cp);
            i += n;
            break;
        }
        case 'N': throw_error_at(line, "\\N{...} escapes are not supported in string literals");
        default:
            if (e >= '0' && e <= '7') {
                char32_t cp = char32_t(e - '0');
                for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; k++)
                    cp = cp * 8 + char32_t(body[++i] - '0');
                append_utf8(out, cp);
            } else {
                out.push_back('\\');  // unknown escapes stay as written, as in Python
                out.push_back(e);
            }
        }
    }
    return out;
}

class Lexer {
public:
    Lexer(std::string_view src, const LexOptions &opt) : opt_(opt) {
        // jinja2 treats \r\n and \r as newlines and, by default, drops one trailing newline.
        src_.reserve(src.size());
        for (size_t i = 0; i < src.size(); i++) {
            if (src[i] == '\r') {
                src_.push_back('\n');
                if (i + 1 < src.size() && src[i + 1] == '\n') i++;
            } else {
                src_.push_back(src[i]);
            }
        }
        if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    }

    std::vector<Token> run() {
        bool line_starting = true;  // the previous tag's match ended with a newline (or we are at the start)
        while (pos_ < src_.size()) {
            size_t start = find_tag(pos_);
            if (start == std::string::npos) {
                emit(Tok::Data, src_.substr(pos_));
                line_ += count_nl(std::string_view(src_).substr(pos_));
                pos_ = src_.size();
                break;
            }
            char kind = src_[start + 1];  // '{', '%' or '#'
            char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
            std::string text = src_.substr(pos_, start - pos_);
            int text_lines = count_nl(text);
            if (sign == '-') {
                text = rstrip_py(text);
            } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
                size_t l_pos = text.rfind('\n');
                l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
                if ((l_pos > 0 || line_starting) && all_py_space(std::string_view(text).substr(l_pos)))
                    text.resize(l_pos);
            }
            if (!text.empty()) emit(Tok::Data, text);
            line_ += text_lines;
            pos_ = start + 2 + (sign ? 1 : 0);
            if (kind == '#') {
                line_starting = comment();
            } else if (kind == '%' && raw_begin()) {
                line_starting = raw();
            } else {
                line_starting = tag(kind == '%');
            }
        }
        emit(Tok::Eof, "");
        return std::move(toks_);
    }

private:
    std::string src_;
    LexOptions opt_;
    size_t pos_ = 0;
    int line_ = 1;
    std::vector<Token> toks_;

    void emit(Tok t, std::string text) {
        Token tk;
        tk.type = t;
        tk.text = std::move(text);
        tk.line = line_;
        toks_.push_back(std::move(tk));
    }

    size_t find_tag(size_t from) const {
        for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
            if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
        return std::string::npos;
    }

    // After a tag's closing delimiter: `-` eats all whitespace, plain (block/comment) eats one newline under
    // trim_blocks, `+` nothing. Returns whether what was consumed ends with a newline.
    bool after_close(char sign, bool block_like) {
        size_t begin = pos_;
        if (sign == '-') {
            pos_ += ws_prefix(std::string_view(src_).substr(pos_));
        } else if (sign == 0 && block_like && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
            pos_++;
        }
        line_ += count_nl(std::string_view(src_).substr(begin, pos_ - begin));
        return pos_ > begin && src_[pos_ - 1] == '\n';
    }

    bool comment() {
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) throw_error_at(line_, "Missing end of comment tag");
        char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
        line_ += count_nl(std::string_view(src_).substr(pos_, end + 2 - pos_));
        pos_ = end + 2;
        return after_close(sign, true);
    }

    // `{% raw %}` / `{%- raw -%}`: pos_ is just past `{%` and its sign.
    bool raw_begin() {
        size_t p = pos_;
        while (p < src_.size() && is_ws(src_[p])) p++;
        if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
        p += 3;
        while (p < src_.size() && is_ws(src_[p])) p++;
        if (src_.compare(p, 3, "-%}") == 0) {
            line_ += count_nl(std::string_view(src_).substr(pos_, p + 3 - pos_));
            pos_ = p + 3;
            after_close('-', true);
            return true;
        }
        if (src_.compare(p, 2, "%}") == 0) {  // no trim_blocks newline here: jinja2 keeps it
            line_ += count_nl(std::string_view(src_).substr(pos_, p + 2 - pos_));
            pos_ = p + 2;
            return true;
        }
        return false;
    }

    bool raw() {
        int start_line = line_;
        for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
            size_t p = i + 2;
            char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
            if (sign) p++;
            while (p < src_.size() && is_ws(src_[p])) p++;
            if (src_.compare(p, 6, "endraw") != 0) continue;
            p += 6;
            while (p < src_.size() && is_ws(src_[p])) p++;
            char close = 0;
            if (src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0) {
                close = src_[p];
                p += 3;
            } else if (src_.compare(p, 2, "%}") == 0) {
                p += 2;
            } else {
                continue;
            }
            std::string text = src_.substr(pos_, i - pos_);
            int text_lines = count_nl(text);
            if (sign == '-') {
                text = rstrip_py(text);
            } else if (sign != '+' && opt_.lstrip_blocks) {
                size_t l_pos = text.rfind('\n');
                l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
                if (l_pos > 0 && all_py_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
            }
            if (!text.empty()) emit(Tok::Data, text);
            line_ += text_lines + count_nl(std::string_view(src_).substr(i, p - i));
            pos_ = p;
            return after_close(close, true);
        }
        throw_error_at(start_line, "Missing end of raw directive");
    }

    // Tokens inside `{{ ... }}` or `{% ... %}`; pos_ is just past the opening delimiter and its sign.
    bool tag(bool block) {
        emit(block ? Tok::BlockBegin : Tok::VarBegin, block ? "{%" : "{{");
        std::vector<char> brackets;
        int open_line = line_;
        while (true) {
            while (pos_ < src_.size() && is_ws(src_[pos_])) {
                if (src_[pos_] == '\n') line_++;
                pos_++;
            }
            if (pos_ >= src_.size())
                throw_error_at(open_line, std::string("unexpected end of template, expected '") +
                                              (block ? "%}" : "}}") + "'");
            if (brackets.empty()) {
                const char *close = block ? "%}" : "}}";
                char sign = 0;
                bool closed = false;
                if ((src_[pos_] == '-' || (block && src_[pos_] == '+')) && src_.compare(pos_ + 1, 2, close) == 0) {
                    sign = src_[pos_];
                    pos_ += 3;
                    closed = true;
                } else if (src_.compare(pos_, 2, close) == 0) {
                    pos_ += 2;
                    closed = true;
                }
                if (closed) {
                    emit(block ? Tok::BlockEnd : Tok::VarEnd, close);
                    return after_close(sign, block);
                }
            }
            char c = src_[pos_];
            if (c == '\'' || c == '"') {
                string_literal(c);
            } else if (is_digit(c)) {
                number();
            } else if (is_name_start(c)) {
                size_t b = pos_;
                while (pos_ < src_.size() && is_name_char(src_[pos_])) pos_++;
                emit(Tok::Name, src_.substr(b, pos_ - b));
            } else {
                operator_token(brackets);
            }
        }
    }

    void string_literal(char q) {
        size_t b = pos_ + 1, i = b;
        int start_line = line_;
        while (i < src_.size() && src_[i] != q) i += src_[i] == '\\' ? 2 : 1;
        if (i >= src_.size()) throw_error_at(start_line, "unexpected end of string literal");
        std::string body = src_.substr(b, i - b);
        Token tk;
        tk.type = Tok::String;
        tk.text = unescape(body, start_line);
        tk.line = start_line;
        toks_.push_back(std::move(tk));
        line_ += count_nl(body);
        pos_ = i + 1;
    }

    // Digits with optional `_` separators between them.
    size_t digits(size_t p, bool (*ok)(char)) const {
        size_t q = p;
        while (q < src_.size() && (ok(src_[q]) || (src_[q] == '_' && q > p && q + 1 < src_.size() && ok(src_[q + 1]))))
            q++;
        return q;
    }

    void number() {
        size_t b = pos_;
        auto dec = [](char c) { return c >= '0' && c <= '9'; };
        char c1 = pos_ + 1 < src_.size() ? char(src_[pos_ + 1] | 0x20) : 0;
        if (src_[pos_] == '0' && (c1 == 'x' || c1 == 'o' || c1 == 'b')) {
            int base = c1 == 'x' ? 16 : c1 == 'o' ? 8 : 2;
            size_t p = pos_ + 2;
            int64_t v = 0;
            bool any = false;
            while (p < src_.size()) {
                char c = src_[p];
                if (c == '_') {
                    p++;
                    continue;
                }
                int d = hexval(c);
                if (d < 0 || d >= base) break;
                v = v * base + d;
                any = true;
                p++;
            }
            if (!any) throw_error_at(line_, "invalid integer literal");
            Token tk;
            tk.type = Tok::Int;
            tk.ival = v;
            tk.text = src_.substr(b, p - b);
            tk.line = line_;
            toks_.push_back(tk);
            pos_ = p;
            return;
        }
        size_t p = digits(pos_, dec);
        bool is_float = false;
        // A float needs digits after the dot ("1." is the integer 1 followed by an attribute dot).
        if (p + 1 < src_.size() && src_[p] == '.' && dec(src_[p + 1])) {
            p = digits(p + 1, dec);
            is_float = true;
        }
        if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
            size_t q = p + 1;
            if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) q++;
            if (q < src_.size() && dec(src_[q])) {
                p = digits(q, dec);
                is_float = true;
            }
        }
        std::string text = src_.substr(b, p - b);
        std::string clean;
        for (char c : text)
            if (c != '_') clean.push_back(c);
        Token tk;
        tk.text = text;
        tk.line = line_;
        if (is_float) {
            tk.type = Tok::Float;
            tk.fval = std::strtod(clean.c_str(), nullptr);
        } else {
            tk.type = Tok::Int;
            errno = 0;
            tk.ival = std::strtoll(clean.c_str(), nullptr, 10);
            if (errno == ERANGE) throw_error_at(line_, "integer literal " + text + " is too large");
        }
        toks_.push_back(tk);
        pos_ = p;
    }

    void operator_token(std::vector<char> &brackets) {
        static const char *two[] = {"//", "**", "==", "!=", ">=", "<="};
        for (const char *op : two) {
            if (src_.compare(pos_, 2, op) == 0) {
                emit(Tok::Op, op);
                pos_ += 2;
                return;
            }
        }
        char c = src_[pos_];
        if (!std::strchr("+-/*%~[](){}<>=.:|,;", c) || c == 0)
            throw_error_at(line_, std::string("unexpected char '") + c + "'");
        if (c == '(' || c == '[' || c == '{') {
            brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        } else if (c == ')' || c == ']' || c == '}') {
            if (brackets.empty()) throw_error_at(line_, std::string("unexpected '") + c + "'");
            if (brackets.back() != c)
                throw_error_at(line_, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
            brackets.pop_back();
        }
        emit(Tok::Op, std::string(1, c));
        pos_++;
    }
};

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions &opt) { return Lexer(source, opt).run(); }

}  // namespace strata::jinja
