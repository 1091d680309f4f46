// The request fields that constrain generation, turned into a grammar constraint for the job: response_format
// (json_object, json_schema), llama.cpp's `grammar` (GBNF) and top-level `json_schema`, and the schemas of tools marked
// `strict` for their calls' arguments. What cannot be compiled is a 400 naming the field, and for a schema the
// keyword and where it is.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/text.h"

namespace strata::grammar {
struct ConstraintSpec;
}

namespace strata::server {

// What the reply as a whole must be (before the template is known).
struct OutputFormat {
    enum class Kind { None, JsonObject, JsonSchema, Grammar } kind = Kind::None;
    nlohmann::ordered_json schema;  // JsonSchema
    std::string gbnf;               // Grammar
    std::string param;              // the request field it came from
};

// response_format, grammar and json_schema (at most one of them). Throws ApiError.
OutputFormat parse_output_format(const nlohmann::ordered_json &body);

// The constraint of a reply with no tools: the format's grammar over the whole output; null for none. Throws ApiError.
std::shared_ptr<const grammar::ConstraintSpec> output_constraint(const OutputFormat &f);

// The constraint of a chat reply once the template's tool-call format is known.
//  - A forced call (tool_choice "required" or a named function; the prompt already wrote the call's opening): the
//    rest of the call. Its arguments follow the tool's schema when the tool is strict; with several tools the name
//    is one of theirs. A named tool that is not strict: no constraint.
//  - Otherwise, with strict tools and no output format: free text, and each call from `<tool_call>` to
//    `</tool_call>` follows the grammar of the tools' calls (reasoning is left free).
//  - With json_object or json_schema and tools: the reply is that value or tool calls.
//  - With `grammar`: the grammar alone (tool calls then only where it writes them).
// Throws ApiError (a strict tool's schema that cannot be compiled names tools[i].function.parameters).
std::shared_ptr<const grammar::ConstraintSpec> chat_constraint(const OutputFormat &f, const nlohmann::ordered_json &tools,
                                                               ToolFormat format, bool force_call,
                                                               const std::string &forced_tool, bool starts_in_reasoning);

}  // namespace strata::server
