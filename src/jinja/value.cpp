// Values of the chat-template language: construction, Python printing (str/repr), equality and ordering,
// iteration, JSON in and out. Not the evaluator: operators and attribute lookup live in the interpreter.
#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace strata::jinja {

void throw_error(std::string message) { throw TemplateError{std::move(message), 0}; }
void throw_error_at(int line, std::string message) { throw TemplateError{std::move(message), line}; }

// ---- UTF-8 ---------------------------------------------------------------------------------------------------

void append_utf8(std::string &out, char32_t cp) {
    if (cp >= 0xDC80 && cp <= 0xDCFF) {  // an undecodable byte carried through (see decode_utf8)
        out.push_back(char(cp - 0xDC00));
    } else if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

std::u32string decode_utf8(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = (unsigned char)s[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        bool ok = n > 0 && i + size_t(n) <= s.size();
        for (int k = 1; ok && k < n; k++) {
            unsigned char cc = (unsigned char)s[i + size_t(k)];
            if ((cc & 0xC0) != 0x80) ok = false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        // Reject overlong forms, surrogates and out-of-range values the way a strict decoder does.
        if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
                   (cp >= 0xD800 && cp <= 0xDFFF)))
            ok = false;
        if (!ok) {
            out.push_back(0xDC00 + c);
            i++;
        } else {
            out.push_back(cp);
            i += size_t(n);
        }
    }
    return out;
}

std::string encode_utf8(const std::u32string &cps) {
    std::string out;
    out.reserve(cps.size());
    for (char32_t cp : cps) append_utf8(out, cp);
    return out;
}

bool is_py_space(char32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

// Python's str.isprintable() for repr. Exact for ASCII and Latin-1; above that it covers the common
// non-printing blocks (spaces, format characters, private use) rather than the full Unicode tables.
static bool py_printable(char32_t c) {
    if (c < 0x20 || c == 0x7F) return false;
    if (c < 0x7F) return true;
    if (c <= 0xA0 || c == 0xAD) return false;
    if (c < 0x300) return true;
    if (c == 0x61C || c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
        (c >= 0x205F && c <= 0x206F) || c == 0x3000 || (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF ||
        (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF || c >= 0xF0000 || (c >= 0xE0000 && c <= 0xE0FFF))
        return false;
    return true;
}

std::string python_str_repr(std::string_view s) {
    bool has_single = s.find('\'') != std::string_view::npos, has_double = s.find('"') != std::string_view::npos;
    char quote = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, quote);
    char buf[16];
    for (char32_t c : decode_utf8(s)) {
        if (c == char32_t(quote) || c == '\\') {
            out.push_back('\\');
            out.push_back(char(c));
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (py_printable(c)) {
            append_utf8(out, c);
        } else {
            if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
            else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
            else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(c));
            out += buf;
        }
    }
    out.push_back(quote);
    return out;
}

std::string html_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '\'': out += "&#39;"; break;
        case '"': out += "&#34;"; break;
        default: out.push_back(c);
        }
    }
    return out;
}

// ---- floats --------------------------------------------------------------------------------------------------

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, r.ptr);  // shortest round-trip digits: "-1.2345e+02"
    bool neg = sci[0] == '-';
    if (neg) sci.erase(0, 1);
    size_t epos = sci.find('e');
    std::string digits = sci.substr(0, epos);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    int exp = std::atoi(sci.c_str() + epos + 1);
    std::string out = neg ? "-" : "";
    // Python's repr switches to exponent notation outside [1e-4, 1e16).
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            std::string ip = digits.substr(0, std::min(digits.size(), size_t(exp + 1)));
            while (ip.size() < size_t(exp + 1)) ip.push_back('0');
            std::string fp = digits.size() > size_t(exp + 1) ? digits.substr(size_t(exp + 1)) : "0";
            out += ip + "." + fp;
        } else {
            out += "0." + std::string(size_t(-exp - 1), '0') + digits;
        }
    } else {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += eb;
    }
    return out;
}

// ---- Dict ----------------------------------------------------------------------------------------------------

// Hash identity of a key: equal Python keys (1, 1.0, True) share one id; unhashable kinds are an error.
static std::string key_id(const Value &k) {
    switch (k.kind()) {
    case Kind::String: return "s" + k.str();
    case Kind::Bool:
    case Kind::Int: return "i" + std::to_string(k.as_int());
    case Kind::Float: {
        double d = k.as_double();
        if (std::floor(d) == d && std::fabs(d) < 9e18) return "i" + std::to_string(int64_t(d));
        return "f" + float_repr(d);
    }
    case Kind::None: return "n";
    case Kind::Tuple: {
        std::string id = "t";
        for (const Value &e : k.items()) {
            std::string sub = key_id(e);
            id += std::to_string(sub.size()) + ":" + sub;
        }
        return id;
    }
    case Kind::Undefined: throw_error("unhashable type: 'Undefined'");
    default: throw_error("unhashable type: '" + k.type_name() + "'");
    }
}

const Value *Dict::find(const Value &key) const {
    if (key.kind() == Kind::List || key.kind() == Kind::Dict || key.kind() == Kind::Undefined) return nullptr;
    auto it = index_.find(key_id(key));
    return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const Value &key, Value v) {
    std::string id = key_id(key);
    auto it = index_.find(id);
    if (it != index_.end()) {
        items_[it->second].second = std::move(v);
        return;
    }
    index_.emplace(std::move(id), items_.size());
    items_.emplace_back(key, std::move(v));
}

// ---- Object defaults -----------------------------------------------------------------------------------------

void Object::set_attr(const std::string &name, Value) {
    throw_error(std::string("cannot assign attribute '") + name + "' on a " + type_name() + " object");
}

std::string Object::repr(Interp &) { return std::string("<") + type_name() + " object>"; }

// ---- Value ---------------------------------------------------------------------------------------------------

Value Value::undefined(std::string hint) {
    Value v;
    v.s_ = std::make_shared<const std::string>(std::move(hint));
    return v;
}
Value Value::unsafe(std::string hint) {
    Value v = undefined(std::move(hint));
    v.safe_ = true;
    return v;
}
Value Value::none() {
    Value v;
    v.kind_ = Kind::None;
    return v;
}
Value Value::boolean(bool b) {
    Value v;
    v.kind_ = Kind::Bool;
    v.b_ = b;
    return v;
}
Value Value::integer(int64_t i) {
    Value v;
    v.kind_ = Kind::Int;
    v.i_ = i;
    return v;
}
Value Value::number(double f) {
    Value v;
    v.kind_ = Kind::Float;
    v.f_ = f;
    return v;
}
Value Value::string(std::string s, bool safe) {
    Value v;
    v.kind_ = Kind::String;
    v.s_ = std::make_shared<const std::string>(std::move(s));
    v.safe_ = safe;
    return v;
}
Value Value::list(List items) {
    Value v;
    v.kind_ = Kind::List;
    v.list_ = std::make_shared<const List>(std::move(items));
    return v;
}
Value Value::generator(List items) {
    Value v = list(std::move(items));
    v.safe_ = true;
    return v;
}
Value Value::tuple(List items) {
    Value v = list(std::move(items));
    v.kind_ = Kind::Tuple;
    return v;
}
Value Value::dict(Dict d) {
    Value v;
    v.kind_ = Kind::Dict;
    v.dict_ = std::make_shared<const Dict>(std::move(d));
    return v;
}
Value Value::callable(std::string name, std::function<Value(Interp &, Args &)> fn) {
    Value v;
    v.kind_ = Kind::Callable;
    v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
    return v;
}
Value Value::object(std::shared_ptr<Object> o) {
    Value v;
    v.kind_ = Kind::Object;
    v.obj_ = std::move(o);
    return v;
}

// Input nesting is bounded: templates never need more, and it keeps hostile JSON from exhausting the stack.
static Value from_json_at(const nlohmann::ordered_json &j, int depth) {
    if (depth > 512) throw_error("JSON input nested more than 512 levels deep");
    using V = Value;
    using T = nlohmann::ordered_json::value_t;
    switch (j.type()) {
    case T::null: return V::none();
    case T::boolean: return V::boolean(j.get<bool>());
    case T::number_integer: return V::integer(j.get<int64_t>());
    case T::number_unsigned: {
        uint64_t u = j.get<uint64_t>();
        return u <= uint64_t(INT64_MAX) ? V::integer(int64_t(u)) : V::number(double(u));
    }
    case T::number_float: return V::number(j.get<double>());
    case T::string: return V::string(j.get<std::string>());
    case T::array: {
        List l;
        l.reserve(j.size());
        for (const auto &e : j) l.push_back(from_json_at(e, depth + 1));
        return V::list(std::move(l));
    }
    case T::object: {
        Dict d;
        for (auto it = j.begin(); it != j.end(); ++it) d.set(V::string(it.key()), from_json_at(it.value(), depth + 1));
        return V::dict(std::move(d));
    }
    default: return V::none();
    }
}

Value Value::from_json(const nlohmann::ordered_json &j) { return from_json_at(j, 0); }

double Value::as_double() const {
    if (kind_ == Kind::Float) return f_;
    return double(as_int());
}

const void *Value::identity() const {
    switch (kind_) {
    case Kind::String: return s_.get();
    case Kind::List:
    case Kind::Tuple: return list_.get();
    case Kind::Dict: return dict_.get();
    case Kind::Callable: return fn_.get();
    case Kind::Object: return obj_.get();
    default: return nullptr;
    }
}

std::string Value::type_name() const {
    switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return safe_ ? "Markup" : "str";
    case Kind::List: return safe_ ? "generator" : "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Callable: return "function";
    case Kind::Object: return obj_->type_name();
    }
    return "object";
}

bool Value::truthy() const {
    switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0;
    case Kind::String: return !s_->empty();
    case Kind::List: return safe_ || !list_->empty();
    case Kind::Tuple: return !list_->empty();
    case Kind::Dict: return dict_->size() != 0;
    default: return true;
    }
}

void Value::require_defined() const {
    if (kind_ == Kind::Undefined) throw_error(s_ ? *s_ : std::string("value is undefined"));
}

static std::string join_repr(const List &l, const char *open, const char *close, bool tuple) {
    std::string out = open;
    for (size_t i = 0; i < l.size(); i++) {
        if (i) out += ", ";
        out += l[i].repr();
    }
    if (tuple && l.size() == 1) out += ",";
    return out + close;
}

std::string Value::to_str() const {
    switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return float_repr(f_);
    case Kind::String: return *s_;
    case Kind::List: return safe_ ? "<generator object>" : join_repr(*list_, "[", "]", false);
    case Kind::Tuple: return join_repr(*list_, "(", ")", true);
    case Kind::Dict: {
        std::string out = "{";
        bool first = true;
        for (const auto &[k, v] : dict_->items()) {
            if (!first) out += ", ";
            first = false;
            out += k.repr() + ": " + v.repr();
        }
        return out + "}";
    }
    case Kind::Callable: return "<function " + fn_->name + ">";
    case Kind::Object: return std::string("<") + obj_->type_name() + " object>";
    }
    return "";
}

std::string Value::repr() const {
    if (kind_ == Kind::String) return safe_ ? "Markup(" + python_str_repr(*s_) + ")" : python_str_repr(*s_);
    if (kind_ == Kind::Undefined) return "Undefined";
    return to_str();
}

// ---- equality, ordering, iteration ---------------------------------------------------------------------------

bool equals(const Value &a, const Value &b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    if (a.is_generator() || b.is_generator()) return a.identity() == b.identity();
    switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List:
    case Kind::Tuple: {
        const List &x = a.items(), &y = b.items();
        if (x.size() != y.size()) return false;
        for (size_t i = 0; i < x.size(); i++)
            if (!equals(x[i], y[i])) return false;
        return true;
    }
    case Kind::Dict: {
        if (a.dict_ref().size() != b.dict_ref().size()) return false;
        for (const auto &[k, v] : a.dict_ref().items()) {
            const Value *o = b.dict_ref().find(k);
            if (!o || !equals(v, *o)) return false;
        }
        return true;
    }
    default: return a.identity() == b.identity();
    }
}

bool less_than(const Value &a, const Value &b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.as_double() < b.as_double();
        return a.as_int() < b.as_int();
    }
    if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order is code point order
    if (a.is_list_like() && a.kind() == b.kind() && !a.is_generator() && !b.is_generator()) {
        const List &x = a.items(), &y = b.items();
        for (size_t i = 0; i < x.size() && i < y.size(); i++)
            if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
        return x.size() < y.size();
    }
    a.require_defined();
    b.require_defined();
    throw_error("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

List iterate(const Value &v) {
    switch (v.kind()) {
    case Kind::Undefined:
        if (v.is_unsafe_undefined()) v.require_defined();
        return {};
    case Kind::List:
    case Kind::Tuple: return v.items();
    case Kind::String: {
        List out;
        for (char32_t c : decode_utf8(v.str())) {
            std::string s;
            append_utf8(s, c);
            out.push_back(Value::string(std::move(s)));
        }
        return out;
    }
    case Kind::Dict: {
        List out;
        out.reserve(v.dict_ref().size());
        for (const auto &kv : v.dict_ref().items()) out.push_back(kv.first);
        return out;
    }
    default: throw_error("'" + v.type_name() + "' object is not iterable");
    }
}

int64_t length(const Value &v) {
    switch (v.kind()) {
    case Kind::Undefined: return 0;
    case Kind::String: {
        int64_t n = 0;
        for (unsigned char c : v.str()) n += (c & 0xC0) != 0x80;
        // Continuation bytes without a lead byte are separate characters after decoding; count exactly then.
        return n == int64_t(v.str().size()) ? n : int64_t(decode_utf8(v.str()).size());
    }
    case Kind::List:
        if (v.is_generator()) throw_error("object of type 'generator' has no len()");
        return int64_t(v.items().size());
    case Kind::Tuple: return int64_t(v.items().size());
    case Kind::Dict: return int64_t(v.dict_ref().size());
    default: throw_error("object of type '" + v.type_name() + "' has no len()");
    }
}

bool contains(const Value &hay, const Value &needle) {
    switch (hay.kind()) {
    case Kind::String:
        if (!needle.is_string())
            throw_error("'in <string>' requires string as left operand, not " + needle.type_name());
        return hay.str().find(needle.str()) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
        for (const Value &e : hay.items())
            if (equals(e, needle)) return true;
        return false;
    case Kind::Dict: {
        if (needle.kind() == Kind::List || needle.kind() == Kind::Dict)
            throw_error("unhashable type: '" + needle.type_name() + "'");
        return hay.dict_ref().find(needle) != nullptr;
    }
    case Kind::Undefined: return false;
    default: throw_error("argument of type '" + hay.type_name() + "' is not iterable");
    }
}

// ---- JSON out (json.dumps) -----------------------------------------------------------------------------------

static void dump_string(std::string &out, std::string_view s, bool ensure_ascii) {
    out.push_back('"');
    char buf[16];
    for (char32_t c : decode_utf8(s)) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
                if (c >= 0x10000) {
                    char32_t v = c - 0x10000;
                    std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xD800 + (v >> 10)),
                                  unsigned(0xDC00 + (v & 0x3FF)));
                } else {
                    std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
                }
                out += buf;
            } else {
                append_utf8(out, c);
            }
        }
    }
    out.push_back('"');
}

static std::string json_float(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
    return float_repr(d);
}

static void dump_value(std::string &out, const Value &v, const JsonStyle &st, int level) {
    auto newline = [&](int lv) {
        out.push_back('\n');
        for (int i = 0; i < lv; i++) out += st.indent;
    };
    switch (v.kind()) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: out += json_float(v.as_double()); return;
    case Kind::String: dump_string(out, v.str(), st.ensure_ascii); return;
    case Kind::List:
    case Kind::Tuple: {
        if (v.is_generator()) throw_error("Object of type generator is not JSON serializable");
        const List &l = v.items();
        if (l.empty()) {
            out += "[]";
            return;
        }
        out.push_back('[');
        for (size_t i = 0; i < l.size(); i++) {
            if (i) out += st.item_sep;
            if (st.indent_set) newline(level + 1);
            dump_value(out, l[i], st, level + 1);
        }
        if (st.indent_set) newline(level);
        out.push_back(']');
        return;
    }
    case Kind::Dict: {
        std::vector<std::pair<Value, Value>> items = v.dict_ref().items();
        if (items.empty()) {
            out += "{}";
            return;
        }
        if (st.sort_keys)
            std::stable_sort(items.begin(), items.end(),
                             [](const auto &a, const auto &b) { return less_than(a.first, b.first); });
        out.push_back('{');
        bool first = true;
        for (const auto &[k, val] : items) {
            if (!first) out += st.item_sep;
            first = false;
            if (st.indent_set) newline(level + 1);
            std::string key;
            switch (k.kind()) {
            case Kind::String: key = k.str(); break;
            case Kind::Bool: key = k.as_bool() ? "true" : "false"; break;
            case Kind::Int: key = std::to_string(k.as_int()); break;
            case Kind::Float: key = json_float(k.as_double()); break;
            case Kind::None: key = "null"; break;
            default: throw_error("keys must be str, int, float, bool or None, not " + k.type_name());
            }
            dump_string(out, key, st.ensure_ascii);
            out += st.key_sep;
            dump_value(out, val, st, level + 1);
        }
        if (st.indent_set) newline(level);
        out.push_back('}');
        return;
    }
    default: throw_error("Object of type " + v.type_name() + " is not JSON serializable");
    }
}

std::string dumps(const Value &v, const JsonStyle &style) {
    std::string out;
    dump_value(out, v, style, 0);
    return out;
}

}  // namespace strata::jinja
