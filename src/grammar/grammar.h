// A context-free grammar over bytes for constrained decoding, compiled from GBNF (llama.cpp's grammar format). The
// source speaks of characters (code points); compiling turns every character class into the UTF-8 byte sequences
// it stands for, so that matching works on bytes and a token that ends inside a character needs nothing special.
// This file only describes languages: matching a vocabulary against one is matcher.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace strata::grammar {

// Bad grammar text or a grammar past a limit. The message names the line and column, or the rule.
struct GrammarError : Error {
    using Error::Error;
};

// What one grammar may cost, so a hostile one is refused at compile time instead of exhausting the server.
struct Limits {
    size_t max_source_bytes = 1 << 20;  // GBNF text
    size_t max_elements = 1 << 20;      // compiled elements (bounded repetitions are unrolled)
    uint32_t max_repeat = 10000;        // n in x{n} and x{m,n}
    int max_nesting = 256;              // parentheses inside one rule
};

// A set of byte values.
struct ByteSet {
    uint64_t w[4] = {0, 0, 0, 0};
    bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
    void add(uint8_t b) { w[b >> 6] |= uint64_t(1) << (b & 63); }
    void add_range(uint8_t lo, uint8_t hi) {
        for (unsigned b = lo; b <= hi; b++) add(uint8_t(b));
    }
    bool operator==(const ByteSet &o) const = default;
};

// The compiled form: rules are lists of alternatives; each alternative is a run of elements in one flat array,
// ended by kEnd. An element is a byte set (>= 0, an index into sets()) or a reference to a rule (ref(r) < kEnd).
// Every rule can be completed (alternatives that could never end are removed when compiling) and no rule can begin
// with itself in a way that needs a growing stack (left recursion is refused).
class Grammar {
  public:
    static constexpr int32_t kEnd = -1;
    static constexpr int32_t ref(int32_t rule) { return -rule - 2; }
    static constexpr int32_t rule_of(int32_t element) { return -element - 2; }
    static constexpr bool is_set(int32_t element) { return element >= 0; }

    // Parses GBNF text whose start rule is `root`. Throws GrammarError naming the line and column of bad syntax, an
    // undefined or left-recursive rule, a grammar that can never be completed, or a limit passed.
    static std::shared_ptr<const Grammar> parse(std::string_view gbnf, const Limits &limits = {});

    const std::vector<int32_t> &elements() const { return elements_; }
    const ByteSet &set(int32_t element) const { return sets_[size_t(element)]; }
    // Positions in elements() where each alternative of rule r begins.
    std::span<const int32_t> alternatives(int32_t r) const {
        return {alt_starts_.data() + rule_alts_[size_t(r)], alt_starts_.data() + rule_alts_[size_t(r) + 1]};
    }
    int32_t root() const { return root_; }
    size_t n_rules() const { return names_.size(); }
    const std::string &rule_name(int32_t r) const { return names_[size_t(r)]; }
    // The rule whose alternative holds position pos (for error messages and tests).
    int32_t rule_at(int32_t pos) const;
    // Whether rule r can match the empty string.
    bool nullable(int32_t r) const { return nullable_[size_t(r)]; }

  private:
    friend class Compiler;
    std::vector<int32_t> elements_;
    std::vector<ByteSet> sets_;
    std::vector<int32_t> alt_starts_;  // all rules' alternatives, rule by rule
    std::vector<int32_t> rule_alts_;   // rule r's alternatives: alt_starts_[rule_alts_[r] .. rule_alts_[r+1])
    std::vector<std::string> names_;
    std::vector<bool> nullable_;
    int32_t root_ = 0;
};

// GBNF spelling of text as a string literal ("..." with the escapes GBNF reads back).
std::string gbnf_literal(std::string_view text);

}  // namespace strata::grammar
