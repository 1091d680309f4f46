// Whole-output constraints are a Matcher; triggered ones wrap it in a byte machine that watches for the trigger and
// for reasoning blocks (each marker found with a small string-matching automaton).
#include "grammar/constraint.h"

#include <algorithm>
#include <array>
#include <map>

namespace strata::grammar {

namespace {

// Knuth-Morris-Pratt as an automaton: the length of the longest prefix of the pattern that the text read ends with.
class Marker {
  public:
    explicit Marker(std::string p) : p_(std::move(p)), dfa_(p_.size()) {
        STRATA_ASSERT(!p_.empty() && p_.size() < 255);
        dfa_[0].fill(0);
        dfa_[0][uint8_t(p_[0])] = 1;
        for (size_t j = 1, x = 0; j < p_.size(); j++) {
            dfa_[j] = dfa_[x];
            dfa_[j][uint8_t(p_[j])] = uint8_t(j + 1);
            x = dfa_[x][uint8_t(p_[j])];
        }
    }
    uint8_t step(uint8_t k, uint8_t b) const { return dfa_[k][b]; }
    uint8_t size() const { return uint8_t(p_.size()); }
    char last() const { return p_.back(); }

  private:
    std::string p_;
    std::vector<std::array<uint8_t, 256>> dfa_;
};

class TriggeredConstraint : public TokenConstraint {
  public:
    TriggeredConstraint(const ConstraintSpec &spec, std::shared_ptr<const Vocabulary> vocab, const MatchLimits &limits)
        : m_(spec.grammar, vocab, limits), trigger_(spec.trigger), open_("<think>"), close_("</think>") {
        pos_.in_reasoning = spec.starts_in_reasoning;
        // Only tokens with the trigger's last byte can complete it; any other token leaves free text free.
        const Vocabulary &v = m_.vocab();
        for (int32_t id = 0; id < v.n_vocab(); id++)
            if (v.bytes(id).find(trigger_.last()) != std::string::npos) candidates_.push_back(id);
    }

    const TokenMask *allowed() override {
        if (pos_.active) return m_.allowed();
        const uint32_t key = uint32_t(pos_.k_trigger) | uint32_t(pos_.k_open) << 8 | uint32_t(pos_.k_close) << 16 |
                             uint32_t(pos_.in_reasoning) << 24;
        auto it = free_masks_.find(key);
        if (it != free_masks_.end()) return &it->second;
        TokenMask mask;
        mask.assign(m_.vocab().n_vocab(), true);
        for (int32_t id : candidates_) {
            Pos p = pos_;
            if (!feed(p, m_.vocab().bytes(id))) mask.reset(id);
        }
        if (free_masks_.size() > 64) free_masks_.clear();
        return &free_masks_.emplace(key, std::move(mask)).first->second;
    }

    bool allows(int32_t token) override {
        const Vocabulary &v = m_.vocab();
        if (token < 0 || token >= v.n_vocab()) return false;
        if (v.is_eog(token)) return !pos_.active || m_.can_end();
        if (v.bytes(token).empty()) return !pos_.active;
        Pos p = pos_;
        return feed(p, v.bytes(token));
    }

    void accept(int32_t token) override {
        const Vocabulary &v = m_.vocab();
        if (token < 0 || token >= v.n_vocab()) throw GrammarError(strfmt("token %d is not in the vocabulary", token));
        if (v.is_eog(token)) {
            if (pos_.active && !m_.can_end()) throw GrammarError("the output cannot end inside the constrained part");
            return;
        }
        if (v.bytes(token).empty()) {  // a control token: no text, and it breaks any marker being read
            if (pos_.active) throw GrammarError(strfmt("token %d is not allowed by the grammar here", token));
            pos_.k_trigger = pos_.k_open = pos_.k_close = 0;
            return;
        }
        Pos p = pos_;
        if (!feed(p, v.bytes(token))) throw GrammarError(strfmt("token %d is not allowed by the grammar here", token));
        pos_ = p;
        if (pos_.active) m_.set_state(pos_.g);
    }

  private:
    struct Pos {
        bool active = false, in_reasoning = false;
        uint8_t k_trigger = 0, k_open = 0, k_close = 0;
        int32_t g = 0;  // the grammar's state while active
    };

    // Runs bytes through the machine from p (a copy of pos_: its grammar state is the matcher's, whose ids a
    // rebuild may have renumbered); false when the grammar rejects one. The matcher itself does not move.
    bool feed(Pos &p, std::string_view bytes) {
        StateSpace &sp = m_.space();
        if (p.active) p.g = m_.state();
        for (unsigned char b : bytes) {
            if (p.active) {
                const int32_t t = sp.next(p.g, b);
                if (t == StateSpace::kDead) return false;
                p.g = t;
                if (sp.ended(t)) {  // complete: free text again
                    p.active = false;
                    p.k_trigger = 0;
                }
                continue;
            }
            if (p.in_reasoning) {
                p.k_close = close_.step(p.k_close, b);
                if (p.k_close == close_.size()) p = Pos{};
                continue;
            }
            p.k_open = open_.step(p.k_open, b);
            if (p.k_open == open_.size()) {
                p = Pos{};
                p.in_reasoning = true;
                continue;
            }
            p.k_trigger = trigger_.step(p.k_trigger, b);
            if (p.k_trigger == trigger_.size()) {
                p = Pos{};
                p.active = true;
                p.g = sp.start();
            }
        }
        return true;
    }

    Matcher m_;
    Marker trigger_, open_, close_;
    Pos pos_;
    std::vector<int32_t> candidates_;
    std::map<uint32_t, TokenMask> free_masks_;
};

}  // namespace

std::unique_ptr<TokenConstraint> make_constraint(const ConstraintSpec &spec, std::shared_ptr<const Vocabulary> vocab,
                                                 const MatchLimits &limits) {
    STRATA_ASSERT(spec.grammar);
    if (spec.trigger.empty()) return std::make_unique<Matcher>(spec.grammar, std::move(vocab), limits);
    return std::make_unique<TriggeredConstraint>(spec, std::move(vocab), limits);
}

}  // namespace strata::grammar
