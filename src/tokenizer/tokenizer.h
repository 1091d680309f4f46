// The tokenizer of a model file: text -> token ids and back, for byte-level BPE ("gpt2") and SentencePiece
// ("llama") vocabularies as GGUF stores them. Chat templates live elsewhere; this only turns text into ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class GgufFile;

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6,
};

// Everything the tokenizer reads from a model file, so that tests and tools can also build one by hand.
struct VocabSpec {
    std::string model;                // tokenizer.ggml.model: "gpt2" or "llama"
    std::string pre;                  // tokenizer.ggml.pre (gpt2 only)
    std::vector<std::string> tokens;  // byte-level form for gpt2, U+2581 for spaces for llama
    std::vector<int32_t> types;       // TokenType per token; empty = all normal
    std::vector<float> scores;        // llama only; empty = all 0
    std::vector<std::string> merges;  // gpt2 only, "left right", in rank order
    int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;  // -1: none
    std::optional<bool> add_bos, add_eos, add_space_prefix;              // absent: the model's default
};

// The tokenizer.ggml.* keys of a model file; throws strata::Error naming a missing or mistyped key.
VocabSpec read_vocab_spec(const GgufFile &file);

namespace tok {
class PreTokenizer;
class BpeModel;
class SpmModel;
class SpecialTokenMatcher;
}  // namespace tok

class Tokenizer {
  public:
    // Reads the tokenizer.ggml.* keys. Throws strata::Error naming the key or value for a missing key, an
    // unsupported model or pre-tokenizer, or inconsistent arrays.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile &file);
    static std::unique_ptr<Tokenizer> from_spec(VocabSpec spec);
    ~Tokenizer();
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer &operator=(const Tokenizer &) = delete;

    // Text -> ids. add_special: the BOS/EOS the file asks for (add_bos/add_eos). parse_special: control tokens
    // spelled in the text (e.g. "<|im_start|>" put there by a chat template) become those tokens; without it they
    // are tokenized as plain text, so user input cannot forge them. User-defined tokens are always matched.
    // Thread-safe.
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
    void encode(std::string_view text, bool add_special, bool parse_special, std::vector<int32_t> &out) const;

    // The bytes a token stands for: decoded from the byte-level alphabet (gpt2), U+2581 as a space and <0xXX> as
    // that byte (llama); control, unknown and user-defined tokens as spelled. May be part of a UTF-8 character.
    std::string token_text(int32_t id) const;
    // Ids -> text. Control tokens are left out unless render_special; unused (placeholder) tokens always. A
    // SentencePiece model's dummy-prefix space is dropped at the start. Not streaming: the result may end in part of a
    // character.
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    int32_t n_vocab() const { return int32_t(spec_.tokens.size()); }
    const std::string &token_spelling(int32_t id) const;  // as stored in the file
    TokenType token_type(int32_t id) const;
    bool is_control(int32_t id) const { return token_type(id) == TokenType::control; }
    // The id of the token spelled exactly `spelling` (as stored), or -1.
    int32_t find_token(std::string_view spelling) const;

    // End of generation: EOS, EOT, EOM, and the end-of-turn tokens of the chat formats we serve.
    bool is_eog(int32_t id) const;
    const std::vector<int32_t> &eog_ids() const { return eog_ids_; }

    int32_t bos() const { return spec_.bos; }
    int32_t eos() const { return spec_.eos; }
    int32_t eot() const { return spec_.eot; }
    int32_t eom() const { return spec_.eom; }
    int32_t pad() const { return spec_.pad; }
    int32_t unk() const { return spec_.unk; }
    bool add_bos() const { return add_bos_; }
    bool add_eos() const { return add_eos_; }
    bool is_spm() const { return spm_ != nullptr; }
    const std::string &model_name() const { return spec_.model; }
    const std::string &pre_name() const { return spec_.pre; }

  private:
    Tokenizer();
    void init();
    void encode_text(std::string_view text, bool first, std::vector<int32_t> &out) const;

    VocabSpec spec_;
    bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
    std::unique_ptr<tok::PreTokenizer> pre_;
    std::unique_ptr<tok::BpeModel> bpe_;
    std::unique_ptr<tok::SpmModel> spm_;
    std::unique_ptr<tok::SpecialTokenMatcher> specials_;
    std::vector<std::string> text_;  // token_text for every id, computed once
    std::vector<int32_t> eog_ids_;
    struct Index;
    std::unique_ptr<Index> index_;  // spelling -> id
};

// Turns ids into text as they are generated, emitting only whole UTF-8 characters: bytes of a character split
// across tokens are held back until it is complete, and bytes that can never form one come out as U+FFFD, so
// what push() returns is always valid UTF-8. Unlike decode(), a SentencePiece token keeps its leading space: in a
// stream the text continues a prompt. One decoder per stream; the tokenizer must outlive it.
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer &tok, bool render_special = false)
        : tok_(tok), render_special_(render_special) {}

    // The text that became complete with this token (often empty or one character, sometimes several tokens').
    std::string push(int32_t id);
    // End of stream: whatever is still held back (an unfinished character) as U+FFFD.
    std::string flush();
    size_t pending_bytes() const { return pending_.size(); }

  private:
    const Tokenizer &tok_;
    bool render_special_;
    std::string pending_;
};

}  // namespace strata
