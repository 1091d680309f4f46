// Pre-tokenization for byte-level BPE: the text is cut into words by the regular expressions of the model's
// pre-tokenizer before any merge happens, so no token ever spans two words. Matching is done by PCRE2 (JIT,
// Unicode properties); this file only knows the patterns and the "isolated split" rule, not the vocabulary.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tok {

class PreTokenizer {
  public:
    // The pre-tokenizer of a `tokenizer.ggml.pre` name: "qwen2", "qwen35", "deepseek-v3" or "gpt-4o". Throws
    // strata::Error naming the name (and the supported ones) for anything else.
    static std::unique_ptr<PreTokenizer> for_name(std::string_view name);

    // A chain of patterns applied in turn, each one splitting the pieces the previous one produced. Patterns use
    // the Hugging Face `tokenizers` dialect (Oniguruma); throws strata::Error when one does not compile.
    static std::unique_ptr<PreTokenizer> from_patterns(std::vector<std::string> patterns);

    // Names accepted by for_name, for messages and tests.
    static const std::vector<std::string_view> &known_names();

    ~PreTokenizer();
    PreTokenizer(const PreTokenizer &) = delete;
    PreTokenizer &operator=(const PreTokenizer &) = delete;

    // Appends the words of text, in order, to out. Every byte of text lands in exactly one word: matches and the
    // gaps between them are both kept ("isolated"), so the words concatenate back to text. Bytes that are not
    // well-formed UTF-8 never match a pattern; they end up in gap words. Thread-safe.
    void split(std::string_view text, std::vector<std::string_view> &out) const;

    const std::vector<std::string> &patterns() const { return patterns_; }

  private:
    PreTokenizer() = default;
    struct Compiled;
    std::vector<std::string> patterns_;
    std::vector<std::unique_ptr<Compiled>> compiled_;
};

// Rewrites \s and \S in an Oniguruma pattern as explicit classes so that PCRE2 matches the same characters:
// Oniguruma's \s is exactly Unicode White_Space, PCRE2's is not (it also takes U+180E). Exposed for tests.
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace strata::tok
