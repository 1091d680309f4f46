// Syntax tree and parser of the chat-template language (jinja2's grammar and operator precedence for the
// statements chat templates use). Not the evaluator; unknown filters and tests are rejected here, as jinja2
// rejects them when it compiles a template.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/lexer.h"
#include "jinja/value.h"

namespace strata::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

enum class EK : uint8_t {
    Const,        // value
    Name,         // name
    Attr,         // sub[0].name
    Item,         // sub[0][sub[1]]
    Slice,        // sub[0][sub[1]:sub[2]:sub[3]] (null parts absent)
    Call,         // sub[0](sub[1..], kwargs, *star_args, **star_kwargs)
    Filter,       // sub[0] | name(sub[1..], kwargs)
    Test,         // sub[0] is [not] name(sub[1..], kwargs)
    Not,          // not sub[0]
    Neg,          // -sub[0]
    Pos,          // +sub[0]
    Bin,          // sub[0] name sub[1]; name is + - * / // % **
    Compare,      // sub[0] ops[0] sub[1] ops[1] sub[2] ...
    And,          // sub[0] and sub[1]
    Or,           // sub[0] or sub[1]
    Cond,         // sub[0] if sub[1] else sub[2] (sub[2] null: undefined)
    List,         // [sub...]
    Tuple,        // (sub...)
    Dict,         // {sub[0]: sub[1], ...}
    Concat,       // sub[0] ~ sub[1] ~ ...
    Placeholder,  // the input of a {% filter %} block or {% set x | f %}
};

struct Expr {
    EK kind = EK::Const;
    int line = 0;
    Value value;
    std::string name;
    std::vector<ExprP> sub;
    std::vector<std::string> ops;
    std::vector<std::pair<std::string, ExprP>> kwargs;
    ExprP star_args, star_kwargs;
    bool negated = false;  // Test: `is not`
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

enum class SK : uint8_t {
    Text,         // text
    Print,        // {{ expr }}
    If,           // branches (cond, body) ..., else_body
    For,          // for target in expr [if cond] [recursive]: body else else_body
    Set,          // set target = expr
    SetBlock,     // set target [| filters in expr]: body
    Macro,        // macro name(params = defaults): body
    CallBlock,    // call(params) expr: body
    FilterBlock,  // filter expr: body
    With,         // with assigns: body
    Break,
    Continue,
    Scope,        // {% generation %}: body, rendered unchanged
};

struct Param {
    std::string name;
    ExprP default_value;  // null: required
};

struct Stmt {
    SK kind = SK::Text;
    int line = 0;
    std::string text;
    ExprP expr, target, cond;
    std::vector<std::pair<ExprP, Body>> branches;
    Body body, else_body;
    bool recursive = false;
    std::string name;
    std::vector<Param> params;
    std::vector<std::pair<ExprP, ExprP>> assigns;
    // Macros and call blocks: whether the body reads these names (jinja2 only accepts extra arguments then).
    bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};

// Parse template source; throws TemplateError with the line of the problem.
Body parse(std::string_view source);

// Registries the parser consults (defined with the builtins).
bool has_filter(const std::string &name);
bool has_test(const std::string &name);

}  // namespace strata::jinja
