// Evaluator of the chat-template language: statements, expressions, operators, scopes, macros and loops with
// jinja2's semantics. Not the builtin filters, tests and methods (filters.cpp, methods.cpp).
#include "jinja/interp.h"

#include <cmath>

namespace strata::jinja {

const Value *Scope::lookup(const std::string &name) const {
    for (const Scope *s = this; s; s = s->parent.get()) {
        auto it = s->vars.find(name);
        if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
}

// ---- ArgReader -----------------------------------------------------------------------------------------------

bool ArgReader::has(size_t pos, const char *kw) const {
    if (pos < a_.pos.size()) return true;
    for (auto &[k, v] : a_.kw)
        if (k == kw) return true;
    return false;
}

Value ArgReader::get(size_t pos, const char *kw, Value dflt) {
    for (size_t i = 0; i < a_.kw.size(); i++) {
        if (a_.kw[i].first != kw) continue;
        if (pos < a_.pos.size()) throw_error(name_ + "() got multiple values for argument '" + kw + "'");
        kw_used_[i] = true;
        return a_.kw[i].second;
    }
    if (pos < a_.pos.size()) return a_.pos[pos];
    return dflt;
}

void ArgReader::done(size_t max_pos) {
    if (a_.pos.size() > max_pos)
        throw_error(name_ + "() takes " + std::to_string(max_pos) + " positional argument(s) but " +
                    std::to_string(a_.pos.size()) + " were given");
    for (size_t i = 0; i < a_.kw.size(); i++)
        if (!kw_used_[i]) throw_error(name_ + "() got an unexpected keyword argument '" + a_.kw[i].first + "'");
}

// ---- helpers -------------------------------------------------------------------------------------------------

std::string type_repr(const Value &v) {
    switch (v.kind()) {
    case Kind::None: return "'None'";
    case Kind::Object: return std::string("'") + v.object_ref().type_name() + " object'";
    case Kind::Callable: return "'function object'";
    default: return "'" + v.type_name() + " object'";
    }
}

static Value no_attr(const Value &obj, const std::string &name) {
    return Value::undefined(type_repr(obj) + " has no attribute " + python_str_repr(name));
}

Value slice(const Value &obj, const Value &start, const Value &stop, const Value &step) {
    obj.require_defined();
    auto opt = [](const Value &v, const char *what) -> std::optional<int64_t> {
        if (v.is_undefined() || v.is_none()) return std::nullopt;
        if (!v.is_int()) throw_error(std::string("slice ") + what + " must be an integer or None");
        return v.as_int();
    };
    std::optional<int64_t> b = opt(start, "indices"), e = opt(stop, "indices"), st = opt(step, "indices");
    int64_t stp = st.value_or(1);
    if (stp == 0) throw_error("slice step cannot be zero");
    bool is_str = obj.is_string();
    std::u32string cps;
    const List *items = nullptr;
    int64_t n;
    if (is_str) {
        cps = decode_utf8(obj.str());
        n = int64_t(cps.size());
    } else if (obj.is_list_like() && !obj.is_generator()) {
        items = &obj.items();
        n = int64_t(items->size());
    } else {
        throw_error("'" + obj.type_name() + "' object is not subscriptable");
    }
    // Python's slice.indices()
    auto norm = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
        if (!v) return dflt;
        int64_t x = *v < 0 ? *v + n : *v;
        return std::clamp(x, lo, hi);
    };
    int64_t lo = stp > 0 ? 0 : -1, hi = stp > 0 ? n : n - 1;
    int64_t i0 = norm(b, stp > 0 ? 0 : n - 1, lo, hi);
    int64_t i1 = norm(e, stp > 0 ? n : -1, lo, hi);
    std::u32string out_s;
    List out_l;
    for (int64_t i = i0; stp > 0 ? i < i1 : i > i1; i += stp) {
        if (is_str) out_s.push_back(cps[size_t(i)]);
        else out_l.push_back((*items)[size_t(i)]);
    }
    if (is_str) return Value::string(encode_utf8(out_s));
    return obj.kind() == Kind::Tuple ? Value::tuple(std::move(out_l)) : Value::list(std::move(out_l));
}

// ---- objects: namespace, loop --------------------------------------------------------------------------------

namespace {

struct Namespace : Object {
    Dict attrs;
    const char *type_name() const override { return "jinja2.utils.Namespace"; }
    bool get_attr(Interp &, const std::string &name, Value &out) override {
        const Value *v = attrs.find(Value::string(name));
        if (!v) return false;
        out = *v;
        return true;
    }
    void set_attr(const std::string &name, Value v) override { attrs.set(Value::string(name), std::move(v)); }
    std::string repr(Interp &) override { return "<Namespace " + Value::dict(attrs).repr() + ">"; }
};

struct Loop : Object {
    List items;
    size_t index = 0;
    int depth = 0;
    Value last_changed;
    bool changed_seen = false;
    std::function<Value(Interp &, const Value &)> recurse;  // set for `recursive` loops

    const char *type_name() const override { return "jinja2.runtime.LoopContext"; }
    bool get_attr(Interp &, const std::string &n, Value &out) override {
        int64_t len = int64_t(items.size()), i = int64_t(index);
        if (n == "index") out = Value::integer(i + 1);
        else if (n == "index0") out = Value::integer(i);
        else if (n == "revindex") out = Value::integer(len - i);
        else if (n == "revindex0") out = Value::integer(len - i - 1);
        else if (n == "first") out = Value::boolean(i == 0);
        else if (n == "last") out = Value::boolean(i == len - 1);
        else if (n == "length") out = Value::integer(len);
        else if (n == "depth") out = Value::integer(depth + 1);
        else if (n == "depth0") out = Value::integer(depth);
        else if (n == "previtem") out = i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item");
        else if (n == "nextitem") out = i + 1 < len ? items[size_t(i + 1)] : Value::undefined("there is no next item");
        else if (n == "cycle") {
            out = Value::callable("cycle", [this](Interp &, Args &a) {
                if (a.pos.empty()) throw_error("no items for cycling given");
                return a.pos[index % a.pos.size()];
            });
        } else if (n == "changed") {
            out = Value::callable("changed", [this](Interp &, Args &a) {
                Value v = Value::list(a.pos);
                if (changed_seen && equals(v, last_changed)) return Value::boolean(false);
                changed_seen = true;
                last_changed = v;
                return Value::boolean(true);
            });
        } else {
            return false;
        }
        return true;
    }
    std::string repr(Interp &) override {
        return "<LoopContext " + std::to_string(index + 1) + "/" + std::to_string(items.size()) + ">";
    }
};

}  // namespace

std::shared_ptr<Object> make_namespace(const Dict &init) {
    auto ns = std::make_shared<Namespace>();
    ns->attrs = init;
    return ns;
}

// ---- rendering -----------------------------------------------------------------------------------------------

std::string Interp::run(const Body &body) {
    auto root = std::make_shared<Scope>();
    root->parent = globals_;
    std::string out;
    exec(body, root, out);
    return out;
}

Interp::Flow Interp::exec(const Body &body, const ScopeP &sc, std::string &out) {
    for (const StmtP &s : body) {
        Flow f = exec_stmt(*s, sc, out);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

static std::string print_str(Interp &in, const Value &v) {
    if (v.kind() == Kind::Object) return v.object_ref().repr(in);
    return v.to_str();
}

Interp::Flow Interp::exec_stmt(const Stmt &s, const ScopeP &sc, std::string &out) {
    try {
        switch (s.kind) {
        case SK::Text: out += s.text; break;
        case SK::Print: out += print_str(*this, eval(*s.expr, sc)); break;
        case SK::If:
            for (const auto &[cond, body] : s.branches)
                if (eval(*cond, sc).truthy()) return exec(body, sc, out);
            return exec(s.else_body, sc, out);
        case SK::For: exec_for(s, sc, out, eval(*s.expr, sc), 0); break;
        case SK::Set: assign(*s.target, eval(*s.expr, sc), sc); break;
        case SK::SetBlock: {
            std::string captured;
            auto inner = std::make_shared<Scope>();
            inner->parent = sc;
            exec(s.body, inner, captured);
            Value v = Value::string(std::move(captured));
            if (s.expr) {
                Value saved = placeholder_;
                placeholder_ = v;
                v = eval(*s.expr, sc);
                placeholder_ = saved;
            }
            assign(*s.target, v, sc);
            break;
        }
        case SK::Macro: sc->vars[s.name] = make_macro(s, sc, false); break;
        case SK::CallBlock: {
            const Expr &call_expr = *s.expr;
            Value fn = eval(*call_expr.sub[0], sc);
            Args args;
            eval_args(call_expr, sc, args, 1);
            args.kw.emplace_back("caller", make_macro(s, sc, true));
            out += print_str(*this, call(fn, args));
            break;
        }
        case SK::FilterBlock: {
            std::string captured;
            exec(s.body, sc, captured);
            Value saved = placeholder_;
            placeholder_ = Value::string(std::move(captured));
            Value v = eval(*s.expr, sc);
            placeholder_ = saved;
            out += print_str(*this, v);
            break;
        }
        case SK::With: {
            auto inner = std::make_shared<Scope>();
            inner->parent = sc;
            std::vector<Value> values;
            for (const auto &a : s.assigns) values.push_back(eval(*a.second, sc));
            for (size_t i = 0; i < values.size(); i++) assign(*s.assigns[i].first, values[i], inner);
            return exec(s.body, inner, out);
        }
        case SK::Break: return Flow::Break;
        case SK::Continue: return Flow::Continue;
        case SK::Scope: return exec(s.body, sc, out);
        }
    } catch (TemplateError &e) {
        if (e.line == 0) e.line = s.line;
        throw;
    }
    return Flow::Normal;
}

void Interp::exec_for(const Stmt &s, const ScopeP &sc, std::string &out, const Value &iterable, int depth) {
    List items = iterate(iterable);
    if (s.cond) {
        List kept;
        for (const Value &it : items) {
            auto probe = std::make_shared<Scope>();
            probe->parent = sc;
            assign(*s.target, it, probe);
            if (eval(*s.cond, probe).truthy()) kept.push_back(it);
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        auto inner = std::make_shared<Scope>();
        inner->parent = sc;
        exec(s.else_body, inner, out);
        return;
    }
    auto loop = std::make_shared<Loop>();
    loop->items = items;
    loop->depth = depth;
    if (s.recursive) {
        // `loop(children)` renders the loop body for the children one level deeper.
        loop->recurse = [this, &s, sc, depth](Interp &, const Value &it) {
            if (++depth_ > 200) throw_error("maximum recursion depth exceeded in a recursive loop");
            std::string sub;
            exec_for(s, sc, sub, it, depth + 1);
            depth_--;
            return Value::string(std::move(sub));
        };
    }
    Value loop_value = Value::object(loop);
    for (size_t i = 0; i < items.size(); i++) {
        loop->index = i;
        auto inner = std::make_shared<Scope>();
        inner->parent = sc;
        assign(*s.target, items[i], inner);
        inner->vars["loop"] = loop_value;
        if (exec(s.body, inner, out) == Flow::Break) break;
    }
}

void Interp::assign(const Expr &target, const Value &v, const ScopeP &sc) {
    switch (target.kind) {
    case EK::Name: sc->vars[target.name] = v; return;
    case EK::Tuple: {
        if (!v.is_string() && !v.is_list_like() && v.kind() != Kind::Dict && !v.is_undefined())
            throw_error_at(target.line, "cannot unpack non-iterable " + v.type_name() + " object");
        List items = iterate(v);
        size_t n = target.sub.size();
        if (items.size() < n)
            throw_error_at(target.line, "not enough values to unpack (expected " + std::to_string(n) + ", got " +
                                            std::to_string(items.size()) + ")");
        if (items.size() > n)
            throw_error_at(target.line, "too many values to unpack (expected " + std::to_string(n) + ")");
        for (size_t i = 0; i < n; i++) assign(*target.sub[i], items[i], sc);
        return;
    }
    case EK::Attr: {
        const Value *ns = sc->lookup(target.sub[0]->name);
        if (!ns || ns->kind() != Kind::Object || std::string(ns->object_ref().type_name()) != "jinja2.utils.Namespace")
            throw_error_at(target.line, "cannot assign attribute on non-namespace object");
        ns->object_ref().set_attr(target.name, v);
        return;
    }
    default: throw_error_at(target.line, "can't assign to this expression");
    }
}

Value Interp::make_macro(const Stmt &s, const ScopeP &defining, bool is_caller) {
    const Stmt *m = &s;
    std::string name = is_caller ? "caller" : s.name;
    return Value::callable(name, [m, defining, name](Interp &in, Args &args) {
        auto scope = std::make_shared<Scope>();
        scope->parent = defining;
        size_t np = m->params.size();
        if (args.pos.size() > np && !m->uses_varargs)
            throw_error("macro '" + name + "' takes not more than " + std::to_string(np) + " argument(s)");
        std::vector<bool> bound(np, false);
        for (size_t i = 0; i < np && i < args.pos.size(); i++) {
            scope->vars[m->params[i].name] = args.pos[i];
            bound[i] = true;
        }
        Dict extra_kw;
        bool caller_given = false;
        for (auto &[k, v] : args.kw) {
            size_t p = 0;
            while (p < np && m->params[p].name != k) p++;
            if (p < np) {
                if (bound[p]) throw_error("macro '" + name + "' got multiple values for argument '" + k + "'");
                scope->vars[k] = v;
                bound[p] = true;
            } else if (k == "caller" && m->uses_caller) {
                scope->vars["caller"] = v;
                caller_given = true;
            } else if (m->uses_kwargs) {
                extra_kw.set(Value::string(k), v);
            } else {
                throw_error("macro '" + name + "' takes no keyword argument '" + k + "'");
            }
        }
        // Defaults are evaluated at call time, in the macro's scope (they may use earlier parameters).
        for (size_t i = 0; i < np; i++) {
            if (bound[i]) continue;
            const Param &p = m->params[i];
            scope->vars[p.name] = p.default_value ? in.eval(*p.default_value, scope)
                                                  : Value::undefined("parameter '" + p.name + "' was not provided");
        }
        if (m->uses_varargs) {
            List rest;
            for (size_t i = np; i < args.pos.size(); i++) rest.push_back(args.pos[i]);
            scope->vars["varargs"] = Value::tuple(std::move(rest));
        }
        if (m->uses_kwargs) scope->vars["kwargs"] = Value::dict(std::move(extra_kw));
        if (m->uses_caller && !caller_given && !scope->vars.count("caller"))
            scope->vars["caller"] = Value::undefined("No caller defined");
        if (++in.depth_ > 200) throw_error("maximum recursion depth exceeded calling macro '" + name + "'");
        std::string out;
        try {
            in.exec(m->body, scope, out);
        } catch (...) {
            in.depth_--;
            throw;
        }
        in.depth_--;
        return Value::string(std::move(out));
    });
}

// ---- expressions ---------------------------------------------------------------------------------------------

Value Interp::eval(const Expr &e, const ScopeP &sc) {
    try {
        return eval_inner(e, sc);
    } catch (TemplateError &err) {
        if (err.line == 0) err.line = e.line;
        throw;
    }
}

void Interp::eval_args(const Expr &e, const ScopeP &sc, Args &out, size_t first) {
    for (size_t i = first; i < e.sub.size(); i++) out.pos.push_back(eval(*e.sub[i], sc));
    for (const auto &[k, v] : e.kwargs) out.kw.emplace_back(k, eval(*v, sc));
    if (e.star_args)
        for (Value &v : iterate(eval(*e.star_args, sc))) out.pos.push_back(std::move(v));
    if (e.star_kwargs) {
        Value d = eval(*e.star_kwargs, sc);
        if (d.kind() != Kind::Dict) throw_error("argument after ** must be a mapping, not " + d.type_name());
        for (const auto &[k, v] : d.dict_ref().items()) {
            if (!k.is_string()) throw_error("keywords must be strings");
            out.kw.emplace_back(k.str(), v);
        }
    }
}

Value Interp::eval_inner(const Expr &e, const ScopeP &sc) {
    switch (e.kind) {
    case EK::Const: return e.value;
    case EK::Name: {
        const Value *v = sc->lookup(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case EK::Attr: return getattr(eval(*e.sub[0], sc), e.name);
    case EK::Item: return getitem(eval(*e.sub[0], sc), eval(*e.sub[1], sc));
    case EK::Slice: {
        Value obj = eval(*e.sub[0], sc);
        Value parts[3];
        for (int i = 0; i < 3; i++)
            if (e.sub[size_t(i) + 1]) parts[i] = eval(*e.sub[size_t(i) + 1], sc);
        return slice(obj, parts[0], parts[1], parts[2]);
    }
    case EK::Call: {
        Value fn = eval(*e.sub[0], sc);
        Args args;
        eval_args(e, sc, args, 1);
        return call(fn, args);
    }
    case EK::Filter: {
        Value input = e.sub[0]->kind == EK::Placeholder ? placeholder_ : eval(*e.sub[0], sc);
        Args args;
        eval_args(e, sc, args, 1);
        // A name the parse let through (in a branch: parser.cpp) fails here, when it is applied.
        if (!has_filter(e.name)) throw_error("No filter named '" + e.name + "' found.");
        return apply_filter(e.name, input, args);
    }
    case EK::Test: {
        Value input = eval(*e.sub[0], sc);
        Args args;
        eval_args(e, sc, args, 1);
        if (!has_test(e.name)) throw_error("No test named '" + e.name + "' found.");
        return Value::boolean(apply_test(e.name, input, args) != e.negated);
    }
    case EK::Not: return Value::boolean(!eval(*e.sub[0], sc).truthy());
    case EK::Neg:
    case EK::Pos: {
        Value v = eval(*e.sub[0], sc);
        v.require_defined();
        if (!v.is_number())
            throw_error(std::string("bad operand type for unary ") + (e.kind == EK::Neg ? "-" : "+") + ": '" +
                        v.type_name() + "'");
        if (e.kind == EK::Pos) return v.kind() == Kind::Bool ? Value::integer(v.as_int()) : v;
        if (v.kind() == Kind::Float) return Value::number(-v.as_double());
        return Value::integer(-v.as_int());
    }
    case EK::Bin: return binop(e.name, eval(*e.sub[0], sc), eval(*e.sub[1], sc));
    case EK::Compare: {
        Value left = eval(*e.sub[0], sc);
        for (size_t i = 0; i < e.ops.size(); i++) {
            Value right = eval(*e.sub[i + 1], sc);
            if (!compare(e.ops[i], left, right).truthy()) return Value::boolean(false);
            left = std::move(right);
        }
        return Value::boolean(true);
    }
    case EK::And: {
        Value l = eval(*e.sub[0], sc);
        return l.truthy() ? eval(*e.sub[1], sc) : l;
    }
    case EK::Or: {
        Value l = eval(*e.sub[0], sc);
        return l.truthy() ? l : eval(*e.sub[1], sc);
    }
    case EK::Cond:
        if (eval(*e.sub[1], sc).truthy()) return eval(*e.sub[0], sc);
        if (e.sub[2]) return eval(*e.sub[2], sc);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
    case EK::List:
    case EK::Tuple: {
        List items;
        items.reserve(e.sub.size());
        for (const ExprP &x : e.sub) items.push_back(eval(*x, sc));
        return e.kind == EK::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case EK::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.sub.size(); i += 2) {
            Value k = eval(*e.sub[i], sc);
            d.set(k, eval(*e.sub[i + 1], sc));
        }
        return Value::dict(std::move(d));
    }
    case EK::Concat: {
        std::string s;
        for (const ExprP &x : e.sub) s += print_str(*this, eval(*x, sc));
        return Value::string(std::move(s));
    }
    case EK::Placeholder: return placeholder_;
    }
    return Value();
}

Value Interp::getattr(const Value &obj, const std::string &name) {
    switch (obj.kind()) {
    case Kind::Undefined: obj.require_defined(); break;
    case Kind::Dict: {
        Value m = method(obj, name);
        if (!m.is_undefined() || m.is_unsafe_undefined()) return m;
        const Value *v = obj.dict_ref().find(Value::string(name));
        return v ? *v : no_attr(obj, name);
    }
    case Kind::Object: {
        Value out;
        if (obj.object_ref().get_attr(*this, name, out)) return out;
        return no_attr(obj, name);
    }
    default: {
        Value m = method(obj, name);
        if (!m.is_undefined() || m.is_unsafe_undefined()) return m;
        return no_attr(obj, name);
    }
    }
    return Value();
}

Value Interp::getitem(const Value &obj, const Value &key) {
    auto missing = [&]() {
        if (key.is_string()) {
            Value m = obj.kind() == Kind::Object ? Value() : method(obj, key.str());
            if (obj.kind() == Kind::Object) {
                Value out;
                if (obj.object_ref().get_attr(*this, key.str(), out)) return out;
            }
            if (!m.is_undefined() || m.is_unsafe_undefined()) return m;
        }
        // jinja2 words a missing non-string key differently ("list object has no element 3").
        if (!key.is_string()) {
            std::string t = type_repr(obj);
            return Value::undefined(t.substr(1, t.size() - 2) + " has no element " + key.repr());
        }
        return Value::undefined(type_repr(obj) + " has no attribute " + key.repr());
    };
    switch (obj.kind()) {
    case Kind::Undefined: obj.require_defined(); break;
    case Kind::Dict: {
        const Value *v = obj.dict_ref().find(key);
        return v ? *v : missing();
    }
    case Kind::List:
    case Kind::Tuple:
    case Kind::String: {
        if (key.kind() == Kind::Tuple || obj.is_generator()) return missing();
        if (!key.is_int()) return missing();
        int64_t i = key.as_int();
        if (obj.is_string()) {
            std::u32string cps = decode_utf8(obj.str());
            int64_t n = int64_t(cps.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return missing();
            std::string out;
            append_utf8(out, cps[size_t(i)]);
            return Value::string(std::move(out));
        }
        int64_t n = int64_t(obj.items().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return missing();
        return obj.items()[size_t(i)];
    }
    default: return missing();
    }
    return Value();
}

Value Interp::call(const Value &fn, Args &args) {
    switch (fn.kind()) {
    case Kind::Callable: return fn.callable_ref().fn(*this, args);
    case Kind::Undefined: fn.require_defined(); break;
    case Kind::Object: {
        if (auto *loop = dynamic_cast<Loop *>(&fn.object_ref())) {
            if (!loop->recurse) throw_error("Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
            if (args.pos.size() != 1 || !args.kw.empty()) throw_error("loop() takes exactly one argument");
            return loop->recurse(*this, args.pos[0]);
        }
        break;
    }
    default: break;
    }
    throw_error("'" + fn.type_name() + "' object is not callable");
}

// ---- operators -----------------------------------------------------------------------------------------------

// Takes the result by reference: it must be read after the overflow builtin has written it.
static int64_t checked_op(bool overflow, const int64_t &v) {
    if (overflow) throw_error("integer overflow (values beyond 64 bits are not supported)");
    return v;
}

Value Interp::binop(const std::string &op, const Value &a, const Value &b) {
    a.require_defined();
    b.require_defined();
    bool nums = a.is_number() && b.is_number();
    bool floats = nums && (a.kind() == Kind::Float || b.kind() == Kind::Float);
    auto unsupported = [&]() -> Value {
        throw_error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    int64_t r = 0;
    if (op == "+") {
        if (floats) return Value::number(a.as_double() + b.as_double());
        if (nums) return Value::integer(checked_op(__builtin_add_overflow(a.as_int(), b.as_int(), &r), r));
        if (a.is_string() && b.is_string()) {
            // Markup + str escapes the plain side (markupsafe's __add__/__radd__); str + str stays plain.
            if (a.is_safe() != b.is_safe())
                return Value::string((a.is_safe() ? a.str() : html_escape(a.str())) +
                                         (b.is_safe() ? b.str() : html_escape(b.str())),
                                     true);
            return Value::string(a.str() + b.str(), a.is_safe());
        }
        if (a.kind() == b.kind() && a.is_list_like() && !a.is_generator() && !b.is_generator()) {
            List l = a.items();
            l.insert(l.end(), b.items().begin(), b.items().end());
            return a.kind() == Kind::List ? Value::list(std::move(l)) : Value::tuple(std::move(l));
        }
        if (a.is_string() || a.is_list_like())
            throw_error("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " +
                        a.type_name());
        return unsupported();
    }
    if (op == "-") {
        if (floats) return Value::number(a.as_double() - b.as_double());
        if (nums) return Value::integer(checked_op(__builtin_sub_overflow(a.as_int(), b.as_int(), &r), r));
        return unsupported();
    }
    if (op == "*") {
        if (floats) return Value::number(a.as_double() * b.as_double());
        if (nums) return Value::integer(checked_op(__builtin_mul_overflow(a.as_int(), b.as_int(), &r), r));
        const Value *seq = a.is_int() ? &b : &a, *cnt = a.is_int() ? &a : &b;
        if (cnt->is_int() && (seq->is_string() || seq->is_list_like()) && !seq->is_generator()) {
            int64_t n = std::max<int64_t>(cnt->as_int(), 0);
            if (seq->is_string()) {
                if (n * int64_t(seq->str().size()) > (int64_t(1) << 30)) throw_error("string repetition too large");
                std::string s;
                for (int64_t i = 0; i < n; i++) s += seq->str();
                return Value::string(std::move(s), seq->is_safe());
            }
            if (n * int64_t(seq->items().size()) > (int64_t(1) << 24)) throw_error("list repetition too large");
            List l;
            for (int64_t i = 0; i < n; i++) l.insert(l.end(), seq->items().begin(), seq->items().end());
            return seq->kind() == Kind::List ? Value::list(std::move(l)) : Value::tuple(std::move(l));
        }
        return unsupported();
    }
    if (op == "/") {
        if (!nums) return unsupported();
        if (b.as_double() == 0) throw_error("division by zero");
        return Value::number(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
        if (op == "%" && a.is_string()) return Value::string(py_format(a.str(), b), a.is_safe());
        if (!nums) return unsupported();
        if (b.as_double() == 0) throw_error(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
        if (floats) {
            double x = a.as_double(), y = b.as_double();
            double m = std::fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            if (op == "%") return Value::number(m);
            // CPython's float floor division: exact quotient of (x - fmod) then floor with its rounding guard.
            double mod = std::fmod(x, y), div = (x - mod) / y;
            if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
            double fl = std::floor(div);
            if (div - fl > 0.5) fl += 1.0;
            return Value::number(fl);
        }
        int64_t x = a.as_int(), y = b.as_int();
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q -= 1;
            m += y;
        }
        return Value::integer(op == "//" ? q : m);
    }
    if (op == "**") {
        if (!nums) return unsupported();
        if (!floats && b.as_int() >= 0) {
            int64_t base = a.as_int(), e = b.as_int(), acc = 1;
            while (e-- > 0) {
                int64_t next = 0;
                acc = checked_op(__builtin_mul_overflow(acc, base, &next), next);
            }
            return Value::integer(acc);
        }
        return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    throw_error("unknown operator " + op);
}

Value Interp::compare(const std::string &op, const Value &a, const Value &b) {
    if (op == "==") return Value::boolean(equals(a, b));
    if (op == "!=") return Value::boolean(!equals(a, b));
    if (op == "in") return Value::boolean(contains(b, a));
    if (op == "notin") return Value::boolean(!contains(b, a));
    a.require_defined();
    b.require_defined();
    bool ok = (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
              (a.is_list_like() && a.kind() == b.kind() && !a.is_generator() && !b.is_generator());
    if (!ok)
        throw_error("'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() +
                    "'");
    if (op == "<") return Value::boolean(less_than(a, b));
    if (op == ">") return Value::boolean(less_than(b, a));
    if (op == "<=") return Value::boolean(!less_than(b, a));
    return Value::boolean(!less_than(a, b));  // >=
}

}  // namespace strata::jinja
