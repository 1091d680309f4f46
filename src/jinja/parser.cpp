// Parser of the chat-template language: recursive descent over the lexer's tokens, with jinja2's precedence
// (conditional < or < and < not < comparisons < + - < ~ < * / // % < ** < unary < postfix/filters/tests) and its
// statement set minus template inheritance and includes (chat templates are single strings). Not the evaluator.
#include "jinja/parser.h"

#include <set>

namespace strata::jinja {
namespace {

class Parser {
public:
    explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

    Body parse_template() {
        Body body = subparse({});
        if (cur().type != Tok::Eof) fail_at(cur().line, "unexpected " + describe(cur()));
        return body;
    }

private:
    std::vector<Token> t_;
    size_t i_ = 0;
    std::vector<std::vector<std::string>> end_stack_;  // end tags the open blocks wait for
    std::vector<std::string> tag_stack_;               // open block names, for messages
    int loop_depth_ = 0;
    int nesting_ = 0;  // expression and block nesting, bounded so a hostile template cannot exhaust the stack

    // Counts one level of recursive descent for the lifetime of a parse function.
    struct Nest {
        Parser &p;
        explicit Nest(Parser &parser, int line) : p(parser) {
            if (++p.nesting_ > 300) fail_at(line, "template nested too deeply (more than 300 levels)");
        }
        ~Nest() { p.nesting_--; }
    };
    // A left-associative chain (a + b + c ..., x|f|g ...) deepens the tree by one level per link.
    void chain(int &links, int line) const {
        if (nesting_ + ++links > 300) fail_at(line, "template nested too deeply (more than 300 levels)");
    }

    [[noreturn]] static void fail_at(int line, std::string msg) { throw_error_at(line, std::move(msg)); }

    const Token &cur() const { return t_[i_]; }
    const Token &peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
    Token next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
    bool is_op(const char *op) const { return cur().type == Tok::Op && cur().text == op; }
    bool is_name(const char *n) const { return cur().type == Tok::Name && cur().text == n; }
    bool skip_op(const char *op) {
        if (!is_op(op)) return false;
        i_++;
        return true;
    }
    bool skip_name(const char *n) {
        if (!is_name(n)) return false;
        i_++;
        return true;
    }
    static std::string describe(const Token &t) {
        if (t.type == Tok::Op || t.type == Tok::Name) return "'" + t.text + "'";
        return tok_name(t.type);
    }
    void expect_op(const char *op) {
        if (!skip_op(op)) fail_at(cur().line, std::string("expected token '") + op + "', got " + describe(cur()));
    }
    void expect_name(const char *n) {
        if (!skip_name(n)) fail_at(cur().line, std::string("expected token '") + n + "', got " + describe(cur()));
    }
    std::string expect_identifier() {
        if (cur().type != Tok::Name) fail_at(cur().line, "expected a name, got " + describe(cur()));
        return next().text;
    }
    void expect_block_end() {
        if (cur().type != Tok::BlockEnd) fail_at(cur().line, "expected token 'end of statement block', got " + describe(cur()));
        i_++;
    }

    static ExprP node(EK k, int line) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->line = line;
        return e;
    }
    static StmtP stmt(SK k, int line) {
        auto s = std::make_unique<Stmt>();
        s->kind = k;
        s->line = line;
        return s;
    }

    [[noreturn]] void fail_unknown_tag(const std::string &name, int line) {
        std::string msg = name.empty() ? "Unexpected end of template." : "Encountered unknown tag '" + name + "'.";
        if (!end_stack_.empty()) {
            std::set<std::string> expected;
            for (auto &v : end_stack_) expected.insert(v.begin(), v.end());
            std::string looking;
            for (auto &e : end_stack_.back()) looking += (looking.empty() ? "'" : " or '") + e + "'";
            if (!name.empty() && expected.count(name))
                msg += " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
                       looking + ".";
            else
                msg += " Jinja was looking for the following tags: " + looking + ".";
        }
        if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
        fail_at(line, msg);
    }

    // Statements until one of `ends` (a block whose first name is in ends); the end tag's name is left current.
    Body subparse(const std::vector<std::string> &ends) {
        Body body;
        if (!ends.empty()) end_stack_.push_back(ends);
        while (true) {
            const Token &tk = cur();
            if (tk.type == Tok::Eof) {
                if (!ends.empty()) fail_unknown_tag("", tk.line);
                break;
            }
            if (tk.type == Tok::Data) {
                auto s = stmt(SK::Text, tk.line);
                s->text = tk.text;
                body.push_back(std::move(s));
                i_++;
            } else if (tk.type == Tok::VarBegin) {
                i_++;
                auto s = stmt(SK::Print, tk.line);
                s->expr = parse_tuple(true, {});
                if (cur().type != Tok::VarEnd) fail_at(cur().line, "expected token 'end of print statement', got " + describe(cur()));
                i_++;
                body.push_back(std::move(s));
            } else if (tk.type == Tok::BlockBegin) {
                const Token &name = peek();
                if (name.type == Tok::Name) {
                    for (auto &e : ends)
                        if (name.text == e) {
                            i_++;  // leave the end tag's name current
                            end_stack_.pop_back();
                            return body;
                        }
                }
                i_++;
                body.push_back(parse_statement());
            } else {
                fail_at(tk.line, "unexpected " + describe(tk));
            }
        }
        if (!ends.empty()) end_stack_.pop_back();
        return body;
    }

    // Parses `{% endX %}` after subparse stopped on it.
    void end_tag(const char *name) {
        expect_name(name);
        expect_block_end();
    }

    StmtP parse_statement() {
        const Token &tk = cur();
        Nest guard(*this, tk.line);
        if (tk.type != Tok::Name) fail_at(tk.line, "tag name expected");
        std::string n = tk.text;
        int line = tk.line;
        tag_stack_.push_back(n);
        StmtP s;
        if (n == "if") s = parse_if();
        else if (n == "for") s = parse_for();
        else if (n == "set") s = parse_set();
        else if (n == "macro") s = parse_macro();
        else if (n == "call") s = parse_call_block();
        else if (n == "filter") s = parse_filter_block();
        else if (n == "with") s = parse_with();
        else if (n == "generation") {
            i_++;
            expect_block_end();
            s = stmt(SK::Scope, line);
            s->body = subparse({"endgeneration"});
            end_tag("endgeneration");
        } else if (n == "break" || n == "continue") {
            i_++;
            if (loop_depth_ == 0) fail_at(line, "'" + n + "' outside of a loop");
            expect_block_end();
            s = stmt(n == "break" ? SK::Break : SK::Continue, line);
        } else if (n == "extends" || n == "include" || n == "import" || n == "from" || n == "block") {
            fail_at(line, "the '" + n + "' tag is not supported: a chat template is a single string");
        } else {
            tag_stack_.pop_back();
            fail_unknown_tag(n, line);
        }
        tag_stack_.pop_back();
        return s;
    }

    StmtP parse_if() {
        auto s = stmt(SK::If, cur().line);
        i_++;
        while (true) {
            ExprP cond = parse_tuple(false, {});
            expect_block_end();
            Body body = subparse({"elif", "else", "endif"});
            s->branches.emplace_back(std::move(cond), std::move(body));
            std::string tag = next().text;
            if (tag == "elif") continue;
            if (tag == "else") {
                expect_block_end();
                s->else_body = subparse({"endif"});
                end_tag("endif");
            } else {
                expect_block_end();
            }
            break;
        }
        return s;
    }

    StmtP parse_for() {
        auto s = stmt(SK::For, cur().line);
        i_++;
        s->target = parse_assign_target({"in"}, false);
        expect_name("in");
        s->expr = parse_tuple(false, {"recursive"});
        if (skip_name("if")) s->cond = parse_expression(true);
        if (skip_name("recursive")) s->recursive = true;
        expect_block_end();
        loop_depth_++;
        s->body = subparse({"endfor", "else"});
        loop_depth_--;
        if (next().text == "else") {
            expect_block_end();
            s->else_body = subparse({"endfor"});
            end_tag("endfor");
        } else {
            expect_block_end();
        }
        return s;
    }

    StmtP parse_set() {
        int line = cur().line;
        i_++;
        ExprP target = parse_assign_target({}, true);
        if (skip_op("=")) {
            auto s = stmt(SK::Set, line);
            s->target = std::move(target);
            s->expr = parse_tuple(true, {});
            expect_block_end();
            return s;
        }
        auto s = stmt(SK::SetBlock, line);
        s->target = std::move(target);
        if (is_op("|")) s->expr = parse_filters(node(EK::Placeholder, line));
        expect_block_end();
        s->body = subparse({"endset"});
        end_tag("endset");
        return s;
    }

    // Names (and `ns.attr` where allowed), optionally as a tuple: `a`, `k, v`, `(a, b)`, `ns.x`.
    ExprP parse_assign_target(const std::vector<std::string> &extra_end, bool with_namespace) {
        int line = cur().line;
        std::vector<ExprP> items;
        bool comma = false;
        while (true) {
            ExprP item;
            if (skip_op("(")) {
                item = parse_assign_target({}, false);
                expect_op(")");
            } else {
                int l = cur().line;
                std::string n = expect_identifier();
                if (with_namespace && is_op(".") && peek().type == Tok::Name) {
                    i_++;
                    item = node(EK::Attr, l);
                    auto base = node(EK::Name, l);
                    base->name = n;
                    item->sub.push_back(std::move(base));
                    item->name = next().text;
                } else {
                    if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
                        fail_at(l, "can't assign to 'const'");
                    item = node(EK::Name, l);
                    item->name = n;
                }
            }
            items.push_back(std::move(item));
            if (!skip_op(",")) break;
            comma = true;
            bool end = cur().type == Tok::BlockEnd || is_op("=") || is_op("|") || is_op(")");
            for (auto &e : extra_end) end = end || is_name(e.c_str());
            if (end) break;
        }
        if (!comma) return std::move(items[0]);
        auto t = node(EK::Tuple, line);
        t->sub = std::move(items);
        return t;
    }

    void parse_signature(Stmt &s) {
        expect_op("(");
        while (!is_op(")")) {
            if (!s.params.empty()) expect_op(",");
            if (is_op(")")) break;
            Param p;
            p.name = expect_identifier();
            if (skip_op("=")) p.default_value = parse_expression(true);
            else if (!s.params.empty() && s.params.back().default_value)
                fail_at(cur().line, "non-default argument follows default argument");
            s.params.push_back(std::move(p));
        }
        expect_op(")");
    }

    static void scan_names(const Expr *e, Stmt &s) {
        if (!e) return;
        if (e->kind == EK::Name) {
            if (e->name == "varargs") s.uses_varargs = true;
            if (e->name == "kwargs") s.uses_kwargs = true;
            if (e->name == "caller") s.uses_caller = true;
        }
        for (auto &c : e->sub) scan_names(c.get(), s);
        for (auto &kv : e->kwargs) scan_names(kv.second.get(), s);
        scan_names(e->star_args.get(), s);
        scan_names(e->star_kwargs.get(), s);
    }
    static void scan_body(const Body &b, Stmt &s) {
        for (auto &st : b) {
            scan_names(st->expr.get(), s);
            scan_names(st->target.get(), s);
            scan_names(st->cond.get(), s);
            for (auto &br : st->branches) {
                scan_names(br.first.get(), s);
                scan_body(br.second, s);
            }
            for (auto &p : st->params) scan_names(p.default_value.get(), s);
            for (auto &a : st->assigns) scan_names(a.second.get(), s);
            scan_body(st->body, s);
            scan_body(st->else_body, s);
        }
    }

    StmtP parse_macro() {
        auto s = stmt(SK::Macro, cur().line);
        i_++;
        s->name = expect_identifier();
        parse_signature(*s);
        expect_block_end();
        int saved = loop_depth_;
        loop_depth_ = 0;  // a loop outside the macro does not make break legal inside it
        s->body = subparse({"endmacro"});
        loop_depth_ = saved;
        end_tag("endmacro");
        scan_body(s->body, *s);
        return s;
    }

    StmtP parse_call_block() {
        auto s = stmt(SK::CallBlock, cur().line);
        i_++;
        if (is_op("(")) parse_signature(*s);
        s->expr = parse_expression(true);
        if (s->expr->kind != EK::Call) fail_at(s->line, "expected call");
        expect_block_end();
        int saved = loop_depth_;
        loop_depth_ = 0;
        s->body = subparse({"endcall"});
        loop_depth_ = saved;
        end_tag("endcall");
        scan_body(s->body, *s);
        return s;
    }

    StmtP parse_filter_block() {
        auto s = stmt(SK::FilterBlock, cur().line);
        i_++;
        s->expr = parse_filters(node(EK::Placeholder, s->line), true);
        expect_block_end();
        s->body = subparse({"endfilter"});
        end_tag("endfilter");
        return s;
    }

    StmtP parse_with() {
        auto s = stmt(SK::With, cur().line);
        i_++;
        while (cur().type != Tok::BlockEnd) {
            if (!s->assigns.empty()) expect_op(",");
            ExprP target = parse_assign_target({}, false);
            expect_op("=");
            s->assigns.emplace_back(std::move(target), parse_expression(true));
        }
        expect_block_end();
        s->body = subparse({"endwith"});
        end_tag("endwith");
        return s;
    }

    // ---- expressions -----------------------------------------------------------------------------------------

    bool tuple_end(const std::vector<std::string> &extra) const {
        if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof || is_op(")"))
            return true;
        for (auto &e : extra)
            if (is_name(e.c_str())) return true;
        return false;
    }

    // Comma-separated expressions; a comma makes a tuple (`{% set a = 1, 2 %}`).
    ExprP parse_tuple(bool with_condexpr, const std::vector<std::string> &extra_end, bool explicit_parens = false) {
        int line = cur().line;
        std::vector<ExprP> items;
        bool comma = false;
        while (true) {
            if (!items.empty()) {
                if (!skip_op(",")) break;
                comma = true;
            }
            if (tuple_end(extra_end)) break;
            items.push_back(parse_expression(with_condexpr));
        }
        if (!comma) {
            if (!items.empty()) return std::move(items[0]);
            if (!explicit_parens) fail_at(cur().line, "Expected an expression, got " + describe(cur()));
        }
        auto t = node(EK::Tuple, line);
        t->sub = std::move(items);
        return t;
    }

    ExprP parse_expression(bool with_condexpr) {
        Nest n(*this, cur().line);
        return with_condexpr ? parse_condexpr() : parse_or();
    }

    ExprP parse_condexpr() {
        int line = cur().line;
        ExprP e = parse_or();
        int links = 0;
        while (skip_name("if")) {
            chain(links, line);
            auto c = node(EK::Cond, line);
            ExprP test = parse_or();
            ExprP other = skip_name("else") ? parse_condexpr() : nullptr;
            c->sub.push_back(std::move(e));
            c->sub.push_back(std::move(test));
            c->sub.push_back(std::move(other));
            e = std::move(c);
        }
        return e;
    }

    ExprP binary(EK k, ExprP l, ExprP r, int line, std::string op = {}) {
        auto b = node(k, line);
        b->name = std::move(op);
        b->sub.push_back(std::move(l));
        b->sub.push_back(std::move(r));
        return b;
    }

    ExprP parse_or() {
        int line = cur().line;
        ExprP l = parse_and();
        int links = 0;
        while (skip_name("or")) {
            chain(links, line);
            l = binary(EK::Or, std::move(l), parse_and(), line);
        }
        return l;
    }
    ExprP parse_and() {
        int line = cur().line;
        ExprP l = parse_not();
        int links = 0;
        while (skip_name("and")) {
            chain(links, line);
            l = binary(EK::And, std::move(l), parse_not(), line);
        }
        return l;
    }
    ExprP parse_not() {
        Nest guard(*this, cur().line);
        if (is_name("not")) {
            auto n = node(EK::Not, next().line);
            n->sub.push_back(parse_not());
            return n;
        }
        return parse_compare();
    }
    ExprP parse_compare() {
        int line = cur().line;
        ExprP first = parse_math1();
        auto c = node(EK::Compare, line);
        while (true) {
            if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                          cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
                c->ops.push_back(next().text);
            } else if (skip_name("in")) {
                c->ops.push_back("in");
            } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
                i_ += 2;
                c->ops.push_back("notin");
            } else {
                break;
            }
            c->sub.push_back(parse_math1());
        }
        if (c->ops.empty()) return first;
        c->sub.insert(c->sub.begin(), std::move(first));
        return c;
    }
    ExprP parse_math1() {
        int line = cur().line;
        ExprP l = parse_concat();
        int links = 0;
        while (is_op("+") || is_op("-")) {
            chain(links, line);
            std::string op = next().text;
            l = binary(EK::Bin, std::move(l), parse_concat(), line, op);
        }
        return l;
    }
    ExprP parse_concat() {
        int line = cur().line;
        ExprP first = parse_math2();
        if (!is_op("~")) return first;
        auto c = node(EK::Concat, line);
        c->sub.push_back(std::move(first));
        while (skip_op("~")) c->sub.push_back(parse_math2());
        return c;
    }
    ExprP parse_math2() {
        int line = cur().line;
        ExprP l = parse_pow();
        int links = 0;
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            chain(links, line);
            std::string op = next().text;
            l = binary(EK::Bin, std::move(l), parse_pow(), line, op);
        }
        return l;
    }
    ExprP parse_pow() {
        int line = cur().line;
        ExprP l = parse_unary(true);
        int links = 0;
        while (skip_op("**")) {
            chain(links, line);
            l = binary(EK::Bin, std::move(l), parse_unary(true), line, "**");
        }
        return l;
    }
    ExprP parse_unary(bool with_filter) {
        int line = cur().line;
        Nest guard(*this, line);
        ExprP n;
        if (skip_op("-")) {
            n = node(EK::Neg, line);
            n->sub.push_back(parse_unary(false));
        } else if (skip_op("+")) {
            n = node(EK::Pos, line);
            n->sub.push_back(parse_unary(false));
        } else {
            n = parse_primary();
        }
        n = parse_postfix(std::move(n));
        if (with_filter) n = parse_filter_expr(std::move(n));
        return n;
    }

    ExprP parse_primary() {
        const Token &tk = cur();
        int line = tk.line;
        if (tk.type == Tok::Name) {
            i_++;
            auto c = node(EK::Const, line);
            if (tk.text == "true" || tk.text == "True") c->value = Value::boolean(true);
            else if (tk.text == "false" || tk.text == "False") c->value = Value::boolean(false);
            else if (tk.text == "none" || tk.text == "None") c->value = Value::none();
            else {
                c->kind = EK::Name;
                c->name = tk.text;
            }
            return c;
        }
        if (tk.type == Tok::String) {
            std::string s;
            while (cur().type == Tok::String) s += next().text;  // adjacent literals concatenate
            auto c = node(EK::Const, line);
            c->value = Value::string(std::move(s));
            return c;
        }
        if (tk.type == Tok::Int || tk.type == Tok::Float) {
            i_++;
            auto c = node(EK::Const, line);
            c->value = tk.type == Tok::Int ? Value::integer(tk.ival) : Value::number(tk.fval);
            return c;
        }
        if (skip_op("(")) {
            ExprP e = parse_tuple(true, {}, true);
            expect_op(")");
            return e;
        }
        if (skip_op("[")) {
            auto l = node(EK::List, line);
            while (!is_op("]")) {
                if (!l->sub.empty()) expect_op(",");
                if (is_op("]")) break;
                l->sub.push_back(parse_expression(true));
            }
            expect_op("]");
            return l;
        }
        if (skip_op("{")) {
            auto d = node(EK::Dict, line);
            while (!is_op("}")) {
                if (!d->sub.empty()) expect_op(",");
                if (is_op("}")) break;
                d->sub.push_back(parse_expression(true));
                expect_op(":");
                d->sub.push_back(parse_expression(true));
            }
            expect_op("}");
            return d;
        }
        fail_at(line, "unexpected " + describe(tk));
    }

    ExprP parse_postfix(ExprP n) {
        int links = 0;
        while (true) {
            chain(links, cur().line);
            if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
            else if (is_op("(")) n = parse_call(std::move(n));
            else return n;
        }
    }

    ExprP parse_filter_expr(ExprP n) {
        int links = 0;
        while (true) {
            chain(links, cur().line);
            if (is_op("|")) n = parse_filters(std::move(n));
            else if (is_name("is")) n = parse_test(std::move(n));
            else if (is_op("(")) n = parse_call(std::move(n));
            else return n;
        }
    }

    ExprP parse_subscript(ExprP n) {
        Token tk = next();
        if (tk.text == ".") {
            const Token &a = cur();
            if (a.type == Tok::Name) {
                auto g = node(EK::Attr, tk.line);
                g->sub.push_back(std::move(n));
                g->name = next().text;
                return g;
            }
            if (a.type == Tok::Int) {
                auto g = node(EK::Item, tk.line);
                g->sub.push_back(std::move(n));
                auto k = node(EK::Const, a.line);
                k->value = Value::integer(next().ival);
                g->sub.push_back(std::move(k));
                return g;
            }
            fail_at(a.line, "expected name or number");
        }
        // '[': one subscript, a slice, or several (a tuple key)
        std::vector<ExprP> keys;
        bool comma = false;
        while (!is_op("]")) {
            if (!keys.empty()) {
                expect_op(",");
                comma = true;
                if (is_op("]")) break;
            }
            keys.push_back(parse_subscribed());
        }
        expect_op("]");
        if (keys.empty()) fail_at(tk.line, "expected subscript expression");
        if (keys.size() == 1 && !comma && keys[0]->kind == EK::Slice) {
            keys[0]->sub[0] = std::move(n);
            return std::move(keys[0]);
        }
        auto g = node(EK::Item, tk.line);
        g->sub.push_back(std::move(n));
        if (keys.size() == 1 && !comma) {
            g->sub.push_back(std::move(keys[0]));
        } else {
            auto t = node(EK::Tuple, tk.line);
            t->sub = std::move(keys);
            g->sub.push_back(std::move(t));
        }
        return g;
    }

    // One subscript: an expression or a slice `a:b:c` (returned as a Slice with an empty object slot).
    ExprP parse_subscribed() {
        int line = cur().line;
        ExprP start;
        if (!is_op(":")) {
            start = parse_expression(true);
            if (!is_op(":")) return start;
        }
        i_++;  // ':'
        auto s = node(EK::Slice, line);
        s->sub.push_back(nullptr);
        s->sub.push_back(std::move(start));
        ExprP stop, step;
        if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
        if (skip_op(":")) {
            if (!is_op("]") && !is_op(",")) step = parse_expression(true);
        }
        s->sub.push_back(std::move(stop));
        s->sub.push_back(std::move(step));
        return s;
    }

    // Arguments of a call, filter or test: positional, name=value, *args, **kwargs.
    void parse_args(Expr &e) {
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                expect_op(",");
                if (is_op(")")) break;
            }
            first = false;
            if (skip_op("*")) {
                e.star_args = parse_expression(true);
            } else if (skip_op("**")) {
                e.star_kwargs = parse_expression(true);
            } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
                if (e.star_kwargs) fail_at(cur().line, "invalid syntax for function call expression");
                std::string key = next().text;
                i_++;
                e.kwargs.emplace_back(key, parse_expression(true));
            } else {
                if (e.star_args || e.star_kwargs || !e.kwargs.empty())
                    fail_at(cur().line, "invalid syntax for function call expression");
                e.sub.push_back(parse_expression(true));
            }
        }
        expect_op(")");
    }

    ExprP parse_call(ExprP n) {
        auto c = node(EK::Call, cur().line);
        c->sub.push_back(std::move(n));
        parse_args(*c);
        return c;
    }

    std::string dotted_name() {
        std::string n = expect_identifier();
        while (is_op(".") && peek().type == Tok::Name) {
            i_++;
            n.push_back('.');  // (not "." + text: g++ 12 reports a false -Wrestrict there)
            n += next().text;
        }
        return n;
    }

    // `| f | g(args)`; start_inline: the first filter has no leading `|` ({% filter f %}).
    ExprP parse_filters(ExprP n, bool start_inline = false) {
        int links = 0;
        while (is_op("|") || start_inline) {
            chain(links, cur().line);
            if (!start_inline) i_++;
            start_inline = false;
            int line = cur().line;
            auto f = node(EK::Filter, line);
            f->name = dotted_name();
            f->sub.push_back(std::move(n));
            if (is_op("(")) parse_args(*f);
            n = std::move(f);
        }
        return n;
    }

    ExprP parse_test(ExprP n) {
        int line = next().line;  // 'is'
        bool negated = skip_name("not");
        auto t = node(EK::Test, line);
        t->name = dotted_name();
        t->negated = negated;
        t->sub.push_back(std::move(n));
        const Token &c = cur();
        if (is_op("(")) {
            parse_args(*t);
        } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
            if (is_name("is")) fail_at(c.line, "You cannot chain multiple tests with is");
            t->sub.push_back(parse_postfix(parse_primary()));
        }
        return t;
    }
};

}  // namespace

// Unknown filters and tests, resolved as jinja2 resolves them: a name no builtin has fails the parse where it stands
// in the template's own flow, but only when it is applied where it stands in a branch, an `if` block or a conditional
// expression ("soft"), which a render may never take. Loop, macro, call, filter, with and set blocks start a flow of
// their own (jinja2's inner frames), so an unknown name directly inside one fails the parse again.
namespace {

void check_names(const Expr *e, bool soft);
void check_names(const Body &b, bool soft);

void check_names(const Expr *e, bool soft) {
    if (!e) return;
    if (e->kind == EK::Cond) soft = true;
    if (!soft && e->kind == EK::Filter && !has_filter(e->name))
        throw_error_at(e->line, "No filter named '" + e->name + "'.");
    if (!soft && e->kind == EK::Test && !has_test(e->name))
        throw_error_at(e->line, "No test named '" + e->name + "'.");
    for (const ExprP &c : e->sub) check_names(c.get(), soft);
    for (const auto &kv : e->kwargs) check_names(kv.second.get(), soft);
    check_names(e->star_args.get(), soft);
    check_names(e->star_kwargs.get(), soft);
}

void check_names(const Body &body, bool soft) {
    for (const StmtP &s : body) {
        switch (s->kind) {
            case SK::If:
                for (const auto &br : s->branches) check_names(br.first.get(), true), check_names(br.second, true);
                check_names(s->else_body, true);
                break;
            case SK::For:
                check_names(s->expr.get(), soft);
                check_names(s->cond.get(), false);
                check_names(s->body, false);
                check_names(s->else_body, false);
                break;
            case SK::With:
                for (const auto &a : s->assigns) check_names(a.second.get(), soft);
                check_names(s->body, false);
                break;
            case SK::CallBlock:
                check_names(s->expr.get(), soft);
                for (const Param &p : s->params) check_names(p.default_value.get(), false);
                check_names(s->body, false);
                break;
            case SK::Macro:
                for (const Param &p : s->params) check_names(p.default_value.get(), false);
                check_names(s->body, false);
                break;
            case SK::FilterBlock:
            case SK::SetBlock:
                check_names(s->expr.get(), false);
                check_names(s->body, false);
                break;
            case SK::Scope: check_names(s->body, false); break;
            default:
                check_names(s->expr.get(), soft);
                check_names(s->target.get(), soft);
                break;
        }
    }
}

}  // namespace

Body parse(std::string_view source) {
    Body body = Parser(lex(source)).parse_template();
    check_names(body, false);
    return body;
}


}  // namespace strata::jinja
