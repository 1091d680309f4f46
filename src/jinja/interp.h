// Evaluator of the chat-template language (internal): scopes with jinja2's rules (a for-loop iteration and a
// macro call get their own scope, if-blocks do not; macros see their defining scope live), Python's attribute and
// item lookup with the immutable sandbox's restrictions, and the interface filters, tests and methods use.
// Not the public API (jinja.h) and not the builtins themselves (filters.cpp, methods.cpp).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "jinja/parser.h"
#include "jinja/value.h"

namespace strata::jinja {

struct Scope {
    std::shared_ptr<Scope> parent;
    std::unordered_map<std::string, Value> vars;

    const Value *lookup(const std::string &name) const;
};
using ScopeP = std::shared_ptr<Scope>;

// Reads a builtin's arguments the way a Python signature would bind them, with Python-like errors.
class ArgReader {
public:
    ArgReader(Args &a, std::string fname) : a_(a), name_(std::move(fname)) {}
    // The argument at position `pos` or named `kw`; `dflt` when absent.
    Value get(size_t pos, const char *kw, Value dflt = Value());
    bool has(size_t pos, const char *kw) const;
    // Errors for arguments no get() asked for (call after the last get).
    void done(size_t max_pos);

private:
    Args &a_;
    std::string name_;
    std::vector<bool> kw_used_ = std::vector<bool>(a_.kw.size(), false);
};

class Interp {
public:
    // `globals`: the render context (messages, tools, ...) over the builtin globals.
    explicit Interp(ScopeP globals) : globals_(std::move(globals)) {}

    std::string run(const Body &body);

    Value eval(const Expr &e, const ScopeP &sc);
    Value getattr(const Value &obj, const std::string &name);
    Value getitem(const Value &obj, const Value &key);
    Value call(const Value &fn, Args &args);
    Value apply_filter(const std::string &name, const Value &input, Args &args);
    bool apply_test(const std::string &name, const Value &input, Args &args);

    // Binary operators with Python semantics (+ - * / // % **).
    Value binop(const std::string &op, const Value &a, const Value &b);

    // Builtin lookups (filters.cpp / methods.cpp).
    static Value method(const Value &obj, const std::string &name);  // bound method or Undefined
    static ScopeP builtin_globals();

private:
    enum class Flow { Normal, Break, Continue };
    ScopeP globals_;
    int depth_ = 0;  // call depth, to turn runaway recursion into an error instead of a crash

    Flow exec(const Body &body, const ScopeP &sc, std::string &out);
    Flow exec_stmt(const Stmt &s, const ScopeP &sc, std::string &out);
    void exec_for(const Stmt &s, const ScopeP &sc, std::string &out, const Value &iterable, int depth);
    void assign(const Expr &target, const Value &v, const ScopeP &sc);
    Value make_macro(const Stmt &s, const ScopeP &defining, bool is_caller);
    Value eval_inner(const Expr &e, const ScopeP &sc);
    void eval_args(const Expr &e, const ScopeP &sc, Args &out, size_t first);
    Value compare(const std::string &op, const Value &a, const Value &b);
    Value placeholder_;  // the input of the filter chain being applied by {% filter %} / {% set x | f %}
};

// Python-style helpers the builtins share.
std::string type_repr(const Value &v);  // "'dict object'" / "None" as jinja2 names objects in messages
Value slice(const Value &obj, const Value &start, const Value &stop, const Value &step);
std::string strip_chars(const std::string &s, const Value &chars, bool left, bool right);
std::string py_format(const std::string &fmt, const Value &args);  // printf-style `%`
std::string now_strftime(const std::string &fmt);                // honours SOURCE_DATE_EPOCH
std::shared_ptr<Object> make_namespace(const Dict &init);

}  // namespace strata::jinja
