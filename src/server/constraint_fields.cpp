// Request fields -> grammar constraints (constraint_fields.h says which field gives which constraint). Tool-call
// grammars follow the call formats the output parser reads (server/text.h): Qwen3's JSON object and the XML
// functions of Qwen3-Coder and Qwen3.5.
#include "server/constraint_fields.h"

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "server/api.h"

namespace strata::server {

namespace {

using grammar::SchemaConverter;
using grammar::SchemaError;

ApiError bad(const std::string &param, const std::string &why) {
    return invalid_request("Invalid value for '" + param + "': " + why, param, "invalid_value");
}

std::shared_ptr<const grammar::ConstraintSpec> make_spec(const std::string &gbnf, const std::string &param,
                                                         std::string trigger = {}, bool reasoning = false) {
    auto spec = std::make_shared<grammar::ConstraintSpec>();
    try {
        spec->grammar = grammar::Grammar::parse(gbnf);
    } catch (const grammar::GrammarError &e) {
        throw bad(param, e.what());
    }
    spec->trigger = std::move(trigger);
    spec->starts_in_reasoning = reasoning;
    spec->what = param;
    return spec;
}

// The format's value with optional whitespace around it, as rules named fmt-*; returns the rule.
std::string format_rules(const OutputFormat &f, std::string &gbnf) {
    SchemaConverter conv("fmt-");
    std::string value;
    try {
        value = f.kind == OutputFormat::Kind::JsonObject ? conv.any_object() : conv.add(f.schema);
    } catch (const SchemaError &e) {
        throw bad(f.param, e.what());
    }
    const std::string w = conv.ws();  // before gbnf(): it adds the rule
    gbnf += "fmt-root ::= " + w + " " + value + " " + w + "\n" + conv.gbnf();
    return "fmt-root";
}

std::string alternatives(const std::vector<std::string> &alts) {
    std::string out = "( ";
    for (size_t i = 0; i < alts.size(); i++) out += (i ? " | " : "") + alts[i];
    return out + " )";
}

struct Tool {
    std::string name;
    const ojson *params = nullptr;  // null: none given
    bool strict = false;
    std::string param;  // tools[i].function.parameters, for errors
};

std::vector<Tool> tools_of(const ojson &tools) {
    std::vector<Tool> out;
    for (size_t i = 0; i < tools.size(); i++) {
        const ojson &fn = tools[i]["function"];
        Tool t;
        t.name = fn["name"].get<std::string>();
        auto p = fn.find("parameters");
        if (p != fn.end() && !p->is_null()) t.params = &*p;
        auto s = fn.find("strict");
        t.strict = s != fn.end() && s->is_boolean() && s->get<bool>();
        t.param = strfmt("tools[%zu].function.parameters", i);
        out.push_back(std::move(t));
    }
    return out;
}

// The rules of the tools' calls, in one format.
class CallRules {
  public:
    explicit CallRules(ToolFormat format) : format_(format) {}

    // The arguments of a call (JSON) or its parameters (XML): by the schema when the tool is strict, else anything
    // of the right shape.
    std::string arguments(const Tool &t) {
        try {
            if (format_ == ToolFormat::Json) {
                if (!t.strict || !t.params) return conv_.any_object();
                return conv_.add(*t.params);
            }
            return t.strict ? xml_params(t) : xml_any_params();
        } catch (const SchemaError &e) {
            throw bad(t.param, e.what());
        }
    }

    // After the name: the arguments and the end of the block.
    std::string rest_after_name(const Tool &t) {
        const std::string w = conv_.ws();
        if (format_ == ToolFormat::Json)
            return w + " \",\" " + w + " \"\\\"arguments\\\"\" " + w + " \":\" " + w + " " + arguments(t) + " " + close();
        return "\">\\n\" " + arguments(t) + " " + close();
    }

    // From the opening a forced call wrote (forced_call_opening) to the end of the block.
    std::string forced(const std::vector<Tool> &tools, const std::string &name) {
        if (!name.empty()) {
            const Tool &t = *std::find_if(tools.begin(), tools.end(), [&](const Tool &x) { return x.name == name; });
            return arguments(t) + " " + close();
        }
        std::vector<std::string> alts;
        for (const Tool &t : tools) alts.push_back(name_literal(t, true) + " " + rest_after_name(t));
        return alternatives(alts);
    }

    // A whole block body, after <tool_call>.
    std::string body(const std::vector<Tool> &tools) {
        std::vector<std::string> alts;
        for (const Tool &t : tools) alts.push_back(name_literal(t, false) + " " + rest_after_name(t));
        const std::string w = conv_.ws();
        if (format_ == ToolFormat::Json)
            return sp() + " \"{\" " + w + " \"\\\"name\\\"\" " + w + " \":\" " + w + " " + alternatives(alts);
        return sp() + " \"<function=\" " + alternatives(alts);
    }

    std::string gbnf() const { return conv_.gbnf() + own_; }
    std::string sp() {
        if (own_.find("tc-sp ::=") == std::string::npos) own_ += "tc-sp ::= [ \\n]{0,2}\n";
        return "tc-sp";
    }

  private:
    std::string close() {
        if (format_ == ToolFormat::Json) return conv_.ws() + " \"}\" " + sp() + " \"</tool_call>\"";
        return "\"</function>\" " + sp() + " \"</tool_call>\"";
    }

    // The name as the format writes it; `after_quote`: a forced JSON opening already wrote the opening quote.
    std::string name_literal(const Tool &t, bool after_quote) {
        if (format_ == ToolFormat::Json) {
            const std::string lit = ojson(t.name).dump(-1, ' ', false, ojson::error_handler_t::replace);
            return grammar::gbnf_literal(after_quote ? lit.substr(1) : lit);
        }
        if (t.name.find_first_of(">\n<") != std::string::npos)
            throw bad("tools", "the function name '" + t.name + "' cannot be written in this model's call format");
        return grammar::gbnf_literal(t.name);
    }

    static std::string param_open(const std::string &key) {
        return grammar::gbnf_literal("<parameter=" + key + ">\n");
    }
    static std::string param_close() { return grammar::gbnf_literal("\n</parameter>\n"); }

    // The properties in the schema's order, required ones always, each one's value as the output parser reads it:
    // raw text where the property's type allows strings (or says nothing), JSON otherwise.
    std::string xml_params(const Tool &t) {
        if (!t.params) return xml_any_params();
        const ojson &s = *t.params;
        const ojson empty = ojson::object();
        const ojson &props = s.is_object() && s.contains("properties") ? s["properties"] : empty;
        if (!props.is_object()) throw SchemaError("properties", "", "must be an object");
        std::vector<std::string> required;
        if (s.is_object() && s.contains("required") && s["required"].is_array())
            for (const ojson &r : s["required"])
                if (r.is_string()) required.push_back(r.get<std::string>());
        for (const std::string &r : required)
            if (!props.contains(r))
                throw SchemaError("required", "", "names '" + r + "', which is not in 'properties' (XML-style calls "
                                                  "write only declared parameters)");
        std::string out;
        for (auto it = props.begin(); it != props.end(); ++it) {
            const std::string &key = it.key();
            if (key.empty() || key.find_first_of(">\n<") != std::string::npos)
                throw SchemaError("properties", "", "the parameter name '" + key + "' cannot be written in XML-style calls");
            const ojson &ps = it.value();
            std::vector<std::string> types;
            if (ps.is_object() && ps.contains("type")) {
                if (ps["type"].is_string()) types.push_back(ps["type"].get<std::string>());
                else if (ps["type"].is_array())
                    for (const ojson &x : ps["type"])
                        if (x.is_string()) types.push_back(x.get<std::string>());
            }
            std::string value;
            if (types.empty()) {
                value = conv_.add_raw_string(ps);
            } else if (std::find(types.begin(), types.end(), "string") != types.end()) {
                ojson as_string = ps;
                as_string["type"] = "string";
                as_string.erase("nullable");
                value = conv_.add_raw_string(as_string);
            } else {
                value = conv_.add(ps);
            }
            const std::string item = param_open(key) + " " + value + " " + param_close();
            const bool req = std::find(required.begin(), required.end(), key) != required.end();
            out += (out.empty() ? "" : " ") + (req ? item : "( " + item + " )?");
        }
        return out.empty() ? "\"\"" : "( " + out + " )";
    }

    std::string xml_any_params() {
        const std::string text = conv_.add_raw_string(ojson{{"type", "string"}});
        return "( \"<parameter=\" [^>\\n<]+ \">\\n\" " + text + " " + param_close() + " )*";
    }

    ToolFormat format_;
    SchemaConverter conv_{"tc-"};
    std::string own_;
};

}  // namespace

OutputFormat parse_output_format(const ojson &body) {
    OutputFormat f;
    auto set = [&](OutputFormat::Kind k, const std::string &param) {
        if (f.kind != OutputFormat::Kind::None)
            throw bad(param, "give one of 'response_format' (json_object or json_schema), 'json_schema' and 'grammar'");
        f.kind = k;
        f.param = param;
    };
    if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
        if (!rf->is_object()) throw bad("response_format", "expected an object");
        const ojson *t = rf->contains("type") ? &(*rf)["type"] : nullptr;
        if (t && !t->is_string()) throw bad("response_format.type", "expected a string");
        const std::string type = t ? t->get<std::string>() : "text";
        if (type == "json_object") {
            // llama.cpp's form: a schema given beside json_object.
            if (rf->contains("schema") && (*rf)["schema"].is_object()) {
                set(OutputFormat::Kind::JsonSchema, "response_format.schema");
                f.schema = (*rf)["schema"];
            } else {
                set(OutputFormat::Kind::JsonObject, "response_format");
            }
        } else if (type == "json_schema") {
            auto js = rf->find("json_schema");
            if (js == rf->end() || !js->is_object())
                throw invalid_request("Missing required parameter: 'response_format.json_schema'.",
                                      "response_format.json_schema", "missing_required_parameter");
            set(OutputFormat::Kind::JsonSchema, "response_format.json_schema.schema");
            auto s = js->find("schema");
            f.schema = s == js->end() || s->is_null() ? ojson::object() : *s;  // no schema: any JSON value
            if (!f.schema.is_object() && !f.schema.is_boolean())
                throw bad("response_format.json_schema.schema", "expected a JSON schema (an object)");
            if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null())
                throw bad("response_format.json_schema.strict", "expected a boolean");
        } else if (type != "text") {
            throw bad("response_format.type", "'" + type + "' is not one of 'text', 'json_object', 'json_schema'");
        }
    }
    if (auto js = body.find("json_schema"); js != body.end() && !js->is_null()) {
        if (!js->is_object() && !js->is_boolean()) throw bad("json_schema", "expected a JSON schema (an object)");
        set(OutputFormat::Kind::JsonSchema, "json_schema");
        f.schema = *js;
    }
    if (auto g = body.find("grammar"); g != body.end() && !g->is_null()) {
        if (!g->is_string()) throw bad("grammar", "expected a string (GBNF)");
        if (!g->get<std::string>().empty()) {
            set(OutputFormat::Kind::Grammar, "grammar");
            f.gbnf = g->get<std::string>();
        }
    }
    return f;
}

std::shared_ptr<const grammar::ConstraintSpec> output_constraint(const OutputFormat &f) {
    switch (f.kind) {
        case OutputFormat::Kind::None: return nullptr;
        case OutputFormat::Kind::Grammar: return make_spec(f.gbnf, f.param);
        default: {
            std::string gbnf;
            const std::string root = format_rules(f, gbnf);
            return make_spec("root ::= " + root + "\n" + gbnf, f.param);
        }
    }
}

std::shared_ptr<const grammar::ConstraintSpec> chat_constraint(const OutputFormat &f, const ojson &tools,
                                                               ToolFormat format, bool force_call,
                                                               const std::string &forced_tool, bool starts_in_reasoning) {
    if (!tools.is_array() || tools.empty()) return output_constraint(f);
    const std::vector<Tool> ts = tools_of(tools);
    CallRules calls(format);
    if (force_call) {
        if (!forced_tool.empty()) {
            auto it = std::find_if(ts.begin(), ts.end(), [&](const Tool &t) { return t.name == forced_tool; });
            if (it == ts.end() || !it->strict) return nullptr;  // the model's own arguments, as without constraints
        }
        const std::string body = calls.forced(ts, forced_tool);
        return make_spec("root ::= " + body + "\n" + calls.gbnf(), "tools");
    }
    if (f.kind == OutputFormat::Kind::Grammar) return output_constraint(f);
    const bool any_strict = std::any_of(ts.begin(), ts.end(), [](const Tool &t) { return t.strict; });
    if (f.kind == OutputFormat::Kind::None) {
        if (!any_strict) return nullptr;
        const std::string body = calls.body(ts);
        return make_spec("root ::= " + body + "\n" + calls.gbnf(), "tools", "<tool_call>", starts_in_reasoning);
    }
    // The format's value, or one call or more.
    std::string gbnf;
    const std::string value = format_rules(f, gbnf);
    const std::string body = calls.body(ts);
    const std::string sp = calls.sp();
    gbnf += "tc-calls ::= \"<tool_call>\" " + body + " ( " + sp + " \"<tool_call>\" " + body + " )*\n";
    return make_spec("root ::= " + value + " | tc-calls\n" + gbnf + calls.gbnf(), f.param);
}

}  // namespace strata::server
