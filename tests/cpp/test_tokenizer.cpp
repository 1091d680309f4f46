// Tokenizer: UTF-8 and byte-level helpers, pre-tokenizer splits, the BPE merge loop against a naive reference,
// SentencePiece on a hand-made vocabulary, special tokens, the streaming decoder, GGUF loading and its errors, and
// the real Qwen2 vocabulary against the reference ids in the shared test data. The cross-checks against Hugging
// Face and SentencePiece on a large corpus are in tests/python/test_tokenizer.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace strata;
using namespace strata::tok;

namespace {

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << haystack

template <class F>
std::string error_of(F &&f) {
    try {
        f();
    } catch (const Error &e) {
        return e.what();
    }
    ADD_FAILURE() << "no error thrown";
    return "";
}

std::vector<std::string> split(const PreTokenizer &pt, std::string_view text) {
    std::vector<std::string_view> words;
    pt.split(text, words);
    return std::vector<std::string>(words.begin(), words.end());
}

using Words = std::vector<std::string>;

// A byte-level vocabulary: the 256 byte tokens (id = byte value), then one token per merge result, then `extra`
// tokens of the given types.
VocabSpec byte_level_spec(const std::vector<std::pair<std::string, std::string>> &merges,
                          const std::vector<std::pair<std::string, TokenType>> &extra = {}) {
    VocabSpec s;
    s.model = "gpt2";
    s.pre = "qwen2";
    for (int b = 0; b < 256; b++) s.tokens.push_back(bytes_to_byte_level(std::string(1, char(b))));
    for (const auto &[l, r] : merges) {
        const std::string bl = bytes_to_byte_level(l), br = bytes_to_byte_level(r);
        s.merges.push_back(bl + " " + br);
        if (std::find(s.tokens.begin(), s.tokens.end(), bl + br) == s.tokens.end()) s.tokens.push_back(bl + br);
    }
    s.types.assign(s.tokens.size(), int32_t(TokenType::normal));
    for (const auto &[text, type] : extra) {
        s.tokens.push_back(text);
        s.types.push_back(int32_t(type));
    }
    return s;
}

std::filesystem::path shared_vocab(const char *name) {
    return std::filesystem::path(STRATA_SHARED_DIR) / "testdata/vocab" / name;
}

std::string read_file(const std::filesystem::path &p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace

// ---- UTF-8 and the byte-level alphabet -------------------------------------------------------------------------

TEST(Utf8, SequenceLengthsFollowTheStandard) {
    EXPECT_EQ(utf8_seq_len("a", 0), 1u);
    EXPECT_EQ(utf8_seq_len("\xC3\xA9", 0), 2u);
    EXPECT_EQ(utf8_seq_len("\xE4\xB8\xAD", 0), 3u);
    EXPECT_EQ(utf8_seq_len("\xF0\x9F\xA6\x99", 0), 4u);
    EXPECT_EQ(utf8_seq_len("\xC0\x80", 0), 0u);          // overlong
    EXPECT_EQ(utf8_seq_len("\xE0\x80\x80", 0), 0u);      // overlong
    EXPECT_EQ(utf8_seq_len("\xED\xA0\x80", 0), 0u);      // surrogate
    EXPECT_EQ(utf8_seq_len("\xF4\x90\x80\x80", 0), 0u);  // > U+10FFFF
    EXPECT_EQ(utf8_seq_len("\x80", 0), 0u);
    EXPECT_EQ(utf8_seq_len("\xE4\xB8", 0), 0u);  // cut short
    EXPECT_EQ(utf8_decode("\xF0\x9F\xA6\x99", 0, 4), 0x1F999u);
}

TEST(Utf8, IncompleteTailIsOnlyAValidStart) {
    EXPECT_EQ(utf8_incomplete_tail(""), 0u);
    EXPECT_EQ(utf8_incomplete_tail("ab"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\xB8"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\xB8\xAD"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\xA6"), 3u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\x41"), 0u);  // broken, not incomplete: nothing to wait for
    EXPECT_EQ(utf8_incomplete_tail("\xE0\x80"), 0u);   // can never become well-formed
    EXPECT_EQ(utf8_incomplete_tail("\xFF"), 0u);
}

TEST(Utf8, SanitizingReplacesEachMaximalIllFormedPart) {
    auto san = [](std::string_view s) {
        std::string out;
        utf8_append_sanitized(out, s);
        return out;
    };
    EXPECT_EQ(san("ok \xC3\xA9"), "ok \xC3\xA9");
    EXPECT_EQ(san("a\xFF"
                  "b"),
              "a\uFFFD"
              "b");
    EXPECT_EQ(san("\xE4\xB8"
                  "x"),
              "\uFFFD"
              "x");                                        // one truncated sequence: one replacement
    EXPECT_EQ(san("\xE0\x80\x80"), "\uFFFD\uFFFD\uFFFD");  // no valid prefix: one per byte
    EXPECT_EQ(san("\xF0\x9F\xA6"), "\uFFFD");
    EXPECT_EQ(utf8_first_invalid("ab\xC3\xA9\xFF"), 4u);
}

TEST(ByteLevel, AlphabetIsABijection) {
    std::string all;
    for (int b = 0; b < 256; b++) all += char(b);
    const std::string bl = bytes_to_byte_level(all);
    std::string back;
    ASSERT_TRUE(byte_level_to_bytes(bl, back));
    EXPECT_EQ(back, all);
    EXPECT_EQ(bytes_to_byte_level(" "), "\xC4\xA0");   // U+0120 'Ġ'
    EXPECT_EQ(bytes_to_byte_level("\n"), "\xC4\x8A");  // U+010A 'Ċ'
    EXPECT_EQ(bytes_to_byte_level("A"), "A");
    EXPECT_EQ(byte_to_codepoint(0xAD), 0x143u);               // soft hyphen is the last byte moved
    EXPECT_FALSE(byte_level_to_bytes("\xE4\xB8\xAD", back));  // U+4E2D is not in the alphabet
}

// ---- pre-tokenizers --------------------------------------------------------------------------------------------

// Expected words here were checked against Hugging Face `tokenizers` with the same patterns.
TEST(PreTokenizer, Qwen2Splits) {
    auto pt = PreTokenizer::for_name("qwen2");
    EXPECT_EQ(split(*pt, "Hello world"), (Words{"Hello", " world"}));
    EXPECT_EQ(split(*pt, "2024"), (Words{"2", "0", "2", "4"}));
    EXPECT_EQ(split(*pt, "it's I'M"), (Words{"it", "'s", " I", "'M"}));
    EXPECT_EQ(split(*pt, "a  \n\n b"), (Words{"a", "  \n\n", " b"}));
    EXPECT_EQ(split(*pt, "x   y"), (Words{"x", "  ", " y"}));
    EXPECT_EQ(split(*pt, "e\xCC\x81x"), (Words{"e", "\xCC\x81x"}));  // a combining mark is not a letter here
    // Oniguruma's \s is Unicode White_Space: U+0085 is in it, U+180E is not (PCRE2's own \s differs on both).
    EXPECT_EQ(split(*pt,
                    "a\xC2\x85\xC2\x85"
                    "b"),
              (Words{"a", "\xC2\x85",
                     "\xC2\x85"
                     "b"}));
    EXPECT_EQ(split(*pt,
                    "a \xE1\xA0\x8E"
                    "b"),
              (Words{"a", " \xE1\xA0\x8E", "b"}));
}

TEST(PreTokenizer, OtherModelsSplits) {
    auto q35 = PreTokenizer::for_name("qwen35");
    EXPECT_EQ(split(*q35, "e\xCC\x81x ok"), (Words{"e\xCC\x81x", " ok"}));
    auto o200k = PreTokenizer::for_name("gpt-4o");
    EXPECT_EQ(split(*o200k, "HelloWorld don't 1234567"), (Words{"Hello", "World", " don't", " ", "123", "456", "7"}));
    EXPECT_EQ(split(*o200k, "a/b\n/"), (Words{"a", "/b", "\n", "/"}));
    auto ds = PreTokenizer::for_name("deepseek-v3");
    EXPECT_EQ(split(*ds,
                    "\xE4\xBD\xA0\xE5\xA5\xBD"
                    "abc1234567"),
              (Words{"\xE4\xBD\xA0\xE5\xA5\xBD", "abc", "123", "456", "7"}));
    EXPECT_EQ(split(*ds, ".Net  x"), (Words{".Net", " ", " x"}));
}

TEST(PreTokenizer, WordsAlwaysCoverTheText) {
    std::mt19937 rng(7);
    const char *pieces[] = {"a",
                            "Z",
                            " ",
                            "  ",
                            "\n",
                            "\r\n",
                            "\t",
                            "'s",
                            "1",
                            "\xC3\xA9",
                            "\xE4\xB8\xAD",
                            "!",
                            "\xF0\x9F\xA6\x99",
                            "\xCC\x81",
                            "\xFF",
                            "\xE4\xB8",
                            "\x80",
                            "\xC2\x85",
                            "\xE3\x80\x80"};
    for (auto name : PreTokenizer::known_names()) {
        auto pt = PreTokenizer::for_name(name);
        for (int rep = 0; rep < 300; rep++) {
            std::string text;
            const int n = int(rng() % 60);
            for (int i = 0; i < n; i++) text += pieces[rng() % std::size(pieces)];
            std::string joined;
            for (const auto &w : split(*pt, text)) {
                EXPECT_FALSE(w.empty());
                joined += w;
            }
            ASSERT_EQ(joined, text) << name;
        }
    }
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheMatcher) {
    auto pt = PreTokenizer::for_name("qwen2");
    const std::string spaces(200000, ' ');
    const Words w = split(*pt, spaces + "x");
    ASSERT_EQ(w.size(), 2u);
    EXPECT_EQ(w[1], " x");
    EXPECT_EQ(split(*pt, std::string(100000, 'a')).size(), 1u);
}

TEST(PreTokenizer, RejectsUnknownNamesAndBadPatterns) {
    const std::string msg = error_of([] { PreTokenizer::for_name("llama-bpe"); });
    EXPECT_HAS(msg, "tokenizer.ggml.pre 'llama-bpe' is not supported");
    EXPECT_HAS(msg, "qwen2, qwen35, deepseek-v3, gpt-4o");
    EXPECT_HAS(error_of([] { PreTokenizer::from_patterns({"(unclosed"}); }), "does not compile");
}

TEST(PreTokenizer, WhiteSpaceRewriteKeepsClassesIntact) {
    EXPECT_EQ(onig_to_pcre2(R"(a\p{L})"), R"(a\p{L})");
    const std::string in_class = onig_to_pcre2(R"([^\s\p{L}])");
    EXPECT_EQ(in_class.rfind("[^", 0), 0u);
    EXPECT_EQ(std::count(in_class.begin(), in_class.end(), '['), 1);
    EXPECT_HAS(in_class, R"(\x{85})");
    EXPECT_HAS(onig_to_pcre2(R"(\s+(?!\S))"), R"((?![^)");
    EXPECT_EQ(onig_to_pcre2(R"(\\s)"), R"(\\s)");  // an escaped backslash followed by 's' is not \s
}

// ---- BPE merges ------------------------------------------------------------------------------------------------

namespace {

// The textbook rule, slowly: merge the lowest-ranked adjacent pair, leftmost on ties, until none is left.
std::vector<std::string> naive_bpe(const std::string &word,
                                   const std::map<std::pair<std::string, std::string>, int> &ranks) {
    std::vector<std::string> syms;
    for (char c : word) syms.push_back(std::string(1, c));
    while (syms.size() > 1) {
        int best = -1, best_rank = INT_MAX;
        for (size_t i = 0; i + 1 < syms.size(); i++) {
            auto it = ranks.find({syms[i], syms[i + 1]});
            if (it != ranks.end() && it->second < best_rank) best = int(i), best_rank = it->second;
        }
        if (best < 0) break;
        syms[best] += syms[best + 1];
        syms.erase(syms.begin() + best + 1);
    }
    return syms;
}

}  // namespace

TEST(Bpe, MatchesTheNaiveRuleOnShortAndLongWords) {
    std::mt19937 rng(11);
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    std::map<std::pair<std::string, std::string>, int> ranks;
    while (merges.size() < 80) {
        const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
        if (l.size() + r.size() > 8 || ranks.count({l, r})) continue;
        ranks[{l, r}] = int(merges.size());
        merges.push_back({l, r});
        if (std::find(tokens.begin(), tokens.end(), l + r) == tokens.end()) tokens.push_back(l + r);
    }
    VocabSpec spec = byte_level_spec(merges);
    std::map<std::string, int32_t> id_of;
    for (size_t i = 0; i < spec.tokens.size(); i++) id_of.emplace(spec.tokens[i], int32_t(i));
    BpeModel bpe;
    std::vector<std::string_view> mv(spec.merges.begin(), spec.merges.end());
    bpe.build(mv, [&](std::string_view s) {
        auto it = id_of.find(std::string(s));
        return it == id_of.end() ? -1 : it->second;
    });
    EXPECT_EQ(bpe.n_merges(), 80u);
    // Lengths on both sides of the switch from the linear scan to the heap, and repeats to hit the word cache.
    for (int rep = 0; rep < 400; rep++) {
        const size_t len = 1 + rng() % (rep % 4 == 0 ? 300 : 40);
        std::string word;
        for (size_t i = 0; i < len; i++) word += char('a' + rng() % 3);
        std::vector<int32_t> want;
        for (const auto &s : naive_bpe(word, ranks)) want.push_back(id_of.at(s));
        for (int twice = 0; twice < 2; twice++) {
            std::vector<int32_t> got;
            bpe.encode_word(word, got);
            ASSERT_EQ(got, want) << word;
        }
    }
}

TEST(Bpe, TiesGoToTheLeftmostPair) {
    // "aaa" with the single merge a+a: the left pair merges first, leaving "aa" "a".
    auto t = Tokenizer::from_spec(byte_level_spec({{"a", "a"}}));
    const int32_t aa = t->find_token("aa");
    EXPECT_EQ(t->encode("aaa", false, false), (std::vector<int32_t>{aa, 'a'}));
    EXPECT_EQ(t->encode("aaaaa", false, false), (std::vector<int32_t>{aa, aa, 'a'}));
}

TEST(Bpe, NoTokenSpansTwoWords) {
    auto t = Tokenizer::from_spec(byte_level_spec({{"a", " "}, {"a ", "b"}}));
    // "a b" is one token in the vocabulary, but the pre-tokenizer has already cut "a" from " b".
    EXPECT_EQ(t->encode("a b", false, false), (std::vector<int32_t>{'a', ' ', 'b'}));
}

// ---- special tokens --------------------------------------------------------------------------------------------

TEST(SpecialTokens, ControlOnlyWhenAskedUserDefinedAlways) {
    auto t = Tokenizer::from_spec(
        byte_level_spec({}, {{"<|im_start|>", TokenType::control}, {"<think>", TokenType::user_defined}}));
    const int32_t im = t->find_token("<|im_start|>"), th = t->find_token("<think>");
    const auto with = t->encode("x<|im_start|><think>", false, true);
    EXPECT_EQ(with, (std::vector<int32_t>{'x', im, th}));
    const auto without = t->encode("x<|im_start|><think>", false, false);
    EXPECT_EQ(without.back(), th);
    EXPECT_EQ(std::count(without.begin(), without.end(), im), 0);
    EXPECT_EQ(t->decode(without), "x<|im_start|><think>");
    EXPECT_EQ(t->decode(with), "x<think>");  // control tokens are not text unless asked for
    EXPECT_EQ(t->decode(with, true), "x<|im_start|><think>");
}

TEST(SpecialTokens, LeftmostThenLongestAndControlFirst) {
    auto t = Tokenizer::from_spec(byte_level_spec({}, {{"<|a|>", TokenType::control},
                                                       {"<|a|>b", TokenType::control},
                                                       {"bc", TokenType::control},
                                                       {"ab", TokenType::user_defined}}));
    const int32_t a = t->find_token("<|a|>"), ab_ctl = t->find_token("<|a|>b"), bc = t->find_token("bc"),
                  ab = t->find_token("ab");
    EXPECT_EQ(t->encode("<|a|>b<|a|>", false, true), (std::vector<int32_t>{ab_ctl, a}));
    // Control tokens are found before user-defined ones, so "bc" wins over the earlier "ab".
    EXPECT_EQ(t->encode("abc", false, true), (std::vector<int32_t>{'a', bc}));
    EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{ab, 'c'}));
}

// ---- SentencePiece ---------------------------------------------------------------------------------------------

namespace {

const std::string kSp = "\xE2\x96\x81";

VocabSpec spm_spec(bool with_bytes) {
    VocabSpec s;
    s.model = "llama";
    auto add = [&](std::string piece, float score, TokenType type) {
        s.tokens.push_back(std::move(piece));
        s.scores.push_back(score);
        s.types.push_back(int32_t(type));
        return int32_t(s.tokens.size() - 1);
    };
    s.unk = add("<unk>", 0, TokenType::unknown);
    s.bos = add("<s>", 0, TokenType::control);
    s.eos = add("</s>", 0, TokenType::control);
    if (with_bytes)
        for (int b = 0; b < 256; b++) add(strfmt("<0x%02X>", b), 0, TokenType::byte);
    add(kSp, -1, TokenType::normal);
    add("a", -2, TokenType::normal);
    add("b", -3, TokenType::normal);
    add("c", -4, TokenType::normal);
    add("x", -4, TokenType::normal);
    add("ab", -0.5f, TokenType::normal);
    add("bc", -0.1f, TokenType::unused);
    add("abc", -0.2f, TokenType::normal);
    add(kSp + "a", -0.3f, TokenType::normal);
    add(kSp + "x", -0.3f, TokenType::normal);
    add("<u>", 0, TokenType::user_defined);
    return s;
}

}  // namespace

TEST(SentencePiece, MergesByScoreAndSplitsUnusedPiecesBack) {
    auto t = Tokenizer::from_spec(spm_spec(true));
    EXPECT_TRUE(t->add_bos());  // SentencePiece's default
    auto id = [&](const std::string &s) { return t->find_token(s); };
    // "▁abc": bc (-0.1) first, then abc (-0.2) beats ▁a (-0.3).
    EXPECT_EQ(t->encode("abc", false, false), (std::vector<int32_t>{id(kSp), id("abc")}));
    // "▁bc": the unused piece bc is merged, then given back as b, c.
    EXPECT_EQ(t->encode("bc", false, false), (std::vector<int32_t>{id(kSp), id("b"), id("c")}));
    EXPECT_EQ(t->encode("a x", true, false), (std::vector<int32_t>{t->bos(), id(kSp + "a"), id(kSp + "x")}));
    EXPECT_EQ(t->decode(t->encode("a x", true, false)), "a x");  // BOS and the dummy prefix are not text
}

TEST(SentencePiece, ByteFallbackAndUnknownRuns) {
    auto t = Tokenizer::from_spec(spm_spec(true));
    const auto ids = t->encode("\xC3\xA9", false, false);
    ASSERT_EQ(ids.size(), 3u);
    EXPECT_EQ(t->token_spelling(ids[1]), "<0xC3>");
    EXPECT_EQ(t->token_spelling(ids[2]), "<0xA9>");
    EXPECT_EQ(t->decode(ids), "\xC3\xA9");
    auto nob = Tokenizer::from_spec(spm_spec(false));
    // Without byte pieces a run of unknown characters is one unknown token.
    EXPECT_EQ(nob->encode("\xC3\xA9\xC3\xA9"
                          "a",
                          false, false),
              (std::vector<int32_t>{nob->find_token(kSp), nob->unk(), nob->find_token("a")}));
}

TEST(SentencePiece, UserDefinedPiecesAreInlineText) {
    auto t = Tokenizer::from_spec(spm_spec(true));
    const int32_t u = t->find_token("<u>"), sp = t->find_token(kSp), a = t->find_token("a");
    EXPECT_EQ(t->encode("<u>a", false, false), (std::vector<int32_t>{sp, u, a}));
    EXPECT_EQ(t->encode("<s>a", false, true), (std::vector<int32_t>{t->bos(), t->find_token(kSp + "a")}));
}

// ---- streaming decoder -----------------------------------------------------------------------------------------

TEST(StreamDecoder, EmitsOnlyWholeCharacters) {
    auto t = Tokenizer::from_spec(byte_level_spec({}, {{"<|end|>", TokenType::control}}));
    StreamDecoder d(*t);
    // "é🦙" one byte per token.
    const std::string text = "\xC3\xA9\xF0\x9F\xA6\x99!";
    std::vector<std::string> outs;
    for (char c : text) outs.push_back(d.push(uint8_t(c)));
    EXPECT_EQ(outs, (std::vector<std::string>{"", "\xC3\xA9", "", "", "", "\xF0\x9F\xA6\x99", "!"}));
    EXPECT_EQ(d.push(t->find_token("<|end|>")), "");  // control tokens are not text
    EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, BrokenBytesBecomeReplacementCharacters) {
    auto t = Tokenizer::from_spec(byte_level_spec({}));
    StreamDecoder d(*t);
    EXPECT_EQ(d.push(0xFF), "\uFFFD");
    EXPECT_EQ(d.push(0xE4), "");
    EXPECT_EQ(d.pending_bytes(), 1u);
    EXPECT_EQ(d.push('a'),
              "\uFFFD"
              "a");
    EXPECT_EQ(d.push(0xE4), "");
    EXPECT_EQ(d.push(0xB8), "");
    EXPECT_EQ(d.flush(), "\uFFFD");
    EXPECT_EQ(d.pending_bytes(), 0u);
}

// ---- loading and its errors ------------------------------------------------------------------------------------

TEST(TokenizerLoad, RejectsUnsupportedModelsNamingThem) {
    VocabSpec s = byte_level_spec({});
    s.model = "bert";
    EXPECT_HAS(error_of([&] { Tokenizer::from_spec(s); }), "tokenizer.ggml.model 'bert' is not supported");
    s = byte_level_spec({});
    s.pre = "falcon";
    EXPECT_HAS(error_of([&] { Tokenizer::from_spec(s); }), "tokenizer.ggml.pre 'falcon' is not supported");
    s = byte_level_spec({});
    s.eos = 100000;
    EXPECT_HAS(error_of([&] { Tokenizer::from_spec(s); }), "eos_token_id = 100000 is not a token id");
    s = byte_level_spec({});
    s.types.pop_back();
    EXPECT_HAS(error_of([&] { Tokenizer::from_spec(s); }), "token_type has 255 entries");
    s = byte_level_spec({});
    s.merges = {"nospace"};
    EXPECT_HAS(error_of([&] { Tokenizer::from_spec(s); }), "merges[0] 'nospace'");
    s = byte_level_spec({});
    s.add_bos = true;
    EXPECT_HAS(error_of([&] { Tokenizer::from_spec(s); }), "no bos_token_id");
}

TEST(TokenizerLoad, ReadsTheGgufKeys) {
    const VocabSpec s = byte_level_spec({{"a", "b"}}, {{"<|im_end|>", TokenType::control}});
    GgufWriter w;
    w.add_string("general.architecture", "qwen3moe");
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_string_array("tokenizer.ggml.tokens", s.tokens);
    w.add_array("tokenizer.ggml.token_type", GgufType::I32, s.types.data(), s.types.size());
    w.add_string_array("tokenizer.ggml.merges", s.merges);
    w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(s.tokens.size() - 1));
    w.add_u32("tokenizer.ggml.bos_token_id", 'B');
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    const std::vector<uint8_t> bytes = w.write_to_memory();
    auto f = GgufFile::from_memory(bytes.data(), bytes.size());
    auto t = Tokenizer::from_gguf(*f);
    EXPECT_EQ(t->n_vocab(), int32_t(s.tokens.size()));
    EXPECT_TRUE(t->add_bos());
    EXPECT_EQ(t->encode("ab<|im_end|>", true, true), (std::vector<int32_t>{'B', t->find_token("ab"), t->eos()}));
    EXPECT_TRUE(t->is_eog(t->eos()));

    GgufWriter empty;
    empty.add_string("general.architecture", "qwen3moe");
    const std::vector<uint8_t> eb = empty.write_to_memory();
    auto ef = GgufFile::from_memory(eb.data(), eb.size());
    EXPECT_HAS(error_of([&] { Tokenizer::from_gguf(*ef); }), "tokenizer.ggml.model");
}

// ---- the real Qwen2 vocabulary ---------------------------------------------------------------------------------

class Qwen2Vocab : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        const auto path = shared_vocab("ggml-vocab-qwen2.gguf");
        if (!std::filesystem::exists(path)) return;
        file_ = GgufFile::open(path.string()).release();
        tok_ = Tokenizer::from_gguf(*file_).release();
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete file_;
    }
    void SetUp() override {
        if (!tok_) GTEST_SKIP() << "shared test data not found at " << STRATA_SHARED_DIR << "/testdata/vocab";
    }
    static GgufFile *file_;
    static Tokenizer *tok_;
};
GgufFile *Qwen2Vocab::file_ = nullptr;
Tokenizer *Qwen2Vocab::tok_ = nullptr;

TEST_F(Qwen2Vocab, EveryReferenceCaseGivesTheReferenceIds) {
    const std::string inp = read_file(shared_vocab("ggml-vocab-qwen2.gguf.inp"));
    const std::string out = read_file(shared_vocab("ggml-vocab-qwen2.gguf.out"));
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> cases;
    for (size_t pos = 0; pos < inp.size();) {
        size_t end = inp.find(sep, pos);
        if (end == std::string::npos) end = inp.size();
        cases.push_back(inp.substr(pos, end - pos));
        pos = end + sep.size();
    }
    std::vector<std::vector<int32_t>> want;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
        std::istringstream ids(line);
        want.emplace_back();
        for (int32_t id; ids >> id;) want.back().push_back(id);
    }
    ASSERT_EQ(cases.size(), 46u);
    ASSERT_EQ(want.size(), cases.size());
    for (size_t i = 0; i < cases.size(); i++) {
        const auto ids = tok_->encode(cases[i], /*add_special=*/false, /*parse_special=*/true);
        EXPECT_EQ(ids, want[i]) << "case " << i << ": " << cases[i];
        EXPECT_EQ(tok_->decode(ids), cases[i]);
    }
}

TEST_F(Qwen2Vocab, FileFacts) {
    EXPECT_EQ(tok_->n_vocab(), 151936);
    EXPECT_EQ(tok_->pre_name(), "qwen2");
    EXPECT_FALSE(tok_->add_bos());  // the file has no add_bos_token: byte-level BPE adds none
    EXPECT_EQ(tok_->find_token("<|im_end|>"), 151645);
    EXPECT_TRUE(tok_->is_eog(151643));  // <|endoftext|>, the file's EOS
    EXPECT_TRUE(tok_->is_eog(151645));  // <|im_end|>, the chat template's end of turn
    EXPECT_FALSE(tok_->is_eog(151644));
    EXPECT_EQ(tok_->token_text(198), "\n");
    EXPECT_EQ(tok_->encode("<|im_start|>user", false, true), (std::vector<int32_t>{151644, 872}));
}

TEST_F(Qwen2Vocab, ArbitraryBytesRoundTrip) {
    std::mt19937 rng(3);
    for (int rep = 0; rep < 200; rep++) {
        std::string s(rng() % 200, '\0');
        for (auto &c : s) c = char(rng() % (rep % 2 ? 256 : 128));
        EXPECT_EQ(tok_->decode(tok_->encode(s, false, false)), s);
    }
}

TEST_F(Qwen2Vocab, StreamingGivesTheSameTextInWholeCharacters) {
    const std::string text =
        "Emoji 😶‍🌫️ 👨‍👩‍👧‍👦 🇯🇵, CJK 我想在apple工作, Khmer កាន់តែពិសេស, Devanagari नमस्ते, e\xCC\x81\xCC\x82 "
        "<|im_end|>";
    const auto ids = tok_->encode(text, false, true);
    StreamDecoder d(*tok_, /*render_special=*/true);
    std::string all;
    for (int32_t id : ids) {
        const std::string part = d.push(id);
        EXPECT_EQ(utf8_first_invalid(part), part.size()) << "token " << id;
        all += part;
    }
    all += d.flush();
    EXPECT_EQ(all, text);
}
