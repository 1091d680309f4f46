// Finding special tokens (control and user-defined, e.g. "<|im_start|>", "<think>") whole inside text, before the
// rest of the text is tokenized. Does not decide which tokens are special: the vocabulary's token types do.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::tok {

class SpecialTokenMatcher {
  public:
    // `control`: matched only when the caller asks for special tokens to be parsed (they steer the model, so text
    // from a user must not be able to produce them); otherwise matched always (user-defined tokens stand for
    // plain text, as they do in the reference tokenizer).
    void add(std::string_view text, int32_t id, bool control);
    bool empty() const { return n_tokens_ == 0; }

    struct Fragment {
        int32_t id;             // >= 0: this special token; -1: the text below, still to be tokenized
        std::string_view text;  // the text, or the token's spelling
    };

    // Splits text into fragments in order. Control tokens are found first and user-defined ones in the text
    // between them (two passes, as the reference does); within a pass the leftmost match wins, and among
    // matches starting there the longest.
    void split(std::string_view text, bool parse_control, std::vector<Fragment> &out) const;

  private:
    struct Trie {
        struct Node {
            int32_t id = -1;
        };
        std::vector<Node> nodes{Node{}};
        std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child
        bool first_byte[256] = {};
        size_t n = 0;

        void add(std::string_view text, int32_t id);
        // Longest token starting at text[pos]: its length (0: none) and id.
        size_t longest_at(std::string_view text, size_t pos, int32_t &id) const;
        void split(std::string_view text, std::vector<Fragment> &out) const;
    };
    Trie control_, user_;
    size_t n_tokens_ = 0;
};

}  // namespace strata::tok
