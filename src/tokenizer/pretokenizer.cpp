// Pre-tokenizer patterns and the PCRE2 matching loop. The patterns are those of the models' Hugging Face
// tokenizer.json files (the reference the ids must match), not llama.cpp's ASCII-only rewrites of them.
// Unicode properties come from PCRE2's tables (Unicode 14 in Debian 12's PCRE2 10.42); the reference's regex
// library may know newer ones, so letters first assigned after Unicode 14 (Kawi, CJK Extension H, ...) can split
// differently until PCRE2 is updated.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "core/error.h"

namespace strata::tok {

namespace {

// Qwen2 / Qwen3 / Qwen3-Next / Qwen3-Coder: letters run together with one leading non-letter, digits one by one.
constexpr const char *kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|)"
    R"(\s+(?!\S)|\s+)";

// Qwen3.5: as Qwen2, but combining marks stay with the letters they modify.
constexpr const char *kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek-V3: three passes: digits in groups of up to three, then runs of CJK ideographs and kana, then words.
constexpr const char *kDeepseekV3Digits = R"(\p{N}{1,3})";
constexpr const char *kDeepseekV3Cjk = R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)";
constexpr const char *kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
    R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// gpt-oss (o200k): words split at case changes, contractions attached, digits in groups of up to three.
constexpr const char *kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A long run of one kind of character can make the lookahead alternatives backtrack deeply; PCRE2's default JIT
// stack (32 KiB) is sized for ordinary patterns, so each thread gets a larger one on first use.
pcre2_jit_stack_8 *thread_jit_stack(void *) {
    struct Holder {
        pcre2_jit_stack_8 *stack = pcre2_jit_stack_create_8(64 * 1024, 8 * 1024 * 1024, nullptr);
        ~Holder() { pcre2_jit_stack_free_8(stack); }
    };
    thread_local Holder holder;
    return holder.stack;
}

std::string pcre2_message(int code) {
    PCRE2_UCHAR8 buf[256];
    if (pcre2_get_error_message_8(code, buf, sizeof buf) < 0) return strfmt("PCRE2 error %d", code);
    return reinterpret_cast<const char *>(buf);
}

}  // namespace

struct PreTokenizer::Compiled {
    pcre2_code_8 *code = nullptr;
    pcre2_match_context_8 *mctx = nullptr;
    ~Compiled() {
        pcre2_match_context_free_8(mctx);
        pcre2_code_free_8(code);
    }
};

std::string onig_to_pcre2(std::string_view p) {
    // Unicode White_Space, spelled out: PCRE2's own \s (10.42, UCP mode) adds U+180E, which stopped being
    // white space in Unicode 6.3, and other PCRE2 versions may differ again.
    constexpr std::string_view kWhiteSpace =
        R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
    std::string out;
    out.reserve(p.size() + 64);
    bool in_class = false;
    for (size_t i = 0; i < p.size(); i++) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char e = p[i + 1];
            i++;
            if (e == 's') {
                if (!in_class) out += '[';
                out += kWhiteSpace;
                if (!in_class) out += ']';
            } else if (e == 'S') {
                if (in_class)
                    fail("pre-tokenizer pattern: \\S inside a character class is not supported: %.*s", int(p.size()),
                         p.data());
                out += "[^";
                out += kWhiteSpace;
                out += ']';
            } else {
                out += c;
                out += e;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            // A ']' right after '[' or '[^' is a literal member, not the end of the class.
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
            continue;
        }
        if (in_class && c == '[')
            fail("pre-tokenizer pattern: nested character classes are not supported: %.*s", int(p.size()), p.data());
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

const std::vector<std::string_view> &PreTokenizer::known_names() {
    static const std::vector<std::string_view> names = {"qwen2", "qwen35", "deepseek-v3", "gpt-4o"};
    return names;
}

std::unique_ptr<PreTokenizer> PreTokenizer::for_name(std::string_view name) {
    if (name == "qwen2") return from_patterns({kQwen2});
    if (name == "qwen35") return from_patterns({kQwen35});
    if (name == "deepseek-v3") return from_patterns({kDeepseekV3Digits, kDeepseekV3Cjk, kDeepseekV3Words});
    if (name == "gpt-4o") return from_patterns({kGpt4o});
    std::string known;
    for (auto n : known_names()) known += (known.empty() ? "" : ", ") + std::string(n);
    fail("tokenizer.ggml.pre '%.*s' is not supported (supported: %s)", int(name.size()), name.data(), known.c_str());
}

std::unique_ptr<PreTokenizer> PreTokenizer::from_patterns(std::vector<std::string> patterns) {
    std::unique_ptr<PreTokenizer> pt(new PreTokenizer);
    for (const std::string &onig : patterns) {
        const std::string pat = onig_to_pcre2(onig);
        auto c = std::make_unique<Compiled>();
        int err = 0;
        PCRE2_SIZE err_off = 0;
        // UCP: \s, \p{..} and (?i) use Unicode properties and case folding, as Oniguruma does. MATCH_INVALID_UTF:
        // ill-formed bytes are never matched instead of failing the whole match.
        c->code = pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>(pat.data()), pat.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
        if (!c->code)
            fail("pre-tokenizer pattern does not compile at offset %zu (%s): %s", size_t(err_off),
                 pcre2_message(err).c_str(), onig.c_str());
        // Without JIT (a platform PCRE2 lacks it for) pcre2_match interprets the pattern: slower, same result.
        pcre2_jit_compile_8(c->code, PCRE2_JIT_COMPLETE);
        c->mctx = pcre2_match_context_create_8(nullptr);
        if (!c->mctx) throw std::bad_alloc();
        pcre2_jit_stack_assign_8(c->mctx, thread_jit_stack, nullptr);
        pt->compiled_.push_back(std::move(c));
    }
    pt->patterns_ = std::move(patterns);
    return pt;
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view> &out) const {
    if (text.empty()) return;
    struct MatchData {
        pcre2_match_data_8 *md = pcre2_match_data_create_8(1, nullptr);
        ~MatchData() { pcre2_match_data_free_8(md); }
    };
    // One ovector pair is enough: only the whole match is used (pcre2_match returns 0 if there are groups).
    thread_local MatchData data;
    if (!data.md) throw std::bad_alloc();
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer_8(data.md);

    std::vector<std::string_view> cur{text}, next;
    for (size_t stage = 0; stage < compiled_.size(); stage++) {
        const Compiled &c = *compiled_[stage];
        const bool last = stage + 1 == compiled_.size();
        std::vector<std::string_view> &dst = last ? out : next;
        for (std::string_view piece : cur) {
            // Each piece is matched on its own, so lookarounds see the piece's ends as the subject's ends, as
            // they do when Hugging Face applies a chain of splits.
            const auto *subject = reinterpret_cast<PCRE2_SPTR8>(piece.data());
            size_t emitted = 0, search = 0;
            while (search < piece.size()) {
                const int rc = pcre2_match_8(c.code, subject, piece.size(), search, 0, data.md, c.mctx);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) fail("pre-tokenizer: matching failed: %s", pcre2_message(rc).c_str());
                const size_t s = ov[0], e = ov[1];
                if (e == s) {
                    // No pattern here matches the empty string; were one to, step over a character and leave
                    // it in the gap rather than loop.
                    search = s + 1;
                    while (search < piece.size() && (uint8_t(piece[search]) & 0xC0) == 0x80) search++;
                    continue;
                }
                if (s > emitted) dst.push_back(piece.substr(emitted, s - emitted));
                dst.push_back(piece.substr(s, e - s));
                emitted = search = e;
            }
            if (emitted < piece.size()) dst.push_back(piece.substr(emitted));
        }
        if (!last) {
            cur.swap(next);
            next.clear();
        }
    }
}

}  // namespace strata::tok
