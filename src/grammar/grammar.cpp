// GBNF -> byte-level grammar: a recursive-descent parser into rules over code point classes, then lowering of each
// class to UTF-8 byte sequences, and the checks that make matching safe (every rule completable, no left recursion
// that would grow the parse stack without reading a byte).
//
// The syntax is llama.cpp's: `name ::= alternatives`, `|`, string literals "...", character classes [a-z] and
// [^...], `.` (any character), groups (...), repetition * + ? {n} {m,} {m,n} {,n}, comments from # to the end of the
// line. A rule may continue over several lines (a new rule begins where `name ::=` does). Token references (<...>)
// are not supported.
#include "grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace strata::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kUnbounded = UINT32_MAX;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code point ranges, inclusive

Ranges normalized(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (auto [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
        else out.push_back({lo, hi});
    }
    return out;
}

Ranges complement(const Ranges &r) {
    Ranges out;
    uint32_t next = 0;
    for (auto [lo, hi] : r) {
        if (lo > next) out.push_back({next, lo - 1});
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return out;
}

// One symbol of a rule before lowering: a character class or a rule.
struct Sym {
    bool is_class;
    int32_t idx;  // into Parser::classes or Parser::rules
};
using Seq = std::vector<Sym>;

struct SymRule {
    std::string name;
    std::vector<Seq> alts;
    bool defined = false;
    size_t line = 0, col = 0;  // where it was defined, else first referenced
};

// ---- parsing ---------------------------------------------------------------------------------------------------

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
  public:
    Parser(std::string_view src, const Limits &limits) : src_(src), limits_(limits) {}

    void parse() {
        skip_space();
        while (pos_ < src_.size()) {
            parse_rule();
            skip_space();
        }
    }

    std::vector<SymRule> rules;
    std::vector<Ranges> classes;
    std::unordered_map<std::string, int32_t> by_name;

  private:
    [[noreturn]] void error_at(size_t at, const std::string &what) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < src_.size(); i++) {
            if (src_[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        throw GrammarError(strfmt("grammar line %zu column %zu: %s", line, col, what.c_str()));
    }
    [[noreturn]] void error(const std::string &what) const { error_at(pos_, what); }

    void position(size_t at, size_t &line, size_t &col) const {
        line = 1;
        col = 1;
        for (size_t i = 0; i < at; i++) {
            if (src_[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
    }

    // Spaces, newlines and comments.
    void skip_space() {
        while (pos_ < src_.size()) {
            const char c = src_[pos_];
            if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
                pos_++;
            } else if (c == '#') {
                while (pos_ < src_.size() && src_[pos_] != '\n') pos_++;
            } else {
                break;
            }
        }
    }

    // Whether the text at pos_ is the start of a rule definition (`name ::=`): the end of the rule before it.
    bool at_rule_start() const {
        size_t p = pos_;
        while (p < src_.size() && is_name_char(src_[p])) p++;
        if (p == pos_) return false;
        while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t')) p++;
        return src_.substr(p, 3) == "::=";
    }

    std::string parse_name() {
        const size_t start = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) pos_++;
        if (pos_ == start) error("expected a rule name");
        return std::string(src_.substr(start, pos_ - start));
    }

    int32_t rule_id(const std::string &name, size_t at) {
        auto it = by_name.find(name);
        if (it != by_name.end()) return it->second;
        const int32_t id = int32_t(rules.size());
        SymRule r;
        r.name = name;
        position(at, r.line, r.col);
        rules.push_back(std::move(r));
        by_name.emplace(name, id);
        return id;
    }

    int32_t new_rule(const std::string &base) {
        const int32_t id = int32_t(rules.size());
        SymRule r;
        r.name = strfmt("%s#%zu", base.c_str(), rules.size());  // '#' never appears in a parsed name
        r.defined = true;
        rules.push_back(std::move(r));
        return id;
    }

    void count(size_t n) {
        n_syms_ += n;
        if (n_syms_ > limits_.max_elements)
            error(strfmt("the grammar is too large (more than %zu elements once repetitions are unrolled)",
                         limits_.max_elements));
    }

    void parse_rule() {
        const size_t start = pos_;
        const std::string name = parse_name();
        const int32_t id = rule_id(name, start);
        if (rules[size_t(id)].defined) {
            size_t line, col;
            position(start, line, col);
            error_at(start, strfmt("rule '%s' is defined twice (again on line %zu)", name.c_str(), line));
        }
        position(start, rules[size_t(id)].line, rules[size_t(id)].col);
        while (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\t')) pos_++;
        if (src_.substr(pos_, 3) != "::=") error("expected '::=' after the rule name '" + name + "'");
        pos_ += 3;
        current_ = name;
        std::vector<Seq> alts = parse_alternates(0);
        rules[size_t(id)].alts = std::move(alts);
        rules[size_t(id)].defined = true;
        skip_space();
        if (pos_ < src_.size() && !at_rule_start()) {
            if (src_[pos_] == ')') error("unbalanced ')'");
            error("expected a new rule (name ::= ...)");
        }
    }

    std::vector<Seq> parse_alternates(int nesting) {
        if (nesting > limits_.max_nesting) error(strfmt("groups nested deeper than %d", limits_.max_nesting));
        std::vector<Seq> alts;
        alts.push_back(parse_sequence(nesting));
        while (pos_ < src_.size() && src_[pos_] == '|') {
            pos_++;
            alts.push_back(parse_sequence(nesting));
        }
        return alts;
    }

    Seq parse_sequence(int nesting) {
        Seq seq;
        for (;;) {
            skip_space();
            if (pos_ >= src_.size()) break;
            const char c = src_[pos_];
            if (c == '|' || c == ')') break;
            if (nesting == 0 && at_rule_start()) break;
            Seq atom = parse_atom(nesting);
            skip_space();
            if (pos_ < src_.size() && (src_[pos_] == '*' || src_[pos_] == '+' || src_[pos_] == '?' || src_[pos_] == '{'))
                atom = parse_repetition(std::move(atom));
            count(atom.size());
            seq.insert(seq.end(), atom.begin(), atom.end());
        }
        return seq;
    }

    uint32_t parse_hex(size_t digits) {
        uint32_t v = 0;
        for (size_t i = 0; i < digits; i++) {
            if (pos_ >= src_.size()) error("unfinished escape");
            const char c = src_[pos_];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) error(strfmt("expected %zu hexadecimal digits in the escape", digits));
            v = v * 16 + uint32_t(d);
            pos_++;
        }
        return v;
    }

    // One character of a literal or class, escapes decoded.
    uint32_t parse_char() {
        if (pos_ >= src_.size()) error("unexpected end of the grammar");
        if (src_[pos_] == '\\') {
            pos_++;
            if (pos_ >= src_.size()) error("unfinished escape");
            const char e = src_[pos_++];
            switch (e) {
                case 'n': return '\n';
                case 'r': return '\r';
                case 't': return '\t';
                case 'f': return '\f';
                case 'v': return '\v';
                case '0': return 0;
                case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.': case '|':
                case '(': case ')': case '*': case '+': case '?': case '{': case '}': case '#':
                    return uint32_t(uint8_t(e));
                case 'x': return parse_hex(2);
                case 'u': return checked_cp(parse_hex(4));
                case 'U': return checked_cp(parse_hex(8));
                default: pos_--; error(strfmt("unknown escape '\\%c'", e));
            }
        }
        const size_t n = tok::utf8_seq_len(src_, pos_);
        if (n == 0) error("the grammar is not valid UTF-8 here");
        const uint32_t cp = tok::utf8_decode(src_, pos_, n);
        pos_ += n;
        return cp;
    }

    uint32_t checked_cp(uint32_t cp) {
        if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
            error(strfmt("U+%04X is not a character (a surrogate or past U+10FFFF)", cp));
        return cp;
    }

    int32_t add_class(Ranges r) {
        classes.push_back(normalized(std::move(r)));
        return int32_t(classes.size() - 1);
    }

    Seq parse_atom(int nesting) {
        const char c = src_[pos_];
        Seq out;
        if (c == '"') {
            pos_++;
            while (pos_ < src_.size() && src_[pos_] != '"') {
                if (src_[pos_] == '\n') error("unterminated string literal");
                const uint32_t cp = parse_char();
                out.push_back({true, add_class({{cp, cp}})});
            }
            if (pos_ >= src_.size()) error("unterminated string literal");
            pos_++;
            return out;
        }
        if (c == '[') {
            const size_t start = pos_++;
            bool negated = false;
            if (pos_ < src_.size() && src_[pos_] == '^') {
                negated = true;
                pos_++;
            }
            Ranges r;
            while (pos_ < src_.size() && src_[pos_] != ']') {
                const uint32_t lo = parse_char();
                uint32_t hi = lo;
                if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
                    pos_++;
                    hi = parse_char();
                    if (hi < lo) error(strfmt("the range U+%04X-U+%04X is backwards", lo, hi));
                }
                r.push_back({lo, hi});
            }
            if (pos_ >= src_.size()) error_at(start, "unterminated character class");
            pos_++;
            r = normalized(std::move(r));
            if (negated) r = complement(r);
            out.push_back({true, add_class(std::move(r))});
            return out;
        }
        if (c == '.') {
            pos_++;
            out.push_back({true, add_class({{0, kMaxCodePoint}})});
            return out;
        }
        if (c == '(') {
            const size_t start = pos_++;
            std::vector<Seq> alts = parse_alternates(nesting + 1);
            if (pos_ >= src_.size() || src_[pos_] != ')') error_at(start, "unbalanced '(': expected ')'");
            pos_++;
            if (alts.size() == 1) return std::move(alts[0]);  // a plain sequence needs no rule of its own
            const int32_t id = new_rule(current_);
            rules[size_t(id)].alts = std::move(alts);
            out.push_back({false, id});
            return out;
        }
        if (c == '<') error("token references (<...>) are not supported");
        if (is_name_char(c)) {
            const size_t start = pos_;
            const std::string name = parse_name();
            out.push_back({false, rule_id(name, start)});
            return out;
        }
        error(strfmt("unexpected '%c'", c));
    }

    uint32_t parse_count() {
        const size_t start = pos_;
        uint64_t v = 0;
        while (pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '9') {
            v = v * 10 + uint64_t(src_[pos_] - '0');
            if (v > limits_.max_repeat) error_at(start, strfmt("repetition counts are limited to %u", limits_.max_repeat));
            pos_++;
        }
        if (pos_ == start) error("expected a number");
        return uint32_t(v);
    }

    Seq parse_repetition(Seq atom) {
        uint32_t lo = 0, hi = kUnbounded;
        const char op = src_[pos_++];
        if (op == '*') {
        } else if (op == '+') {
            lo = 1;
        } else if (op == '?') {
            hi = 1;
        } else {  // {n}, {m,}, {m,n}, {,n}
            skip_space();
            lo = pos_ < src_.size() && src_[pos_] == ',' ? 0 : parse_count();
            skip_space();
            if (pos_ < src_.size() && src_[pos_] == ',') {
                pos_++;
                skip_space();
                hi = pos_ < src_.size() && src_[pos_] == '}' ? kUnbounded : parse_count();
            } else {
                hi = lo;
            }
            skip_space();
            if (pos_ >= src_.size() || src_[pos_] != '}') error("expected '}' to close the repetition");
            pos_++;
            if (hi < lo) error(strfmt("the repetition {%u,%u} is backwards", lo, hi));
        }
        skip_space();
        if (pos_ < src_.size() && (src_[pos_] == '*' || src_[pos_] == '+' || src_[pos_] == '?' || src_[pos_] == '{'))
            error("a repetition cannot be repeated directly: put it in parentheses");
        Sym x{false, 0};
        if (atom.size() == 1) {
            x = atom[0];
        } else {  // repeat the whole sequence ("abc"*, (a b)*)
            const int32_t id = new_rule(current_);
            rules[size_t(id)].alts = {std::move(atom)};
            x = {false, id};
        }
        Seq out(lo, x);
        count(lo);
        if (hi == kUnbounded) {  // S ::= x S | (nothing): tail recursion, which matching does without stack growth
            const int32_t s = new_rule(current_);
            rules[size_t(s)].alts = {{x, Sym{false, s}}, {}};
            out.push_back({false, s});
        } else if (hi > lo) {  // O_k ::= x O_(k-1) | (nothing), O_1 ::= x | (nothing)
            int32_t prev = -1;
            for (uint32_t k = 1; k <= hi - lo; k++) {
                const int32_t o = new_rule(current_);
                Seq first = {x};
                if (prev >= 0) first.push_back({false, prev});
                rules[size_t(o)].alts = {std::move(first), {}};
                prev = o;
                count(2);
            }
            out.push_back({false, prev});
        }
        return out;
    }

    std::string_view src_;
    const Limits &limits_;
    size_t pos_ = 0;
    size_t n_syms_ = 0;
    std::string current_;  // the rule being parsed, for naming the rules its groups and repetitions become
};

// ---- UTF-8 byte sequences of code point ranges ------------------------------------------------------------------

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;  // one byte range per position

// The UTF-8 bytes of cp (at most 4) into b.
void encode(uint32_t cp, uint8_t (&b)[4], int &n) {
    std::string s;
    tok::utf8_append(s, cp);
    n = int(std::min<size_t>(s.size(), 4));
    STRATA_ASSERT(s.size() == size_t(n));
    for (int i = 0; i < n; i++) b[i] = uint8_t(s[size_t(i)]);
}

// The UTF-8 encodings of [lo, hi] (surrogates left out) as sequences of byte ranges, each sequence standing for
// every combination of its ranges: split where the encoded length changes, then where a continuation byte's range
// would not be whole.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq> &out) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
        return;
    }
    for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu})
        if (lo <= max && hi > max) {
            utf8_sequences(lo, max, out);
            utf8_sequences(max + 1, hi, out);
            return;
        }
    if (hi <= 0x7F) {
        out.push_back({{uint8_t(lo), uint8_t(hi)}});
        return;
    }
    for (int i = 1; i < 4; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_sequences(lo, lo | m, out);
                utf8_sequences((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                utf8_sequences(lo, (hi & ~m) - 1, out);
                utf8_sequences(hi & ~m, hi, out);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    int na, nb;
    encode(lo, a, na);
    encode(hi, b, nb);
    STRATA_ASSERT(na == nb);
    ByteSeq seq;
    for (int i = 0; i < na; i++) seq.push_back({a[i], b[i]});
    out.push_back(std::move(seq));
}

}  // namespace

// ---- lowering and checks ---------------------------------------------------------------------------------------

class Compiler {
  public:
    Compiler(Parser &p, const Limits &limits) : p_(p), limits_(limits) {}

    std::shared_ptr<const Grammar> compile() {
        for (const SymRule &r : p_.rules)
            if (!r.defined)
                throw GrammarError(strfmt("grammar line %zu column %zu: rule '%s' is used but not defined", r.line,
                                          r.col, r.name.c_str()));
        auto root_it = p_.by_name.find("root");
        if (root_it == p_.by_name.end()) throw GrammarError("the grammar has no rule named 'root' (where it starts)");

        // Byte-level rules: the parsed ones first (same ids), then one per multi-sequence class.
        for (const SymRule &r : p_.rules) names_.push_back(r.name);
        alts_.resize(p_.rules.size());
        for (size_t i = 0; i < p_.rules.size(); i++)
            for (const Seq &seq : p_.rules[i].alts) {
                std::vector<int32_t> out;
                for (const Sym &s : seq) lower(s, out);
                alts_[i].push_back(std::move(out));
            }
        if (n_elements_ > limits_.max_elements)
            throw GrammarError(strfmt("the grammar is too large (more than %zu elements)", limits_.max_elements));

        prune_unproductive(root_it->second);
        compute_nullable();
        check_left_recursion();

        auto g = std::shared_ptr<Grammar>(new Grammar());
        g->sets_ = std::move(sets_);
        g->names_ = names_;
        g->root_ = root_it->second;
        g->rule_alts_.push_back(0);
        for (size_t r = 0; r < alts_.size(); r++) {
            for (const auto &alt : alts_[r]) {
                g->alt_starts_.push_back(int32_t(g->elements_.size()));
                g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
                g->elements_.push_back(Grammar::kEnd);
            }
            g->rule_alts_.push_back(int32_t(g->alt_starts_.size()));
        }
        g->nullable_ = nullable_;
        return g;
    }

  private:
    int32_t intern_set(const ByteSet &s) {
        auto key = std::make_tuple(s.w[0], s.w[1], s.w[2], s.w[3]);
        auto it = set_ids_.find(key);
        if (it != set_ids_.end()) return it->second;
        sets_.push_back(s);
        set_ids_.emplace(key, int32_t(sets_.size() - 1));
        return int32_t(sets_.size() - 1);
    }

    void lower(const Sym &s, std::vector<int32_t> &out) {
        n_elements_++;
        if (!s.is_class) {
            out.push_back(Grammar::ref(s.idx));
            return;
        }
        auto cached = class_rule_.find(s.idx);
        if (cached != class_rule_.end()) {
            if (cached->second.size() == 1) {
                const auto &only = cached->second[0];
                out.insert(out.end(), only.begin(), only.end());
            } else {
                out.push_back(Grammar::ref(class_rule_id_[s.idx]));
            }
            return;
        }
        std::vector<ByteSeq> seqs;
        for (auto [lo, hi] : p_.classes[size_t(s.idx)]) utf8_sequences(lo, hi, seqs);
        if (seqs.empty()) throw GrammarError("a character class matches no character (e.g. [^\\x00-\\U0010FFFF])");
        // Single-byte sequences are alternatives of one byte each: one set.
        std::vector<std::vector<int32_t>> alts;
        ByteSet ascii;
        bool any_ascii = false;
        for (const ByteSeq &q : seqs) {
            if (q.size() == 1) {
                ascii.add_range(q[0].first, q[0].second);
                any_ascii = true;
                continue;
            }
            std::vector<int32_t> alt;
            for (auto [lo, hi] : q) {
                ByteSet b;
                b.add_range(lo, hi);
                alt.push_back(intern_set(b));
            }
            alts.push_back(std::move(alt));
        }
        if (any_ascii) alts.insert(alts.begin(), std::vector<int32_t>{intern_set(ascii)});
        n_elements_ += alts.size() * 2;
        class_rule_[s.idx] = alts;
        if (alts.size() == 1) {
            out.insert(out.end(), alts[0].begin(), alts[0].end());
            return;
        }
        const int32_t id = int32_t(names_.size());
        names_.push_back(strfmt("class#%d", s.idx));
        alts_.push_back(alts);
        class_rule_id_[s.idx] = id;
        out.push_back(Grammar::ref(id));
    }

    // Alternatives that can never be completed (they need a rule that cannot) are removed: a matcher that entered
    // one could never end.
    void prune_unproductive(int32_t root) {
        std::vector<bool> productive(alts_.size(), false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < alts_.size(); r++) {
                if (productive[r]) continue;
                for (const auto &alt : alts_[r]) {
                    if (std::all_of(alt.begin(), alt.end(), [&](int32_t e) {
                            return Grammar::is_set(e) || productive[size_t(Grammar::rule_of(e))];
                        })) {
                        productive[r] = true;
                        changed = true;
                        break;
                    }
                }
            }
        }
        if (!productive[size_t(root)])
            throw GrammarError("the grammar can never be completed: every alternative of 'root' leads back into a "
                               "rule that never ends");
        for (size_t r = 0; r < alts_.size(); r++)
            std::erase_if(alts_[r], [&](const std::vector<int32_t> &alt) {
                return std::any_of(alt.begin(), alt.end(), [&](int32_t e) {
                    return !Grammar::is_set(e) && !productive[size_t(Grammar::rule_of(e))];
                });
            });
    }

    void compute_nullable() {
        nullable_.assign(alts_.size(), false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < alts_.size(); r++) {
                if (nullable_[r]) continue;
                for (const auto &alt : alts_[r])
                    if (std::all_of(alt.begin(), alt.end(), [&](int32_t e) {
                            return !Grammar::is_set(e) && nullable_[size_t(Grammar::rule_of(e))];
                        })) {
                        nullable_[r] = true;
                        changed = true;
                        break;
                    }
            }
        }
    }

    // Edges r -> s where s can come first in r (after rules that may be empty). An edge is a tail edge when nothing
    // follows s in that alternative: matching then reuses r's continuation instead of pushing one. A cycle of tail
    // edges only revisits the same stacks and ends; a cycle with another edge pushes forever: left recursion.
    void check_left_recursion() {
        const size_t n = alts_.size();
        std::vector<std::vector<std::pair<int32_t, bool>>> edges(n);  // (target, tail)
        for (size_t r = 0; r < n; r++)
            for (const auto &alt : alts_[r])
                for (size_t i = 0; i < alt.size(); i++) {
                    if (Grammar::is_set(alt[i])) break;
                    const int32_t s = Grammar::rule_of(alt[i]);
                    edges[r].push_back({s, i + 1 == alt.size()});
                    if (!nullable_[size_t(s)]) break;
                }
        // Tarjan's strongly connected components, iteratively.
        std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1), stack;
        std::vector<bool> on_stack(n, false);
        int32_t next_index = 0, n_comp = 0;
        for (size_t start = 0; start < n; start++) {
            if (index[start] >= 0) continue;
            std::vector<std::pair<size_t, size_t>> work = {{start, 0}};
            index[start] = low[start] = next_index++;
            stack.push_back(int32_t(start));
            on_stack[start] = true;
            while (!work.empty()) {
                auto &[v, ei] = work.back();
                if (ei < edges[v].size()) {
                    const size_t w = size_t(edges[v][ei++].first);
                    if (index[w] < 0) {
                        index[w] = low[w] = next_index++;
                        stack.push_back(int32_t(w));
                        on_stack[w] = true;
                        work.push_back({w, 0});
                    } else if (on_stack[w]) {
                        low[v] = std::min(low[v], index[w]);
                    }
                } else {
                    const size_t vv = v;
                    if (low[vv] == index[vv]) {
                        for (;;) {
                            const int32_t w = stack.back();
                            stack.pop_back();
                            on_stack[size_t(w)] = false;
                            comp[size_t(w)] = n_comp;
                            if (size_t(w) == vv) break;
                        }
                        n_comp++;
                    }
                    work.pop_back();
                    if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[vv]);
                }
            }
        }
        for (size_t r = 0; r < n; r++)
            for (auto [s, tail] : edges[r])
                if (!tail && comp[r] == comp[size_t(s)])
                    throw GrammarError(strfmt("rule '%s' is left-recursive (it can begin with itself through '%s'); "
                                              "write the recursion on the right",
                                              display_name(int32_t(r)).c_str(), display_name(s).c_str()));
    }

    // Generated rules are named after the rule they came from.
    std::string display_name(int32_t r) const {
        const std::string &n = names_[size_t(r)];
        const size_t hash = n.find('#');
        return hash == std::string::npos ? n : n.substr(0, hash);
    }

    Parser &p_;
    const Limits &limits_;
    std::vector<std::string> names_;
    std::vector<std::vector<std::vector<int32_t>>> alts_;
    std::vector<ByteSet> sets_;
    std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>, int32_t> set_ids_;
    std::unordered_map<int32_t, std::vector<std::vector<int32_t>>> class_rule_;  // class -> its byte alternatives
    std::unordered_map<int32_t, int32_t> class_rule_id_;                         // class -> its rule, when several
    std::vector<bool> nullable_;
    size_t n_elements_ = 0;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, const Limits &limits) {
    if (gbnf.size() > limits.max_source_bytes)
        throw GrammarError(strfmt("the grammar is too long (%zu bytes; at most %zu)", gbnf.size(),
                                  limits.max_source_bytes));
    Parser p(gbnf, limits);
    p.parse();
    return Compiler(p, limits).compile();
}

int32_t Grammar::rule_at(int32_t pos) const {
    // alt_starts_ is increasing; find the last alternative that starts at or before pos, then its rule.
    auto it = std::upper_bound(alt_starts_.begin(), alt_starts_.end(), pos);
    STRATA_ASSERT(it != alt_starts_.begin());
    const int32_t alt = int32_t(it - alt_starts_.begin()) - 1;
    auto r = std::upper_bound(rule_alts_.begin(), rule_alts_.end(), alt);
    return int32_t(r - rule_alts_.begin()) - 1;
}

std::string gbnf_literal(std::string_view text) {
    std::string out = "\"";
    for (unsigned char c : text) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20 || c == 0x7F) out += strfmt("\\x%02X", c);
                else out += char(c);
        }
    }
    return out + "\"";
}

}  // namespace strata::grammar
