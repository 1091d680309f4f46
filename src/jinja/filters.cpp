// Builtin filters and tests of the chat-template language, following jinja2 3.1's definitions, transformers' tojson
// override (json.dumps with ensure_ascii=False, no HTML escaping) and the from_json filter serving frameworks add.
// Filters that return generators in jinja2 (map, select, items, reverse, ...) return generator-flagged lists. Not the
// methods or globals (methods.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "jinja/interp.h"

namespace strata::jinja {

std::string str_upper(const std::string &s);
std::string str_lower(const std::string &s);
std::string str_capitalize(const std::string &s);

namespace {

using FilterFn = Value (*)(Interp &, const Value &, Args &);
using TestFn = bool (*)(Interp &, const Value &, Args &);

// soft_str(): strings stay as they are (Markup included), anything else goes through str().
Value soft_str(const Value &v) { return v.is_string() ? v : Value::string(v.to_str()); }
Value same_safety(const Value &input, std::string s) { return Value::string(std::move(s), input.is_safe()); }

// Attribute paths as filters take them: "a.b.0" looks up a, then b, then item 0 (digits become integers).
std::vector<Value> attr_parts(const Value &attribute) {
    std::vector<Value> parts;
    if (attribute.is_none() || attribute.is_undefined()) return parts;
    if (!attribute.is_string()) return {attribute};
    std::string s = attribute.str();
    size_t start = 0;
    while (true) {
        size_t dot = s.find('.', start);
        std::string p = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
        parts.push_back(digits ? Value::integer(std::stoll(p)) : Value::string(p));
        if (dot == std::string::npos) break;
        start = dot + 1;
    }
    return parts;
}

Value lookup_path(Interp &in, Value item, const std::vector<Value> &parts, const Value &dflt = Value()) {
    for (const Value &p : parts) {
        item = in.getitem(item, p);
        if (!dflt.is_undefined() && !dflt.is_none() && item.is_undefined()) item = dflt;
    }
    return item;
}

Value lower_if_str(const Value &v) { return v.is_string() ? Value::string(str_lower(v.str())) : v; }

// A sort key for sort/unique/min/max/dictsort: the attribute (or comma-separated attributes) then lowercasing.
Value sort_key(Interp &in, const Value &item, const Value &attribute, bool case_sensitive) {
    if (attribute.is_string() && attribute.str().find(',') != std::string::npos) {
        List keys;
        std::string s = attribute.str();
        size_t start = 0;
        while (true) {
            size_t c = s.find(',', start);
            Value k = lookup_path(in, item, attr_parts(Value::string(s.substr(start, c == std::string::npos ? c : c - start))));
            keys.push_back(case_sensitive ? k : lower_if_str(k));
            if (c == std::string::npos) break;
            start = c + 1;
        }
        return Value::list(std::move(keys));
    }
    Value k = lookup_path(in, item, attr_parts(attribute));
    return case_sensitive ? k : lower_if_str(k);
}

bool py_less(const Value &a, const Value &b) {
    a.require_defined();
    b.require_defined();
    bool ok = (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
              (a.is_list_like() && a.kind() == b.kind() && !a.is_generator() && !b.is_generator());
    if (!ok)
        throw_error("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
    return less_than(a, b);
}

// ---- filters -------------------------------------------------------------------------------------------------

Value f_abs(Interp &, const Value &v, Args &a) {
    ArgReader(a, "abs").done(0);
    v.require_defined();
    if (v.kind() == Kind::Float) return Value::number(std::fabs(v.as_double()));
    if (v.is_int()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
    throw_error("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "attr");
    Value name = r.get(0, "name");
    r.done(1);
    std::string n = name.to_str();
    if (v.kind() == Kind::Object) {
        Value out;
        if (v.object_ref().get_attr(in, n, out)) return out;
    } else if (!v.is_undefined()) {
        Value m = Interp::method(v, n);
        if (!m.is_undefined() || m.is_unsafe_undefined()) return m;
    } else {
        v.require_defined();
    }
    return Value::undefined(type_repr(v) + " has no attribute " + python_str_repr(n));
}

Value f_batch(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "batch");
    int64_t n = r.get(0, "linecount").as_int();
    Value fill = r.get(1, "fill_with", Value::none());
    r.done(2);
    if (n <= 0) throw_error("batch linecount must be positive");
    List out, cur;
    for (const Value &x : iterate(v)) {
        if (int64_t(cur.size()) == n) {
            out.push_back(Value::list(std::move(cur)));
            cur.clear();
        }
        cur.push_back(x);
    }
    if (!cur.empty()) {
        if (!fill.is_none())
            while (int64_t(cur.size()) < n) cur.push_back(fill);
        out.push_back(Value::list(std::move(cur)));
    }
    return Value::generator(std::move(out));
}

Value f_capitalize(Interp &, const Value &v, Args &a) {
    ArgReader(a, "capitalize").done(0);
    return same_safety(v, str_capitalize(soft_str(v).str()));
}

Value f_center(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "center");
    Value w = r.get(0, "width", Value::integer(80));
    r.done(1);
    Args m;
    m.pos.push_back(w);
    return in.call(Interp::method(soft_str(v), "center"), m);
}

Value f_default(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "default");
    Value d = r.get(0, "default_value", Value::string("")), boolean = r.get(1, "boolean", Value::boolean(false));
    r.done(2);
    if (v.is_undefined() || (boolean.truthy() && !v.truthy())) return d;
    return v;
}

Value f_dictsort(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "dictsort");
    bool cs = r.get(0, "case_sensitive", Value::boolean(false)).truthy();
    std::string by = r.get(1, "by", Value::string("key")).to_str();
    bool reverse = r.get(2, "reverse", Value::boolean(false)).truthy();
    r.done(3);
    if (v.kind() != Kind::Dict) {
        v.require_defined();
        throw_error("'" + v.type_name() + "' object has no attribute 'items'");
    }
    if (by != "key" && by != "value") throw_error("You can only sort by either \"key\" or \"value\"");
    size_t pos = by == "key" ? 0 : 1;
    List items;
    for (const auto &[k, x] : v.dict_ref().items()) items.push_back(Value::tuple({k, x}));
    std::stable_sort(items.begin(), items.end(), [&](const Value &x, const Value &y) {
        Value kx = x.items()[pos], ky = y.items()[pos];
        if (!cs) {
            kx = lower_if_str(kx);
            ky = lower_if_str(ky);
        }
        return reverse ? py_less(ky, kx) : py_less(kx, ky);
    });
    return Value::list(std::move(items));
}

Value f_escape(Interp &, const Value &v, Args &a) {
    ArgReader(a, "escape").done(0);
    if (v.is_safe()) return v;
    return Value::string(html_escape(v.to_str()), true);
}

Value f_forceescape(Interp &, const Value &v, Args &a) {
    ArgReader(a, "forceescape").done(0);
    return Value::string(html_escape(v.to_str()), true);
}

Value f_first(Interp &, const Value &v, Args &a) {
    ArgReader(a, "first").done(0);
    List l = iterate(v);
    return l.empty() ? Value::undefined("No first item, sequence was empty.") : l.front();
}

Value f_last(Interp &, const Value &v, Args &a) {
    ArgReader(a, "last").done(0);
    List l = iterate(v);
    return l.empty() ? Value::undefined("No last item, sequence was empty.") : l.back();
}

// Python's float(str): optional whitespace, sign, digits, '.', exponent, inf/nan, underscores between digits.
bool parse_py_float(const std::string &s, double &out) {
    std::string t = strip_chars(s, Value(), true, true), clean;
    for (size_t i = 0; i < t.size(); i++) {
        if (t[i] == '_') {
            if (i == 0 || i + 1 >= t.size() || !isdigit((unsigned char)t[i - 1]) || !isdigit((unsigned char)t[i + 1]))
                return false;
            continue;
        }
        clean.push_back(t[i]);
    }
    if (clean.empty()) return false;
    std::string low = str_lower(clean);
    std::string body = (low[0] == '+' || low[0] == '-') ? low.substr(1) : low;
    if (body == "inf" || body == "infinity" || body == "nan") {
        out = body == "nan" ? NAN : INFINITY;
        if (low[0] == '-') out = -out;
        return true;
    }
    if (body.find_first_not_of("0123456789.e+-") != std::string::npos || body.find('x') != std::string::npos) return false;
    char *end = nullptr;
    out = std::strtod(clean.c_str(), &end);
    return end && *end == 0;
}

bool parse_py_int(const std::string &s, int64_t base, int64_t &out) {
    std::string t = strip_chars(s, Value(), true, true);
    if (t.empty()) return false;
    size_t i = 0;
    bool neg = false;
    if (t[0] == '+' || t[0] == '-') {
        neg = t[0] == '-';
        i = 1;
    }
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (i + 1 < t.size() && t[i] == '0') {
            char p = char(t[i + 1] | 0x20);
            int64_t b = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
            if (b && (base == 0 || base == b)) {
                base = b;
                i += 2;
                if (i < t.size() && t[i] == '_') i++;
            }
        }
        if (base == 0) base = 10;
    }
    if (i >= t.size()) return false;
    unsigned __int128 v = 0;
    bool prev_digit = false;
    for (; i < t.size(); i++) {
        char c = t[i];
        if (c == '_') {
            if (!prev_digit || i + 1 >= t.size()) return false;
            prev_digit = false;
            continue;
        }
        int d = (c >= '0' && c <= '9') ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base) return false;
        v = v * unsigned(base) + unsigned(d);
        if (v > (unsigned __int128)INT64_MAX + 1) throw_error("integer value beyond 64 bits is not supported");
        prev_digit = true;
    }
    if (!prev_digit) return false;
    if (!neg && v > (unsigned __int128)INT64_MAX) throw_error("integer value beyond 64 bits is not supported");
    out = neg ? -int64_t(v - 1) - 1 : int64_t(v);
    return true;
}

Value f_float(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "float");
    Value d = r.get(0, "default", Value::number(0.0));
    r.done(1);
    v.require_defined();
    if (v.is_number()) return Value::number(v.as_double());
    double x;
    if (v.is_string() && parse_py_float(v.str(), x)) return Value::number(x);
    return d;
}

Value f_int(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "int");
    Value d = r.get(0, "default", Value::integer(0)), base = r.get(1, "base", Value::integer(10));
    r.done(2);
    v.require_defined();
    if (v.is_int()) return Value::integer(v.as_int());
    if (v.kind() == Kind::Float) {
        double x = v.as_double();
        if (std::isnan(x) || std::isinf(x)) return d;
        return Value::integer(int64_t(std::trunc(x)));
    }
    if (v.is_string()) {
        int64_t i;
        if (parse_py_int(v.str(), base.as_int(), i)) return Value::integer(i);
        double x;
        if (parse_py_float(v.str(), x) && !std::isnan(x) && !std::isinf(x)) return Value::integer(int64_t(std::trunc(x)));
    }
    return d;
}

Value f_format(Interp &, const Value &v, Args &a) {
    if (!a.pos.empty() && !a.kw.empty()) throw_error("can't handle positional and keyword arguments at the same time");
    Value args;
    if (!a.kw.empty()) {
        Dict d;
        for (auto &[k, x] : a.kw) d.set(Value::string(k), x);
        args = Value::dict(std::move(d));
    } else {
        args = Value::tuple(a.pos);
    }
    return same_safety(v, py_format(soft_str(v).str(), args));
}

Value f_groupby(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "groupby");
    Value attribute = r.get(0, "attribute"), dflt = r.get(1, "default", Value::none());
    bool cs = r.get(2, "case_sensitive", Value::boolean(false)).truthy();
    r.done(3);
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value &x : iterate(v)) {
        Value k = lookup_path(in, x, attr_parts(attribute), dflt);
        keyed.emplace_back(cs ? k : lower_if_str(k), x);
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](auto &p, auto &q) { return py_less(p.first, q.first); });
    List out;
    for (size_t i = 0; i < keyed.size();) {
        size_t j = i;
        List group;
        while (j < keyed.size() && equals(keyed[j].first, keyed[i].first)) group.push_back(keyed[j++].second);
        // Without case_sensitive the group is named by its first item's original value, as jinja2 does.
        Value name = cs ? keyed[i].first : lookup_path(in, group[0], attr_parts(attribute), dflt);
        out.push_back(Value::tuple({name, Value::list(std::move(group))}));
        i = j;
    }
    return Value::list(std::move(out));
}

List splitlines(const std::string &s) {
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
        if (x == '\r' && i + 1 < c.size() && c[i + 1] == '\n') i++;
        out.push_back(Value::string(encode_utf8(cur)));
        cur.clear();
    }
    if (!cur.empty()) out.push_back(Value::string(encode_utf8(cur)));
    return out;
}

Value f_indent(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "indent");
    Value width = r.get(0, "width", Value::integer(4));
    bool first = r.get(1, "first", Value::boolean(false)).truthy();
    bool blank = r.get(2, "blank", Value::boolean(false)).truthy();
    r.done(3);
    v.require_defined();
    std::string ind = width.is_string() ? width.str() : std::string(size_t(std::max<int64_t>(width.as_int(), 0)), ' ');
    // jinja2 appends a newline first so that splitlines() keeps a trailing empty line.
    List lines = splitlines(soft_str(v).str() + "\n");
    std::string rv;
    if (blank) {
        for (size_t i = 0; i < lines.size(); i++) rv += (i ? "\n" + ind : "") + lines[i].str();
    } else {
        for (size_t i = 0; i < lines.size(); i++) {
            const std::string &l = lines[i].str();
            if (i == 0) rv = l;
            else rv += "\n" + (l.empty() ? l : ind + l);
        }
    }
    if (first) rv = ind + rv;
    return same_safety(v, rv);
}

Value f_items(Interp &, const Value &v, Args &a) {
    ArgReader(a, "items").done(0);
    if (v.is_undefined()) return Value::generator({});
    if (v.kind() != Kind::Dict) throw_error("Can only get item pairs from a mapping.");
    List out;
    for (const auto &[k, x] : v.dict_ref().items()) out.push_back(Value::tuple({k, x}));
    return Value::generator(std::move(out));
}

Value f_join(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "join");
    std::string d = r.get(0, "d", Value::string("")).to_str();
    Value attribute = r.get(1, "attribute", Value::none());
    r.done(2);
    std::string out;
    bool first = true;
    for (const Value &x : iterate(v)) {
        if (!first) out += d;
        first = false;
        Value item = attribute.is_none() ? x : lookup_path(in, x, attr_parts(attribute));
        out += item.kind() == Kind::Object ? item.object_ref().repr(in) : item.to_str();
    }
    return Value::string(out);
}

Value f_length(Interp &, const Value &v, Args &a) {
    ArgReader(a, "length").done(0);
    return Value::integer(length(v));
}

Value f_list(Interp &, const Value &v, Args &a) {
    ArgReader(a, "list").done(0);
    return Value::list(iterate(v));
}

Value f_lower(Interp &, const Value &v, Args &a) {
    ArgReader(a, "lower").done(0);
    return same_safety(v, str_lower(soft_str(v).str()));
}

Value f_upper(Interp &, const Value &v, Args &a) {
    ArgReader(a, "upper").done(0);
    return same_safety(v, str_upper(soft_str(v).str()));
}

Value f_map(Interp &in, const Value &v, Args &a) {
    List out;
    if (a.pos.empty()) {
        Value attribute, dflt = Value::none();
        for (auto &[k, x] : a.kw) {
            if (k == "attribute") attribute = x;
            else if (k == "default") dflt = x;
            else throw_error("Unexpected keyword argument '" + k + "'");
        }
        if (attribute.is_undefined()) throw_error("map requires a filter argument");
        if (!v.truthy()) return Value::generator({});
        for (const Value &x : iterate(v)) out.push_back(lookup_path(in, x, attr_parts(attribute), dflt));
        return Value::generator(std::move(out));
    }
    std::string name = a.pos[0].to_str();
    if (!has_filter(name)) throw_error("No filter named '" + name + "'.");
    if (!v.truthy()) return Value::generator({});
    for (const Value &x : iterate(v)) {
        Args sub;
        sub.pos.assign(a.pos.begin() + 1, a.pos.end());
        sub.kw = a.kw;
        out.push_back(in.apply_filter(name, x, sub));
    }
    return Value::generator(std::move(out));
}

Value select_common(Interp &in, const Value &v, Args &a, bool attr, bool keep) {
    size_t off = attr ? 1 : 0;
    if (attr && a.pos.empty()) throw_error("Missing parameter for attribute name");
    std::vector<Value> parts = attr ? attr_parts(a.pos[0]) : std::vector<Value>{};
    bool has_test_name = a.pos.size() > off;
    std::string test = has_test_name ? a.pos[off].to_str() : "";
    if (has_test_name && !has_test(test)) throw_error("No test named '" + test + "'.");
    List out;
    if (!v.truthy()) return Value::generator({});
    for (const Value &x : iterate(v)) {
        Value probe = attr ? lookup_path(in, x, parts) : x;
        bool ok;
        if (has_test_name) {
            Args sub;
            sub.pos.assign(a.pos.begin() + long(off) + 1, a.pos.end());
            sub.kw = a.kw;
            ok = in.apply_test(test, probe, sub);
        } else {
            ok = probe.truthy();
        }
        if (ok == keep) out.push_back(x);
    }
    return Value::generator(std::move(out));
}
Value f_select(Interp &in, const Value &v, Args &a) { return select_common(in, v, a, false, true); }
Value f_reject(Interp &in, const Value &v, Args &a) { return select_common(in, v, a, false, false); }
Value f_selectattr(Interp &in, const Value &v, Args &a) { return select_common(in, v, a, true, true); }
Value f_rejectattr(Interp &in, const Value &v, Args &a) { return select_common(in, v, a, true, false); }

Value min_max(Interp &in, const Value &v, Args &a, bool want_max) {
    ArgReader r(a, want_max ? "max" : "min");
    bool cs = r.get(0, "case_sensitive", Value::boolean(false)).truthy();
    Value attribute = r.get(1, "attribute", Value::none());
    r.done(2);
    List l = iterate(v);
    if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    Value bk = sort_key(in, l[0], attribute, cs);
    for (size_t i = 1; i < l.size(); i++) {
        Value k = sort_key(in, l[i], attribute, cs);
        if (want_max ? py_less(bk, k) : py_less(k, bk)) {
            best = i;
            bk = k;
        }
    }
    return l[best];
}
Value f_min(Interp &in, const Value &v, Args &a) { return min_max(in, v, a, false); }
Value f_max(Interp &in, const Value &v, Args &a) { return min_max(in, v, a, true); }

Value f_replace(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "replace");
    Value old = r.get(0, "old"), neu = r.get(1, "new"), count = r.get(2, "count", Value::none());
    r.done(3);
    Args m;
    m.pos = {soft_str(old), soft_str(neu), count.is_none() ? Value::integer(-1) : count};
    return same_safety(v, in.call(Interp::method(soft_str(v), "replace"), m).str());
}

Value f_reverse(Interp &, const Value &v, Args &a) {
    ArgReader(a, "reverse").done(0);
    if (v.is_string()) return slice(v, Value(), Value(), Value::integer(-1));
    List l = iterate(v);
    std::reverse(l.begin(), l.end());
    return Value::generator(std::move(l));
}

Value f_round(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "round");
    int64_t precision = r.get(0, "precision", Value::integer(0)).as_int();
    std::string method = r.get(1, "method", Value::string("common")).to_str();
    r.done(2);
    if (method != "common" && method != "ceil" && method != "floor")
        throw_error("method must be common, ceil or floor");
    v.require_defined();
    if (!v.is_number()) throw_error("type " + v.type_name() + " doesn't define __round__ method");
    if (method == "common") {
        if (v.is_int() && precision >= 0) return Value::integer(v.as_int());
        // Python's round(x, n): correctly rounded decimal, ties to even, which printf's %.*f also does.
        char buf[512];
        if (precision >= 0 && precision < 300) {
            std::snprintf(buf, sizeof buf, "%.*f", int(precision), v.as_double());
            return Value::number(std::strtod(buf, nullptr));
        }
        double p = std::pow(10.0, double(-precision));
        return Value::number(std::nearbyint(v.as_double() / p) * p);
    }
    double p = std::pow(10.0, double(precision));
    double x = v.as_double() * p;
    return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_safe(Interp &, const Value &v, Args &a) {
    ArgReader(a, "safe").done(0);
    return Value::string(v.to_str(), true);
}

Value f_slice(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "slice");
    int64_t slices = r.get(0, "slices").as_int();
    Value fill = r.get(1, "fill_with", Value::none());
    r.done(2);
    if (slices <= 0) throw_error("slices must be positive");
    List seq = iterate(v), out;
    int64_t n = int64_t(seq.size()), per = n / slices, extra = n % slices, offset = 0;
    for (int64_t i = 0; i < slices; i++) {
        int64_t start = offset + i * per;
        if (i < extra) offset++;
        int64_t end = offset + (i + 1) * per;
        List part(seq.begin() + start, seq.begin() + end);
        if (!fill.is_none() && i >= extra) part.push_back(fill);
        out.push_back(Value::list(std::move(part)));
    }
    return Value::generator(std::move(out));
}

Value f_sort(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "sort");
    bool reverse = r.get(0, "reverse", Value::boolean(false)).truthy();
    bool cs = r.get(1, "case_sensitive", Value::boolean(false)).truthy();
    Value attribute = r.get(2, "attribute", Value::none());
    r.done(3);
    List l = iterate(v);
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value &x : l) keyed.emplace_back(sort_key(in, x, attribute, cs), x);
    std::stable_sort(keyed.begin(), keyed.end(),
                     [&](auto &p, auto &q) { return reverse ? py_less(q.first, p.first) : py_less(p.first, q.first); });
    List out;
    for (auto &kv : keyed) out.push_back(kv.second);
    return Value::list(std::move(out));
}

Value f_string(Interp &in, const Value &v, Args &a) {
    ArgReader(a, "string").done(0);
    if (v.kind() == Kind::Object) return Value::string(v.object_ref().repr(in));
    return soft_str(v);
}

Value f_striptags(Interp &, const Value &v, Args &a) {
    ArgReader(a, "striptags").done(0);
    std::string s = soft_str(v).str(), out;
    for (size_t i = 0; i < s.size(); i++) {
        if (s.compare(i, 4, "<!--") == 0) {
            size_t e = s.find("-->", i + 4);
            if (e != std::string::npos) {
                i = e + 2;
                continue;
            }
        }
        if (s[i] == '<') {
            size_t e = s.find('>', i + 1);
            if (e != std::string::npos) {
                i = e;
                continue;
            }
        }
        out.push_back(s[i]);
    }
    // Collapse whitespace like " ".join(s.split()), then unescape the basic entities.
    std::string joined;
    std::u32string c = decode_utf8(out);
    bool in_word = false;
    for (char32_t ch : c) {
        if (is_py_space(ch)) {
            in_word = false;
            continue;
        }
        if (!in_word && !joined.empty()) joined.push_back(' ');
        in_word = true;
        append_utf8(joined, ch);
    }
    static const std::pair<const char *, const char *> ents[] = {
        {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#34;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}};
    for (auto &[e, r] : ents)
        for (size_t p = joined.find(e); p != std::string::npos; p = joined.find(e, p + 1)) joined.replace(p, strlen(e), r);
    return Value::string(joined);
}

Value f_sum(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "sum");
    Value attribute = r.get(0, "attribute", Value::none()), acc = r.get(1, "start", Value::integer(0));
    r.done(2);
    for (const Value &x : iterate(v)) acc = in.binop("+", acc, attribute.is_none() ? x : lookup_path(in, x, attr_parts(attribute)));
    return acc;
}

// jinja2's title: words begin after '-', whitespace, or an opening bracket; each word is capitalized.
Value f_title(Interp &, const Value &v, Args &a) {
    ArgReader(a, "title").done(0);
    std::u32string c = decode_utf8(soft_str(v).str());
    auto is_sep = [](char32_t x) { return x == '-' || x == '(' || x == '{' || x == '[' || x == '<' || is_py_space(x); };
    std::u32string out;
    bool start = true;
    for (char32_t x : c) {
        if (is_sep(x)) {
            out.push_back(x);
            start = true;
            continue;
        }
        std::string one;
        append_utf8(one, x);
        out += decode_utf8(start ? str_upper(one) : str_lower(one));
        start = false;
    }
    return same_safety(v, encode_utf8(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "tojson");
    Value ensure_ascii = r.get(0, "ensure_ascii", Value::boolean(false)), indent = r.get(1, "indent", Value::none()),
          separators = r.get(2, "separators", Value::none()), sort_keys = r.get(3, "sort_keys", Value::boolean(false));
    r.done(4);
    JsonStyle st;
    st.ensure_ascii = ensure_ascii.truthy();
    st.sort_keys = sort_keys.truthy();
    if (!indent.is_none()) {
        st.indent_set = true;
        st.indent = indent.is_string() ? indent.str() : std::string(size_t(std::max<int64_t>(indent.as_int(), 0)), ' ');
        st.item_sep = ",";
    }
    if (!separators.is_none()) {
        List seps = iterate(separators);
        if (seps.size() != 2) throw_error("separators must be an (item_separator, key_separator) pair");
        st.item_sep = seps[0].to_str();
        st.key_sep = seps[1].to_str();
    }
    return Value::string(dumps(v, st));
}

// from_json / fromjson: not jinja2's, but defined by serving frameworks for released templates that normalise tool-call
// arguments, which clients send as a JSON string or as an object: a string is parsed as JSON, anything else is
// returned as it is. A string that is not JSON fails the render, naming the filter.
Value f_from_json(Interp &, const Value &v, Args &a) {
    ArgReader(a, "from_json").done(0);
    v.require_defined();
    if (!v.is_string()) return v;
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(v.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw_error("from_json: the string is not JSON");
    return Value::from_json(j);
}

Value f_trim(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "trim");
    Value chars = r.get(0, "chars", Value::none());
    r.done(1);
    return same_safety(v, strip_chars(soft_str(v).str(), chars, true, true));
}

Value f_truncate(Interp &, const Value &v, Args &a) {
    ArgReader r(a, "truncate");
    int64_t len = r.get(0, "length", Value::integer(255)).as_int();
    bool killwords = r.get(1, "killwords", Value::boolean(false)).truthy();
    std::string end = r.get(2, "end", Value::string("...")).to_str();
    Value lw = r.get(3, "leeway", Value::none());
    r.done(4);
    int64_t leeway = lw.is_none() ? 5 : lw.as_int();
    std::string s = soft_str(v).str();
    int64_t end_len = length(Value::string(end));
    if (len < end_len) throw_error("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(len));
    if (leeway < 0) throw_error("expected leeway >= 0, got " + std::to_string(leeway));
    if (length(Value::string(s)) <= len + leeway) return Value::string(s);
    std::string head = slice(Value::string(s), Value(), Value::integer(len - end_len), Value()).str();
    if (killwords) return Value::string(head + end);
    size_t sp = head.rfind(' ');
    return Value::string((sp == std::string::npos ? head : head.substr(0, sp)) + end);
}

Value f_unique(Interp &in, const Value &v, Args &a) {
    ArgReader r(a, "unique");
    bool cs = r.get(0, "case_sensitive", Value::boolean(false)).truthy();
    Value attribute = r.get(1, "attribute", Value::none());
    r.done(2);
    List out, seen;
    for (const Value &x : iterate(v)) {
        Value k = sort_key(in, x, attribute, cs);
        bool dup = false;
        for (const Value &s : seen)
            if (equals(s, k)) dup = true;
        if (dup) continue;
        seen.push_back(k);
        out.push_back(x);
    }
    return Value::generator(std::move(out));
}

Value f_wordcount(Interp &, const Value &v, Args &a) {
    ArgReader(a, "wordcount").done(0);
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : decode_utf8(soft_str(v).str())) {
        bool w = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 (c >= 0xAA && !is_py_space(c) && c != 0xD7 && c != 0xF7 && !(c >= 0x2000 && c <= 0x206F) &&
                  !(c >= 0x3000 && c <= 0x303F) && !(c >= 0xFF00 && c <= 0xFF0F));
        if (w && !in_word) n++;
        in_word = w;
    }
    return Value::integer(n);
}

const std::unordered_map<std::string, FilterFn> &filters() {
    static const std::unordered_map<std::string, FilterFn> m = {
        {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
        {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
        {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_forceescape},
        {"format", f_format}, {"from_json", f_from_json}, {"fromjson", f_from_json}, {"groupby", f_groupby},
        {"indent", f_indent}, {"int", f_int}, {"items", f_items},
        {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list}, {"lower", f_lower},
        {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr},
        {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe},
        {"select", f_select}, {"selectattr", f_selectattr}, {"slice", f_slice}, {"sort", f_sort},
        {"string", f_string}, {"striptags", f_striptags}, {"sum", f_sum}, {"title", f_title},
        {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", f_truncate}, {"unique", f_unique},
        {"upper", f_upper}, {"wordcount", f_wordcount},
    };
    return m;
}

// ---- tests ---------------------------------------------------------------------------------------------------

Value one_arg(Args &a, const char *name) {
    ArgReader r(a, name);
    Value v = r.get(0, "other");
    r.done(1);
    return v;
}

bool t_boolean(Interp &, const Value &v, Args &) { return v.kind() == Kind::Bool; }
bool t_callable(Interp &, const Value &v, Args &) {
    return v.kind() == Kind::Callable || v.is_unsafe_undefined() || v.is_undefined();
}
bool t_defined(Interp &, const Value &v, Args &) { return !v.is_undefined(); }
bool t_undefined(Interp &, const Value &v, Args &) { return v.is_undefined(); }
bool t_divisibleby(Interp &in, const Value &v, Args &a) {
    Value n = one_arg(a, "divisibleby");
    return equals(in.binop("%", v, n), Value::integer(0));
}
bool t_eq(Interp &, const Value &v, Args &a) { return equals(v, one_arg(a, "eq")); }
bool t_ne(Interp &, const Value &v, Args &a) { return !equals(v, one_arg(a, "ne")); }
bool cmp_args(const Value &v, const Value &o, const char *op) {
    v.require_defined();
    o.require_defined();
    bool ok = (v.is_number() && o.is_number()) || (v.is_string() && o.is_string()) ||
              (v.is_list_like() && v.kind() == o.kind() && !v.is_generator() && !o.is_generator());
    if (!ok)
        throw_error(std::string("'") + op + "' not supported between instances of '" + v.type_name() + "' and '" +
                    o.type_name() + "'");
    return true;
}
bool t_lt(Interp &, const Value &v, Args &a) {
    Value o = one_arg(a, "lt");
    return cmp_args(v, o, "<") && less_than(v, o);
}
bool t_le(Interp &, const Value &v, Args &a) {
    Value o = one_arg(a, "le");
    return cmp_args(v, o, "<=") && !less_than(o, v);
}
bool t_gt(Interp &, const Value &v, Args &a) {
    Value o = one_arg(a, "gt");
    return cmp_args(v, o, ">") && less_than(o, v);
}
bool t_ge(Interp &, const Value &v, Args &a) {
    Value o = one_arg(a, "ge");
    return cmp_args(v, o, ">=") && !less_than(v, o);
}
bool t_escaped(Interp &, const Value &v, Args &) { return v.is_safe(); }
bool t_even(Interp &, const Value &v, Args &) {
    v.require_defined();
    if (!v.is_int()) throw_error("even test needs an integer");
    return v.as_int() % 2 == 0;
}
bool t_odd(Interp &, const Value &v, Args &) {
    v.require_defined();
    if (!v.is_int()) throw_error("odd test needs an integer");
    return v.as_int() % 2 != 0;
}
bool t_false(Interp &, const Value &v, Args &) { return v.kind() == Kind::Bool && !v.as_bool(); }
bool t_true(Interp &, const Value &v, Args &) { return v.kind() == Kind::Bool && v.as_bool(); }
bool t_filter(Interp &, const Value &v, Args &) { return v.is_string() && has_filter(v.str()); }
bool t_test(Interp &, const Value &v, Args &) { return v.is_string() && has_test(v.str()); }
bool t_float(Interp &, const Value &v, Args &) { return v.kind() == Kind::Float; }
bool t_integer(Interp &, const Value &v, Args &) { return v.kind() == Kind::Int; }
bool t_in(Interp &, const Value &v, Args &a) { return contains(one_arg(a, "in"), v); }
// Python's iter() succeeds on these (Undefined iterates as empty).
bool t_iterable(Interp &, const Value &v, Args &) {
    return v.is_undefined() || v.is_string() || v.is_list_like() || v.kind() == Kind::Dict;
}
bool t_lower(Interp &, const Value &v, Args &) {
    return v.is_string() && v.str() == str_lower(v.str()) && v.str() != str_upper(v.str());
}
bool t_upper(Interp &, const Value &v, Args &) {
    return v.is_string() && v.str() == str_upper(v.str()) && v.str() != str_lower(v.str());
}
bool t_mapping(Interp &, const Value &v, Args &) { return v.kind() == Kind::Dict; }
bool t_none(Interp &, const Value &v, Args &) { return v.is_none(); }
bool t_number(Interp &, const Value &v, Args &) { return v.is_number(); }
bool t_sameas(Interp &, const Value &v, Args &a) {
    Value o = one_arg(a, "sameas");
    if (v.kind() != o.kind()) return false;
    switch (v.kind()) {
    case Kind::None: return true;
    case Kind::Bool: return v.as_bool() == o.as_bool();
    // CPython caches small ints, so `1 is 1` holds; larger equal ints made separately usually are not the same.
    case Kind::Int: return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Kind::Undefined: return false;
    default: return v.identity() != nullptr && v.identity() == o.identity();
    }
}
// jinja2: len() and __getitem__ both work (strings, lists, tuples, dicts, and Undefined).
bool t_sequence(Interp &, const Value &v, Args &) {
    return v.is_undefined() || v.is_string() || (v.is_list_like() && !v.is_generator()) || v.kind() == Kind::Dict;
}
bool t_string(Interp &, const Value &v, Args &) { return v.is_string(); }

const std::unordered_map<std::string, TestFn> &tests() {
    static const std::unordered_map<std::string, TestFn> m = {
        {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
        {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"escaped", t_escaped}, {"even", t_even},
        {"false", t_false}, {"filter", t_filter}, {"float", t_float}, {"ge", t_ge}, {">=", t_ge}, {"gt", t_gt},
        {"greaterthan", t_gt}, {">", t_gt}, {"in", t_in}, {"integer", t_integer}, {"iterable", t_iterable},
        {"le", t_le}, {"<=", t_le}, {"lower", t_lower}, {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt},
        {"mapping", t_mapping}, {"ne", t_ne}, {"!=", t_ne}, {"none", t_none}, {"number", t_number},
        {"odd", t_odd}, {"sameas", t_sameas}, {"sequence", t_sequence}, {"string", t_string}, {"test", t_test},
        {"true", t_true}, {"undefined", t_undefined}, {"upper", t_upper},
    };
    return m;
}

}  // namespace

bool has_filter(const std::string &name) { return filters().count(name) != 0; }
bool has_test(const std::string &name) { return tests().count(name) != 0; }

Value Interp::apply_filter(const std::string &name, const Value &input, Args &args) {
    auto it = filters().find(name);
    if (it == filters().end()) throw_error("No filter named '" + name + "'.");
    return it->second(*this, input, args);
}

bool Interp::apply_test(const std::string &name, const Value &input, Args &args) {
    auto it = tests().find(name);
    if (it == tests().end()) throw_error("No test named '" + name + "'.");
    return it->second(*this, input, args);
}

}  // namespace strata::jinja
