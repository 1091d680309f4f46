// SentencePiece BPE encoding, following the reference library's rules: merge the adjacent pair whose joined
// spelling is a piece with the highest score (leftmost on ties); split merged unused pieces back into the parts
// they came from; spell what is left unknown as byte pieces, or as one unknown token per run.
#include "tokenizer/spm.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace strata::tok {

namespace {

constexpr int32_t kTypeUnknown = 2, kTypeControl = 3, kTypeUnused = 5, kTypeByte = 6;

// "<0x4A>" -> 0x4A; -1 when s is not a byte piece's spelling.
int parse_byte_piece(std::string_view s) {
    if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
    auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    const int hi = hex(s[3]), lo = hex(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

void SpmModel::build(const std::vector<std::string_view> &pieces, const std::vector<float> &scores,
                     const std::vector<int32_t> &types, int32_t unk_id) {
    STRATA_ASSERT(scores.size() == pieces.size() && types.size() == pieces.size());
    for (auto &b : byte_ids_) b = -1;
    unk_id_ = unk_id;
    storage_.assign(pieces.begin(), pieces.end());
    pieces_.clear();
    pieces_.reserve(pieces.size());
    for (size_t i = 0; i < pieces.size(); i++) {
        const int32_t t = types[i];
        if (t == kTypeByte) {
            const int b = parse_byte_piece(pieces[i]);
            if (b < 0)
                fail("tokenizer.ggml.tokens[%zu] '%s' has the byte type but is not of the form <0xXX>", i,
                     storage_[i].c_str());
            if (byte_ids_[b] < 0) byte_ids_[b] = int32_t(i);
            has_byte_pieces_ = true;
            continue;
        }
        if (t == kTypeControl || t == kTypeUnknown) continue;
        // The first of two identical spellings wins, as in the reference.
        pieces_.emplace(std::string_view(storage_[i]), PieceInfo{int32_t(i), scores[i], t == kTypeUnused});
    }
}

const SpmModel::PieceInfo *SpmModel::find(std::string_view piece) const {
    auto it = pieces_.find(piece);
    return it == pieces_.end() ? nullptr : &it->second;
}

void SpmModel::emit(std::string_view piece, std::vector<int32_t> &out, bool &prev_unk) const {
    if (const PieceInfo *p = find(piece)) {
        out.push_back(p->id);
        prev_unk = false;
        return;
    }
    if (has_byte_pieces_) {
        for (char c : piece) {
            const int32_t id = byte_ids_[uint8_t(c)];
            if (id >= 0) {
                out.push_back(id);
                prev_unk = false;
            } else if (unk_id_ >= 0 && !prev_unk) {
                out.push_back(unk_id_);
                prev_unk = true;
            }
        }
        return;
    }
    // Without byte pieces a run of unknown characters becomes a single unknown token.
    if (unk_id_ >= 0 && !prev_unk) out.push_back(unk_id_);
    prev_unk = true;
}

void SpmModel::encode(std::string_view text, std::vector<int32_t> &out) const {
    if (text.empty()) return;
    // Symbols start as characters; an ill-formed byte is a symbol of its own (no piece spells it, so it ends up
    // as a byte piece).
    struct Sym {
        int32_t prev, next;
        uint32_t off, len;  // into text; len 0 once merged away
    };
    std::vector<Sym> syms;
    for (size_t pos = 0; pos < text.size();) {
        size_t n = utf8_seq_len(text, pos);
        if (n == 0) n = 1;
        syms.push_back(Sym{int32_t(syms.size()) - 1, int32_t(syms.size()) + 1, uint32_t(pos), uint32_t(n)});
        pos += n;
    }
    syms.back().next = -1;

    struct Cand {
        float score;
        int32_t left, right;
        uint32_t len;
        // Max-heap: higher score first, then the leftmost.
        bool operator<(const Cand &o) const { return score != o.score ? score < o.score : left > o.left; }
    };
    std::priority_queue<Cand> agenda;
    // Where an unused piece came from, to split it back afterwards.
    std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
    auto view = [&](const Sym &s) { return text.substr(s.off, s.len); };
    auto try_pair = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const uint32_t len = syms[l].len + syms[r].len;
        const std::string_view joined = text.substr(syms[l].off, len);
        const PieceInfo *p = find(joined);
        if (!p) return;
        agenda.push(Cand{p->score, l, r, len});
        if (p->unused) rev_merge[joined] = {view(syms[l]), view(syms[r])};
    };
    for (size_t i = 1; i < syms.size(); i++) try_pair(int32_t(i - 1), int32_t(i));

    while (!agenda.empty()) {
        const Cand c = agenda.top();
        agenda.pop();
        Sym &l = syms[c.left];
        Sym &r = syms[c.right];
        // Stale if either side has changed since the pair was queued.
        if (l.len == 0 || r.len == 0 || l.len + r.len != c.len || l.next != c.right) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) syms[r.next].prev = c.left;
        try_pair(l.prev, c.left);
        try_pair(c.left, l.next);
    }

    bool prev_unk = false;
    // Unused pieces are not emitted: each is split back into the two parts it was merged from, recursively.
    auto resegment = [&](auto &self, std::string_view piece) -> void {
        const PieceInfo *p = find(piece);
        if (p && p->unused) {
            auto it = rev_merge.find(piece);
            if (it != rev_merge.end()) {
                self(self, it->second.first);
                self(self, it->second.second);
                return;
            }
        }
        emit(piece, out, prev_unk);
    };
    for (int32_t i = 0; i >= 0; i = syms[i].next) resegment(resegment, view(syms[i]));
}

}  // namespace strata::tok
