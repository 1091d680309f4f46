// SentencePiece BPE (`tokenizer.ggml.model` = "llama"): score-ordered merges over characters, unused pieces split
// back, byte fallback (<0xXX>) for what no piece covers. Takes text already escaped (spaces as U+2581 and the
// dummy prefix added); special tokens and the escaping are the caller's business.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::tok {

class SpmModel {
  public:
    // pieces/scores/types: the vocabulary as stored (types use the GGUF token_type numbers). unk_id < 0: none.
    void build(const std::vector<std::string_view> &pieces, const std::vector<float> &scores,
               const std::vector<int32_t> &types, int32_t unk_id);

    // Appends the ids of one escaped text fragment. Thread-safe.
    void encode(std::string_view text, std::vector<int32_t> &out) const;

    bool byte_fallback() const { return has_byte_pieces_; }
    int32_t byte_token(uint8_t b) const { return byte_ids_[b]; }

  private:
    struct PieceInfo {
        int32_t id;
        float score;
        bool unused;
    };
    const PieceInfo *find(std::string_view piece) const;
    void emit(std::string_view piece, std::vector<int32_t> &out, bool &prev_unk) const;

    // Pieces a merge may produce: normal, user-defined and unused ones (control, unknown and byte pieces are
    // reached only by id, never by spelling).
    std::unordered_map<std::string_view, PieceInfo> pieces_;
    std::vector<std::string> storage_;  // owns the keys of pieces_
    int32_t byte_ids_[256];
    bool has_byte_pieces_ = false;
    int32_t unk_id_ = -1;
};

}  // namespace strata::tok
