// JSON Schema -> GBNF: a grammar of JSON texts that all validate against the schema. Where the schema allows more
// than a grammar should generate, the grammar takes a subset: object properties in the schema's order and no
// properties beyond the declared ones unless additionalProperties asks for them, bounded whitespace and digits.
// What it cannot state exactly (uniqueItems, not, if/then/else, overlapping oneOf branches, ...) it refuses with an
// error naming the keyword and where it is, rather than generating something that may not validate.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/pattern.h"

namespace strata::grammar {

using json = nlohmann::ordered_json;

// A schema this converter does not take. `keyword` is the schema keyword, `path` the JSON pointer of the schema
// object that holds it (within the schema given).
struct SchemaError : Error {
    std::string keyword, path;
    SchemaError(std::string keyword, std::string path, const std::string &why);
};

// Builds the rules of one grammar from any number of schemas (a tool-call grammar holds one per tool). Rule names
// start with `prefix`, so its rules can sit beside others.
class SchemaConverter {
  public:
    explicit SchemaConverter(std::string prefix = "");

    // Adds the rules for values of `schema` (its own root for $ref); returns the name of the rule for one value
    // (no whitespace around it). Throws SchemaError.
    std::string add(const json &schema);
    // A rule for any JSON value / any JSON object.
    std::string any_value();
    std::string any_object();
    // For XML-style tool calls (<parameter=NAME>\nVALUE\n</parameter>): a rule for VALUE as raw text when the
    // property is a string (its enum/const, format, pattern and lengths hold for the raw text), which never holds
    // `</parameter>`. Throws SchemaError when the schema is not one of strings.
    std::string add_raw_string(const json &schema);
    // The rule for optional whitespace between JSON tokens: one space, or a newline and some indentation.
    std::string ws();

    // All rules so far, as GBNF text (without a root rule).
    std::string gbnf() const;

  private:
    struct Ctx {
        const json *root;  // for $ref
        int depth;
    };
    std::string visit(const json &s, const std::string &path, Ctx c);
    std::string visit_type(const json &s, const std::string &type, const std::string &path, Ctx c);
    std::string object_rule(const json &s, const std::string &path, Ctx c);
    std::string array_rule(const json &s, const std::string &path, Ctx c);
    std::string string_rule(const json &s, const std::string &path, TextMode mode);
    std::string number_rule(const json &s, const std::string &path, bool integer);
    std::string ref_rule(const std::string &ref, const std::string &path, Ctx c);
    std::string all_of(const json &s, const std::string &path, Ctx c);
    void check_one_of(const json &branches, const std::string &path, Ctx c);
    std::string key_not_in(const std::vector<std::string> &names);
    std::string literal_value(const json &v);

    std::string rule(const std::string &hint, const std::string &body);  // a new rule (named after hint)
    std::string primitive(const std::string &name);                      // the shared rules: string, number, ...
    std::string sanitize(const std::string &hint) const;

    std::string prefix_;
    std::map<std::string, std::string> rules_;       // name -> body
    std::map<std::string, std::string> by_body_;     // body -> name, so equal rules are one
    std::map<std::string, std::string> ref_names_;   // (root, pointer) -> rule
    std::set<const json *> roots_;
    size_t counter_ = 0;
};

// The whole grammar for response_format json_schema: the value with optional whitespace around it.
std::string json_schema_gbnf(const json &schema);
// The grammar for response_format json_object: any JSON object.
std::string json_object_gbnf();

}  // namespace strata::grammar
