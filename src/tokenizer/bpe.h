// Byte-level BPE merges (GPT-2 style, `tokenizer.ggml.model` = "gpt2"): one word of raw bytes in, token ids out.
// Knows the merge ranks and the 256 byte tokens; pre-tokenization and special tokens are the caller's business.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

// Open-addressing map from a pair of token ids to (rank, merged id): the lookup at the heart of the merge loop,
// flat and probe-local so that it stays fast with 150k+ merges.
class MergeTable {
  public:
    struct Entry {
        uint64_t key = kEmpty;
        int32_t rank = 0;
        int32_t merged = 0;
    };

    void reserve(size_t n_merges);
    // Keeps the first (lowest-rank) entry when a pair repeats, as the reference implementations do.
    void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
    const Entry *find(int32_t left, int32_t right) const;
    size_t size() const { return size_; }

  private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    static uint64_t key(int32_t l, int32_t r) { return uint64_t(uint32_t(l)) << 32 | uint32_t(r); }
    size_t slot(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift_); }

    std::vector<Entry> slots_;
    int shift_ = 64;
    size_t size_ = 0;
};

class BpeModel {
  public:
    static constexpr size_t kCacheWordBytes = 30, kCacheIds = 16;

    // merges: "left right" in byte-level form, in rank order. `lookup` maps a byte-level spelling to its token
    // id (-1 when absent). Merges whose parts or result are not tokens cannot apply to any text and are skipped
    // (counted in n_skipped_merges).
    void build(const std::vector<std::string_view> &merges, const std::function<int32_t(std::string_view)> &lookup);

    // Appends the ids of one pre-tokenized word (raw bytes). A byte whose token the vocabulary lacks becomes
    // `unk_id`, or is dropped when there is none. Thread-safe.
    void encode_word(std::string_view word, std::vector<int32_t> &out) const;

    size_t n_merges() const { return table_.size(); }
    size_t n_skipped_merges() const { return n_skipped_; }
    int32_t byte_token(uint8_t b) const { return byte_ids_[b]; }
    void set_unk(int32_t id) { unk_id_ = id; }

  private:
    void merge_short(std::vector<int32_t> &ids) const;
    void merge_long(std::vector<int32_t> &ids) const;

    MergeTable table_;
    int32_t byte_ids_[256];
    int32_t unk_id_ = -1;
    size_t n_skipped_ = 0;

    // Words repeat a lot in real text; remembering the ids of short ones skips the merge loop and its scattered
    // table lookups. Direct-mapped (a new word evicts the one in its slot), fixed size, guarded by striped locks.
    struct CacheEntry {
        uint64_t hash = 0;
        uint8_t word_len = 0;  // 0: empty slot
        uint8_t n_ids = 0;
        char word[kCacheWordBytes];
        int32_t ids[kCacheIds];
    };
    static constexpr size_t kCacheSlots = 1 << 15, kCacheLocks = 64;
    mutable std::vector<CacheEntry> cache_;
    mutable std::mutex cache_locks_[kCacheLocks];
};

}  // namespace strata::tok
