// Matching a grammar against a vocabulary, token by token: which tokens may come next (a mask for the sampler) and
// the state after the one that came.
//
// A parse state is the set of parse stacks the bytes so far allow (like llama.cpp's grammar stacks), with stacks
// shared and interned as linked nodes and states interned as sets of top nodes: equal states get equal ids, so the
// state reached from a state by a byte is computed once and then looked up, and the mask of a state once and then
// reused (a JSON string's inside, say, comes back at every character). A mask is computed by walking the
// vocabulary's byte trie from the state, skipping every subtree whose prefix the grammar rejects.
//
// Costs are bounded: parse stacks deeper than MatchLimits::max_depth are not followed (that nesting is refused), a
// state with more stacks than max_stacks or a byte step that visits more than max_closure nodes is an error
// (a grammar too ambiguous to follow), and the interned tables are rebuilt around the current state when they
// grow past max_states.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "runtime/sampler.h"

namespace strata {
class Tokenizer;
}

namespace strata::grammar {

struct MatchLimits {
    int32_t max_depth = 1024;        // parse stack entries (JSON nesting takes two or three per level)
    size_t max_stacks = 4096;        // stacks in one state
    size_t max_closure = 1 << 16;    // nodes visited by one byte step
    size_t max_states = 1 << 14;     // interned states before the tables are rebuilt (each holds a 1 KiB row)
    size_t max_nodes = 1 << 20;      // interned stack nodes before the tables are rebuilt
    size_t mask_cache = 32;          // masks kept, by state
};

// The tokens of a vocabulary as bytes, in a trie laid out in depth-first order (a node's subtree is the range up to
// its skip index), so a walk is a forward scan that jumps over rejected subtrees. Immutable; shared by every
// matcher of one model.
class Vocabulary {
  public:
    // Text tokens are all but control, unknown and unused ones (they never come out as text); end-of-generation
    // tokens are the tokenizer's.
    static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer &tok);
    // bytes[id]: the token's text, empty for a token that is not text. For tests and tools.
    static std::shared_ptr<const Vocabulary> from_tokens(std::vector<std::string> bytes, std::vector<int32_t> eog);

    int64_t n_vocab() const { return int64_t(bytes_.size()); }
    const std::string &bytes(int32_t id) const { return bytes_[size_t(id)]; }
    bool is_eog(int32_t id) const { return id >= 0 && size_t(id) < eog_flag_.size() && eog_flag_[size_t(id)]; }
    const std::vector<int32_t> &eog() const { return eog_; }

    // The trie: node i (pre-order) holds one byte at its depth (1 for a first byte), its subtree ends before node
    // `skip`, and the tokens spelled by the path to it are tokens_[tok_begin .. the next node's tok_begin).
    size_t n_nodes() const { return nodes_.size() - 1; }
    size_t max_depth() const { return max_depth_; }

  private:
    friend class Matcher;
    struct Node {
        uint8_t byte;
        uint16_t depth;
        uint32_t skip;
        uint32_t tok_begin;
    };
    void build();
    std::vector<std::string> bytes_;
    std::vector<int32_t> eog_;
    std::vector<bool> eog_flag_;
    std::vector<Node> nodes_;  // n_nodes + 1: the last one only ends the token ranges
    std::vector<int32_t> tokens_;
    size_t max_depth_ = 0;
};

// The interned parse states of one grammar and the byte transitions between them.
class StateSpace {
  public:
    static constexpr int32_t kDead = -1;  // no stack survives: the bytes are rejected

    StateSpace(std::shared_ptr<const Grammar> g, const MatchLimits &limits);
    int32_t start() const { return start_; }
    // The state after byte b (kDead when rejected). Throws GrammarError past a limit.
    int32_t next(int32_t s, uint8_t b) {
        const size_t i = size_t(s) * 256 + b;
        int32_t t = trans_[i];
        if (t == kUnknown) {
            t = advance(s, b);
            trans_[i] = t;
        }
        return t;
    }
    // The grammar may end here.
    bool accepting(int32_t s) const { return flags_[size_t(s)] & kAccepting; }
    // Nothing but the end may follow.
    bool ended(int32_t s) const { return flags_[size_t(s)] & kEnded; }
    size_t n_states() const { return flags_.size(); }
    // The transition table, 256 entries per state, kUnknown where not computed yet (next() computes it; the table
    // may move then).
    static constexpr int32_t kUnknown = -2;
    const int32_t *transitions() const { return trans_.data(); }
    size_t n_nodes() const { return nodes_.size(); }
    // Some stack was not followed because it would have gone deeper than max_depth.
    bool depth_limited() const { return depth_limited_; }

    // Rebuilds the tables keeping only state s; returns its id there.
    int32_t rebuild_around(int32_t s);

  private:
    static constexpr uint8_t kAccepting = 1, kEnded = 2;
    struct Node {
        int32_t pos;     // the next element to match (an index into the grammar's elements), -1 for the bottom
        int32_t parent;  // the stack below: what follows once this rule's alternative is done
        int32_t depth;
    };
    int32_t node(int32_t pos, int32_t parent);
    int32_t successor(int32_t pos, int32_t parent);
    void closure(int32_t n);
    int32_t intern_state();
    int32_t advance(int32_t s, uint8_t b);
    void reset();

    std::shared_ptr<const Grammar> g_;
    MatchLimits limits_;
    std::vector<Node> nodes_;  // node 0 is the empty stack: the grammar is complete
    std::unordered_map<uint64_t, int32_t> node_index_;
    std::vector<int32_t> pool_;     // every state's top nodes, sorted, state after state
    std::vector<uint32_t> offset_;  // state s's tops: pool_[offset_[s] .. offset_[s+1])
    std::vector<uint8_t> flags_;
    std::unordered_multimap<uint64_t, int32_t> state_index_;
    std::vector<int32_t> trans_;  // 256 per state
    int32_t start_ = 0;
    bool depth_limited_ = false;
    // Scratch for a byte step.
    std::vector<int32_t> tops_, work_;
    std::vector<uint32_t> stamp_;
    uint32_t epoch_ = 0;
    size_t closure_visits_ = 0;
};

// One generation's position in a grammar over a vocabulary.
class Matcher : public TokenConstraint {
  public:
    Matcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> vocab, const MatchLimits &limits = {});

    // TokenConstraint. allowed() is never null: end-of-generation tokens are in it where the grammar may end.
    const TokenMask *allowed() override;
    bool allows(int32_t token) override;
    void accept(int32_t token) override;

    // Feeds bytes as if generated; false (and the state unchanged) when the grammar rejects them.
    bool accept_bytes(std::string_view bytes);
    void reset();
    bool can_end() const { return space_.accepting(state_); }
    bool ended() const { return space_.ended(state_); }
    bool finished() const { return finished_; }  // an end-of-generation token was accepted

    // For constraints built on this one (constraint.cpp): steps from any state without moving this matcher.
    StateSpace &space() { return space_; }
    int32_t state() const { return state_; }
    void set_state(int32_t s) { state_ = s; }
    const Vocabulary &vocab() const { return *vocab_; }

    struct Stats {
        uint64_t masks = 0, mask_cache_hits = 0, trie_nodes_visited = 0, rebuilds = 0;
    };
    const Stats &stats() const { return stats_; }

  private:
    void compute_mask(TokenMask &out);
    void maybe_rebuild();

    std::shared_ptr<const Grammar> g_;
    std::shared_ptr<const Vocabulary> vocab_;
    MatchLimits limits_;
    StateSpace space_;
    int32_t state_;
    bool finished_ = false;
    struct CachedMask {
        int32_t state;
        uint64_t used;
        TokenMask mask;
    };
    std::vector<CachedMask> cache_;
    uint64_t clock_ = 0;
    std::vector<int32_t> walk_;  // state per trie depth
    Stats stats_;
};

}  // namespace strata::grammar
