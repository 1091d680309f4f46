// The grammar engine: GBNF parsing and its errors, byte-level matching (UTF-8 split across tokens, tokens across
// terminals), bounds on hostile grammars, the vocabulary mask (checked token by token against the matcher itself,
// on small vocabularies and on the real Qwen vocabulary from ../shared/testdata), triggered constraints, the
// sampler's use of a constraint, and the constraints the server builds from request fields.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "byte_vocab.h"
#include "format/gguf.h"
#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "runtime/sampler.h"
#include "server/constraint_fields.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::grammar;

namespace {

using test::byte_vocab;

bool matches(const std::string &gbnf, std::string_view text) {
    Matcher m(Grammar::parse(gbnf), byte_vocab());
    return m.accept_bytes(text) && m.can_end();
}

bool viable_prefix(const std::string &gbnf, std::string_view text) {
    Matcher m(Grammar::parse(gbnf), byte_vocab());
    return m.accept_bytes(text);
}

std::string parse_error(const std::string &gbnf) {
    try {
        Grammar::parse(gbnf);
    } catch (const GrammarError &e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

// ---- parsing -----------------------------------------------------------------------------------------------------

TEST(GrammarParse, LiteralsClassesAndRepetition) {
    const std::string g = R"(root ::= "ab" [0-9]+ ("x" | "yz")? [^a-c]{2,3} . "\n")";
    EXPECT_TRUE(matches(g, "ab1x..!\n"));
    EXPECT_TRUE(matches(g, "ab123yzdef\xc3\xa9\n"));  // . is any character, é two bytes
    EXPECT_FALSE(matches(g, "ab1.\n"));               // [^a-c]{2,3} then . then "\n": too short
    EXPECT_FALSE(matches(g, "abx..!\n"));             // [0-9]+ needs one
    EXPECT_FALSE(matches(g, "ab1xa..\n"));            // a is in [a-c]
    EXPECT_FALSE(matches(g, "ab1yz...!!\n"));         // {2,3} at most 3
    EXPECT_TRUE(matches(g, "ab1yz...!\n"));
}

TEST(GrammarParse, BoundedRepetitionForms) {
    EXPECT_TRUE(matches(R"(root ::= "a"{3})", "aaa"));
    EXPECT_FALSE(matches(R"(root ::= "a"{3})", "aa"));
    EXPECT_FALSE(matches(R"(root ::= "a"{3})", "aaaa"));
    EXPECT_TRUE(matches(R"(root ::= "a"{2,})", "aaaaaaa"));
    EXPECT_FALSE(matches(R"(root ::= "a"{2,})", "a"));
    EXPECT_TRUE(matches(R"(root ::= "a"{,2})", ""));
    EXPECT_FALSE(matches(R"(root ::= "a"{,2})", "aaa"));
    EXPECT_TRUE(matches(R"(root ::= "ab"*)", "ababab"));  // a literal repeats whole
    EXPECT_FALSE(matches(R"(root ::= "ab"*)", "aba"));
}

TEST(GrammarParse, RulesCommentsAndLines) {
    const std::string g =
        "# a comment\n"
        "root ::= greeting \" \" name   # trailing comment\n"
        "greeting ::=\n"
        "    \"hello\"\n"
        "  | \"hi\"\n"
        "name ::= [A-Z] [a-z]*\n";
    EXPECT_TRUE(matches(g, "hello Ada"));
    EXPECT_TRUE(matches(g, "hi Bob"));
    EXPECT_FALSE(matches(g, "hey Bob"));
    EXPECT_FALSE(matches(g, "hi bob"));
}

TEST(GrammarParse, EscapesAndUnicode) {
    EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\U0001F600\t\"\\")", "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\"));
    EXPECT_TRUE(matches(R"(root ::= [à-ÿ]+)", "\xc3\xa0\xc3\xbf"));
    EXPECT_FALSE(matches(R"(root ::= [à-ÿ]+)", "a"));
    // A negated class holds every character outside it, multi-byte ones too, and never a surrogate or bad UTF-8.
    EXPECT_TRUE(matches(R"(root ::= [^a]+)", "\xe4\xb8\xad\xf4\x8f\xbf\xbf"));  // U+4E2D, U+10FFFF
    EXPECT_FALSE(matches(R"(root ::= [^a]+)", "\xed\xa0\x80"));                 // a surrogate's encoding
    EXPECT_FALSE(matches(R"(root ::= [^a]+)", "\xc0\x80"));                     // overlong
    EXPECT_FALSE(matches(R"(root ::= .)", "\xff"));
    // Half a character is a viable prefix, not a match.
    EXPECT_TRUE(viable_prefix(R"(root ::= "é")", "\xc3"));
    EXPECT_FALSE(matches(R"(root ::= "é")", "\xc3"));
}

TEST(GrammarParse, ErrorsNameTheLineAndTheProblem) {
    EXPECT_NE(parse_error("root ::= foo\n").find("line 1 column 10: rule 'foo' is used but not defined"),
              std::string::npos)
        << parse_error("root ::= foo\n");
    EXPECT_NE(parse_error("start ::= \"a\"").find("no rule named 'root'"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"abc").find("line 1"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"abc").find("unterminated string literal"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
    EXPECT_NE(parse_error("root ::= (\"a\"").find("unbalanced '('"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\" )").find("unbalanced ')'"), std::string::npos);
    EXPECT_NE(parse_error("root ::= [z-a]").find("backwards"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\"{5,2}").find("backwards"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\"{20000}").find("limited to"), std::string::npos);
    EXPECT_NE(parse_error("root ::= <think>").find("token references"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"a\"**").find("cannot be repeated directly"), std::string::npos);
    EXPECT_NE(parse_error("root ::= \"\\uD800\"").find("not a character"), std::string::npos);
    EXPECT_NE(parse_error("\n\nroot ::= x\nx ::= \"a\" | !").find("line 4 column 13: unexpected '!'"), std::string::npos)
        << parse_error("\n\nroot ::= x\nx ::= \"a\" | !");
}

TEST(GrammarParse, LeftRecursionIsRefusedRightRecursionTaken) {
    EXPECT_NE(parse_error("root ::= root \"a\" | \"b\"").find("'root' is left-recursive"), std::string::npos);
    EXPECT_NE(parse_error("root ::= x \"a\"\nx ::= y | \"b\"\ny ::= root \"c\"").find("left-recursive"),
              std::string::npos);
    // Through an empty-able rule.
    EXPECT_NE(parse_error("root ::= e root \"a\" | \"b\"\ne ::= \"x\"?").find("left-recursive"), std::string::npos);
    EXPECT_TRUE(matches("root ::= \"a\" root | \"b\"", "aaab"));
    // Repeating something that may be empty loops on the same stacks only: taken.
    EXPECT_TRUE(matches(R"(root ::= ("a"?)* "b")", "aab"));
    EXPECT_TRUE(matches(R"(root ::= ("a" | "")* "b")", "b"));
}

TEST(GrammarParse, UncompletableRulesArePrunedOrRefused) {
    EXPECT_NE(parse_error("root ::= \"a\" root").find("can never be completed"), std::string::npos);
    // A branch into a rule that never ends is removed, so a matcher can never walk into it.
    const std::string g = "root ::= \"a\" | \"b\" trap\ntrap ::= \"c\" trap";
    EXPECT_TRUE(matches(g, "a"));
    EXPECT_FALSE(viable_prefix(g, "b"));
}

// ---- matching ------------------------------------------------------------------------------------------------

TEST(GrammarMatch, TailRecursionRunsInConstantSpace) {
    Matcher m(Grammar::parse("root ::= item*\nitem ::= \"a\" | \"bc\""), byte_vocab());
    std::string text;
    for (int i = 0; i < 20000; i++) text += i % 3 ? "a" : "bc";
    ASSERT_TRUE(m.accept_bytes(text));
    EXPECT_TRUE(m.can_end());
    EXPECT_LT(m.space().n_nodes(), 50u);
    EXPECT_LT(m.space().n_states(), 50u);
}

TEST(GrammarMatch, DeepNestingStopsAtTheDepthLimit) {
    MatchLimits lim;
    lim.max_depth = 100;
    Matcher m(Grammar::parse("root ::= \"(\" root \")\" | \"\""), byte_vocab(), lim);
    EXPECT_TRUE(m.accept_bytes(std::string(50, '(') + std::string(50, ')')));
    m.reset();
    EXPECT_FALSE(m.accept_bytes(std::string(500, '(')));  // refused past the limit, nothing else happens
    EXPECT_TRUE(m.space().depth_limited());
}

TEST(GrammarMatch, AmbiguityIsBoundedOrRefused) {
    // Duplicate derivations share stacks.
    Matcher dup(Grammar::parse(R"(root ::= ("a" | "a" | [a])*)"), byte_vocab());
    ASSERT_TRUE(dup.accept_bytes(std::string(5000, 'a')));
    EXPECT_LT(dup.space().n_states(), 10u);
    // Every split of a run into x's: the stacks multiply with the nesting until the limit says no.
    MatchLimits lim;
    lim.max_stacks = 64;
    Matcher blow(Grammar::parse("root ::= x*\nx ::= \"a\" | \"a\" x \"b\""), byte_vocab(), lim);
    EXPECT_THROW(blow.accept_bytes(std::string(200, 'a')), GrammarError);
}

TEST(GrammarMatch, TokensSpanTerminalsAndSplitCharacters) {
    // Tokens: "ab", "a", "b", the two bytes of é apart, é whole, "é!" and an end token.
    auto v = Vocabulary::from_tokens({"ab", "a", "b", "\xc3", "\xa9", "\xc3\xa9", "\xc3\xa9!", "!", ""}, {8});
    Matcher m(Grammar::parse(R"(root ::= "a" "b" [é] "!"?)"), v);
    const TokenMask *mask = m.allowed();
    EXPECT_TRUE(mask->test(0));   // "ab" spans two terminals
    EXPECT_TRUE(mask->test(1));   // "a"
    EXPECT_FALSE(mask->test(2));  // "b"
    EXPECT_FALSE(mask->test(8));  // not the end yet
    m.accept(0);
    mask = m.allowed();
    EXPECT_TRUE(mask->test(3));   // the first byte of é
    EXPECT_FALSE(mask->test(4));  // its second byte alone
    EXPECT_TRUE(mask->test(5));
    EXPECT_TRUE(mask->test(6));  // é then "!"
    m.accept(3);
    mask = m.allowed();
    EXPECT_TRUE(mask->test(4));
    EXPECT_FALSE(mask->test(3));
    EXPECT_FALSE(mask->test(8));  // half a character cannot end
    m.accept(4);
    mask = m.allowed();
    EXPECT_TRUE(mask->test(8));  // "!" is optional: the end may come
    EXPECT_TRUE(mask->test(7));
    m.accept(7);
    mask = m.allowed();
    EXPECT_TRUE(m.ended());
    for (int32_t id = 0; id < 8; id++) EXPECT_FALSE(mask->test(id)) << id;  // only the end
    EXPECT_TRUE(mask->test(8));
    EXPECT_THROW(m.accept(1), GrammarError);
    m.accept(8);
    EXPECT_TRUE(m.finished());
}

TEST(GrammarMatch, NoAllowedTokenIsAnErrorNotACrash) {
    auto v = Vocabulary::from_tokens({"a", "b", ""}, {2});
    Matcher m(Grammar::parse(R"(root ::= "c")"), v);
    EXPECT_THROW(m.allowed(), GrammarError);
}

namespace {
// The mask against the definition: a token is allowed when its bytes go on from the state (and the end where the
// grammar may end).
void expect_mask_is_exact(Matcher &m) {
    const TokenMask mask = *m.allowed();
    const Vocabulary &v = m.vocab();
    for (int32_t id = 0; id < v.n_vocab(); id++) {
        bool want;
        if (v.is_eog(id)) {
            want = m.can_end();
        } else if (v.bytes(id).empty()) {
            want = false;
        } else {
            int32_t s = m.state();
            want = true;
            for (unsigned char c : v.bytes(id))
                if ((s = m.space().next(s, c)) == StateSpace::kDead) {
                    want = false;
                    break;
                }
        }
        ASSERT_EQ(mask.test(id), want) << "token " << id << " '" << v.bytes(id) << "'";
    }
}
}  // namespace

TEST(GrammarMatch, MaskEqualsTheTokenByTokenDefinitionOnRandomVocabularies) {
    std::mt19937 rng(7);
    const std::string alphabet = "{}[]\":, \n0123456789.-eEtrufalsn\\abc\xc3\xa9";
    auto g = Grammar::parse(json_object_gbnf());
    for (int round = 0; round < 20; round++) {
        std::vector<std::string> tokens;
        for (int i = 0; i < 400; i++) {
            std::string t;
            const int len = 1 + int(rng() % 5);
            for (int k = 0; k < len; k++) t += alphabet[rng() % alphabet.size()];
            tokens.push_back(t);
        }
        for (int b = 0; b < 256; b++) tokens.push_back(std::string(1, char(b)));  // every byte reachable
        tokens.push_back("");
        auto v = Vocabulary::from_tokens(tokens, {int32_t(tokens.size() - 1)});
        Matcher m(g, v);
        // Walk a random allowed path, checking the mask at every step.
        for (int step = 0; step < 40 && !m.finished(); step++) {
            expect_mask_is_exact(m);
            const TokenMask *mask = m.allowed();
            std::vector<int32_t> ok;
            for (int32_t id = 0; id < v->n_vocab(); id++)
                if (mask->test(id)) ok.push_back(id);
            ASSERT_FALSE(ok.empty());
            m.accept(ok[rng() % ok.size()]);
        }
    }
}

TEST(GrammarMatch, RebuildingTheTablesChangesNoMask) {
    // A matcher whose tables are rebuilt at almost every token gives the masks of one that never rebuilds.
    auto g = Grammar::parse(json_object_gbnf());
    MatchLimits tight;
    tight.max_states = 8;
    tight.max_nodes = 64;
    Matcher a(g, byte_vocab()), b(g, byte_vocab(), tight);
    const std::string text = R"({"k": [1, {"x": "é\"z"}, -2.5e3], "n": null, "t" : true})";
    for (unsigned char c : text) {
        ASSERT_EQ(a.allowed()->words, b.allowed()->words) << "before '" << c << "'";
        a.accept(c);
        b.accept(c);
    }
    EXPECT_TRUE(b.can_end());
    EXPECT_GT(b.stats().rebuilds, 0u);
}

TEST(GrammarMatch, MasksAreCachedByState) {
    Matcher m(Grammar::parse(json_object_gbnf()), byte_vocab());
    m.accept_bytes("{\"abc");
    const TokenMask first = *m.allowed();
    const uint64_t hits = m.stats().mask_cache_hits;
    m.accept('d');  // inside the same string: the same state
    EXPECT_EQ(m.allowed()->words, first.words);
    EXPECT_EQ(m.stats().mask_cache_hits, hits + 1);
}

// ---- triggered constraints -------------------------------------------------------------------------------------

namespace {
struct Vocab {
    std::vector<std::string> t;
    int32_t id(const std::string &s) {
        for (size_t i = 0; i < t.size(); i++)
            if (t[i] == s) return int32_t(i);
        t.push_back(s);
        return int32_t(t.size() - 1);
    }
};
}  // namespace

TEST(GrammarConstraint, TriggerStartsTheGrammarUntilItIsComplete) {
    Vocab w;
    for (int b = 1; b < 256; b++) w.id(std::string(1, char(b)));
    const int32_t call = w.id("<call>"), x = w.id("x"), y = w.id("y"), end_call = w.id("</call>"),
                  call_x = w.id("<call>x"), call_y = w.id("<call>y"), think = w.id("<think>"), unthink = w.id("</think>"),
                  eog = w.id("");
    auto v = Vocabulary::from_tokens(w.t, {eog});
    ConstraintSpec spec{Grammar::parse(R"(root ::= "x"+ "</call>")"), "<call>", false, "test"};
    auto c = make_constraint(spec, v);
    // Free: anything, the end too; but a token that opens the call and goes on wrongly is not.
    EXPECT_TRUE(c->allows(y));
    EXPECT_TRUE(c->allows(eog));
    EXPECT_TRUE(c->allows(call_x));
    EXPECT_FALSE(c->allows(call_y));
    EXPECT_FALSE(c->allowed()->test(call_y));
    EXPECT_TRUE(c->allowed()->test(call_x));
    c->accept(y);
    c->accept(call);
    // Inside: only the grammar.
    EXPECT_FALSE(c->allows(y));
    EXPECT_FALSE(c->allows(eog));
    EXPECT_FALSE(c->allowed()->test(y));
    EXPECT_TRUE(c->allowed()->test(x));
    EXPECT_THROW(c->accept(y), GrammarError);
    c->accept(x);
    c->accept(x);
    c->accept(end_call);
    // Complete: free again.
    EXPECT_TRUE(c->allows(y));
    EXPECT_TRUE(c->allows(eog));
    // Spelled byte by byte, the trigger counts too.
    for (char ch : std::string("<call")) c->accept(w.id(std::string(1, ch)));
    c->accept(w.id(">"));
    EXPECT_FALSE(c->allows(y));
    c->accept(x);
    c->accept(end_call);
    // Inside a reasoning block a trigger is only text.
    c->accept(think);
    c->accept(call);
    EXPECT_TRUE(c->allows(y));
    c->accept(y);
    c->accept(unthink);
    c->accept(call);
    EXPECT_FALSE(c->allows(y));
}

TEST(GrammarConstraint, OutputThatBeginsInReasoning) {
    Vocab w;
    const int32_t call = w.id("<call>"), x = w.id("x"), y = w.id("y"), unthink = w.id("</think>"), eog = w.id("");
    auto v = Vocabulary::from_tokens(w.t, {eog});
    auto c = make_constraint({Grammar::parse(R"(root ::= "x")"), "<call>", true, "test"}, v);
    c->accept(call);  // still reasoning
    EXPECT_TRUE(c->allows(y));
    c->accept(unthink);
    c->accept(call);
    EXPECT_FALSE(c->allows(y));
    EXPECT_TRUE(c->allows(x));
}

// ---- the sampler ---------------------------------------------------------------------------------------------

TEST(GrammarSampler, DrawsOnlyAllowedTokensAndTellsTheConstraint) {
    auto v = Vocabulary::from_tokens({"a", "b", "c", "d", ""}, {4});
    auto g = Grammar::parse(R"(root ::= [bc] [bc] "d")");
    std::vector<float> logits = {5.0f, 1.0f, 0.5f, 0.0f, 3.0f};  // "a" and the end are the model's favourites
    // Greedy: the best allowed token.
    SamplerParams gp;
    gp.temperature = 0;
    Sampler greedy(gp, std::make_unique<Matcher>(g, v));
    std::vector<int32_t> out;
    for (int i = 0; i < 4; i++) out.push_back(greedy.sample(logits.data(), 5, out));
    EXPECT_EQ(out, (std::vector<int32_t>{1, 1, 3, 4}));
    // The logprobs stay the model's (before the mask).
    EXPECT_NEAR(greedy.last_logprobs()[0] - greedy.last_logprobs()[4], 2.0f, 1e-5);
    // Sampling, many seeds: never a disallowed token, and both allowed letters come up.
    int counts[5] = {0, 0, 0, 0, 0};
    for (uint64_t seed = 0; seed < 300; seed++) {
        SamplerParams sp;
        sp.temperature = 1.0f;
        sp.top_k = 0;
        sp.top_p = 1.0f;
        sp.min_p = 0.0f;
        sp.seed = seed;
        Sampler s(sp, std::make_unique<Matcher>(g, v));
        std::vector<int32_t> h;
        for (int i = 0; i < 4; i++) h.push_back(s.sample(logits.data(), 5, h));
        ASSERT_TRUE((h[0] == 1 || h[0] == 2) && (h[1] == 1 || h[1] == 2) && h[2] == 3 && h[3] == 4) << seed;
        counts[h[0]]++;
    }
    EXPECT_GT(counts[1], counts[2]);  // b's logit is higher
    EXPECT_GT(counts[2], 30);
    // Nothing allowed: an error, not a pick.
    Sampler dead(gp, std::make_unique<Matcher>(Grammar::parse(R"(root ::= "e")"), v));
    std::vector<int32_t> h;
    EXPECT_THROW(dead.sample(logits.data(), 5, h), Error);
}

// ---- the real Qwen vocabulary ----------------------------------------------------------------------------------

namespace {
std::unique_ptr<Tokenizer> qwen_tokenizer() {
    const auto path = std::filesystem::path(STRATA_SHARED_DIR) / "testdata/vocab/ggml-vocab-qwen2.gguf";
    if (!std::filesystem::exists(path)) return nullptr;
    static std::unique_ptr<GgufFile> file = GgufFile::open(path.string());
    return Tokenizer::from_gguf(*file);
}
}  // namespace

class QwenGrammar : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        tok_ = qwen_tokenizer().release();
        if (tok_) vocab_ = new std::shared_ptr<const Vocabulary>(Vocabulary::from_tokenizer(*tok_));
    }
    static void TearDownTestSuite() {
        delete vocab_;
        delete tok_;
    }
    void SetUp() override {
        if (!tok_) GTEST_SKIP() << "shared test data not found at " << STRATA_SHARED_DIR << "/testdata/vocab";
    }
    static Tokenizer *tok_;
    static std::shared_ptr<const Vocabulary> *vocab_;
};
Tokenizer *QwenGrammar::tok_ = nullptr;
std::shared_ptr<const Vocabulary> *QwenGrammar::vocab_ = nullptr;

TEST_F(QwenGrammar, MaskIsExactAlongATokenizedDocument) {
    const json schema = json::parse(R"({"type": "object", "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "score": {"type": "number"}}, "required": ["name", "tags", "score"]})");
    Matcher m(Grammar::parse(json_schema_gbnf(schema)), *vocab_);
    const std::string doc = R"({"name": "Zoë \"Z\" Ω", "tags": ["a", "中文"], "score": -12.5})";
    const std::vector<int32_t> ids = tok_->encode(doc, false, false);
    for (int32_t id : ids) {
        expect_mask_is_exact(m);
        ASSERT_TRUE(m.allowed()->test(id)) << "'" << tok_->token_text(id) << "'";
        m.accept(id);
    }
    EXPECT_TRUE(m.can_end());
    EXPECT_TRUE(m.allowed()->test(tok_->eos()));
    expect_mask_is_exact(m);
}

TEST_F(QwenGrammar, RandomGenerationIsValidJsonAndRespectsTheVocabulary) {
    // Draw uniformly among the allowed tokens (a model that says nothing useful) until the end.
    auto g = Grammar::parse(json_object_gbnf());
    std::mt19937 rng(11);
    for (int doc = 0; doc < 5; doc++) {
        Matcher m(g, *vocab_);
        std::vector<int32_t> out;
        while (!m.finished() && out.size() < 400) {
            const TokenMask *mask = m.allowed();
            std::vector<int32_t> ok;
            for (int32_t id = 0; id < (*vocab_)->n_vocab(); id++)
                if (mask->test(id)) ok.push_back(id);
            ASSERT_FALSE(ok.empty());
            // Ending is the likeliest once allowed, so documents stay short.
            int32_t pick = ok[rng() % ok.size()];
            if (m.can_end() && rng() % 2) pick = tok_->eos();
            if (!(*vocab_)->is_eog(pick) && out.size() > 200 && m.allows(tok_->encode("}", false, false)[0]))
                pick = tok_->encode("}", false, false)[0];
            m.accept(pick);
            out.push_back(pick);
        }
        if (!m.finished()) continue;  // a long one: the length cap, not a failure
        out.pop_back();
        const std::string text = tok_->decode(out);
        EXPECT_FALSE(json::parse(text, nullptr, false).is_discarded()) << text;
        EXPECT_TRUE(json::parse(text).is_object()) << text;
    }
}

TEST_F(QwenGrammar, ControlTokensAreNeverAllowed) {
    Matcher m(Grammar::parse(R"(root ::= "<|im_start|>" | [a-z]+)"), *vocab_);
    const int32_t im_start = tok_->find_token("<|im_start|>");
    ASSERT_GE(im_start, 0);
    EXPECT_FALSE(m.allowed()->test(im_start));  // the text may be spelled out, the control token never
    EXPECT_TRUE(m.allows(tok_->encode("<", false, false)[0]));
}

// ---- request fields -> constraints (server/constraint_fields.h) ------------------------------------------------

namespace {
// Feeds text through a constraint over the byte vocabulary; false at the first byte it refuses.
bool feed(TokenConstraint &c, std::string_view text) {
    for (unsigned char b : text) {
        if (!c.allows(b)) return false;
        c.accept(b);
    }
    return true;
}
}  // namespace

TEST(GrammarRequests, StrictToolCallsInBothFormats) {
    const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
        "required": ["city"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])");
    const server::OutputFormat none;
    // JSON calls (Qwen3), triggered by <tool_call>, reasoning free.
    auto spec = server::chat_constraint(none, tools, server::ToolFormat::Json, false, "", false);
    ASSERT_TRUE(spec);
    EXPECT_EQ(spec->trigger, "<tool_call>");
    auto c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                         "\"days\": 3}}\n</tool_call> and <tool_call>{\"name\": \"get_time\", \"arguments\": "
                         "{\"zone\": [1]}}</tool_call>"));
    EXPECT_TRUE(c->allows(256));
    c = make_constraint(*spec, byte_vocab());
    EXPECT_FALSE(feed(*c, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}"));  // city required
    c = make_constraint(*spec, byte_vocab());
    EXPECT_FALSE(feed(*c, "<tool_call>\n{\"name\": \"get_wether\""));  // only the tools' names
    c = make_constraint(*spec, byte_vocab());
    EXPECT_FALSE(feed(*c, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 8}"));
    // XML calls (Qwen3-Coder), values as the output parser types them.
    spec = server::chat_constraint(none, tools, server::ToolFormat::Xml, false, "", true);
    c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "thinking <tool_call> is text here</think>\n<tool_call>\n<function=get_weather>\n"
                         "<parameter=city>\nNew <York>\n</parameter>\n<parameter=days>\n7\n</parameter>\n"
                         "</function>\n</tool_call>"));
    c = make_constraint(*spec, byte_vocab());
    EXPECT_FALSE(feed(*c, "</think><tool_call>\n<function=get_weather>\n<parameter=days>\n"));  // city first
    // A forced call: the rest after the opening the prompt wrote.
    spec = server::chat_constraint(none, tools, server::ToolFormat::Json, true, "get_weather", false);
    ASSERT_TRUE(spec);
    EXPECT_TRUE(spec->trigger.empty());
    c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "{\"city\": \"Oslo\"}}\n</tool_call>"));
    EXPECT_TRUE(c->allows(256));
    spec = server::chat_constraint(none, tools, server::ToolFormat::Json, true, "", false);  // required, two tools
    c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "get_time\", \"arguments\": {}}</tool_call>"));
    spec = server::chat_constraint(none, tools, server::ToolFormat::Xml, true, "", false);
    c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"));
    // Not strict and not forced: no constraint; a named tool that is not strict: none either.
    const json loose = json::array({tools[1]});
    EXPECT_FALSE(server::chat_constraint(none, loose, server::ToolFormat::Json, false, "", false));
    EXPECT_FALSE(server::chat_constraint(none, tools, server::ToolFormat::Json, true, "get_time", false));
}

TEST(GrammarRequests, FormatAndToolsTogether) {
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "f",
        "strict": true, "parameters": {"type": "object", "properties": {"x": {"type": "boolean"}},
        "required": ["x"], "additionalProperties": false}}}])");
    const server::OutputFormat f = server::parse_output_format(json::parse(
        R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}})"));
    auto spec = server::chat_constraint(f, tools, server::ToolFormat::Json, false, "", false);
    ASSERT_TRUE(spec && spec->trigger.empty());
    auto c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "42"));
    EXPECT_TRUE(c->allows(256));
    c = make_constraint(*spec, byte_vocab());
    EXPECT_TRUE(feed(*c, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": true}}\n</tool_call>"));
    EXPECT_TRUE(c->allows(256));
    c = make_constraint(*spec, byte_vocab());
    EXPECT_FALSE(feed(*c, "\"text\""));
}
