// Special-token matching over a byte trie. Text between matches is passed through untouched.
#include "tokenizer/special_tokens.h"

namespace strata::tok {

void SpecialTokenMatcher::Trie::add(std::string_view text, int32_t id) {
    if (text.empty()) return;
    int32_t node = 0;
    for (char c : text) {
        const uint64_t key = uint64_t(node) << 8 | uint8_t(c);
        auto it = edges.find(key);
        if (it == edges.end()) {
            nodes.push_back(Node{});
            it = edges.emplace(key, int32_t(nodes.size() - 1)).first;
        }
        node = it->second;
    }
    // Two tokens with the same spelling: the lower id keeps it, as a vocabulary lookup would.
    if (nodes[node].id < 0) {
        nodes[node].id = id;
        n++;
    }
    first_byte[uint8_t(text[0])] = true;
}

size_t SpecialTokenMatcher::Trie::longest_at(std::string_view text, size_t pos, int32_t &id) const {
    size_t best = 0;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); i++) {
        auto it = edges.find(uint64_t(node) << 8 | uint8_t(text[i]));
        if (it == edges.end()) break;
        node = it->second;
        if (nodes[node].id >= 0) {
            best = i + 1 - pos;
            id = nodes[node].id;
        }
    }
    return best;
}

void SpecialTokenMatcher::Trie::split(std::string_view text, std::vector<Fragment> &out) const {
    size_t start = 0;
    for (size_t pos = 0; pos < text.size(); pos++) {
        if (!first_byte[uint8_t(text[pos])]) continue;
        int32_t id = -1;
        const size_t len = longest_at(text, pos, id);
        if (len == 0) continue;
        if (pos > start) out.push_back(Fragment{-1, text.substr(start, pos - start)});
        out.push_back(Fragment{id, text.substr(pos, len)});
        start = pos + len;
        pos = start - 1;
    }
    if (start < text.size()) out.push_back(Fragment{-1, text.substr(start)});
}

void SpecialTokenMatcher::add(std::string_view text, int32_t id, bool control) {
    (control ? control_ : user_).add(text, id);
    n_tokens_ = control_.n + user_.n;
}

void SpecialTokenMatcher::split(std::string_view text, bool parse_control, std::vector<Fragment> &out) const {
    if (text.empty()) return;
    std::vector<Fragment> first;
    if (parse_control && control_.n > 0) {
        control_.split(text, first);
    } else {
        first.push_back(Fragment{-1, text});
    }
    for (const Fragment &f : first) {
        if (f.id >= 0 || user_.n == 0) {
            out.push_back(f);
        } else {
            user_.split(f.text, out);
        }
    }
}

}  // namespace strata::tok
