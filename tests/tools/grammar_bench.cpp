// The grammar engine's cost per token on a real vocabulary: a JSON document is tokenized with the model's
// tokenizer and replayed through a fresh matcher (as one request would run), timing the mask the sampler needs before
// each token (allowed()), the one-token check a greedy pick makes first (allows()) and accept().
//   grammar_bench VOCAB.gguf [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include <random>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::grammar;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Figures {
    std::vector<double> mask_us, check_us;
    Matcher::Stats stats;
};

Figures replay(const std::shared_ptr<const Grammar> &g, const std::shared_ptr<const Vocabulary> &v,
               const std::vector<int32_t> &ids, int32_t eos) {
    Figures f;
    Matcher m(g, v);
    std::vector<int32_t> all = ids;
    all.push_back(eos);
    for (int32_t id : all) {
        auto t0 = Clock::now();
        const TokenMask *mask = m.allowed();
        f.mask_us.push_back(us_since(t0));
        if (!mask->test(id)) {
            std::fprintf(stderr, "token %d is not allowed: the document does not fit the grammar\n", id);
            std::exit(1);
        }
        t0 = Clock::now();
        const bool ok = m.allows(id);
        f.check_us.push_back(us_since(t0));
        if (!ok) std::exit(1);
        m.accept(id);
    }
    f.stats = m.stats();
    return f;
}

void report(const char *name, const std::vector<Figures> &runs, size_t n_tokens) {
    std::vector<double> mask, check;
    for (const Figures &f : runs) {
        mask.insert(mask.end(), f.mask_us.begin(), f.mask_us.end());
        check.insert(check.end(), f.check_us.begin(), f.check_us.end());
    }
    auto pct = [](std::vector<double> x, double p) {
        std::sort(x.begin(), x.end());
        return x[std::min(x.size() - 1, size_t(p * double(x.size())))];
    };
    double sum = 0;
    for (double x : mask) sum += x;
    const Matcher::Stats &s = runs[0].stats;
    std::printf("| %s | %zu | %.1f | %.1f | %.1f | %.0f | %.2f | %llu / %llu | %.0f |\n", name, n_tokens,
                sum / double(mask.size()), pct(mask, 0.5), pct(mask, 0.99), *std::max_element(mask.begin(), mask.end()),
                pct(check, 0.5), (unsigned long long)s.masks, (unsigned long long)(s.masks + s.mask_cache_hits),
                s.masks ? double(s.trie_nodes_visited) / double(s.masks) : 0.0);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: grammar_bench VOCAB.gguf [repeats]\n");
        return 2;
    }
    const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
    auto file = GgufFile::open(argv[1]);
    auto tok = Tokenizer::from_gguf(*file);
    auto t0 = Clock::now();
    auto vocab = Vocabulary::from_tokenizer(*tok);
    std::printf("vocabulary: %lld tokens, trie of %zu nodes (longest token %zu bytes), built in %.1f ms\n\n",
                (long long)vocab->n_vocab(), vocab->n_nodes(), vocab->max_depth(), us_since(t0) / 1e3);

    const json schema = json::parse(R"({
      "type": "object",
      "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,}$"},
        "born": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city"],
                    "additionalProperties": false},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "score": {"type": "number"},
        "notes": {"type": ["string", "null"]}
      },
      "required": ["name", "age", "tags", "address", "role"],
      "additionalProperties": false})");
    const std::string doc = R"({"name": "Ada Lovelace", "age": 36, "email": "ada.lovelace@example.org",
  "born": "1815-12-10", "tags": ["mathematician", "writer", "analyst", "Zürich 中文"],
  "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"}, "role": "editor",
  "score": 97.25, "notes": "Wrote the first published algorithm for Babbage's Analytical Engine, with notes longer than the paper they annotated: \"the engine might compose elaborate pieces of music\"."})";
    const std::vector<int32_t> ids = tok->encode(doc, false, false);

    t0 = Clock::now();
    auto g_schema = Grammar::parse(json_schema_gbnf(schema));
    const double schema_ms = us_since(t0) / 1e3;
    t0 = Clock::now();
    auto g_object = Grammar::parse(json_object_gbnf());
    const double object_ms = us_since(t0) / 1e3;
    std::printf("grammars compiled: json_schema %.2f ms, json_object %.2f ms; document: %zu tokens\n\n", schema_ms,
                object_ms, ids.size());

    std::printf("| grammar | tokens | mask mean µs | p50 | p99 | max | allows() p50 µs | masks computed / asked | "
                "trie nodes per computed mask |\n|---|---|---|---|---|---|---|---|---|\n");
    for (auto [name, g] : {std::pair{"json_schema", g_schema}, std::pair{"json_object", g_object}}) {
        std::vector<Figures> runs;
        for (int r = 0; r < repeats; r++) runs.push_back(replay(g, vocab, ids, tok->eos()));
        report(name, runs, ids.size() + 1);
    }

    // Whole sampling steps: random logits, temperature 1 with top-k 40 (and greedy), with and without the
    // json_schema constraint, over up to 200 tokens of a generation that the constraint steers.
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> logits(size_t(vocab->n_vocab()));
    for (float &x : logits) x = nd(rng);
    std::printf("\n| sampling step (150k vocabulary, random logits) | tokens | µs per token |\n|---|---|---|\n");
    for (float temp : {1.0f, 0.0f})
        for (bool constrained : {false, true}) {
            SamplerParams sp;
            sp.temperature = temp;
            sp.top_k = 40;
            sp.seed = 3;
            std::unique_ptr<TokenConstraint> c;
            if (constrained) c = make_constraint({g_schema, "", false, "bench"}, vocab);
            Sampler sampler(sp, std::move(c));
            std::vector<int32_t> hist;
            auto t1 = Clock::now();
            for (int i = 0; i < 200; i++) {
                const int32_t tok = sampler.sample(logits.data(), vocab->n_vocab(), hist);
                hist.push_back(tok);
                if (vocab->is_eog(tok)) break;
                std::rotate(logits.begin(), logits.begin() + 7919, logits.end());  // another distribution next time
            }
            std::printf("| %s, %s | %zu | %.0f |\n", temp > 0 ? "temperature 1, top-k 40" : "greedy",
                        constrained ? "json_schema constraint" : "no constraint", hist.size(),
                        us_since(t1) / double(hist.size()));
        }
    return 0;
}
