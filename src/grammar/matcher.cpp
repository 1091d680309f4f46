// Parse states, their byte transitions, the vocabulary trie and the per-token mask (see matcher.h for the design).
#include "grammar/matcher.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace strata::grammar {

// ---- Vocabulary ------------------------------------------------------------------------------------------------

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer &tok) {
    std::vector<std::string> bytes(size_t(tok.n_vocab()));
    for (int32_t id = 0; id < tok.n_vocab(); id++) {
        const TokenType t = tok.token_type(id);
        if (t == TokenType::control || t == TokenType::unknown || t == TokenType::unused || tok.is_eog(id)) continue;
        bytes[size_t(id)] = tok.token_text(id);
    }
    return from_tokens(std::move(bytes), tok.eog_ids());
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokens(std::vector<std::string> bytes, std::vector<int32_t> eog) {
    auto v = std::shared_ptr<Vocabulary>(new Vocabulary());
    v->bytes_ = std::move(bytes);
    v->eog_flag_.assign(v->bytes_.size(), false);
    for (int32_t id : eog)
        if (id >= 0 && size_t(id) < v->bytes_.size() && !v->eog_flag_[size_t(id)]) {
            v->eog_flag_[size_t(id)] = true;
            v->eog_.push_back(id);
            v->bytes_[size_t(id)].clear();  // an end is never text
        }
    v->build();
    return v;
}

// Tokens in byte order give the trie in pre-order: each token shares the path of the one before it up to their
// common prefix, and the nodes past that prefix are closed (their subtrees end where the next node begins).
void Vocabulary::build() {
    std::vector<int32_t> order;
    for (size_t id = 0; id < bytes_.size(); id++)
        if (!bytes_[id].empty()) order.push_back(int32_t(id));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const int c = bytes_[size_t(a)].compare(bytes_[size_t(b)]);
        return c < 0 || (c == 0 && a < b);
    });
    std::vector<uint32_t> path;  // node index per depth - 1
    const std::string *prev = nullptr;
    for (int32_t id : order) {
        const std::string &s = bytes_[size_t(id)];
        size_t common = 0;
        if (prev)
            while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) common++;
        while (path.size() > common) {
            nodes_[path.back()].skip = uint32_t(nodes_.size());
            path.pop_back();
        }
        for (size_t d = common; d < s.size(); d++) {
            path.push_back(uint32_t(nodes_.size()));
            nodes_.push_back({uint8_t(s[d]), uint16_t(std::min<size_t>(d + 1, UINT16_MAX)), 0, uint32_t(tokens_.size())});
        }
        tokens_.push_back(id);
        max_depth_ = std::max(max_depth_, s.size());
        prev = &s;
    }
    while (!path.empty()) {
        nodes_[path.back()].skip = uint32_t(nodes_.size());
        path.pop_back();
    }
    nodes_.push_back({0, 0, 0, uint32_t(tokens_.size())});
    if (max_depth_ >= UINT16_MAX) fail("a token of %zu bytes is longer than the grammar matcher handles", max_depth_);
}

// ---- StateSpace ------------------------------------------------------------------------------------------------

StateSpace::StateSpace(std::shared_ptr<const Grammar> g, const MatchLimits &limits)
    : g_(std::move(g)), limits_(limits) {
    reset();
}

void StateSpace::reset() {
    nodes_.assign(1, Node{-1, -1, 0});
    node_index_.clear();
    pool_.clear();
    offset_.assign(1, 0);
    flags_.clear();
    state_index_.clear();
    trans_.clear();
    stamp_.clear();
    epoch_ = 0;
    depth_limited_ = false;
    tops_.clear();
    ++epoch_;
    closure_visits_ = 0;
    for (int32_t a : g_->alternatives(g_->root())) closure(successor(a, 0));
    start_ = intern_state();
    STRATA_ASSERT(start_ == 0);  // the root can be completed, so some stack survives
}

int32_t StateSpace::node(int32_t pos, int32_t parent) {
    const uint64_t key = (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent);
    auto it = node_index_.find(key);
    if (it != node_index_.end()) return it->second;
    const int32_t id = int32_t(nodes_.size());
    nodes_.push_back(Node{pos, parent, nodes_[size_t(parent)].depth + 1});
    node_index_.emplace(key, id);
    return id;
}

// The stack after an element: the next position of the same alternative, or (at its end) the stack below.
int32_t StateSpace::successor(int32_t pos, int32_t parent) {
    return g_->elements()[size_t(pos)] == Grammar::kEnd ? parent : node(pos, parent);
}

// Adds to tops_ every stack that n expands to without reading a byte: rules are entered (one stack per
// alternative) and finished alternatives popped, until each stack's top is a byte set or the stack is empty.
void StateSpace::closure(int32_t n) {
    const std::vector<int32_t> &el = g_->elements();
    work_.push_back(n);
    while (!work_.empty()) {
        const int32_t x = work_.back();
        work_.pop_back();
        if (stamp_.size() <= size_t(x)) stamp_.resize(std::max(nodes_.size(), size_t(x) + 1) * 2, 0);
        if (stamp_[size_t(x)] == epoch_) continue;
        stamp_[size_t(x)] = epoch_;
        if (++closure_visits_ > limits_.max_closure)
            throw GrammarError(strfmt("the grammar is too ambiguous to follow: one byte opens more than %zu parse "
                                      "paths",
                                      limits_.max_closure));
        if (x == 0) {
            tops_.push_back(0);
            continue;
        }
        const Node nd = nodes_[size_t(x)];
        const int32_t e = el[size_t(nd.pos)];
        if (Grammar::is_set(e)) {
            tops_.push_back(x);
            continue;
        }
        STRATA_ASSERT(e != Grammar::kEnd);  // successor() never makes a node at the end of an alternative
        const int32_t cont = successor(nd.pos + 1, nd.parent);
        if (nodes_[size_t(cont)].depth + 1 > limits_.max_depth) {
            depth_limited_ = true;
            continue;
        }
        for (int32_t a : g_->alternatives(Grammar::rule_of(e))) work_.push_back(successor(a, cont));
    }
}

int32_t StateSpace::intern_state() {
    std::sort(tops_.begin(), tops_.end());
    tops_.erase(std::unique(tops_.begin(), tops_.end()), tops_.end());
    if (tops_.empty()) return kDead;
    if (tops_.size() > limits_.max_stacks)
        throw GrammarError(strfmt("the grammar is too ambiguous to follow: more than %zu parse stacks at once",
                                  limits_.max_stacks));
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : tops_) h = (h ^ uint64_t(uint32_t(x))) * 1099511628211ull;
    auto [lo, hi] = state_index_.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
        const int32_t s = it->second;
        const size_t n = offset_[size_t(s) + 1] - offset_[size_t(s)];
        if (n == tops_.size() && std::equal(tops_.begin(), tops_.end(), pool_.begin() + offset_[size_t(s)])) return s;
    }
    if (flags_.size() >= limits_.max_states * 4)
        throw GrammarError(strfmt("the grammar has too many parse states (more than %zu within one token step)",
                                  limits_.max_states * 4));
    const int32_t s = int32_t(flags_.size());
    pool_.insert(pool_.end(), tops_.begin(), tops_.end());
    offset_.push_back(uint32_t(pool_.size()));
    uint8_t f = 0;
    if (tops_[0] == 0) f |= kAccepting;
    if (tops_.size() == 1 && tops_[0] == 0) f |= kEnded;
    flags_.push_back(f);
    state_index_.emplace(h, s);
    trans_.resize(trans_.size() + 256, kUnknown);
    return s;
}

int32_t StateSpace::advance(int32_t s, uint8_t b) {
    tops_.clear();
    if (++epoch_ == 0) {  // wrapped: old stamps could collide
        std::fill(stamp_.begin(), stamp_.end(), 0);
        epoch_ = 1;
    }
    closure_visits_ = 0;
    const std::vector<int32_t> &el = g_->elements();
    for (uint32_t i = offset_[size_t(s)]; i < offset_[size_t(s) + 1]; i++) {
        const int32_t x = pool_[i];
        if (x == 0) continue;
        const Node nd = nodes_[size_t(x)];
        if (!g_->set(el[size_t(nd.pos)]).has(b)) continue;
        closure(successor(nd.pos + 1, nd.parent));
    }
    return intern_state();
}

int32_t StateSpace::rebuild_around(int32_t s) {
    std::vector<std::vector<int32_t>> stacks;  // positions, top first
    for (uint32_t i = offset_[size_t(s)]; i < offset_[size_t(s) + 1]; i++) {
        std::vector<int32_t> chain;
        for (int32_t y = pool_[i]; y != 0; y = nodes_[size_t(y)].parent) chain.push_back(nodes_[size_t(y)].pos);
        stacks.push_back(std::move(chain));
    }
    reset();
    tops_.clear();
    for (const auto &chain : stacks) {
        int32_t parent = 0;
        for (size_t i = chain.size(); i-- > 0;) parent = node(chain[i], parent);
        tops_.push_back(parent);
    }
    const int32_t t = intern_state();
    STRATA_ASSERT(t != kDead);
    return t;
}

// ---- Matcher ---------------------------------------------------------------------------------------------------

Matcher::Matcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> vocab, const MatchLimits &limits)
    : g_(g), vocab_(std::move(vocab)), limits_(limits), space_(std::move(g), limits), state_(space_.start()) {}

void Matcher::reset() {
    state_ = space_.start();
    finished_ = false;
}

void Matcher::maybe_rebuild() {
    if (space_.n_states() <= limits_.max_states && space_.n_nodes() <= limits_.max_nodes) return;
    state_ = space_.rebuild_around(state_);
    cache_.clear();
    stats_.rebuilds++;
}

void Matcher::compute_mask(TokenMask &out) {
    const Vocabulary &v = *vocab_;
    out.assign(v.n_vocab(), false);
    walk_.resize(v.max_depth() + 1);
    walk_[0] = state_;
    const size_t n = v.n_nodes();
    const Vocabulary::Node *node = v.nodes_.data();
    const int32_t *tokens = v.tokens_.data();
    const int32_t *trans = space_.transitions();
    uint64_t visited = 0;
    for (size_t i = 0; i < n;) {
        visited++;
        const Vocabulary::Node nd = node[i];
        const int32_t from = walk_[nd.depth - 1u];
        int32_t t = trans[size_t(from) * 256 + nd.byte];
        if (t == StateSpace::kUnknown) {
            t = space_.next(from, nd.byte);
            trans = space_.transitions();
        }
        if (t == StateSpace::kDead) {
            i = nd.skip;
            continue;
        }
        walk_[nd.depth] = t;
        for (uint32_t k = nd.tok_begin, e = node[i + 1].tok_begin; k < e; k++) out.set(tokens[k]);
        i++;
    }
    if (space_.accepting(state_))
        for (int32_t id : v.eog()) out.set(id);
    stats_.trie_nodes_visited += visited;
    stats_.masks++;
}

const TokenMask *Matcher::allowed() {
    maybe_rebuild();
    for (CachedMask &c : cache_)
        if (c.state == state_) {
            c.used = ++clock_;
            stats_.mask_cache_hits++;
            return &c.mask;
        }
    CachedMask *slot;
    if (cache_.size() < std::max<size_t>(limits_.mask_cache, 1)) {
        cache_.push_back({});
        slot = &cache_.back();
    } else {
        slot = &*std::min_element(cache_.begin(), cache_.end(),
                                  [](const CachedMask &a, const CachedMask &b) { return a.used < b.used; });
    }
    slot->state = state_;
    slot->used = ++clock_;
    compute_mask(slot->mask);
    if (std::all_of(slot->mask.words.begin(), slot->mask.words.end(), [](uint64_t w) { return w == 0; })) {
        slot->state = -1;
        throw GrammarError(space_.depth_limited()
                               ? strfmt("the grammar allows no token here: it nests deeper than %d levels",
                                        limits_.max_depth)
                               : std::string("the grammar allows no token of this vocabulary here"));
    }
    return &slot->mask;
}

bool Matcher::allows(int32_t token) {
    if (finished_ || token < 0 || token >= vocab_->n_vocab()) return false;
    if (vocab_->is_eog(token)) return can_end();
    const std::string &b = vocab_->bytes(token);
    if (b.empty()) return false;
    int32_t s = state_;
    for (unsigned char c : b)
        if ((s = space_.next(s, c)) == StateSpace::kDead) return false;
    return true;
}

void Matcher::accept(int32_t token) {
    if (finished_) throw GrammarError("the grammar was already complete");
    if (token < 0 || token >= vocab_->n_vocab()) throw GrammarError(strfmt("token %d is not in the vocabulary", token));
    if (vocab_->is_eog(token)) {
        if (!can_end()) throw GrammarError("the grammar cannot end here");
        finished_ = true;
        return;
    }
    if (vocab_->bytes(token).empty() || !accept_bytes(vocab_->bytes(token)))
        throw GrammarError(strfmt("token %d is not allowed by the grammar here", token));
}

bool Matcher::accept_bytes(std::string_view bytes) {
    int32_t s = state_;
    for (unsigned char c : bytes)
        if ((s = space_.next(s, c)) == StateSpace::kDead) return false;
    state_ = s;
    return true;
}

}  // namespace strata::grammar
