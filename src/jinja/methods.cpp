// Python methods of template values (str.split, dict.items, ...), printf-style `%` and str.format, and the
// global functions (range, namespace, dict, cycler, joiner, raise_exception, strftime_now). Methods that would
// modify a list or dict are refused, as in jinja2's immutable sandbox. Not the filters and tests.
#include <sys/time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "jinja/interp.h"

namespace strata::jinja {

// ---- case mapping --------------------------------------------------------------------------------------------
// ASCII, Latin-1, Greek and Cyrillic letters: enough for the text chat templates transform, without Unicode
// tables. Other characters pass through unchanged.

static char32_t to_upper_cp(char32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}
static char32_t to_lower_cp(char32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}
static bool is_lower_cp(char32_t c) { return to_upper_cp(c) != c || c == 0xDF; }
static bool is_upper_cp(char32_t c) { return to_lower_cp(c) != c; }
static bool is_alpha_cp(char32_t c) {
    return is_lower_cp(c) || is_upper_cp(c) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) ||
           (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0xAA && c <= 0x2AF && c != 0xD7 && c != 0xF7 && c != 0xBB && c != 0xAB);
}
static bool is_digit_cp(char32_t c) { return c >= '0' && c <= '9'; }

std::string str_upper(const std::string &s) {
    std::u32string c = decode_utf8(s);
    for (auto &x : c) x = to_upper_cp(x);
    return encode_utf8(c);
}
std::string str_lower(const std::string &s) {
    std::u32string c = decode_utf8(s);
    for (auto &x : c) x = to_lower_cp(x);
    return encode_utf8(c);
}
std::string str_capitalize(const std::string &s) {
    std::u32string c = decode_utf8(s);
    for (size_t i = 0; i < c.size(); i++) c[i] = i == 0 ? to_upper_cp(c[i]) : to_lower_cp(c[i]);
    return encode_utf8(c);
}
// str.title(): a cased letter after a non-cased character starts a word.
std::string str_title(const std::string &s) {
    std::u32string c = decode_utf8(s);
    bool prev_cased = false;
    for (auto &x : c) {
        bool cased = is_lower_cp(x) || is_upper_cp(x);
        if (cased) x = prev_cased ? to_lower_cp(x) : to_upper_cp(x);
        prev_cased = cased;
    }
    return encode_utf8(c);
}

// ---- shared string helpers -----------------------------------------------------------------------------------

std::string strip_chars(const std::string &s, const Value &chars, bool left, bool right) {
    std::u32string c = decode_utf8(s), set;
    bool ws = chars.is_undefined() || chars.is_none();
    if (!ws) {
        if (!chars.is_string()) throw_error("strip arg must be None or str");
        set = decode_utf8(chars.str());
    }
    auto strip = [&](char32_t x) { return ws ? is_py_space(x) : set.find(x) != std::u32string::npos; };
    size_t b = 0, e = c.size();
    if (left)
        while (b < e && strip(c[b])) b++;
    if (right)
        while (e > b && strip(c[e - 1])) e--;
    return encode_utf8(c.substr(b, e - b));
}

static std::vector<std::string> split_ws(const std::string &s, int64_t maxsplit) {
    std::u32string c = decode_utf8(s);
    std::vector<std::string> out;
    size_t i = 0;
    while (i < c.size()) {
        while (i < c.size() && is_py_space(c[i])) i++;
        if (i >= c.size()) break;
        if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
            out.push_back(encode_utf8(c.substr(i)));  // the rest, trailing whitespace included
            break;
        }
        size_t j = i;
        while (j < c.size() && !is_py_space(c[j])) j++;
        out.push_back(encode_utf8(c.substr(i, j - i)));
        i = j;
    }
    return out;
}

static std::vector<std::string> split_sep(const std::string &s, const std::string &sep, int64_t maxsplit) {
    if (sep.empty()) throw_error("empty separator");
    std::vector<std::string> out;
    size_t start = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
        size_t p = s.find(sep, start);
        if (p == std::string::npos) break;
        out.push_back(s.substr(start, p - start));
        start = p + sep.size();
    }
    out.push_back(s.substr(start));
    return out;
}

static std::vector<std::string> rsplit_sep(const std::string &s, const std::string &sep, int64_t maxsplit) {
    if (sep.empty()) throw_error("empty separator");
    std::vector<std::string> out;
    size_t end = s.size();
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
        if (end < sep.size()) break;
        size_t p = s.rfind(sep, end - sep.size());
        if (p == std::string::npos) break;
        out.push_back(s.substr(p + sep.size(), end - p - sep.size()));
        end = p;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
}

static Value str_list(const std::vector<std::string> &v) {
    List l;
    for (auto &s : v) l.push_back(Value::string(s));
    return Value::list(std::move(l));
}

static std::string need_str(const Value &v, const char *what) {
    if (!v.is_string()) throw_error(std::string(what) + " must be str, not " + v.type_name());
    return v.str();
}

// Byte offset -> code point index (find/index return code point positions).
static int64_t cp_index(const std::string &s, size_t byte_pos) { return length(Value::string(s.substr(0, byte_pos))); }

// Python's optional start/end arguments, in code points, resolved to a byte range of s.
static std::pair<size_t, size_t> byte_range(const std::string &s, const Value &start, const Value &end) {
    std::u32string c = decode_utf8(s);
    int64_t n = int64_t(c.size());
    auto norm = [&](const Value &v, int64_t dflt) {
        if (v.is_undefined() || v.is_none()) return dflt;
        int64_t x = v.as_int();
        if (x < 0) x += n;
        return std::clamp<int64_t>(x, 0, n);
    };
    int64_t b = norm(start, 0), e = norm(end, n);
    if (e < b) e = b;
    return {encode_utf8(c.substr(0, size_t(b))).size(), encode_utf8(c.substr(0, size_t(e))).size()};
}

// ---- printf-style % ------------------------------------------------------------------------------------------

static std::string pad(std::string s, int64_t width, bool left, char fill = ' ') {
    int64_t n = length(Value::string(s));
    if (n >= width) return s;
    std::string p(size_t(width - n), fill);
    return left ? s + p : p + s;
}

static std::string format_number(const Value &v, char type, int precision, bool plus, bool space) {
    char buf[512];
    std::string sign;
    if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o') {
        if (!v.is_number()) throw_error("%" + std::string(1, type) + " format: a number is required, not " + v.type_name());
        int64_t i = v.kind() == Kind::Float ? int64_t(std::trunc(v.as_double())) : v.as_int();
        if (i < 0) sign = "-";
        else if (plus) sign = "+";
        else if (space) sign = " ";
        uint64_t u = i < 0 ? uint64_t(0) - uint64_t(i) : uint64_t(i);
        const char *f = type == 'x' ? "%llx" : type == 'X' ? "%llX" : type == 'o' ? "%llo" : "%llu";
        std::snprintf(buf, sizeof buf, f, (unsigned long long)u);
        return sign + buf;
    }
    if (!v.is_number()) throw_error("must be real number, not " + v.type_name());
    double d = v.as_double();
    std::string f = std::string("%") + (plus ? "+" : space ? " " : "") + "." + std::to_string(precision < 0 ? 6 : precision) + type;
    std::snprintf(buf, sizeof buf, f.c_str(), d);
    return buf;
}

std::string py_format(const std::string &fmt, const Value &args) {
    List pos;
    const Dict *named = nullptr;
    if (args.kind() == Kind::Tuple) pos = args.items();
    else if (args.kind() == Kind::Dict) named = &args.dict_ref();
    else pos.push_back(args);
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); i++) {
        if (fmt[i] != '%') {
            out.push_back(fmt[i]);
            continue;
        }
        if (++i >= fmt.size()) throw_error("incomplete format");
        Value arg;
        bool have = false;
        if (fmt[i] == '(') {
            size_t e = fmt.find(')', i);
            if (e == std::string::npos) throw_error("incomplete format key");
            if (!named) throw_error("format requires a mapping");
            const Value *v = named->find(Value::string(fmt.substr(i + 1, e - i - 1)));
            if (!v) throw_error("KeyError: " + python_str_repr(fmt.substr(i + 1, e - i - 1)));
            arg = *v;
            have = true;
            i = e + 1;
        }
        bool left = false, plus = false, space = false, zero = false;
        for (; i < fmt.size() && std::string("-+ 0#").find(fmt[i]) != std::string::npos; i++) {
            left |= fmt[i] == '-';
            plus |= fmt[i] == '+';
            space |= fmt[i] == ' ';
            zero |= fmt[i] == '0';
        }
        int64_t width = 0;
        while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') width = width * 10 + (fmt[i++] - '0');
        int precision = -1;
        if (i < fmt.size() && fmt[i] == '.') {
            precision = 0;
            while (++i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') precision = precision * 10 + (fmt[i] - '0');
        }
        if (i >= fmt.size()) throw_error("incomplete format");
        char type = fmt[i];
        if (type == '%') {
            out.push_back('%');
            continue;
        }
        if (!have) {
            if (named) {
                arg = args;
            } else {
                if (next >= pos.size()) throw_error("not enough arguments for format string");
                arg = pos[next++];
            }
        }
        std::string s;
        switch (type) {
        case 's': s = arg.to_str(); break;
        case 'r':
        case 'a': s = arg.repr(); break;
        case 'c': s = arg.is_string() ? arg.str() : std::string(1, char(arg.as_int())); break;
        case 'd': case 'i': case 'x': case 'X': case 'o': case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
            s = format_number(arg, type, precision, plus, space);
            break;
        default: throw_error(std::string("unsupported format character '") + type + "'");
        }
        if (precision >= 0 && (type == 's' || type == 'r')) s = slice(Value::string(s), Value(), Value::integer(precision), Value()).str();
        if (zero && !left && type != 's' && type != 'r' && !s.empty() && (s[0] == '-' || s[0] == '+')) {
            s = s[0] + pad(s.substr(1), width - 1, false, '0');
        } else {
            s = pad(s, width, left, zero && !left && type != 's' && type != 'r' ? '0' : ' ');
        }
        out += s;
    }
    if (!named && next < pos.size()) throw_error("not all arguments converted during string formatting");
    return out;
}

// str.format(): positional ({}, {0}) and named fields, !r/!s, and [[fill]align][sign][0][width][.precision][type].
static std::string str_format(const std::string &fmt, Args &a) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t i = 0; i < fmt.size(); i++) {
        char c = fmt[i];
        if (c == '}' ) {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') i++;
            else throw_error("Single '}' encountered in format string");
            out.push_back('}');
            continue;
        }
        if (c != '{') {
            out.push_back(c);
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out.push_back('{');
            i++;
            continue;
        }
        size_t e = fmt.find('}', i);
        if (e == std::string::npos) throw_error("expected '}' before end of string");
        std::string field = fmt.substr(i + 1, e - i - 1), spec, conv;
        i = e;
        if (size_t p = field.find(':'); p != std::string::npos) {
            spec = field.substr(p + 1);
            field.resize(p);
        }
        if (size_t p = field.find('!'); p != std::string::npos) {
            conv = field.substr(p + 1);
            field.resize(p);
        }
        Value v;
        if (field.empty()) {
            if (auto_idx >= a.pos.size()) throw_error("Replacement index " + std::to_string(auto_idx) + " out of range");
            v = a.pos[auto_idx++];
        } else if (std::all_of(field.begin(), field.end(), [](char x) { return x >= '0' && x <= '9'; })) {
            size_t k = std::stoul(field);
            if (k >= a.pos.size()) throw_error("Replacement index " + field + " out of range");
            v = a.pos[k];
        } else {
            bool found = false;
            for (auto &[k, x] : a.kw)
                if (k == field) {
                    v = x;
                    found = true;
                }
            if (!found) throw_error("KeyError: " + python_str_repr(field));
        }
        std::string s;
        char fill = ' ', align = 0, type = 0;
        int64_t width = 0;
        int precision = -1;
        size_t p = 0;
        if (spec.size() >= 2 && std::string("<>^").find(spec[1]) != std::string::npos) {
            fill = spec[0];
            align = spec[1];
            p = 2;
        } else if (!spec.empty() && std::string("<>^").find(spec[0]) != std::string::npos) {
            align = spec[0];
            p = 1;
        }
        if (p < spec.size() && spec[p] == '0') {
            fill = '0';
            if (!align) align = '>';
            p++;
        }
        while (p < spec.size() && spec[p] >= '0' && spec[p] <= '9') width = width * 10 + (spec[p++] - '0');
        if (p < spec.size() && spec[p] == '.') {
            precision = 0;
            while (++p < spec.size() && spec[p] >= '0' && spec[p] <= '9') precision = precision * 10 + (spec[p] - '0');
        }
        if (p < spec.size()) type = spec[p++];
        if (p != spec.size()) throw_error("Invalid format specifier '" + spec + "'");
        if (conv == "r") s = v.repr();
        else if (type && type != 's') s = format_number(v, type, precision, false, false);
        else {
            s = v.to_str();
            if (precision >= 0) s = slice(Value::string(s), Value(), Value::integer(precision), Value()).str();
        }
        if (!align) align = (v.is_number() && conv.empty()) ? '>' : '<';
        int64_t n = length(Value::string(s));
        if (n < width) {
            size_t padn = size_t(width - n);
            if (align == '<') s += std::string(padn, fill);
            else if (align == '>') s = std::string(padn, fill) + s;
            else s = std::string(padn / 2, fill) + s + std::string(padn - padn / 2, fill);
        }
        out += s;
    }
    return out;
}

// ---- methods -------------------------------------------------------------------------------------------------

using Fn = std::function<Value(Interp &, Args &)>;

static Value make_method(const std::string &name, Fn f) { return Value::callable(name, std::move(f)); }

static Value string_method(const Value &self, const std::string &n) {
    const std::string s = self.str();
    auto m = [&](Fn f) { return make_method(n, std::move(f)); };
    if (n == "startswith" || n == "endswith") {
        bool starts = n == "startswith";
        return m([s, starts, n](Interp &, Args &a) {
            ArgReader r(a, n);
            Value pre = r.get(0, "prefix"), b = r.get(1, "start"), e = r.get(2, "end");
            r.done(3);
            auto [lo, hi] = byte_range(s, b, e);
            std::string sub = s.substr(lo, hi - lo);
            List cands = pre.kind() == Kind::Tuple ? pre.items() : List{pre};
            for (const Value &c : cands) {
                std::string x = need_str(c, (n + " first arg").c_str());
                if (x.size() <= sub.size() &&
                    (starts ? sub.compare(0, x.size(), x) == 0 : sub.compare(sub.size() - x.size(), x.size(), x) == 0))
                    return Value::boolean(true);
            }
            return Value::boolean(false);
        });
    }
    if (n == "split" || n == "rsplit") {
        bool right = n == "rsplit";
        return m([s, right, n](Interp &, Args &a) {
            ArgReader r(a, n);
            Value sep = r.get(0, "sep"), mx = r.get(1, "maxsplit", Value::integer(-1));
            r.done(2);
            int64_t maxsplit = mx.as_int();
            if (sep.is_none() || sep.is_undefined()) {
                if (!right || maxsplit < 0) return str_list(split_ws(s, maxsplit));
                // rsplit() on whitespace with a limit: split the reversed string.
                std::u32string c = decode_utf8(s);
                std::reverse(c.begin(), c.end());
                std::vector<std::string> parts = split_ws(encode_utf8(c), maxsplit);
                for (auto &p : parts) {
                    std::u32string pc = decode_utf8(p);
                    std::reverse(pc.begin(), pc.end());
                    p = encode_utf8(pc);
                }
                std::reverse(parts.begin(), parts.end());
                return str_list(parts);
            }
            std::string x = need_str(sep, "sep");
            return str_list(right ? rsplit_sep(s, x, maxsplit) : split_sep(s, x, maxsplit));
        });
    }
    if (n == "splitlines") {
        return m([s](Interp &, Args &a) {
            ArgReader r(a, "splitlines");
            bool keep = r.get(0, "keepends", Value::boolean(false)).truthy();
            r.done(1);
            List out;
            std::u32string c = decode_utf8(s), cur;
            for (size_t i = 0; i < c.size(); i++) {
                char32_t x = c[i];
                bool nl = x == '\n' || x == '\r' || x == 0x0B || x == 0x0C || x == 0x1C || x == 0x1D || x == 0x1E ||
                          x == 0x85 || x == 0x2028 || x == 0x2029;
                if (!nl) {
                    cur.push_back(x);
                    continue;
                }
                std::u32string end(1, x);
                if (x == '\r' && i + 1 < c.size() && c[i + 1] == '\n') {
                    end.push_back('\n');
                    i++;
                }
                out.push_back(Value::string(encode_utf8(keep ? cur + end : cur)));
                cur.clear();
            }
            if (!cur.empty()) out.push_back(Value::string(encode_utf8(cur)));
            return Value::list(std::move(out));
        });
    }
    if (n == "strip" || n == "lstrip" || n == "rstrip") {
        bool l = n != "rstrip", rt = n != "lstrip";
        return m([s, l, rt, n](Interp &, Args &a) {
            ArgReader r(a, n);
            Value chars = r.get(0, "chars");
            r.done(1);
            return Value::string(strip_chars(s, chars, l, rt));
        });
    }
    if (n == "replace") {
        return m([s](Interp &, Args &a) {
            ArgReader r(a, "replace");
            std::string old = need_str(r.get(0, "old"), "replace() argument 1"),
                        neu = need_str(r.get(1, "new"), "replace() argument 2");
            int64_t count = r.get(2, "count", Value::integer(-1)).as_int();
            r.done(3);
            std::string out;
            if (old.empty()) {
                // Python inserts `new` between characters (and at both ends).
                List chars = iterate(Value::string(s));
                int64_t done = 0;
                for (size_t i = 0; i <= chars.size(); i++) {
                    if (count < 0 || done < count) {
                        out += neu;
                        done++;
                    }
                    if (i < chars.size()) out += chars[i].str();
                }
                return Value::string(out);
            }
            size_t pos = 0;
            int64_t done = 0;
            while (count < 0 || done < count) {
                size_t p = s.find(old, pos);
                if (p == std::string::npos) break;
                out += s.substr(pos, p - pos) + neu;
                pos = p + old.size();
                done++;
            }
            return Value::string(out + s.substr(pos));
        });
    }
    auto unary = [&](std::string (*f)(const std::string &)) {
        return m([s, f, n](Interp &, Args &a) {
            ArgReader(a, n).done(0);
            return Value::string(f(s));
        });
    };
    if (n == "upper") return unary(str_upper);
    if (n == "lower") return unary(str_lower);
    if (n == "title") return unary(str_title);
    if (n == "capitalize") return unary(str_capitalize);
    if (n == "swapcase") {
        return unary([](const std::string &x) {
            std::u32string c = decode_utf8(x);
            for (auto &ch : c) ch = is_upper_cp(ch) ? to_lower_cp(ch) : to_upper_cp(ch);
            return encode_utf8(c);
        });
    }
    if (n == "find" || n == "rfind" || n == "index" || n == "rindex" || n == "count") {
        return m([s, n](Interp &, Args &a) {
            ArgReader r(a, n);
            std::string sub = need_str(r.get(0, "sub"), "must be str");
            Value b = r.get(1, "start"), e = r.get(2, "end");
            r.done(3);
            auto [lo, hi] = byte_range(s, b, e);
            std::string hay = s.substr(lo, hi - lo);
            if (n == "count") {
                if (sub.empty()) return Value::integer(length(Value::string(hay)) + 1);
                int64_t c = 0;
                for (size_t p = hay.find(sub); p != std::string::npos; p = hay.find(sub, p + sub.size())) c++;
                return Value::integer(c);
            }
            size_t p = (n == "find" || n == "index") ? hay.find(sub) : hay.rfind(sub);
            if (p == std::string::npos) {
                if (n == "index" || n == "rindex") throw_error("substring not found");
                return Value::integer(-1);
            }
            return Value::integer(cp_index(s, lo + p));
        });
    }
    if (n == "join") {
        return m([s](Interp &, Args &a) {
            ArgReader r(a, "join");
            Value it = r.get(0, "iterable");
            r.done(1);
            std::string out;
            bool first = true;
            for (const Value &v : iterate(it)) {
                if (!v.is_string()) throw_error("sequence item: expected str instance, " + v.type_name() + " found");
                if (!first) out += s;
                first = false;
                out += v.str();
            }
            return Value::string(out);
        });
    }
    if (n == "isdigit" || n == "isnumeric" || n == "isdecimal" || n == "isalpha" || n == "isalnum" || n == "isspace" ||
        n == "islower" || n == "isupper") {
        return m([s, n](Interp &, Args &a) {
            ArgReader(a, n).done(0);
            std::u32string c = decode_utf8(s);
            if (c.empty()) return Value::boolean(false);
            if (n == "islower" || n == "isupper") {
                bool any = false;
                for (char32_t x : c) {
                    if (n == "islower" ? is_upper_cp(x) : is_lower_cp(x)) return Value::boolean(false);
                    any |= is_lower_cp(x) || is_upper_cp(x);
                }
                return Value::boolean(any);
            }
            for (char32_t x : c) {
                bool ok = n == "isspace" ? is_py_space(x)
                        : n == "isalpha" ? is_alpha_cp(x)
                        : n == "isalnum" ? (is_alpha_cp(x) || is_digit_cp(x))
                                         : is_digit_cp(x);
                if (!ok) return Value::boolean(false);
            }
            return Value::boolean(true);
        });
    }
    if (n == "center" || n == "ljust" || n == "rjust") {
        return m([s, n](Interp &, Args &a) {
            ArgReader r(a, n);
            int64_t w = r.get(0, "width").as_int();
            std::string fill = r.get(1, "fillchar", Value::string(" ")).str();
            r.done(2);
            int64_t len = length(Value::string(s));
            if (w <= len) return Value::string(s);
            int64_t total = w - len, left = n == "ljust" ? 0 : n == "rjust" ? total : total / 2 + (total & w & 1);
            std::string out;
            for (int64_t i = 0; i < left; i++) out += fill;
            out += s;
            for (int64_t i = 0; i < total - left; i++) out += fill;
            return Value::string(out);
        });
    }
    if (n == "zfill") {
        return m([s](Interp &, Args &a) {
            ArgReader r(a, "zfill");
            int64_t w = r.get(0, "width").as_int();
            r.done(1);
            int64_t len = length(Value::string(s));
            if (w <= len) return Value::string(s);
            std::string zeros(size_t(w - len), '0');
            if (!s.empty() && (s[0] == '-' || s[0] == '+')) return Value::string(s.substr(0, 1) + zeros + s.substr(1));
            return Value::string(zeros + s);
        });
    }
    if (n == "removeprefix" || n == "removesuffix") {
        return m([s, n](Interp &, Args &a) {
            ArgReader r(a, n);
            std::string x = need_str(r.get(0, "affix"), n.c_str());
            r.done(1);
            if (n == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
            if (n == "removesuffix" && !x.empty() && s.size() >= x.size() &&
                s.compare(s.size() - x.size(), x.size(), x) == 0)
                return Value::string(s.substr(0, s.size() - x.size()));
            return Value::string(s);
        });
    }
    if (n == "partition" || n == "rpartition") {
        return m([s, n](Interp &, Args &a) {
            ArgReader r(a, n);
            std::string sep = need_str(r.get(0, "sep"), n.c_str());
            r.done(1);
            if (sep.empty()) throw_error("empty separator");
            size_t p = n == "partition" ? s.find(sep) : s.rfind(sep);
            if (p == std::string::npos)
                return n == "partition" ? Value::tuple({Value::string(s), Value::string(""), Value::string("")})
                                        : Value::tuple({Value::string(""), Value::string(""), Value::string(s)});
            return Value::tuple({Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))});
        });
    }
    if (n == "format") return m([s](Interp &, Args &a) { return Value::string(str_format(s, a)); });
    return Value::undefined("");
}

static Value unsafe_method(const Value &self, const std::string &n) {
    return Value::unsafe("access to attribute '" + n + "' of '" + self.type_name() + "' object is unsafe.");
}

Value Interp::method(const Value &obj, const std::string &n) {
    switch (obj.kind()) {
    case Kind::String: return string_method(obj, n);
    case Kind::List:
    case Kind::Tuple: {
        if (n == "index" || n == "count") {
            return make_method(n, [obj, n](Interp &, Args &a) {
                ArgReader r(a, n);
                Value x = r.get(0, "value");
                r.done(n == "index" ? 3 : 1);
                int64_t c = 0;
                const List &l = obj.items();
                for (size_t i = 0; i < l.size(); i++) {
                    if (!equals(l[i], x)) continue;
                    if (n == "index") return Value::integer(int64_t(i));
                    c++;
                }
                if (n == "index") throw_error(x.repr() + " is not in list");
                return Value::integer(c);
            });
        }
        if (n == "copy" && obj.kind() == Kind::List)
            return make_method(n, [obj](Interp &, Args &a) {
                ArgReader(a, "copy").done(0);
                return obj;
            });
        if (obj.kind() == Kind::List && (n == "append" || n == "extend" || n == "insert" || n == "pop" ||
                                         n == "remove" || n == "reverse" || n == "sort" || n == "clear"))
            return unsafe_method(obj, n);
        return Value::undefined("");
    }
    case Kind::Dict: {
        if (n == "items" || n == "keys" || n == "values") {
            return make_method(n, [obj, n](Interp &, Args &a) {
                ArgReader(a, n).done(0);
                List out;
                for (const auto &[k, v] : obj.dict_ref().items())
                    out.push_back(n == "items" ? Value::tuple({k, v}) : n == "keys" ? k : v);
                return Value::list(std::move(out));
            });
        }
        if (n == "get") {
            return make_method(n, [obj](Interp &, Args &a) {
                ArgReader r(a, "get");
                Value k = r.get(0, "key"), d = r.get(1, "default", Value::none());
                r.done(2);
                const Value *v = obj.dict_ref().find(k);
                return v ? *v : d;
            });
        }
        if (n == "copy")
            return make_method(n, [obj](Interp &, Args &a) {
                ArgReader(a, "copy").done(0);
                return obj;
            });
        if (n == "pop" || n == "popitem" || n == "setdefault" || n == "update" || n == "clear")
            return unsafe_method(obj, n);
        return Value::undefined("");
    }
    default: return Value::undefined("");
    }
}

// ---- globals -------------------------------------------------------------------------------------------------

std::string now_strftime(const std::string &fmt) {
    struct timeval tv {};
    gettimeofday(&tv, nullptr);
    time_t t = tv.tv_sec;
    long usec = long(tv.tv_usec);
    // SOURCE_DATE_EPOCH pins "now" (reproducible output; the cross-checks use it).
    if (const char *e = std::getenv("SOURCE_DATE_EPOCH"); e && *e) {
        t = time_t(std::strtoll(e, nullptr, 10));
        usec = 0;
    }
    struct tm tmv {};
    localtime_r(&t, &tmv);
    // %f (microseconds) is Python's own; the rest is the C library's, as in Python's datetime.strftime.
    std::string f;
    for (size_t i = 0; i < fmt.size(); i++) {
        if (fmt[i] == '%' && i + 1 < fmt.size() && fmt[i + 1] == 'f') {
            char b[8];
            std::snprintf(b, sizeof b, "%06ld", usec);
            f += b;
            i++;
        } else if (fmt[i] == '%' && i + 1 < fmt.size()) {
            f += fmt.substr(i, 2);
            i++;
        } else {
            f.push_back(fmt[i]);
        }
    }
    if (f.empty()) return "";
    std::string out(256 + f.size() * 8, '\0');
    size_t n = std::strftime(out.data(), out.size(), f.c_str(), &tmv);
    out.resize(n);
    return out;
}

namespace {

struct Cycler : Object {
    List items;
    size_t pos = 0;
    const char *type_name() const override { return "jinja2.utils.Cycler"; }
    bool get_attr(Interp &, const std::string &n, Value &out) override {
        if (n == "current") {
            out = items[pos];
        } else if (n == "next") {
            out = Value::callable("next", [this](Interp &, Args &) {
                Value v = items[pos];
                pos = (pos + 1) % items.size();
                return v;
            });
        } else if (n == "reset") {
            out = Value::callable("reset", [this](Interp &, Args &) {
                pos = 0;
                return Value::none();
            });
        } else {
            return false;
        }
        return true;
    }
};

}  // namespace

ScopeP Interp::builtin_globals() {
    auto g = std::make_shared<Scope>();
    g->vars["range"] = make_method("range", [](Interp &, Args &a) {
        if (!a.kw.empty()) throw_error("range() takes no keyword arguments");
        if (a.pos.empty() || a.pos.size() > 3) throw_error("range expected 1 to 3 arguments");
        for (auto &v : a.pos)
            if (!v.is_int()) throw_error("'" + v.type_name() + "' object cannot be interpreted as an integer");
        int64_t start = 0, stop, step = 1;
        if (a.pos.size() == 1) stop = a.pos[0].as_int();
        else {
            start = a.pos[0].as_int();
            stop = a.pos[1].as_int();
            if (a.pos.size() == 3) step = a.pos[2].as_int();
        }
        if (step == 0) throw_error("range() arg 3 must not be zero");
        int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
        if (n > 100000) throw_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        List out;
        for (int64_t i = 0; i < n; i++) out.push_back(Value::integer(start + i * step));
        return Value::list(std::move(out));
    });
    auto build_dict = [](Args &a, const char *fname) {
        Dict d;
        if (a.pos.size() > 1) throw_error(std::string(fname) + " expected at most 1 argument");
        if (a.pos.size() == 1) {
            const Value &src = a.pos[0];
            if (src.kind() == Kind::Dict) d = src.dict_ref();
            else if (src.kind() == Kind::Object) throw_error(std::string(fname) + ": cannot copy a " + src.type_name());
            else
                for (const Value &kv : iterate(src)) {
                    List pair = iterate(kv);
                    if (pair.size() != 2) throw_error("dictionary update sequence element has wrong length");
                    d.set(pair[0], pair[1]);
                }
        }
        for (auto &[k, v] : a.kw) d.set(Value::string(k), v);
        return d;
    };
    g->vars["dict"] = make_method("dict", [build_dict](Interp &, Args &a) { return Value::dict(build_dict(a, "dict")); });
    g->vars["namespace"] = make_method("namespace", [build_dict](Interp &, Args &a) {
        return Value::object(make_namespace(build_dict(a, "namespace")));
    });
    g->vars["cycler"] = make_method("cycler", [](Interp &, Args &a) {
        if (a.pos.empty()) throw_error("at least one item has to be provided");
        auto c = std::make_shared<Cycler>();
        c->items = a.pos;
        return Value::object(c);
    });
    g->vars["joiner"] = make_method("joiner", [](Interp &, Args &a) {
        ArgReader r(a, "joiner");
        std::string sep = r.get(0, "sep", Value::string(", ")).to_str();
        r.done(1);
        auto used = std::make_shared<bool>(false);
        return make_method("joiner", [sep, used](Interp &, Args &) {
            if (!*used) {
                *used = true;
                return Value::string("");
            }
            return Value::string(sep);
        });
    });
    g->vars["raise_exception"] = make_method("raise_exception", [](Interp &, Args &a) -> Value {
        ArgReader r(a, "raise_exception");
        Value msg = r.get(0, "message");
        r.done(1);
        throw_error("the template raised an error: " + msg.to_str());
    });
    g->vars["strftime_now"] = make_method("strftime_now", [](Interp &, Args &a) {
        ArgReader r(a, "strftime_now");
        Value f = r.get(0, "format");
        r.done(1);
        return Value::string(now_strftime(need_str(f, "strftime() argument 1")));
    });
    return g;
}

}  // namespace strata::jinja
