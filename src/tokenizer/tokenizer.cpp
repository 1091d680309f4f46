// Tokenizer: ties the vocabulary to the pre-tokenizer, the merge model and the special-token matcher, and turns
// ids back into text. Reading the model file is in tokenizer_gguf.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/spm.h"
#include "tokenizer/utf8.h"

namespace strata {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Turn-ending tokens of the chat formats we serve. A model file names one EOS; generation must also stop at
// the others its template uses (Qwen instruct models end turns with <|im_end|> but name <|endoftext|> as EOS in
// some files, and the reverse in others).
// clang-format off
constexpr std::string_view kEogSpellings[] = {
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|return|>", "<|call|>",
    "<｜end▁of▁sentence｜>", "<end_of_turn>",
};
// clang-format on

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    size_t pos = 0;
    while (true) {
        const size_t hit = s.find(from, pos);
        if (hit == std::string_view::npos) break;
        out.append(s.data() + pos, hit - pos);
        out.append(to);
        pos = hit + from.size();
    }
    out.append(s.data() + pos, s.size() - pos);
    return out;
}

}  // namespace

// Spelling -> id, flat: each slot holds a hash tag and the id, and the spelling is compared in place, which keeps
// loading a 150k-token vocabulary (half a million lookups for the merges) to a few cache misses per lookup.
struct Tokenizer::Index {
    std::vector<uint64_t> slots;  // (hash >> 32) << 32 | (id + 1); 0 = empty
    size_t mask = 0;

    void build(const std::vector<std::string> &tokens) {
        size_t cap = 16;
        while (cap < tokens.size() * 2) cap *= 2;
        slots.assign(cap, 0);
        mask = cap - 1;
        for (size_t id = 0; id < tokens.size(); id++) {
            const uint64_t h = std::hash<std::string_view>{}(tokens[id]);
            for (size_t i = h & mask;; i = (i + 1) & mask) {
                if (slots[i] == 0) {
                    slots[i] = (h >> 32) << 32 | (id + 1);
                    break;
                }
                // Two tokens spelled alike: the lower id keeps the spelling.
                if (slots[i] >> 32 == h >> 32 && tokens[(slots[i] & 0xFFFFFFFF) - 1] == tokens[id]) break;
            }
        }
    }

    int32_t find(const std::vector<std::string> &tokens, std::string_view s) const {
        const uint64_t h = std::hash<std::string_view>{}(s);
        for (size_t i = h & mask;; i = (i + 1) & mask) {
            const uint64_t e = slots[i];
            if (e == 0) return -1;
            const size_t id = (e & 0xFFFFFFFF) - 1;
            if (e >> 32 == h >> 32 && tokens[id] == s) return int32_t(id);
        }
    }
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_spec(VocabSpec spec) {
    std::unique_ptr<Tokenizer> t(new Tokenizer);
    t->spec_ = std::move(spec);
    t->init();
    return t;
}

void Tokenizer::init() {
    VocabSpec &s = spec_;
    const size_t n = s.tokens.size();
    if (n == 0) fail("tokenizer.ggml.tokens is empty");
    if (n > size_t(INT32_MAX)) fail("tokenizer.ggml.tokens has %zu entries, more than token ids can hold", n);
    if (s.types.empty()) s.types.assign(n, int32_t(TokenType::normal));
    if (s.types.size() != n)
        fail("tokenizer.ggml.token_type has %zu entries but tokenizer.ggml.tokens has %zu", s.types.size(), n);
    for (size_t i = 0; i < n; i++)
        if (s.types[i] < 0 || s.types[i] > 6)
            fail("tokenizer.ggml.token_type[%zu] = %d is not a token type (0..6)", i, s.types[i]);
    auto check_id = [&](int32_t id, const char *key) {
        if (id < -1 || id >= int32_t(n))
            fail("tokenizer.ggml.%s = %d is not a token id (the vocabulary has %zu tokens)", key, id, n);
    };
    check_id(s.bos, "bos_token_id");
    check_id(s.eos, "eos_token_id");
    check_id(s.eot, "eot_token_id");
    check_id(s.eom, "eom_token_id");
    check_id(s.unk, "unknown_token_id");
    check_id(s.pad, "padding_token_id");

    index_ = std::make_unique<Index>();
    index_->build(s.tokens);

    if (s.model == "gpt2") {
        pre_ = tok::PreTokenizer::for_name(s.pre);
        bpe_ = std::make_unique<tok::BpeModel>();
        std::vector<std::string_view> merges(s.merges.begin(), s.merges.end());
        bpe_->build(merges, [this](std::string_view sp) { return find_token(sp); });
        bpe_->set_unk(s.unk);
        // Byte-level BPE models add a BOS only when the file asks for one (DeepSeek-V3 files do, Qwen files not).
        add_bos_ = s.add_bos.value_or(false);
    } else if (s.model == "llama") {
        if (s.scores.empty()) s.scores.assign(n, 0.0f);
        if (s.scores.size() != n)
            fail("tokenizer.ggml.scores has %zu entries but tokenizer.ggml.tokens has %zu", s.scores.size(), n);
        spm_ = std::make_unique<tok::SpmModel>();
        std::vector<std::string_view> pieces(s.tokens.begin(), s.tokens.end());
        spm_->build(pieces, s.scores, s.types, s.unk);
        add_space_prefix_ = s.add_space_prefix.value_or(true);
        // SentencePiece models expect a BOS by default (Llama's convention), when they have one.
        add_bos_ = s.add_bos.value_or(s.bos >= 0);
    } else {
        fail("tokenizer.ggml.model '%s' is not supported (supported: gpt2, llama)", s.model.c_str());
    }
    add_eos_ = s.add_eos.value_or(false);
    if (add_bos_ && s.bos < 0) fail("tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
    if (add_eos_ && s.eos < 0) fail("tokenizer.ggml.add_eos_token is true but there is no eos_token_id");

    text_.resize(n);
    for (size_t i = 0; i < n; i++) {
        const std::string &sp = s.tokens[i];
        const auto type = TokenType(s.types[i]);
        std::string &t = text_[i];
        if (type == TokenType::control || type == TokenType::unknown) {
            t = sp;
        } else if (spm_) {
            if (type == TokenType::byte) {
                const int b = sp.size() == 6 ? int(std::strtol(sp.substr(3, 2).c_str(), nullptr, 16)) : -1;
                t = b >= 0 ? std::string(1, char(b)) : sp;
            } else {
                t = replace_all(sp, kSpmSpace, " ");
            }
        } else if (type == TokenType::user_defined || !tok::byte_level_to_bytes(sp, t)) {
            // Added tokens are stored as plain text; so is any token outside the byte-level alphabet.
            t = sp;
        }
    }

    specials_ = std::make_unique<tok::SpecialTokenMatcher>();
    for (size_t i = 0; i < n; i++) {
        const auto type = TokenType(s.types[i]);
        if (type == TokenType::control || type == TokenType::unknown) {
            specials_->add(text_[i], int32_t(i), /*control=*/true);
        } else if (type == TokenType::user_defined) {
            // SentencePiece matches user-defined pieces in the escaped text, where no plain space is left, so a
            // piece spelled with one never matches.
            if (spm_ && s.tokens[i].find(' ') != std::string::npos) continue;
            specials_->add(text_[i], int32_t(i), /*control=*/false);
        }
    }

    for (int32_t id : {s.eos, s.eot, s.eom})
        if (id >= 0) eog_ids_.push_back(id);
    for (std::string_view sp : kEogSpellings) {
        const int32_t id = find_token(sp);
        if (id >= 0 && (is_control(id) || token_type(id) == TokenType::user_defined)) eog_ids_.push_back(id);
    }
    // gpt-oss (harmony) closes every message, the reasoning ones too, with <|end|>, and the final answer with
    // <|return|> or a tool call with <|call|>: there <|end|> must not stop generation.
    if (find_token("<|return|>") >= 0 && find_token("<|call|>") >= 0) {
        const int32_t end = find_token("<|end|>");
        eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), end), eog_ids_.end());
    }
    std::sort(eog_ids_.begin(), eog_ids_.end());
    eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
}

const std::string &Tokenizer::token_spelling(int32_t id) const {
    if (id < 0 || id >= n_vocab()) fail("token id %d is out of range (the vocabulary has %d tokens)", id, n_vocab());
    return spec_.tokens[size_t(id)];
}

TokenType Tokenizer::token_type(int32_t id) const {
    if (id < 0 || id >= n_vocab()) fail("token id %d is out of range (the vocabulary has %d tokens)", id, n_vocab());
    return TokenType(spec_.types[size_t(id)]);
}

int32_t Tokenizer::find_token(std::string_view spelling) const {
    return index_->find(spec_.tokens, spelling);
}

bool Tokenizer::is_eog(int32_t id) const {
    return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::string Tokenizer::token_text(int32_t id) const {
    if (id < 0 || id >= n_vocab()) fail("token id %d is out of range (the vocabulary has %d tokens)", id, n_vocab());
    return text_[size_t(id)];
}

void Tokenizer::encode_text(std::string_view text, bool first, std::vector<int32_t> &out) const {
    if (bpe_) {
        std::vector<std::string_view> words;
        pre_->split(text, words);
        for (std::string_view w : words) bpe_->encode_word(w, out);
        return;
    }
    if (text.empty() && !(first && add_space_prefix_)) return;
    std::string escaped;
    escaped.reserve(text.size() + 8);
    if (first && add_space_prefix_) escaped += kSpmSpace;
    escaped += replace_all(text, " ", kSpmSpace);
    spm_->encode(escaped, out);
}

void Tokenizer::encode(std::string_view text, bool add_special, bool parse_special, std::vector<int32_t> &out) const {
    if (add_special && add_bos_) out.push_back(spec_.bos);
    std::vector<tok::SpecialTokenMatcher::Fragment> fragments;
    specials_->split(text, parse_special, fragments);
    // SentencePiece's dummy prefix goes before the text, and after each control token (the text after one starts
    // afresh, as in llama.cpp); not after a user-defined token, which SentencePiece treats as part of the text.
    bool starts_afresh = true;
    for (const auto &f : fragments) {
        if (f.id >= 0) {
            const bool user_defined = token_type(f.id) == TokenType::user_defined;
            // Text that opens with a user-defined token still gets its dummy prefix, as a piece of its own.
            if (spm_ && user_defined && starts_afresh) encode_text({}, true, out);
            out.push_back(f.id);
            starts_afresh = !user_defined;
        } else {
            encode_text(f.text, starts_afresh, out);
            starts_afresh = false;
        }
    }
    if (add_special && add_eos_) out.push_back(spec_.eos);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    std::vector<int32_t> out;
    encode(text, add_special, parse_special, out);
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
        const bool control = is_control(id);  // also checks that id is in range
        if (!render_special && control) continue;
        if (token_type(id) == TokenType::unused) continue;  // placeholders, never text (as llama.cpp does)
        const std::string &t = text_[size_t(id)];
        // The dummy prefix the encoder added is not part of the text.
        if (first && spm_ && add_space_prefix_ && !t.empty() && t[0] == ' ' && !control) {
            out.append(t, 1, std::string::npos);
        } else {
            out += t;
        }
        first = false;
    }
    return out;
}

std::string StreamDecoder::push(int32_t id) {
    if (!render_special_ && tok_.is_control(id)) return {};
    if (tok_.token_type(id) == TokenType::unused) return {};
    pending_ += tok_.token_text(id);
    const size_t keep = tok::utf8_incomplete_tail(pending_);
    std::string out;
    tok::utf8_append_sanitized(out, std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    tok::utf8_append_sanitized(out, pending_);
    pending_.clear();
    return out;
}

}  // namespace strata
