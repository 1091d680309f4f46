// JSON Schema -> grammar: what each keyword lets through and keeps out, the errors for what is refused, and a
// property test: random schemas of bounded size, random texts drawn from each schema's grammar, every one parsed
// as JSON and validated against its schema by an independent validator (valijson, draft 7).
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "byte_vocab.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

#if STRATA_HAVE_VALIJSON
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>
#endif

using namespace strata;
using namespace strata::grammar;

namespace {

using test::byte_vocab;

struct Checker {
    std::shared_ptr<const Grammar> g;
    explicit Checker(const std::string &schema_text) : g(Grammar::parse(json_schema_gbnf(json::parse(schema_text)))) {}
    bool operator()(std::string_view text) const {
        Matcher m(g, byte_vocab());
        return m.accept_bytes(text) && m.can_end();
    }
};

std::string schema_error(const std::string &schema_text, std::string *keyword = nullptr) {
    try {
        json_schema_gbnf(json::parse(schema_text));
    } catch (const SchemaError &e) {
        if (keyword) *keyword = e.keyword;
        return e.what();
    }
    return "(no error)";
}

}  // namespace

// ---- keywords ----------------------------------------------------------------------------------------------------

TEST(JsonSchema, ObjectsInOrderWithRequiredAndOptional) {
    Checker c(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                  "c": {"type": "boolean"}}, "required": ["b"]})");
    EXPECT_TRUE(c(R"({"b": "x"})"));
    EXPECT_TRUE(c(R"({"a": 1, "b": "x", "c": true})"));
    EXPECT_TRUE(c(R"({"a":1,"b":"x"})"));
    EXPECT_TRUE(c("{\n  \"b\": \"x\",\n  \"c\": false\n}"));
    EXPECT_FALSE(c(R"({"a": 1})"));               // b is required
    EXPECT_FALSE(c(R"({"b": "x", "a": 1})"));     // the schema's order
    EXPECT_FALSE(c(R"({"b": "x", "d": 1})"));     // no other properties unless asked for
    EXPECT_FALSE(c(R"({"b": "x",})"));
    EXPECT_FALSE(c(R"({, "b": "x"})"));
    EXPECT_FALSE(c(R"({"a": "1", "b": "x"})"));  // a's type
    Checker none(R"({"type": "object", "properties": {"a": {"type": "null"}}})");
    EXPECT_TRUE(none("{}"));
    EXPECT_TRUE(none("{ }"));
    EXPECT_TRUE(none(R"({"a": null})"));
}

TEST(JsonSchema, AdditionalPropertiesNeverRepeatADeclaredName) {
    Checker c(R"({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": {"type": "integer"}})");
    EXPECT_TRUE(c(R"({"name": "x", "n": 1, "na": 2, "names": 3, "": 4})"));
    EXPECT_TRUE(c(R"({"k": 1})"));
    EXPECT_TRUE(c(R"({})"));
    EXPECT_FALSE(c(R"({"name": "x", "name": 1})"));  // a duplicate key would change what the object means
    EXPECT_FALSE(c(R"({"k": "v"})"));                // additional values are integers
    Checker map(R"({"type": "object", "additionalProperties": true})");
    EXPECT_TRUE(map(R"({"k": [1, {"z": null}], "ü": "é"})"));
    // A required name outside properties takes the additional schema.
    Checker req(R"({"type": "object", "required": ["id"], "additionalProperties": {"type": "string"}})");
    EXPECT_TRUE(req(R"({"id": "7"})"));
    EXPECT_FALSE(req(R"({})"));
    EXPECT_NE(schema_error(R"({"type": "object", "required": ["id"], "additionalProperties": false})").find("'required'"),
              std::string::npos);
}

TEST(JsonSchema, ArraysWithCountsAndTuples) {
    Checker c(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
    EXPECT_TRUE(c("[1]"));
    EXPECT_TRUE(c("[1, 2, 3]"));
    EXPECT_FALSE(c("[]"));
    EXPECT_FALSE(c("[1, 2, 3, 4]"));
    EXPECT_FALSE(c("[1, \"2\"]"));
    Checker any(R"({"type": "array"})");
    EXPECT_TRUE(any("[]"));
    EXPECT_TRUE(any(R"([1, "a", [null], {}])"));
    Checker tuple(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"}})");
    EXPECT_TRUE(tuple(R"(["a", 1, true, false])"));
    EXPECT_TRUE(tuple(R"(["a"])"));
    EXPECT_FALSE(tuple(R"([1])"));
    EXPECT_FALSE(tuple(R"(["a", 1, 2])"));
    Checker closed(R"({"type": "array", "items": [{"type": "string"}], "additionalItems": false, "minItems": 1})");
    EXPECT_TRUE(closed(R"(["a"])"));
    EXPECT_FALSE(closed(R"(["a", "b"])"));
    EXPECT_NE(schema_error(R"({"type": "array", "items": [{}], "additionalItems": false, "minItems": 2})").find("minItems"),
              std::string::npos);
}

TEST(JsonSchema, StringsLengthsCountCharacters) {
    Checker c(R"({"type": "string", "minLength": 2, "maxLength": 3})");
    EXPECT_TRUE(c(R"("ab")"));
    EXPECT_TRUE(c("\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\""));  // three characters of 2, 3 and 4 bytes
    EXPECT_TRUE(c(R"("a\n\u00e9")"));                           // an escape is one character
    EXPECT_TRUE(c(R"("\ud83d\ude00x")"));                       // a surrogate pair is one
    EXPECT_FALSE(c(R"("a")"));
    EXPECT_FALSE(c(R"("abcd")"));
    EXPECT_FALSE(c("\"a\nb\""));            // raw control characters are not JSON
    EXPECT_FALSE(c(R"("\ud83dx")"));        // a lone surrogate is not a character
    EXPECT_FALSE(c(R"("\u0000x")"));        // nor is NUL offered
    EXPECT_FALSE(c(R"("a\qb")"));
}

TEST(JsonSchema, EnumConstAndTypeLists) {
    Checker e(R"({"enum": ["red", 2, null, {"a": [1]}]})");
    EXPECT_TRUE(e(R"("red")"));
    EXPECT_TRUE(e("2"));
    EXPECT_TRUE(e("null"));
    EXPECT_TRUE(e(R"({"a":[1]})"));
    EXPECT_FALSE(e(R"("blue")"));
    Checker typed(R"({"type": "string", "enum": ["a", 1, "b"]})");  // values of other types are dropped
    EXPECT_TRUE(typed(R"("b")"));
    EXPECT_FALSE(typed("1"));
    Checker k(R"({"const": "x\"y"})");
    EXPECT_TRUE(k(R"("x\"y")"));
    Checker t(R"({"type": ["integer", "null"]})");
    EXPECT_TRUE(t("null"));
    EXPECT_TRUE(t("-5"));
    EXPECT_FALSE(t("5.5"));
    EXPECT_FALSE(t("true"));
}

TEST(JsonSchema, Formats) {
    Checker d(R"({"type": "string", "format": "date"})");
    EXPECT_TRUE(d(R"("2024-02-29")"));
    EXPECT_TRUE(d(R"("2000-02-29")"));
    EXPECT_FALSE(d(R"("1900-02-29")"));
    EXPECT_FALSE(d(R"("2023-02-29")"));
    EXPECT_FALSE(d(R"("2023-04-31")"));
    EXPECT_TRUE(d(R"("2023-12-31")"));
    EXPECT_FALSE(d(R"("2023-13-01")"));
    EXPECT_FALSE(d(R"("0000-01-01")"));
    Checker dt(R"({"type": "string", "format": "date-time"})");
    EXPECT_TRUE(dt(R"("2024-06-01T12:30:59Z")"));
    EXPECT_TRUE(dt(R"("2024-06-01T23:59:00.123+05:30")"));
    EXPECT_FALSE(dt(R"("2024-06-01T24:00:00Z")"));
    EXPECT_FALSE(dt(R"("2024-06-01T12:30:59")"));  // RFC 3339 wants the offset
    Checker u(R"({"type": "string", "format": "uuid"})");
    EXPECT_TRUE(u(R"("123e4567-e89b-12d3-a456-426614174000")"));
    EXPECT_FALSE(u(R"("123e4567e89b12d3a456426614174000")"));
    Checker ip(R"({"type": "string", "format": "ipv4"})");
    EXPECT_TRUE(ip(R"("192.168.0.255")"));
    EXPECT_FALSE(ip(R"("256.1.1.1")"));
    EXPECT_FALSE(ip(R"("01.1.1.1")"));
}

TEST(JsonSchema, PatternsAreSearchedUnlessAnchored) {
    Checker anchored(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"})");
    EXPECT_TRUE(anchored(R"("AB-12")"));
    EXPECT_TRUE(anchored(R"("AB-123")"));
    EXPECT_FALSE(anchored(R"("xAB-12")"));
    EXPECT_FALSE(anchored(R"("AB-1234")"));
    Checker search(R"({"type": "string", "pattern": "ab+c"})");
    EXPECT_TRUE(search(R"("abbc")"));
    EXPECT_TRUE(search(R"("zzabcé")"));
    EXPECT_FALSE(search(R"("ac")"));
    Checker alt(R"({"type": "string", "pattern": "^(cat|dog)s?$|^x"})");
    EXPECT_TRUE(alt(R"("dogs")"));
    EXPECT_TRUE(alt(R"("xanything")"));
    EXPECT_FALSE(alt(R"("cats!")"));
    // Characters JSON escapes come out escaped.
    Checker q(R"({"type": "string", "pattern": "^[\"\\\\]+$"})");
    EXPECT_TRUE(q(R"("\"\\")"));
    EXPECT_FALSE(q("\"\"\""));
    Checker dot(R"({"type": "string", "pattern": "^.$"})");
    EXPECT_TRUE(dot("\"\xe4\xb8\xad\""));
    EXPECT_FALSE(dot(R"("\n")"));
    std::string kw;
    EXPECT_NE(schema_error(R"({"type": "string", "pattern": "^(?=a)b$"})", &kw).find("lookahead"), std::string::npos);
    EXPECT_EQ(kw, "pattern");
    EXPECT_NE(schema_error(R"({"type": "string", "pattern": "(a)\\1"})").find("backreferences"), std::string::npos);
    EXPECT_NE(schema_error(R"({"type": "string", "pattern": "a^b"})").find("'^'"), std::string::npos);
    EXPECT_NE(schema_error(R"({"type": "string", "pattern": "\\bword"})").find("word boundaries"), std::string::npos);
}

TEST(JsonSchema, IntegerRangesExactly) {
    const std::vector<std::pair<std::string, std::pair<int, int>>> cases = {
        {R"({"type": "integer", "minimum": 0, "maximum": 150})", {0, 150}},
        {R"({"type": "integer", "minimum": -37, "maximum": 1204})", {-37, 1204}},
        {R"({"type": "integer", "exclusiveMinimum": -1000, "exclusiveMaximum": -99})", {-999, -100}},
        {R"({"type": "integer", "minimum": 7, "maximum": 7})", {7, 7}},
        {R"({"type": "integer", "minimum": 19.5, "maximum": 300.2})", {20, 300}},
        {R"({"type": "integer", "minimum": 101})", {101, 2000}},    // checked up to 2000
        {R"({"type": "integer", "maximum": -8})", {-2000, -8}},    // checked down to -2000
    };
    for (const auto &[schema, range] : cases) {
        Checker c(schema);
        for (int n = -2000; n <= 2000; n++) {
            const bool in = n >= range.first && n <= range.second;
            ASSERT_EQ(c(std::to_string(n)), in) << schema << " n=" << n;
        }
        EXPECT_FALSE(c("007"));
        EXPECT_FALSE(c("-0"));
        EXPECT_FALSE(c("1.0"));
    }
    EXPECT_NE(schema_error(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("no integer"), std::string::npos);
}

TEST(JsonSchema, NumberBoundsWithFractions) {
    Checker c(R"({"type": "number", "minimum": -2, "exclusiveMaximum": 3})");
    for (const char *ok : {"-2", "-2.0", "-1.999", "0", "0.5", "-0.5", "2.9999", "1"}) EXPECT_TRUE(c(ok)) << ok;
    for (const char *bad : {"-2.001", "3", "3.0", "3.5", "-3", "1e2", "-0"}) EXPECT_FALSE(c(bad)) << bad;
    Checker pos(R"({"type": "number", "exclusiveMinimum": 0})");
    for (const char *ok : {"0.001", "5", "12345.5"}) EXPECT_TRUE(pos(ok)) << ok;
    for (const char *bad : {"0", "0.0", "-0.5"}) EXPECT_FALSE(pos(bad)) << bad;
    Checker any(R"({"type": "number"})");
    for (const char *ok : {"0", "-1.5e10", "3E-2", "12.0"}) EXPECT_TRUE(any(ok)) << ok;
    for (const char *bad : {"01", "1.", ".5", "+1", "NaN"}) EXPECT_FALSE(any(bad)) << bad;
    EXPECT_NE(schema_error(R"({"type": "number", "minimum": 0.5})").find("integer"), std::string::npos);
}

TEST(JsonSchema, CombinationsAndReferences) {
    Checker any_of(R"({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer"}]})");
    EXPECT_TRUE(any_of(R"("a")"));
    EXPECT_TRUE(any_of("12"));
    EXPECT_FALSE(any_of(R"("ab")"));
    Checker one_of(R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                                   "required": ["kind", "x"]},
                                  {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]})");
    EXPECT_TRUE(one_of(R"({"kind": "a", "x": 1})"));
    EXPECT_TRUE(one_of(R"({"kind": "b"})"));
    EXPECT_FALSE(one_of(R"({"kind": "c"})"));
    std::string kw;
    EXPECT_NE(schema_error(R"({"oneOf": [{"type": "number"}, {"type": "integer"}]})", &kw).find("may match the same"),
              std::string::npos);
    EXPECT_EQ(kw, "oneOf");
    Checker tree(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
                     "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                     "required": ["v"], "additionalProperties": false}}})");
    EXPECT_TRUE(tree(R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
    EXPECT_FALSE(tree(R"({"v": 1, "kids": [{"kids": []}]})"));
    Checker all(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                              {"properties": {"b": {"type": "string"}}}]})");
    EXPECT_TRUE(all(R"({"a": 1, "b": "x"})"));
    EXPECT_TRUE(all(R"({"a": 1})"));
    EXPECT_FALSE(all(R"({"b": "x"})"));
    Checker nullable(R"({"type": "string", "nullable": true})");
    EXPECT_TRUE(nullable("null"));
    Checker anything(R"({"description": "anything at all"})");
    EXPECT_TRUE(anything(R"([{"a": "b"}, 1, true])"));
}

TEST(JsonSchema, RefusalsNameTheKeywordAndPlace) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
        {R"({"not": {"type": "string"}})", "not"},
        {R"({"if": {"type": "string"}, "then": {"minLength": 1}})", "if"},
        {R"({"type": "object", "patternProperties": {"^x": {}}})", "patternProperties"},
        {R"({"type": "integer", "multipleOf": 5})", "multipleOf"},
        {R"({"type": "string", "format": "email"})", "format"},
        {R"({"$ref": "https://example.com/s.json"})", "$ref"},
        {R"({"$ref": "#/$defs/missing"})", "$ref"},
        {R"({"type": "object", "properties": {"a": {"type": "strnig"}}})", "type"},
        {R"({"type": "object", "properties": {"a": {"frobnicate": 1}}})", "frobnicate"},
        {R"({"type": "object", "properties": {"a": false}})", "false"},
        {R"({"type": "object", "minProperties": 2})", "minProperties"},
        {R"({"type": "string", "enum": ["a"], "maxLength": 3})", "maxLength"},
    };
    for (const auto &[schema, keyword] : cases) {
        std::string kw;
        const std::string msg = schema_error(schema, &kw);
        EXPECT_EQ(kw, keyword) << schema << ": " << msg;
        EXPECT_NE(msg.find("JSON schema at '"), std::string::npos) << msg;
    }
    std::string kw;
    EXPECT_NE(schema_error(R"({"type": "object", "properties": {"a": {"type": "strnig"}}})", &kw).find("'/properties/a'"),
              std::string::npos);
    // Annotations are no constraint: taken.
    EXPECT_EQ(schema_error(R"({"title": "T", "description": "d", "examples": [1], "default": 2, "x-vendor": 1,
                               "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"})"),
              "(no error)");
}

TEST(JsonSchema, RawStringsForXmlParameters) {
    SchemaConverter conv;
    const std::string plain = conv.add_raw_string(json::parse(R"({"type": "string"})"));
    const std::string pick = conv.add_raw_string(json::parse(R"({"enum": ["north", "south"]})"));
    auto g = Grammar::parse("root ::= " + plain + " \"|\" " + pick + "\n" + conv.gbnf());
    auto ok = [&](std::string_view t) {
        Matcher m(g, byte_vocab());
        return m.accept_bytes(t) && m.can_end();
    };
    EXPECT_TRUE(ok("a \"quoted\" <b> </param\nline|north"));  // raw: nothing escaped
    EXPECT_FALSE(ok("x</parameter>y|north"));                // but never the closing tag
    EXPECT_FALSE(ok("x|east"));
    EXPECT_THROW(conv.add_raw_string(json::parse(R"({"type": "integer"})")), SchemaError);
}

// ---- the property test ---------------------------------------------------------------------------------------

namespace {

// Random texts of a grammar: random derivations that, past a length budget, take the alternative with the shortest
// derivation tree, which always ends.
class TextSampler {
  public:
    explicit TextSampler(const Grammar &g) : g_(g), height_(g.n_rules(), kInf) {
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < g.n_rules(); r++)
                for (int32_t a : g.alternatives(int32_t(r))) {
                    const int h = alt_height(a);
                    if (h < height_[r]) {
                        height_[r] = h;
                        changed = true;
                    }
                }
        }
    }
    std::string sample(std::mt19937 &rng, size_t budget) {
        out_.clear();
        expand(g_.root(), rng, budget);
        return out_;
    }

  private:
    static constexpr int kInf = 1 << 28;
    int alt_height(int32_t pos) const {
        int h = 0;
        for (; g_.elements()[size_t(pos)] != Grammar::kEnd; pos++) {
            const int32_t e = g_.elements()[size_t(pos)];
            if (!Grammar::is_set(e)) h = std::max(h, height_[size_t(Grammar::rule_of(e))]);
        }
        return h >= kInf ? kInf : h + 1;
    }
    void expand(int32_t r, std::mt19937 &rng, size_t budget) {
        const auto alts = g_.alternatives(r);
        int32_t pos = alts[rng() % alts.size()];
        if (out_.size() > budget || rng() % 4 == 0) {  // short ones often: objects and strings then end
            if (out_.size() > budget)
                pos = *std::min_element(alts.begin(), alts.end(), [&](int32_t a, int32_t b) { return alt_height(a) < alt_height(b); });
        }
        for (; g_.elements()[size_t(pos)] != Grammar::kEnd; pos++) {
            const int32_t e = g_.elements()[size_t(pos)];
            if (Grammar::is_set(e)) {
                const ByteSet &s = g_.set(e);
                std::vector<uint8_t> bytes;
                for (int b = 0; b < 256; b++)
                    if (s.has(uint8_t(b))) bytes.push_back(uint8_t(b));
                out_ += char(bytes[rng() % bytes.size()]);
            } else {
                expand(Grammar::rule_of(e), rng, budget);
            }
        }
    }
    const Grammar &g_;
    std::vector<int> height_;
    std::string out_;
};

// Random schemas of bounded size, of the keywords the converter takes, written as draft 7 (the validator's draft).
class SchemaGen {
  public:
    explicit SchemaGen(std::mt19937 &rng) : rng_(rng) {}
    json root() {
        json defs = json::object();
        json s = gen(0);
        if (pick(3) == 0) {
            defs["item"] = gen(1);
            defs["node"] = json::parse(R"({"type": "object", "properties": {"v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}},
                "required": ["v"], "additionalProperties": false})");
            json wrapper = {{"type", "object"},
                            {"properties", {{"main", s}, {"extra", {{"$ref", "#/definitions/item"}}},
                                            {"tree", {{"$ref", "#/definitions/node"}}}}},
                            {"required", json::array({"main", "tree"})},
                            {"definitions", defs}};
            return wrapper;
        }
        return s;
    }

  private:
    size_t pick(size_t n) { return rng_() % n; }
    json gen(int depth) {
        const size_t kinds = depth >= 3 ? 6 : 11;
        switch (pick(kinds)) {
            case 0: return string_schema();
            case 1: return integer_schema();
            case 2: return number_schema();
            case 3: return json{{"type", pick(2) ? "boolean" : "null"}};
            case 4: return enum_schema();
            case 5: return json{{"type", json::array({"string", "null"})}, {"maxLength", 4}};
            case 6: case 7: return object_schema(depth);
            case 8: return array_schema(depth);
            case 9: return json{{"anyOf", json::array({gen(depth + 1), gen(depth + 1)})}};
            default: {  // oneOf of different types
                json a = string_schema(), b = integer_schema();
                return json{{"oneOf", pick(2) ? json::array({a, b}) : json::array({b, a, {{"type", "boolean"}}})}};
            }
        }
    }
    json string_schema() {
        json s = {{"type", "string"}};
        switch (pick(6)) {
            case 0: break;
            case 1: {
                const int lo = int(pick(4));
                s["minLength"] = lo;
                if (pick(2)) s["maxLength"] = lo + int(pick(5));
                break;
            }
            case 2: {
                static const char *formats[] = {"date", "time", "date-time"};
                s["format"] = formats[pick(3)];
                break;
            }
            case 3: {
                // ASCII patterns: the validator's std::regex counts bytes, not characters.
                static const char *patterns[] = {"^[a-z]+$", "^[A-Z]{2,3}-[0-9]{1,4}$", "^(foo|bar)+$", "ab",
                                                 "^\\d{3}$", "x$", "^\\w+@\\w+\\.com$", "^(\\+|-)?[0-9]+(\\.[0-9]{1,2})?$",
                                                 "^[a-c]*z", "^\\s?[xy]{2}\\S$"};
                s["pattern"] = patterns[pick(10)];
                break;
            }
            case 4: s = {{"type", "string"}, {"enum", json::array({"red", "gr\"een", "blü", "a\\b"})}}; break;
            default: s["const"] = "fixed"; break;
        }
        return s;
    }
    json integer_schema() {
        json s = {{"type", "integer"}};
        if (pick(2)) s[pick(2) ? "minimum" : "exclusiveMinimum"] = int(pick(2000)) - 1000;
        if (pick(2)) {
            const int lo = s.contains("minimum") ? s["minimum"].get<int>() : s.contains("exclusiveMinimum") ? s["exclusiveMinimum"].get<int>() + 1 : -1000;
            s[pick(2) ? "maximum" : "exclusiveMaximum"] = lo + 2 + int(pick(3000));
        }
        return s;
    }
    json number_schema() {
        json s = {{"type", "number"}};
        if (pick(2)) s[pick(2) ? "minimum" : "exclusiveMinimum"] = int(pick(20)) - 10;
        if (pick(2)) s[pick(2) ? "maximum" : "exclusiveMaximum"] = 11 + int(pick(20));
        return s;
    }
    json enum_schema() {
        return json{{"enum", json::array({"x", 3, nullptr, json::array({1, "two"}), json{{"k", false}}, -2.5})}};
    }
    json object_schema(int depth) {
        static const char *names[] = {"a", "b c", "ünï", "q\"uote", "back\\slash", "emoji😀", "", "id", "ab"};
        json props = json::object();
        json required = json::array();
        const size_t n = pick(5);
        for (size_t i = 0; i < n; i++) {
            const std::string name = names[pick(9)];
            if (props.contains(name)) continue;
            props[name] = gen(depth + 1);
            if (pick(2)) required.push_back(name);
        }
        json s = {{"type", "object"}, {"properties", props}};
        if (!required.empty()) s["required"] = required;
        switch (pick(4)) {
            case 0: s["additionalProperties"] = false; break;
            case 1: s["additionalProperties"] = true; break;
            case 2: s["additionalProperties"] = json{{"type", "integer"}, {"maximum", 9}}; break;
            default: break;
        }
        return s;
    }
    json array_schema(int depth) {
        json s = {{"type", "array"}};
        if (pick(3) == 0) {  // a tuple
            s["items"] = json::array({gen(depth + 1), gen(depth + 1)});
            s["additionalItems"] = pick(2) ? json(false) : gen(depth + 1);
        } else {
            s["items"] = gen(depth + 1);
        }
        if (pick(2)) s["minItems"] = int(pick(3));
        if (pick(2)) s["maxItems"] = s.value("minItems", 0) + int(pick(4));
        if (s["items"].is_array() && s["additionalItems"] == false) s["minItems"] = std::min(s.value("minItems", 0), 2);
        return s;
    }
    std::mt19937 &rng_;
};

#if STRATA_HAVE_VALIJSON
// valijson checks "format" before "type" and throws on a value that is not a string (an anyOf branch tried against a
// number, say): for it, each format moves under if/then, which means the same.
nlohmann::json for_valijson(const json &s) {
    nlohmann::json out = nlohmann::json::parse(s.dump());
    std::function<void(nlohmann::json &)> fix = [&](nlohmann::json &v) {
        if (v.is_object()) {
            for (auto &[k, x] : v.items()) fix(x);
            if (v.contains("format") && v["format"].is_string()) {
                v["if"] = {{"type", "string"}};
                v["then"] = {{"format", v["format"]}};
                v.erase("format");
            }
        } else if (v.is_array()) {
            for (auto &x : v) fix(x);
        }
    };
    fix(out);
    return out;
}
#endif

}  // namespace

TEST(JsonSchemaProperty, RandomSchemasGenerateOnlyValidDocuments) {
#if !STRATA_HAVE_VALIJSON
    GTEST_SKIP() << "valijson not found (Debian libvalijson-dev; scripts/setup.sh --tests installs it)";
#else
    std::mt19937 rng(2024);
    int documents = 0, schemas = 0;
    for (int round = 0; round < 300; round++) {
        SchemaGen gen(rng);
        const json schema = gen.root();
        std::shared_ptr<const Grammar> g;
        try {
            g = Grammar::parse(json_schema_gbnf(schema));
        } catch (const std::exception &e) {
            FAIL() << "refused: " << e.what() << "\n" << schema.dump(2);
        }
        schemas++;
        const nlohmann::json plain_schema = for_valijson(schema);
        valijson::Schema vschema;
        valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
        valijson::adapters::NlohmannJsonAdapter schema_adapter(plain_schema);
        parser.populateSchema(schema_adapter, vschema);
        valijson::Validator validator;
        TextSampler sampler(*g);
        for (int k = 0; k < 12; k++) {
            const std::string text = sampler.sample(rng, 150);
            // The matcher accepts what the grammar derives.
            Matcher m(g, byte_vocab());
            ASSERT_TRUE(m.accept_bytes(text) && m.can_end()) << text;
            const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
            ASSERT_FALSE(doc.is_discarded()) << "not JSON: " << text << "\nschema: " << schema.dump();
            valijson::adapters::NlohmannJsonAdapter doc_adapter(doc);
            valijson::ValidationResults results;
            if (!validator.validate(vschema, doc_adapter, &results)) {
                std::string why;
                valijson::ValidationResults::Error err;
                while (results.popError(err)) {
                    for (const std::string &c : err.context) why += c;
                    why += ": " + err.description + "\n";
                }
                FAIL() << "does not validate: " << text << "\nschema: " << schema.dump() << "\n" << why;
            }
            documents++;
        }
    }
    RecordProperty("schemas", schemas);
    RecordProperty("documents", documents);
    EXPECT_EQ(schemas, 300);
#endif
}
