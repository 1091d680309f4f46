// JSON Schema -> GBNF (json_schema.h says what is taken and what the grammar leaves out). Each schema object becomes
// one rule; equal rules are shared; $ref targets become rules of their own, which is what lets schemas recurse.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>

#include "grammar/grammar.h"
#include "tokenizer/utf8.h"

namespace strata::grammar {

SchemaError::SchemaError(std::string kw, std::string p, const std::string &why)
    : Error(kw.empty() ? strfmt("JSON schema at '%s': %s", p.empty() ? "/" : p.c_str(), why.c_str())
                       : strfmt("JSON schema at '%s': '%s' %s", p.empty() ? "/" : p.c_str(), kw.c_str(), why.c_str())),
      keyword(std::move(kw)), path(std::move(p)) {}

namespace {

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxCount = 10000;           // minItems, maxItems, minLength, maxLength
constexpr int64_t kMaxBound = 1000000000000000;  // 1e15: numeric bounds a double holds exactly

// Keywords that say nothing about which values validate.
bool is_annotation(const std::string &k) {
    static const std::set<std::string> a = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "$anchor",
                                            "contentMediaType", "contentEncoding", "discriminator", "$defs",
                                            "definitions", "strict"};
    return a.count(k) || k.starts_with("x-");
}

// Keywords this converter takes (each checked where it applies).
bool is_supported(const std::string &k) {
    static const std::set<std::string> s = {
        "type", "enum", "const", "nullable", "$ref", "anyOf", "oneOf", "allOf",
        "properties", "required", "additionalProperties", "minProperties", "maxProperties",
        "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
        "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
    return s.count(k) > 0;
}

const char *unsupported_reason(const std::string &k) {
    if (k == "not") return "is not supported (a grammar cannot exclude what a schema describes)";
    if (k == "if" || k == "then" || k == "else") return "is not supported (conditional schemas)";
    if (k == "patternProperties" || k == "propertyNames")
        return "is not supported (property names are generated from 'properties' only)";
    if (k == "dependentRequired" || k == "dependentSchemas" || k == "dependencies")
        return "is not supported (dependencies between properties)";
    if (k == "unevaluatedProperties" || k == "unevaluatedItems") return "is not supported";
    if (k == "contains" || k == "minContains" || k == "maxContains") return "is not supported (array contents by search)";
    if (k == "$dynamicRef" || k == "$recursiveRef" || k == "$dynamicAnchor" || k == "$recursiveAnchor")
        return "is not supported (only local $ref)";
    return "is not a keyword this converter knows (refused rather than ignored)";
}

// Keywords of each instance type, to infer the type where "type" is absent.
const std::map<std::string, std::vector<std::string>> &family() {
    static const std::map<std::string, std::vector<std::string>> f = {
        {"string", {"minLength", "maxLength", "pattern", "format"}},
        {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
        {"object", {"properties", "required", "additionalProperties", "minProperties", "maxProperties"}},
        {"array", {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}},
    };
    return f;
}

std::string child(const std::string &path, const std::string &key) {
    std::string k;
    for (char c : key) k += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return path + "/" + k;
}

int64_t count_of(const json &s, const char *key, const std::string &path, int64_t def) {
    auto it = s.find(key);
    if (it == s.end()) return def;
    if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()))
        throw SchemaError(key, path, "must be a non-negative integer");
    const double v = it->get<double>();
    if (v < 0) throw SchemaError(key, path, "must be a non-negative integer");
    if (v > double(kMaxCount)) throw SchemaError(key, path, strfmt("above %lld is not supported", (long long)kMaxCount));
    return int64_t(v);
}

std::string alternatives(const std::vector<std::string> &alts) {
    std::string out;
    for (size_t i = 0; i < alts.size(); i++) out += (i ? " | " : "") + alts[i];
    return out;
}

// ---- decimal ranges ----------------------------------------------------------------------------------------------

// GBNF for the digit strings of one length between lo and hi (equal lengths, lo <= hi), leading zeros allowed.
std::string same_length(const std::string &lo, const std::string &hi) {
    const size_t n = lo.size();
    if (n == 0) return "";
    if (lo == hi) return "\"" + lo + "\"";
    if (n == 1) return strfmt("[%c-%c]", lo[0], hi[0]);
    if (lo[0] == hi[0]) return "\"" + std::string(1, lo[0]) + "\" " + same_length(lo.substr(1), hi.substr(1));
    const std::string nines(n - 1, '9'), zeros(n - 1, '0');
    if (lo.substr(1) == zeros && hi.substr(1) == nines) return strfmt("[%c-%c] [0-9]{%zu}", lo[0], hi[0], n - 1);
    std::vector<std::string> parts;
    parts.push_back("\"" + std::string(1, lo[0]) + "\" (" + same_length(lo.substr(1), nines) + ")");
    if (hi[0] - lo[0] > 1) parts.push_back(strfmt("[%c-%c] [0-9]{%zu}", lo[0] + 1, hi[0] - 1, n - 1));
    parts.push_back("\"" + std::string(1, hi[0]) + "\" (" + same_length(zeros, hi.substr(1)) + ")");
    return "(" + alternatives(parts) + ")";
}

// GBNF for the naturals in [a, b] without leading zeros; b < 0: no upper bound (up to 16 digits).
std::string natural_range(int64_t a, int64_t b) {
    const std::string sa = std::to_string(a);
    std::vector<std::string> parts;
    const size_t max_len = b < 0 ? 16 : std::to_string(b).size();
    for (size_t len = sa.size(); len <= max_len; len++) {
        std::string lo = sa;
        if (len != sa.size()) {  // the smallest number of this length (GCC 12 misreads "1" + string(n, '0'))
            lo.assign(len, '0');
            lo[0] = '1';
        }
        std::string hi = b >= 0 && len == max_len ? std::to_string(b) : std::string(len, '9');
        if (b < 0 && len > sa.size()) {  // every longer number: one alternative for all lengths
            parts.push_back(strfmt("[1-9] [0-9]{%zu,%zu}", len - 1, max_len - 1));
            break;
        }
        parts.push_back(same_length(lo, hi));
    }
    return parts.size() == 1 ? parts[0] : "(" + alternatives(parts) + ")";
}

// GBNF for I(.F)? with a <= I.F <= b (each end open or closed; b < 0: none), a >= 0.
std::string magnitude(int64_t a, bool a_closed, int64_t b, bool b_closed) {
    const std::string frac_any = "(\".\" [0-9]{1,15})?", frac_nonzero = "\".\" [0-9]{0,14} [1-9]",
                      frac_zero = "(\".\" \"0\"{1,15})?";
    std::vector<std::string> parts;
    const std::string la = "\"" + std::to_string(a) + "\"";
    if (b >= 0 && a == b) {
        if (a_closed && b_closed) parts.push_back(la + " " + frac_zero);
    } else {
        parts.push_back(la + " " + (a_closed ? frac_any : frac_nonzero));
        if (b < 0) parts.push_back(natural_range(a + 1, -1) + " " + frac_any);
        else if (a + 1 <= b - 1) parts.push_back(natural_range(a + 1, b - 1) + " " + frac_any);
        if (b >= 0 && b_closed) parts.push_back("\"" + std::to_string(b) + "\" " + frac_zero);
    }
    if (parts.empty()) return "";
    return parts.size() == 1 ? parts[0] : "(" + alternatives(parts) + ")";
}

// A bound of a number schema: minimum/maximum and their exclusive forms (a number since draft 6, a boolean
// modifier in draft 4).
struct Bound {
    bool present = false, closed = true;
    double v = 0;
};

Bound read_bound(const json &s, const char *key, const char *excl_key, bool lower, const std::string &path) {
    Bound b;
    auto it = s.find(key);
    auto ex = s.find(excl_key);
    if (it != s.end()) {
        if (!it->is_number()) throw SchemaError(key, path, "must be a number");
        b = {true, true, it->get<double>()};
    }
    if (ex != s.end()) {
        if (ex->is_boolean()) {
            if (ex->get<bool>()) {
                if (!b.present) throw SchemaError(excl_key, path, "(draft 4 form) needs '" + std::string(key) + "'");
                b.closed = false;
            }
        } else if (ex->is_number()) {
            const double v = ex->get<double>();
            // The tighter of the two bounds.
            if (!b.present || (lower ? v >= b.v : v <= b.v)) b = {true, false, v};
        } else {
            throw SchemaError(excl_key, path, "must be a number");
        }
    }
    if (b.present && !(std::fabs(b.v) <= double(kMaxBound)))
        throw SchemaError(lower ? key : key, path, "beyond 1e15 is not supported");
    return b;
}

}  // namespace

// ---- the converter -------------------------------------------------------------------------------------------------

SchemaConverter::SchemaConverter(std::string prefix) : prefix_(std::move(prefix)) {}

std::string SchemaConverter::sanitize(const std::string &hint) const {
    std::string out;
    for (char c : hint) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        out += ok ? c : '-';
        if (out.size() >= 40) break;
    }
    while (!out.empty() && out.back() == '-') out.pop_back();
    return out.empty() ? "v" : out;
}

std::string SchemaConverter::rule(const std::string &hint, const std::string &body) {
    auto it = by_body_.find(body);
    if (it != by_body_.end()) return it->second;
    const std::string name = prefix_ + sanitize(hint) + "-" + std::to_string(counter_++);
    rules_[name] = body;
    by_body_[body] = name;
    return name;
}

std::string SchemaConverter::ws() { return primitive("ws"); }

std::string SchemaConverter::primitive(const std::string &name) {
    const std::string full = prefix_ + name;
    if (rules_.count(full)) return full;
    auto p = [&](const std::string &n) { return primitive(n); };
    std::string body;
    if (name == "ws") body = "( \" \" | \"\\n\" [ \\t]{0,32} )?";
    else if (name == "hex") body = "[0-9a-fA-F]";
    else if (name == "char") {
        const std::string h = p("hex");
        // \u escapes of characters only: no lone surrogate (a high one comes with its low one), and no U+0000,
        // which many consumers (C strings) cannot hold.
        const std::string nz = "[1-9a-fA-F]";
        body = "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [1-9a-cA-CeEfF] " + h + "{3} | \"0\" ( " + nz +
               " " + h + "{2} | \"0\" ( " + nz + " " + h + " | \"0\" " + nz + " ) ) | [dD] [0-7] " + h + "{2} | [dD] [89abAB] " +
               h + "{2} \"\\\\u\" [dD] [c-fC-F] " + h + "{2} ) )";
    } else if (name == "string") body = "\"\\\"\" " + p("char") + "* \"\\\"\"";
    else if (name == "int") body = "\"0\" | [1-9] [0-9]{0,15}";
    else if (name == "integer") body = "\"-\"? " + p("int");
    else if (name == "number") body = "\"-\"? " + p("int") + " (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?";
    else if (name == "boolean") body = "\"true\" | \"false\"";
    else if (name == "null") body = "\"null\"";
    else if (name == "value") {
        rules_[full] = "";  // reserved: the containers refer back to it
        body = p("object") + " | " + p("array") + " | " + p("string") + " | " + p("number") + " | " + p("boolean") +
               " | " + p("null");
    } else if (name == "object") {
        rules_[full] = "";
        const std::string kv = p("string") + " " + p("ws") + " \":\" " + p("ws") + " " + p("value") + " " + p("ws");
        body = "\"{\" " + p("ws") + " ( " + kv + " ( \",\" " + p("ws") + " " + kv + " )* )? \"}\"";
    } else if (name == "array") {
        rules_[full] = "";
        const std::string el = p("value") + " " + p("ws");
        body = "\"[\" " + p("ws") + " ( " + el + " ( \",\" " + p("ws") + " " + el + " )* )? \"]\"";
    }
    // Formats (the same in JSON strings and raw text: no character in them needs escaping).
    else if (name == "fmt-d28") body = "\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]";
    else if (name == "fmt-year") body = "\"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9]{2} | [1-9] [0-9]{3}";
    else if (name == "fmt-leap") {  // years divisible by 4, not by 100 unless by 400 (no year 0)
        const std::string div4 = "( \"0\" [48] | [2468] [048] | [13579] [26] )";
        body = "[0-9]{2} " + div4 + " | " + div4 + " \"00\"";
    } else if (name == "date") {
        const std::string d28 = p("fmt-d28");
        body = p("fmt-year") + " \"-\" ( ( \"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\" ) \"-\" ( " +
               d28 + " | \"29\" | \"30\" | \"31\" ) | ( \"04\" | \"06\" | \"09\" | \"11\" ) \"-\" ( " + d28 +
               " | \"29\" | \"30\" ) | \"02-\" " + d28 + " ) | " + p("fmt-leap") + " \"-02-29\"";
    } else if (name == "fmt-hh") body = "[01] [0-9] | \"2\" [0-3]";
    else if (name == "fmt-mm") body = "[0-5] [0-9]";
    else if (name == "time")
        body = p("fmt-hh") + " \":\" " + p("fmt-mm") + " \":\" " + p("fmt-mm") + " (\".\" [0-9]{1,6})? ( \"Z\" | [+-] " +
               p("fmt-hh") + " \":\" " + p("fmt-mm") + " )";
    else if (name == "date-time") body = p("date") + " \"T\" " + p("time");
    else if (name == "uuid") {
        const std::string h = p("hex");
        body = h + "{8} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{12}";
    } else if (name == "fmt-octet") body = "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]";
    else if (name == "ipv4") body = p("fmt-octet") + " ( \".\" " + p("fmt-octet") + " ){3}";
    // Raw text (XML tool-call values): any characters but '<' (kept out of patterns and formats), and text that never
    // holds </parameter> (plain string values).
    else if (name == "raw-char") body = "[^<]";
    else STRATA_ASSERT(false && "unknown primitive");
    rules_[full] = body;
    return full;
}

std::string SchemaConverter::any_value() { return primitive("value"); }
std::string SchemaConverter::any_object() { return primitive("object"); }

std::string SchemaConverter::gbnf() const {
    std::string out;
    for (const auto &[name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
}

std::string SchemaConverter::literal_value(const json &v) {
    return gbnf_literal(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string SchemaConverter::add(const json &schema) {
    roots_.insert(&schema);
    return visit(schema, "", Ctx{&schema, 0});
}

namespace {
bool is_type_name(const std::string &t) {
    return t == "null" || t == "boolean" || t == "integer" || t == "number" || t == "string" || t == "array" ||
           t == "object";
}
bool value_has_type(const json &v, const std::string &t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "number") return v.is_number();
    if (t == "string") return v.is_string();
    if (t == "array") return v.is_array();
    return v.is_object();
}

// The types a schema object names ("type", or inferred from its keywords); empty: any.
std::vector<std::string> types_of(const json &s, const std::string &path) {
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
        if (it->is_string()) types.push_back(it->get<std::string>());
        else if (it->is_array())
            for (const json &t : *it) {
                if (!t.is_string()) throw SchemaError("type", path, "must be a string or an array of strings");
                types.push_back(t.get<std::string>());
            }
        else throw SchemaError("type", path, "must be a string or an array of strings");
        for (const std::string &t : types)
            if (!is_type_name(t)) throw SchemaError("type", path, "'" + t + "' is not a JSON Schema type");
        if (types.empty()) throw SchemaError("type", path, "an empty list of types allows no value");
    } else {
        for (const auto &[type, keys] : family())
            if (std::any_of(keys.begin(), keys.end(), [&](const std::string &k) { return s.contains(k); }))
                types.push_back(type);
    }
    if (!types.empty() && s.value("nullable", false) && std::find(types.begin(), types.end(), "null") == types.end())
        types.push_back("null");
    return types;
}

// Keywords of s beside `allowed` that constrain values.
std::string other_constraint(const json &s, const std::set<std::string> &allowed) {
    for (auto it = s.begin(); it != s.end(); ++it)
        if (!is_annotation(it.key()) && !allowed.count(it.key())) return it.key();
    return {};
}
}  // namespace

std::string SchemaConverter::visit(const json &s, const std::string &path, Ctx c) {
    if (c.depth > kMaxDepth) throw SchemaError("", path, strfmt("schemas nested deeper than %d levels", kMaxDepth));
    if (s.is_boolean()) {
        if (s.get<bool>()) return any_value();
        throw SchemaError("false", path, "allows no value");
    }
    if (!s.is_object()) throw SchemaError("", path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string &k = it.key();
        if (is_annotation(k) || is_supported(k)) continue;
        throw SchemaError(k, path, unsupported_reason(k));
    }
    if (auto it = s.find("uniqueItems"); it != s.end() && !(it->is_boolean() && !it->get<bool>()))
        throw SchemaError("uniqueItems", path, "is not supported (a grammar cannot require distinct items)");

    if (auto it = s.find("$ref"); it != s.end()) {
        if (!it->is_string()) throw SchemaError("$ref", path, "must be a string");
        if (const std::string o = other_constraint(s, {"$ref"}); !o.empty())
            throw SchemaError(o, path, "beside '$ref' is not supported");
        return ref_rule(it->get<std::string>(), path, c);
    }
    const std::vector<std::string> types = types_of(s, path);
    auto allowed_type = [&](const json &v) {
        return types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string &t) { return value_has_type(v, t); });
    };
    if (auto it = s.find("const"); it != s.end()) {
        if (const std::string o = other_constraint(s, {"const", "type", "nullable"}); !o.empty())
            throw SchemaError(o, path, "beside 'const' is not supported");
        if (!allowed_type(*it)) throw SchemaError("const", path, "is not of the schema's type");
        return rule("const", literal_value(*it));
    }
    if (auto it = s.find("enum"); it != s.end()) {
        if (!it->is_array() || it->empty()) throw SchemaError("enum", path, "must be a non-empty array");
        if (const std::string o = other_constraint(s, {"enum", "type", "nullable"}); !o.empty())
            throw SchemaError(o, path, "beside 'enum' is not supported");
        std::vector<std::string> alts;
        for (const json &v : *it)
            if (allowed_type(v)) alts.push_back(literal_value(v));
        if (alts.empty()) throw SchemaError("enum", path, "has no value of the schema's type");
        return rule("enum", alternatives(alts));
    }
    for (const char *kw : {"anyOf", "oneOf"}) {
        auto it = s.find(kw);
        if (it == s.end()) continue;
        if (!it->is_array() || it->empty()) throw SchemaError(kw, path, "must be a non-empty array of schemas");
        if (const std::string o = other_constraint(s, {kw, "type", "nullable"}); !o.empty())
            throw SchemaError(o, path, std::string("beside '") + kw + "' is not supported (put it into each branch)");
        if (std::string(kw) == "oneOf") check_one_of(*it, child(path, kw), c);
        std::vector<std::string> alts;
        for (size_t i = 0; i < it->size(); i++)
            alts.push_back(visit((*it)[i], child(child(path, kw), std::to_string(i)), {c.root, c.depth + 1}));
        if (s.value("nullable", false)) alts.push_back(primitive("null"));
        return rule(kw, alternatives(alts));
    }
    if (s.contains("allOf")) return all_of(s, path, c);
    if (types.empty()) return any_value();
    std::vector<std::string> alts;
    for (const std::string &t : types) alts.push_back(visit_type(s, t, path, c));
    return alts.size() == 1 ? alts[0] : rule("types", alternatives(alts));
}

std::string SchemaConverter::visit_type(const json &s, const std::string &t, const std::string &path, Ctx c) {
    if (t == "null") return primitive("null");
    if (t == "boolean") return primitive("boolean");
    if (t == "integer") return number_rule(s, path, true);
    if (t == "number") return number_rule(s, path, false);
    if (t == "string") return string_rule(s, path, TextMode::Json);
    if (t == "array") return array_rule(s, path, c);
    return object_rule(s, path, c);
}

std::string SchemaConverter::ref_rule(const std::string &ref, const std::string &path, Ctx c) {
    if (ref.empty() || ref[0] != '#')
        throw SchemaError("$ref", path, "'" + ref + "': only references within the schema (#...) are supported");
    const std::string key = strfmt("%p", static_cast<const void *>(c.root)) + ref;
    if (auto it = ref_names_.find(key); it != ref_names_.end()) return it->second;
    const json *target = c.root;
    if (ref != "#") {
        json::json_pointer ptr;
        try {
            ptr = json::json_pointer(ref.substr(1));
        } catch (const std::exception &) {
            throw SchemaError("$ref", path, "'" + ref + "' is not a JSON pointer");
        }
        if (!c.root->contains(ptr)) throw SchemaError("$ref", path, "'" + ref + "' points at nothing in the schema");
        target = &(*c.root)[ptr];
    }
    const std::string name = prefix_ + "ref-" + sanitize(ref.substr(1)) + "-" + std::to_string(counter_++);
    ref_names_[key] = name;
    rules_[name] = "";  // reserved while its body is built: recursive references come back here
    rules_[name] = visit(*target, ref.substr(1), {c.root, c.depth + 1});
    return name;
}

std::string SchemaConverter::string_rule(const json &s, const std::string &path, TextMode mode) {
    const int64_t min_len = count_of(s, "minLength", path, 0);
    const int64_t max_len = count_of(s, "maxLength", path, -1);
    if (max_len >= 0 && max_len < min_len) throw SchemaError("maxLength", path, "is below minLength: no string fits");
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    const std::string quote = mode == TextMode::Json ? "\"\\\"\"" : "";
    auto wrap = [&](const std::string &inner) {
        return mode == TextMode::Json ? quote + " " + inner + " " + quote : inner;
    };
    if (auto it = s.find("format"); it != s.end()) {
        if (!it->is_string()) throw SchemaError("format", path, "must be a string");
        const std::string f = it->get<std::string>();
        if (f != "date" && f != "time" && f != "date-time" && f != "uuid" && f != "ipv4")
            throw SchemaError("format", path,
                              "'" + f + "' is not supported (supported: date, time, date-time, uuid, ipv4)");
        if (lengths || s.contains("pattern"))
            throw SchemaError(s.contains("pattern") ? "pattern" : "minLength", path,
                              "together with 'format' is not supported");
        return rule("fmt", wrap(primitive(f)));
    }
    const std::string any_char = mode == TextMode::Json ? primitive("char") : primitive("raw-char");
    if (auto it = s.find("pattern"); it != s.end()) {
        if (!it->is_string()) throw SchemaError("pattern", path, "must be a string");
        if (lengths)
            throw SchemaError(s.contains("minLength") ? "minLength" : "maxLength", path,
                              "together with 'pattern' is not supported");
        std::string body;
        try {
            body = pattern_gbnf(it->get<std::string>(), mode, any_char);
        } catch (const PatternError &e) {
            throw SchemaError("pattern", path, std::string("is not supported: ") + e.what());
        }
        return rule("pattern", wrap(body));
    }
    if (mode == TextMode::Raw && !lengths) {
        // Text that never holds the closing tag: a matcher of "</parameter>" written as rules, one per matched
        // prefix length, so a rule knows how much of the tag the text ends with.
        const std::string tag = "</parameter>";
        auto state = [&](size_t k) { return prefix_ + "raw-text-" + std::to_string(k); };
        for (size_t k = 0; k < tag.size(); k++) {
            std::vector<std::string> alts = {"\"\""};
            std::set<char> seen(tag.begin(), tag.end());
            for (char ch : seen) {
                // The longest prefix of the tag that is a suffix of tag[0..k) + ch.
                const std::string text = tag.substr(0, k) + ch;
                size_t next = 0;
                for (size_t l = std::min(text.size(), tag.size()); l > 0; l--)
                    if (text.compare(text.size() - l, l, tag, 0, l) == 0) {
                        next = l;
                        break;
                    }
                if (next == tag.size()) continue;  // would complete the tag
                alts.push_back(gbnf_literal(std::string(1, ch)) + " " + state(next));
            }
            std::string others = "[^";
            for (char ch : seen) others += strfmt("\\x%02X", uint8_t(ch));
            alts.push_back(others + "] " + state(0));
            rules_[state(k)] = alternatives(alts);
        }
        return state(0);
    }
    std::string body = any_char;
    if (max_len < 0) body += min_len > 0 ? strfmt("{%lld,}", (long long)min_len) : "*";
    else body += strfmt("{%lld,%lld}", (long long)min_len, (long long)max_len);
    return rule("string", wrap(body));
}

std::string SchemaConverter::add_raw_string(const json &schema) {
    roots_.insert(&schema);
    const json *s = &schema;
    if (s->is_object() && s->contains("$ref")) {
        const std::string ref = (*s)["$ref"].is_string() ? (*s)["$ref"].get<std::string>() : "";
        if (ref.size() > 1 && ref[0] == '#') {
            const json::json_pointer ptr(ref.substr(1));
            if (schema.contains(ptr)) s = &schema[ptr];
        }
    }
    if (s->is_boolean() && s->get<bool>()) return string_rule(json::object(), "", TextMode::Raw);
    if (!s->is_object()) throw SchemaError("", "", "a schema must be an object");
    for (auto it = s->begin(); it != s->end(); ++it)
        if (!is_annotation(it.key()) && !is_supported(it.key()))
            throw SchemaError(it.key(), "", unsupported_reason(it.key()));
    auto strings_only = [](const json &vals) {
        return std::all_of(vals.begin(), vals.end(), [](const json &v) { return v.is_string(); });
    };
    if (s->contains("const") || s->contains("enum")) {
        json vals = s->contains("const") ? json::array({(*s)["const"]}) : (*s)["enum"];
        if (!vals.is_array() || vals.empty() || !strings_only(vals))
            throw SchemaError(s->contains("const") ? "const" : "enum", "", "of an XML-style parameter must hold strings");
        std::vector<std::string> alts;
        for (const json &v : vals) {
            const std::string t = v.get<std::string>();
            if (t.find("</parameter>") != std::string::npos)
                throw SchemaError("enum", "", "a value holds </parameter>, which the call format cannot carry");
            alts.push_back(gbnf_literal(t));
        }
        return rule("raw-enum", alternatives(alts));
    }
    const std::vector<std::string> types = types_of(*s, "");
    if (types.size() != 1 || types[0] != "string")
        throw SchemaError("type", "", "of an XML-style parameter without 'type' must be 'string'");
    return string_rule(*s, "", TextMode::Raw);
}

std::string SchemaConverter::number_rule(const json &s, const std::string &path, bool integer) {
    if (auto it = s.find("multipleOf"); it != s.end()) {
        if (!(integer && it->is_number() && it->get<double>() == 1.0))
            throw SchemaError("multipleOf", path, "is not supported (except 1 on integers)");
    }
    Bound lo = read_bound(s, "minimum", "exclusiveMinimum", true, path);
    Bound hi = read_bound(s, "maximum", "exclusiveMaximum", false, path);
    if (!lo.present && !hi.present) return primitive(integer ? "integer" : "number");
    if (integer) {
        // Integer bounds, closed.
        int64_t a = 0, b = 0;
        if (lo.present) a = lo.closed ? int64_t(std::ceil(lo.v)) : int64_t(std::floor(lo.v)) + 1;
        if (hi.present) b = hi.closed ? int64_t(std::floor(hi.v)) : int64_t(std::ceil(hi.v)) - 1;
        if (lo.present && hi.present && a > b) throw SchemaError("maximum", path, "is below minimum: no integer fits");
        std::vector<std::string> parts;
        // n >= 0 part and n < 0 part.
        if (!hi.present || b >= 0) parts.push_back(natural_range(lo.present ? std::max<int64_t>(a, 0) : 0, hi.present ? b : -1));
        if (!lo.present || a < 0) {
            const int64_t m_lo = hi.present ? std::max<int64_t>(-b, 1) : 1;
            const int64_t m_hi = lo.present ? -a : -1;
            parts.push_back("\"-\" " + natural_range(m_lo, m_hi));
        }
        return rule("integer", alternatives(parts));
    }
    for (const Bound *bd : {&lo, &hi})
        if (bd->present && std::floor(bd->v) != bd->v)
            throw SchemaError(bd == &lo ? "minimum" : "maximum", path,
                              "is not an integer: bounds on numbers are supported when they are integers");
    std::vector<std::string> parts;
    const int64_t L = int64_t(lo.v), H = int64_t(hi.v);
    // v >= 0: magnitude in [max(L, 0), H].
    if (!hi.present || H > 0 || (H == 0 && hi.closed)) {
        const int64_t a = lo.present && L >= 0 ? L : 0;
        const bool a_closed = lo.present && L >= 0 ? lo.closed : true;
        const std::string m = magnitude(a, a_closed, hi.present ? H : -1, hi.closed);
        if (!m.empty()) parts.push_back(m);
    }
    // v < 0: written -m with m in (max(0, -H), -L].
    if (!lo.present || L < 0) {
        const int64_t a = hi.present && H < 0 ? -H : 0;
        const bool a_closed = hi.present && H < 0 ? hi.closed : false;
        const std::string m = magnitude(a, a_closed, lo.present ? -L : -1, lo.closed);
        if (!m.empty()) parts.push_back("\"-\" " + m);
    }
    if (parts.empty()) throw SchemaError("maximum", path, "and minimum leave no number");
    return rule("number", alternatives(parts));
}

std::string SchemaConverter::key_not_in(const std::vector<std::string> &names) {
    // A trie of the names' characters; one rule per trie node: text that is not one of the names below it. Keys of
    // additional properties are written without escapes, so a name that needs one can never be equal to them.
    struct TrieNode {
        std::map<uint32_t, size_t> next;
        bool terminal = false;
    };
    std::vector<TrieNode> trie(1);
    for (const std::string &n : names) {
        std::vector<uint32_t> cps;
        bool plain = true;
        for (size_t i = 0; i < n.size();) {
            const size_t len = tok::utf8_seq_len(n, i);
            if (len == 0) {
                plain = false;
                break;
            }
            const uint32_t cp = tok::utf8_decode(n, i, len);
            if (cp == '"' || cp == '\\' || cp < 0x20) plain = false;
            cps.push_back(cp);
            i += len;
        }
        if (!plain) continue;
        size_t v = 0;
        for (uint32_t cp : cps) {
            auto it = trie[v].next.find(cp);
            if (it == trie[v].next.end()) {
                trie.push_back({});
                it = trie[v].next.emplace(cp, trie.size() - 1).first;
            }
            v = it->second;
        }
        trie[v].terminal = true;
    }
    const std::string keychar = rule("keychar", "[^\"\\\\\\x00-\\x1F]");
    const size_t base = counter_;
    counter_ += trie.size();
    auto name = [&](size_t v) { return prefix_ + "key-" + std::to_string(base) + "-" + std::to_string(v); };
    for (size_t v = 0; v < trie.size(); v++) {
        std::vector<std::string> alts;
        if (!trie[v].terminal) alts.push_back("\"\"");
        CodeRanges taken = {{'"', '"'}, {'\\', '\\'}};
        for (auto [cp, w] : trie[v].next) {
            std::string lit;
            tok::utf8_append(lit, cp);
            alts.push_back(gbnf_literal(lit) + " " + name(w));
            taken.push_back({cp, cp});
        }
        std::sort(taken.begin(), taken.end());
        CodeRanges rest;  // the key characters but those taken
        uint32_t next = 0x20;
        for (auto [lo, hi] : taken) {
            if (lo > next) rest.push_back({next, lo - 1});
            next = std::max(next, hi + 1);
        }
        rest.push_back({next, 0x10FFFF});
        alts.push_back(char_set_gbnf(rest, TextMode::Json) + " " + keychar + "*");
        rules_[name(v)] = alternatives(alts);
    }
    return "\"\\\"\" " + name(0) + " \"\\\"\"";
}

std::string SchemaConverter::object_rule(const json &s, const std::string &path, Ctx c) {
    const json empty = json::object();
    const json &props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) throw SchemaError("properties", path, "must be an object");
    std::vector<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
        if (!it->is_array()) throw SchemaError("required", path, "must be an array of strings");
        for (const json &r : *it) {
            if (!r.is_string()) throw SchemaError("required", path, "must be an array of strings");
            if (std::find(required.begin(), required.end(), r.get<std::string>()) == required.end())
                required.push_back(r.get<std::string>());
        }
    }
    // Additional properties: generated only when asked for (true or a schema); absent means none are generated.
    const json *extra = nullptr;
    bool extra_forbidden = false;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
        if (it->is_boolean()) {
            if (it->get<bool>()) extra = &*it;
            else extra_forbidden = true;
        } else if (it->is_object()) {
            extra = &*it;
        } else {
            throw SchemaError("additionalProperties", path, "must be a boolean or a schema");
        }
    }
    const std::string w = primitive("ws");
    struct Item {
        std::string kv;
        bool required;
    };
    std::vector<Item> items;
    std::vector<std::string> names;
    for (auto it = props.begin(); it != props.end(); ++it) {
        const std::string &name = it.key();
        const bool req = std::find(required.begin(), required.end(), name) != required.end();
        const std::string value = visit(it.value(), child(child(path, "properties"), name), {c.root, c.depth + 1});
        items.push_back({literal_value(json(name)) + " " + w + " \":\" " + w + " " + value + " " + w, req});
        names.push_back(name);
    }
    for (const std::string &name : required) {
        if (props.contains(name)) continue;
        if (extra_forbidden)
            throw SchemaError("required", path, "names '" + name + "', which additionalProperties: false forbids");
        const std::string value = extra ? visit(*extra, child(path, "additionalProperties"), {c.root, c.depth + 1})
                                        : any_value();
        items.push_back({literal_value(json(name)) + " " + w + " \":\" " + w + " " + value + " " + w, true});
        names.push_back(name);
    }
    const int64_t n_required = int64_t(std::count_if(items.begin(), items.end(), [](const Item &i) { return i.required; }));
    if (count_of(s, "minProperties", path, 0) > n_required)
        throw SchemaError("minProperties", path, "above the number of required properties is not supported");
    if (s.contains("maxProperties") && (extra || count_of(s, "maxProperties", path, 0) < int64_t(items.size())))
        throw SchemaError("maxProperties", path, "below the number of properties that may be generated is not supported");

    std::string extra_kv;
    if (extra) {
        const std::string value = visit(*extra, child(path, "additionalProperties"), {c.root, c.depth + 1});
        extra_kv = rule("extra-kv", key_not_in(names) + " " + w + " \":\" " + w + " " + value + " " + w);
    }
    // Properties in order, each optional one perhaps left out, commas only between those written: rest_after[i]
    // is the text from property i on once something was written, rest_first[i] while nothing was yet.
    std::string after = extra ? rule("obj-more", "( \",\" " + w + " " + extra_kv + " )*") : "";
    std::string first = extra ? rule("obj-first", "( " + extra_kv + " " + (after.empty() ? "" : after) + " )?") : "";
    for (size_t k = items.size(); k-- > 0;) {
        const Item &it = items[k];
        const std::string a = after.empty() ? "" : " " + after;
        const std::string new_after =
            rule("obj-after", it.required ? "\",\" " + w + " " + it.kv + a : "( \",\" " + w + " " + it.kv + " )?" + a);
        const std::string new_first =
            rule("obj-first", it.required ? it.kv + a : it.kv + a + (first.empty() ? " | \"\"" : " | " + first));
        after = new_after;
        first = new_first;
    }
    return rule("object", "\"{\" " + w + " " + (first.empty() ? "" : first + " ") + "\"}\"");
}

std::string SchemaConverter::array_rule(const json &s, const std::string &path, Ctx c) {
    std::vector<std::string> prefix;  // per position
    std::string rest;                 // items after the prefix ("" when none may follow)
    auto item_rule = [&](const json &schema, const std::string &p) {
        return visit(schema, p, {c.root, c.depth + 1}) + " " + primitive("ws");
    };
    auto tail_schema = [&](const char *key) -> std::string {
        auto it = s.find(key);
        if (it == s.end()) return "";  // a tuple with nothing said about more items: none are generated
        if (it->is_boolean() && !it->get<bool>()) return "";
        return item_rule(*it, child(path, key));
    };
    if (auto pi = s.find("prefixItems"); pi != s.end()) {
        if (!pi->is_array()) throw SchemaError("prefixItems", path, "must be an array of schemas");
        for (size_t i = 0; i < pi->size(); i++)
            prefix.push_back(item_rule((*pi)[i], child(child(path, "prefixItems"), std::to_string(i))));
        rest = tail_schema("items");
    } else if (auto it = s.find("items"); it != s.end() && it->is_array()) {  // draft 7 tuples
        for (size_t i = 0; i < it->size(); i++)
            prefix.push_back(item_rule((*it)[i], child(child(path, "items"), std::to_string(i))));
        rest = tail_schema("additionalItems");
    } else {
        rest = it == s.end() ? any_value() + " " + primitive("ws") : tail_schema("items");
    }
    const int64_t min = count_of(s, "minItems", path, 0);
    int64_t max = count_of(s, "maxItems", path, -1);
    if (rest.empty()) max = max < 0 ? int64_t(prefix.size()) : std::min<int64_t>(max, int64_t(prefix.size()));
    if (max >= 0 && max < min)
        throw SchemaError(s.contains("maxItems") ? "maxItems" : "minItems", path, "leaves no array length possible");
    const std::string w = primitive("ws");
    auto at = [&](int64_t i) { return size_t(i) < prefix.size() ? prefix[size_t(i)] : rest; };
    // Positions with rules of their own: the prefix and the required items; after them, repetitions of `rest`.
    const int64_t fixed = std::max<int64_t>(int64_t(prefix.size()), min);
    const int64_t explicit_end = max >= 0 ? std::min(fixed, max) : fixed;
    std::string tail;
    if (!rest.empty() && (max < 0 || max > explicit_end)) {
        const std::string more = "\",\" " + w + " " + rest;
        tail = max < 0 ? "( " + more + " )*" : strfmt("( %s ){0,%lld}", more.c_str(), (long long)(max - explicit_end));
        if (explicit_end == 0) {  // the first item has no comma
            const std::string first = max < 0 ? rest + " " + tail
                                              : (max - 1 > 0 ? rest + " " + strfmt("( %s ){0,%lld}", more.c_str(), (long long)(max - 1)) : rest);
            return rule("array", "\"[\" " + w + " ( " + first + " )? \"]\"");
        }
    }
    // From the end: after[i] is the text from position i on (i >= 1), given i items were written.
    std::string after = tail;
    for (int64_t i = explicit_end - 1; i >= 1; i--) {
        const std::string item = "\",\" " + w + " " + at(i) + (after.empty() ? "" : " " + after);
        after = rule("arr-after", i < min ? item : "( " + item + " )?");
    }
    if (explicit_end == 0) return rule("array", "\"[\" " + w + " \"]\"");
    const std::string body = at(0) + (after.empty() ? "" : " " + after);
    return rule("array", "\"[\" " + w + " " + (min >= 1 ? body : "( " + body + " )?") + " \"]\"");
}

namespace {
// The kinds of value a schema can hold, for telling oneOf branches apart: a bit per JSON type, integers apart from
// other numbers.
enum Kind : unsigned { kNull = 1, kBool = 2, kInt = 4, kFrac = 8, kString = 16, kArray = 32, kObject = 64, kAll = 127 };

unsigned kind_of_value(const json &v) {
    if (v.is_null()) return kNull;
    if (v.is_boolean()) return kBool;
    if (v.is_number()) return value_has_type(v, "integer") ? kInt : kFrac;
    if (v.is_string()) return kString;
    return v.is_array() ? kArray : kObject;
}

const json *resolve(const json &s, const json &root) {
    if (!s.is_object() || !s.contains("$ref") || !s["$ref"].is_string()) return &s;
    const std::string ref = s["$ref"].get<std::string>();
    if (ref == "#") return &root;
    if (ref.size() < 2 || ref[0] != '#') return &s;
    try {
        const json::json_pointer ptr(ref.substr(1));
        return root.contains(ptr) ? &root[ptr] : &s;
    } catch (const std::exception &) {
        return &s;
    }
}

unsigned kinds(const json &s0, const json &root, int depth) {
    if (depth > 16) return kAll;
    const json &s = *resolve(s0, root);
    if (s.is_boolean()) return s.get<bool>() ? unsigned(kAll) : 0u;
    if (!s.is_object()) return kAll;
    if (s.contains("const")) return kind_of_value(s["const"]);
    if (s.contains("enum") && s["enum"].is_array()) {
        unsigned k = 0;
        for (const json &v : s["enum"]) k |= kind_of_value(v);
        return k;
    }
    for (const char *kw : {"anyOf", "oneOf"})
        if (s.contains(kw) && s[kw].is_array()) {
            unsigned k = 0;
            for (const json &b : s[kw]) k |= kinds(b, root, depth + 1);
            return k;
        }
    std::vector<std::string> types;
    try {
        types = types_of(s, "");
    } catch (const SchemaError &) {
        return kAll;
    }
    if (types.empty()) return kAll;
    unsigned k = 0;
    for (const std::string &t : types)
        k |= t == "null"      ? unsigned(kNull)
             : t == "boolean" ? unsigned(kBool)
             : t == "integer" ? unsigned(kInt)
             : t == "number"  ? unsigned(kInt | kFrac)
             : t == "string"  ? unsigned(kString)
             : t == "array"   ? unsigned(kArray)
                              : unsigned(kObject);
    return k;
}

// The values a property can take when its schema lists them (const or enum).
const json *listed_values(const json &s0, const json &root, json &scratch) {
    const json &s = *resolve(s0, root);
    if (!s.is_object()) return nullptr;
    if (s.contains("const")) {
        scratch = json::array({s["const"]});
        return &scratch;
    }
    if (s.contains("enum") && s["enum"].is_array()) return &s["enum"];
    return nullptr;
}

bool required_in(const json &s, const std::string &name) {
    if (!s.contains("required") || !s["required"].is_array()) return false;
    for (const json &r : s["required"])
        if (r == name) return true;
    return false;
}

// Objects of a and b never coincide: a property both require takes values from disjoint lists, or one requires a
// property the other forbids.
bool objects_disjoint(const json &a, const json &b, const json &root) {
    for (const json *x : {&a, &b}) {
        const json *y = x == &a ? &b : &a;
        if (!x->contains("properties") || !(*x)["properties"].is_object()) continue;
        for (auto it = (*x)["properties"].begin(); it != (*x)["properties"].end(); ++it) {
            if (!required_in(*x, it.key())) continue;
            const bool y_has = y->contains("properties") && (*y)["properties"].is_object() &&
                               (*y)["properties"].contains(it.key());
            if (!y_has && y->contains("additionalProperties") && (*y)["additionalProperties"] == false) return true;
            if (!y_has || !required_in(*y, it.key())) continue;
            json s1, s2;
            const json *v1 = listed_values(it.value(), root, s1), *v2 = listed_values((*y)["properties"][it.key()], root, s2);
            if (v1 && v2 && std::none_of(v1->begin(), v1->end(), [&](const json &v) {
                    return std::find(v2->begin(), v2->end(), v) != v2->end();
                }))
                return true;
        }
    }
    return false;
}
}  // namespace

// A value that matches two branches fails oneOf: only branches that provably never share a value are taken.
void SchemaConverter::check_one_of(const json &branches, const std::string &path, Ctx c) {
    for (size_t i = 0; i < branches.size(); i++)
        for (size_t j = i + 1; j < branches.size(); j++) {
            const unsigned ki = kinds(branches[i], *c.root, 0), kj = kinds(branches[j], *c.root, 0);
            if ((ki & kj) == 0) continue;
            const json &a = *resolve(branches[i], *c.root), &b = *resolve(branches[j], *c.root);
            if (ki == kObject && kj == kObject && objects_disjoint(a, b, *c.root)) continue;
            json s1, s2;
            const json *v1 = listed_values(a, *c.root, s1), *v2 = listed_values(b, *c.root, s2);
            if (v1 && v2 && std::none_of(v1->begin(), v1->end(), [&](const json &v) {
                    return std::find(v2->begin(), v2->end(), v) != v2->end();
                }))
                continue;
            throw SchemaError("oneOf", path,
                              strfmt("branches %zu and %zu may match the same value, which oneOf forbids; supported are "
                                     "branches of different types, objects told apart by a required property with "
                                     "distinct const/enum values, or use anyOf",
                                     i, j));
        }
}

// allOf: one schema, or object schemas whose properties merge (each allowing the properties of the others).
std::string SchemaConverter::all_of(const json &s, const std::string &path, Ctx c) {
    const json &all = s["allOf"];
    if (!all.is_array() || all.empty()) throw SchemaError("allOf", path, "must be a non-empty array of schemas");
    json rest = s;
    rest.erase("allOf");
    const bool rest_constrains = !other_constraint(rest, {}).empty();
    if (all.size() == 1 && !rest_constrains) return visit(all[0], child(child(path, "allOf"), "0"), {c.root, c.depth + 1});
    json merged = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
    std::vector<const json *> members;
    for (const json &m : all) members.push_back(resolve(m, *c.root));
    if (rest_constrains) members.push_back(&rest);
    for (const json *m : members) {
        if (!m->is_object() || !other_constraint(*m, {"type", "properties", "required"}).empty() ||
            (m->contains("type") && (*m)["type"] != "object"))
            throw SchemaError("allOf", path, "is supported for one schema, or for object schemas with only "
                                             "'properties' and 'required' (which then merge)");
        if (m->contains("properties"))
            for (auto it = (*m)["properties"].begin(); it != (*m)["properties"].end(); ++it) {
                if (merged["properties"].contains(it.key()) && merged["properties"][it.key()] != it.value())
                    throw SchemaError("allOf", path, "gives property '" + it.key() + "' two different schemas");
                merged["properties"][it.key()] = it.value();
            }
        if (m->contains("required")) merged["required"].insert(merged["required"].end(), (*m)["required"].begin(), (*m)["required"].end());
    }
    return object_rule(merged, path, c);
}

std::string json_schema_gbnf(const json &schema) {
    SchemaConverter conv;
    const std::string value = conv.add(schema);
    const std::string w = conv.ws();
    return "root ::= " + w + " " + value + " " + w + "\n" + conv.gbnf();
}

std::string json_object_gbnf() {
    SchemaConverter conv;
    const std::string object = conv.any_object();
    const std::string w = conv.ws();
    return "root ::= " + w + " " + object + " " + w + "\n" + conv.gbnf();
}

}  // namespace strata::grammar
