// Byte-level BPE merge loop. The rule is the reference one (Hugging Face `tokenizers`): repeatedly merge the
// adjacent pair with the lowest rank, the leftmost one on ties, until no adjacent pair has a rank.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace strata::tok {

namespace {

// Below this many symbols a linear scan for the best pair beats a heap; above it the heap keeps very long words
// (a 100 kB run of letters is one word) from going quadratic.
constexpr size_t kShortWord = 48;

uint64_t hash_bytes(std::string_view s) {
    // FNV-1a, then a final mix so that the low bits (the slot) depend on every byte.
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    return h ^ (h >> 32);
}

}  // namespace

void MergeTable::reserve(size_t n_merges) {
    size_t cap = 16;
    while (cap < n_merges * 2) cap *= 2;
    slots_.assign(cap, Entry{});
    shift_ = 64 - __builtin_ctzll(cap);
    size_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    STRATA_ASSERT(!slots_.empty() && (size_ + 1) * 2 <= slots_.size());
    const uint64_t k = key(left, right);
    const size_t mask = slots_.size() - 1;
    for (size_t i = slot(k);; i = (i + 1) & mask) {
        Entry &e = slots_[i];
        if (e.key == k) return;
        if (e.key == kEmpty) {
            e = Entry{k, rank, merged};
            size_++;
            return;
        }
    }
}

const MergeTable::Entry *MergeTable::find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    const size_t mask = slots_.size() - 1;
    for (size_t i = slot(k);; i = (i + 1) & mask) {
        const Entry &e = slots_[i];
        if (e.key == k) return &e;
        if (e.key == kEmpty) return nullptr;
    }
}

void BpeModel::build(const std::vector<std::string_view> &merges,
                     const std::function<int32_t(std::string_view)> &lookup) {
    for (int b = 0; b < 256; b++) {
        std::string s;
        utf8_append(s, byte_to_codepoint(uint8_t(b)));
        byte_ids_[b] = lookup(s);
    }
    table_.reserve(merges.size());
    cache_.assign(kCacheSlots, CacheEntry{});
    n_skipped_ = 0;
    std::string joined;
    for (size_t rank = 0; rank < merges.size(); rank++) {
        const std::string_view m = merges[rank];
        // Parts never contain a space (the byte-level alphabet maps it to U+0120), so the first space splits.
        const size_t sp = m.find(' ');
        if (sp == std::string_view::npos || sp == 0 || sp + 1 >= m.size())
            fail("tokenizer.ggml.merges[%zu] '%.*s' is not of the form 'left right'", rank, int(m.size()), m.data());
        const std::string_view l = m.substr(0, sp), r = m.substr(sp + 1);
        joined.assign(l);
        joined.append(r);
        const int32_t il = lookup(l), ir = lookup(r), im = lookup(joined);
        if (il < 0 || ir < 0 || im < 0) {
            n_skipped_++;
            continue;
        }
        table_.insert(il, ir, int32_t(rank), im);
    }
}

void BpeModel::merge_short(std::vector<int32_t> &ids) const {
    // rank[i] / merged[i] describe the pair (ids[i], ids[i+1]).
    int32_t rank[kShortWord], merged[kShortWord];
    size_t n = ids.size();
    auto score = [&](size_t i) {
        const MergeTable::Entry *e = ids[i] >= 0 && ids[i + 1] >= 0 ? table_.find(ids[i], ids[i + 1]) : nullptr;
        rank[i] = e ? e->rank : INT_MAX;
        merged[i] = e ? e->merged : -1;
    };
    for (size_t i = 0; i + 1 < n; i++) score(i);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT_MAX) break;
        ids[best] = merged[best];
        // Close the gap left by ids[best + 1] and by the pair that started there.
        for (size_t i = best + 1; i + 1 < n; i++) ids[i] = ids[i + 1];
        for (size_t i = best + 1; i + 2 < n; i++) {
            rank[i] = rank[i + 1];
            merged[i] = merged[i + 1];
        }
        n--;
        if (best > 0) score(best - 1);
        if (best + 1 < n) score(best);
    }
    ids.resize(n);
}

void BpeModel::merge_long(std::vector<int32_t> &ids) const {
    const auto n = int32_t(ids.size());
    std::vector<int32_t> prev(n), next(n);
    for (int32_t i = 0; i < n; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
        int32_t rank, left, left_id, right_id, merged;
        // std::priority_queue is a max-heap: "less" means a higher rank, or the same rank further right.
        bool operator<(const Cand &o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand> heap;
    auto push = [&](int32_t l) {
        if (l < 0) return;
        const int32_t r = next[l];
        if (r < 0 || ids[l] < 0 || ids[r] < 0) return;
        if (const MergeTable::Entry *e = table_.find(ids[l], ids[r]))
            heap.push(Cand{e->rank, l, ids[l], ids[r], e->merged});
    };
    for (int32_t i = 0; i + 1 < n; i++) push(i);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        // Stale when either side has merged since: a merge always yields a longer token, so an id at a position
        // never comes back and comparing ids is enough.
        const int32_t r = next[c.left];
        if (ids[c.left] != c.left_id || r < 0 || ids[r] != c.right_id) continue;
        ids[c.left] = c.merged;
        ids[r] = -2;  // dead
        next[c.left] = next[r];
        if (next[r] >= 0) prev[next[r]] = c.left;
        push(prev[c.left]);
        push(c.left);
    }
    size_t w = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) ids[w++] = ids[i];
    ids.resize(w);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t> &out) const {
    if (word.empty()) return;
    const bool cacheable = word.size() <= kCacheWordBytes;
    uint64_t h = 0;
    if (cacheable) {
        h = hash_bytes(word);
        const size_t slot = h & (kCacheSlots - 1);
        std::lock_guard<std::mutex> lock(cache_locks_[slot % kCacheLocks]);
        const CacheEntry &e = cache_[slot];
        if (e.hash == h && e.word_len == word.size() && std::equal(word.begin(), word.end(), e.word)) {
            out.insert(out.end(), e.ids, e.ids + e.n_ids);
            return;
        }
    }
    thread_local std::vector<int32_t> ids;  // reused: most words are short and this runs once per word
    ids.resize(word.size());
    for (size_t i = 0; i < word.size(); i++) ids[i] = byte_ids_[uint8_t(word[i])];
    if (ids.size() <= kShortWord) {
        merge_short(ids);
    } else {
        merge_long(ids);
    }
    // A byte with no token of its own (never the case in a complete byte-level vocabulary) is unknown.
    size_t w = 0;
    for (int32_t id : ids) {
        if (id >= 0) {
            ids[w++] = id;
        } else if (unk_id_ >= 0) {
            ids[w++] = unk_id_;
        }
    }
    ids.resize(w);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable && !ids.empty() && ids.size() <= kCacheIds) {
        const size_t slot = h & (kCacheSlots - 1);
        std::lock_guard<std::mutex> lock(cache_locks_[slot % kCacheLocks]);
        CacheEntry &e = cache_[slot];
        e.hash = h;
        e.word_len = uint8_t(word.size());
        e.n_ids = uint8_t(ids.size());
        std::copy(word.begin(), word.end(), e.word);
        std::copy(ids.begin(), ids.end(), e.ids);
    }
    // A huge word (a megabyte of one character) would keep its buffer in this thread for good: give it back.
    if (ids.capacity() > (size_t(1) << 16)) std::vector<int32_t>().swap(ids);
}

}  // namespace strata::tok
