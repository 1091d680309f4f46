// Values of the chat-template language (a Jinja2 subset): Python-like data with Python's printing, equality,
// ordering and JSON rules, so rendered prompts match what jinja2 produces. Not the evaluator (interp.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::jinja {

// Thrown by the lexer, parser and interpreter; the public API turns it into a strata::Error that names the
// template and the line.
struct TemplateError {
    std::string message;
    int line = 0;  // 0: not known yet (set by the node being evaluated)
};
[[noreturn]] void throw_error(std::string message);  // line filled in by the node being evaluated
[[noreturn]] void throw_error_at(int line, std::string message);

class Value;
class Interp;

using List = std::vector<Value>;

// Insertion-ordered mapping (Python dicts keep insertion order; templates print and tojson in that order).
class Dict {
public:
    const Value *find(const Value &key) const;
    void set(const Value &key, Value v);
    size_t size() const { return items_.size(); }
    const std::vector<std::pair<Value, Value>> &items() const { return items_; }

private:
    std::vector<std::pair<Value, Value>> items_;
    std::unordered_map<std::string, size_t> index_;
};

// Arguments of a call: positional then keyword, as written.
struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
    std::string name;
    std::function<Value(Interp &, Args &)> fn;
};

// Objects with attributes: namespace(), the loop variable, cycler/joiner. Attribute lookup returns false when
// the attribute is absent (the caller makes the Undefined).
struct Object {
    virtual ~Object() = default;
    virtual const char *type_name() const = 0;
    virtual bool get_attr(Interp &in, const std::string &name, Value &out) = 0;
    virtual void set_attr(const std::string &name, Value v);  // default: error (only namespaces allow it)
    virtual std::string repr(Interp &in);
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Callable, Object };

class Value {
public:
    Value() = default;  // Undefined with no hint
    static Value undefined(std::string hint);
    // An Undefined that is an error to call: what the sandbox gives for a method that would modify its object.
    static Value unsafe(std::string hint);
    static Value none();
    static Value boolean(bool b);
    static Value integer(int64_t i);
    static Value number(double f);
    static Value string(std::string s, bool safe = false);
    static Value list(List items);
    // What jinja2's select/map/reverse/... return: a Python generator. Always true, no len(), not subscriptable,
    // not JSON. (Unlike Python it can be iterated more than once.)
    static Value generator(List items);
    static Value tuple(List items);
    static Value dict(Dict d);
    static Value callable(std::string name, std::function<Value(Interp &, Args &)> fn);
    static Value object(std::shared_ptr<Object> o);
    static Value from_json(const nlohmann::ordered_json &j);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::Undefined; }
    bool is_none() const { return kind_ == Kind::None; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_int() const { return kind_ == Kind::Int || kind_ == Kind::Bool; }  // Python: bool is an int
    bool is_number() const { return is_int() || kind_ == Kind::Float; }
    bool is_list_like() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
    bool is_safe() const { return kind_ == Kind::String && safe_; }  // a Markup string (|safe, |escape)
    bool is_unsafe_undefined() const { return kind_ == Kind::Undefined && safe_; }
    bool is_generator() const { return kind_ == Kind::List && safe_; }

    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == Kind::Bool ? int64_t(b_) : i_; }
    double as_double() const;
    // String (and the hint of an Undefined; empty for a bare Value()).
    const std::string &str() const { return s_ ? *s_ : empty_string(); }
    const List &items() const { return *list_; }
    const Dict &dict_ref() const { return *dict_; }
    const Callable &callable_ref() const { return *fn_; }
    Object &object_ref() const { return *obj_; }
    const std::shared_ptr<Object> &object_ptr() const { return obj_; }
    const void *identity() const;  // for `is sameas` on containers

    // Python type name for messages: 'int', 'str', 'dict', 'NoneType', ...
    std::string type_name() const;

    bool truthy() const;
    // str(): what {{ x }} prints. Undefined prints ''.
    std::string to_str() const;
    // repr(): how an element prints inside a list or dict.
    std::string repr() const;
    // Raises the Undefined's error when this is Undefined (used where jinja2 would raise UndefinedError).
    void require_defined() const;


private:
    static const std::string &empty_string() {
        static const std::string e;
        return e;
    }
    Kind kind_ = Kind::Undefined;
    bool b_ = false;
    bool safe_ = false;  // String: Markup; Undefined: a refused method; List: a generator
    int64_t i_ = 0;
    double f_ = 0;
    std::shared_ptr<const std::string> s_;
    std::shared_ptr<const List> list_;
    std::shared_ptr<const Dict> dict_;
    std::shared_ptr<const Callable> fn_;
    std::shared_ptr<Object> obj_;
};

// Python == between values (1 == 1.0 == True; lists and dicts deeply; different types are unequal).
bool equals(const Value &a, const Value &b);
// Python ordering (<): numbers, strings, lists/tuples lexicographically; anything else is a TypeError.
bool less_than(const Value &a, const Value &b);
// Iterate like Python's iter(): lists, tuples, strings (code points), dict keys; Undefined is empty.
List iterate(const Value &v);
// len(): strings in code points. Undefined is 0.
int64_t length(const Value &v);
// `needle in hay`: substring, element, or key.
bool contains(const Value &hay, const Value &needle);

// Python float repr: shortest round-trip digits, fixed between 1e-4 and 1e16, else exponent ('1e+16').
std::string float_repr(double d);
std::string python_str_repr(std::string_view s);
// json.dumps with the options transformers' tojson exposes.
struct JsonStyle {
    bool ensure_ascii = false;
    bool sort_keys = false;
    bool indent_set = false;
    std::string indent;          // the string one indentation level adds
    std::string item_sep = ", ";  // ', ' by default, ',' when indenting
    std::string key_sep = ": ";
};
std::string dumps(const Value &v, const JsonStyle &style);
// HTML escaping as markupsafe does it (&, <, >, ', ").
std::string html_escape(std::string_view s);

// UTF-8 helpers: Python strings index by code point.
// Invalid bytes decode to U+DC80+byte and encode back to the same byte, so no input is altered.
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(const std::u32string &cps);
void append_utf8(std::string &out, char32_t cp);
bool is_py_space(char32_t cp);  // str.isspace / str.strip() whitespace

}  // namespace strata::jinja
