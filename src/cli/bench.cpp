// strata bench: prompt-processing (ppP) and generation (tgN) throughput in the manner of llama-bench, with the
// expert cache's counters beside the rates. It drives the engine as `run` and `serve` do; it does not tokenize
// (prompts are seeded pseudo-random token ids) and does not sample (generation is greedy).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/host/mmvq_host.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "cli/usage.h"
#include "core/error.h"
#include "core/units.h"
#include "format/gguf.h"
#include "runtime/engine.h"

namespace strata::cli {

namespace {

using json = nlohmann::ordered_json;

// Largest -p / -n entry accepted: far beyond any context we can hold, small enough that sizes stay in range.
constexpr int64_t k_max_tokens = int64_t(1) << 24;

struct BenchTest {
    std::string name;      // "pp512", "tg128", "tg128 x4", "tg128 @ d4096"
    int64_t depth = 0;     // context tokens each sequence holds before the test (prefilled, not timed)
    int64_t n_prompt = 0;  // pp: tokens prefilled; tg: the untimed 1-token prompt
    int64_t n_gen = 0;     // tg: tokens decoded one at a time (timed); 0 for pp
    int64_t n_seq = 1;     // tg: sequences decoding together, a token of each per pass
    int64_t timed_tokens() const { return n_gen > 0 ? n_gen * n_seq : n_prompt; }
};

struct TestResult {
    BenchTest test;
    std::vector<double> seconds;  // one per timed repetition
    ExpertCacheStats cache;       // expert-cache counters over the timed parts of the repetitions
};

// "512,4096" -> {512, 4096}; every entry a whole number in [lo, k_max_tokens].
std::vector<int64_t> parse_counts(const std::string &flag, const std::string &s, int64_t lo = 1) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
        item = a == std::string::npos ? "" : item.substr(a, b - a + 1);
        char *end = nullptr;
        const long long v = item.empty() ? 0 : std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0')
            usage_fail("%s: '%s' is not a token count (expected whole numbers >= %lld, comma-separated, e.g. 512,4096)",
                       flag.c_str(), item.c_str(), (long long)lo);
        if (v < lo || v > k_max_tokens)
            usage_fail("%s: %lld is out of range (expected token counts from %lld to %lld)", flag.c_str(), v,
                       (long long)lo, (long long)k_max_tokens);
        out.push_back(v);
    }
    if (out.empty()) usage_fail("%s: no token counts given (expected e.g. 512,4096)", flag.c_str());
    return out;
}

// Every test at every depth, depth by depth (llama-bench's -d): "pp512", "tg128 x4", "tg128 @ d4096".
std::vector<BenchTest> make_tests(const std::vector<int64_t> &prompts, const std::vector<int64_t> &gens, int64_t n_seq,
                                  const std::vector<int64_t> &depths) {
    std::vector<BenchTest> tests;
    for (int64_t d : depths) {
        const std::string at = d > 0 ? strfmt(" @ d%lld", (long long)d) : "";
        for (int64_t p : prompts) tests.push_back({strfmt("pp%lld", (long long)p) + at, d, p, 0, 1});
        for (int64_t n : gens)
            tests.push_back(
                {(n_seq > 1 ? strfmt("tg%lld x%lld", (long long)n, (long long)n_seq) : strfmt("tg%lld", (long long)n)) +
                     at,
                 d, 1, n, n_seq});
    }
    return tests;
}

// The context every test fits in: its depth, then the longest prompt, or a 1-token prompt plus the longest
// generation.
int64_t context_for(const std::vector<BenchTest> &tests) {
    int64_t n_ctx = 1;
    for (const BenchTest &t : tests) n_ctx = std::max(n_ctx, t.depth + t.n_prompt + t.n_gen);
    return n_ctx;
}

// Seeded pseudo-random ids in [0, n_vocab): the same for a given (test, repetition) on every run, different
// between repetitions so that a repetition does not replay the routing its predecessor already cached.
std::vector<int32_t> bench_tokens(int64_t n, int64_t n_vocab, uint64_t seed) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    uint64_t x = seed;
    for (int32_t &id : ids) {
        x += 0x9e3779b97f4a7c15ull;  // splitmix64
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        id = int32_t((z ^ (z >> 31)) % uint64_t(n_vocab));
    }
    return ids;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ExpertCacheStats stats_delta(const ExpertCacheStats &after, const ExpertCacheStats &before) {
    ExpertCacheStats d = after;
    d.expert_cache_hits -= before.expert_cache_hits;
    d.expert_cache_misses -= before.expert_cache_misses;
    d.bytes_streamed -= before.bytes_streamed;
    d.mapped_misses -= before.mapped_misses;
    d.mapped_admitted -= before.mapped_admitted;
    d.favourite_fills -= before.favourite_fills;
    d.decode_modes.alone -= before.decode_modes.alone;
    d.decode_modes.split -= before.decode_modes.split;
    d.decode_modes.switches -= before.decode_modes.switches;
    d.hybrid.host_experts -= before.hybrid.host_experts;
    d.hybrid.host_bytes -= before.hybrid.host_bytes;
    d.hybrid.device_misses -= before.hybrid.device_misses;
    d.hybrid.host_ms -= before.hybrid.host_ms;
    return d;
}

ExpertCacheStats stats_sum(const ExpertCacheStats &a, const ExpertCacheStats &b) {
    ExpertCacheStats s = a;
    s.expert_cache_hits += b.expert_cache_hits;
    s.expert_cache_misses += b.expert_cache_misses;
    s.bytes_streamed += b.bytes_streamed;
    s.mapped_misses += b.mapped_misses;
    s.mapped_admitted += b.mapped_admitted;
    s.favourite_fills += b.favourite_fills;
    s.decode_modes.alone += b.decode_modes.alone;
    s.decode_modes.split += b.decode_modes.split;
    s.decode_modes.switches += b.decode_modes.switches;
    s.hybrid.host_experts += b.hybrid.host_experts;
    s.hybrid.host_bytes += b.hybrid.host_bytes;
    s.hybrid.device_misses += b.hybrid.device_misses;
    s.hybrid.host_ms += b.hybrid.host_ms;
    s.hybrid.host_us_per_expert = b.hybrid.host_us_per_expert;
    s.hybrid.device_us_per_miss = b.hybrid.device_us_per_miss;
    return s;
}

struct RunResult {
    double seconds = 0;
    ExpertCacheStats cache;  // counters over the timed part alone
};

// One run of a test in fresh sequences, after `depth` context tokens each (untimed), timing the prefill up to its
// logits (pp), or the n_gen steps after the untimed prompts (tg), each step a token of every sequence in one call
// (one pass of n_seq rows).
RunResult run_once(Engine &eng, const BenchTest &t, uint64_t seed) {
    std::vector<int32_t> seqs;
    std::vector<SeqInput> step, context;
    for (int64_t s = 0; s < t.n_seq; s++) {
        seqs.push_back(eng.new_sequence());
        const uint64_t sseed = seed + 0x1000003ull * uint64_t(s);
        if (t.depth > 0) context.push_back({seqs.back(), bench_tokens(t.depth, eng.n_vocab(), ~sseed), false});
        step.push_back({seqs.back(), bench_tokens(t.n_prompt, eng.n_vocab(), sseed), false});
    }
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> next;  // tg: each sequence's greedy pick, the arg-max of its last logits
    if (!context.empty()) eng.decode(context, logits);
    if (t.n_gen > 0) eng.decode_argmax(step, next);
    const ExpertCacheStats before = eng.expert_stats();
    const auto t0 = std::chrono::steady_clock::now();
    if (t.n_gen == 0) eng.decode(step, logits);
    if (t.n_gen > 0) {  // greedy decoding, as `strata run` at temperature 0 does it
        for (size_t s = 0; s < step.size(); s++) step[s].tokens = {next[s]};
        eng.decode_greedy(step, t.n_gen, [](int64_t, const std::vector<int32_t> &) { return true; });
    }
    RunResult r{seconds_since(t0), stats_delta(eng.expert_stats(), before)};
    for (int32_t seq : seqs) eng.drop(seq);
    return r;
}

// One untimed warm-up (first-touch costs, cache fill), then the timed repetitions with their counters.
TestResult run_test(Engine &eng, const BenchTest &t, int repetitions, uint64_t test_index) {
    TestResult r{t, {}, {}};
    run_once(eng, t, (test_index << 32) | 0xffffffffu);
    for (int rep = 0; rep < repetitions; rep++) {
        const RunResult run = run_once(eng, t, (test_index << 32) | uint64_t(rep));
        r.seconds.push_back(run.seconds);
        r.cache = stats_sum(r.cache, run.cache);
    }
    return r;
}

// ---- figures -------------------------------------------------------------------------------------------------

std::vector<double> rates(const TestResult &r) {
    std::vector<double> tps;
    for (double s : r.seconds) tps.push_back(double(r.test.timed_tokens()) / s);
    return tps;
}

double mean(const std::vector<double> &v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / double(v.size());
}

// Sample standard deviation (n - 1), as llama-bench reports; 0 for a single sample.
double stdev(const std::vector<double> &v) {
    if (v.size() < 2) return 0.0;
    const double m = mean(v);
    double ss = 0;
    for (double x : v) ss += (x - m) * (x - m);
    return std::sqrt(ss / double(v.size() - 1));
}

double wall_seconds(const TestResult &r) {
    double s = 0;
    for (double x : r.seconds) s += x;
    return s;
}

bool cache_used(const ExpertCacheStats &s) {
    return s.expert_cache_hits + s.expert_cache_misses + s.bytes_streamed + s.hybrid.host_experts > 0;
}

json cache_json(const ExpertCacheStats &s, double seconds) {
    // misses computed on the host are misses too: counted apart from those copied in
    const uint64_t misses = s.expert_cache_misses + s.hybrid.host_experts, lookups = s.expert_cache_hits + misses;
    json j;
    j["hits"] = s.expert_cache_hits;
    j["misses"] = misses;
    j["misses_on_host"] = s.hybrid.host_experts;
    j["misses_mapped"] = s.mapped_misses;      // read in place from the host copy by the device's kernels
    j["mapped_admitted"] = s.mapped_admitted;  // of those, filled into a slot afterwards (admission)
    j["favourite_fills"] = s.favourite_fills;  // experts filled as decoding began, for the prompts' favourites
    // decode-sized passes run by the device alone and split, where both applied (STRATA_DECODE_CHOOSE)
    j["passes_alone"] = s.decode_modes.alone;
    j["passes_split"] = s.decode_modes.split;
    j["hit_rate"] = lookups ? json(double(s.expert_cache_hits) / double(lookups)) : json(nullptr);
    j["cpu_share"] = misses ? json(double(s.hybrid.host_experts) / double(misses)) : json(nullptr);
    j["host_expert_gb_per_s"] = s.hybrid.host_ms > 0 ? double(s.hybrid.host_bytes) / s.hybrid.host_ms / 1e6 : 0.0;
    j["bytes_streamed"] = s.bytes_streamed;
    j["effective_h2d_gb_per_s"] = seconds > 0 ? double(s.bytes_streamed) / seconds / 1e9 : 0.0;
    return j;
}

struct ModelFacts {
    std::string path, name, arch;
    uint64_t size_bytes = 0;
};

ModelFacts model_facts(const Engine &eng, const std::string &path) {
    ModelFacts m;
    m.path = path;
    m.arch = eng.hparams().arch_name;
    const GgufValue *name = eng.model().file->find("general.name");
    m.name = name && name->type == GgufType::STRING ? std::string(name->str) : m.arch;
    m.size_bytes = eng.model().file->file_size();
    return m;
}

// ---- output --------------------------------------------------------------------------------------------------

// "mean ± sd" over the repetitions; the mean alone for one run (a spread of one sample means nothing).
std::string rate_text(const std::vector<double> &tps) {
    return tps.size() > 1 ? strfmt("%.2f ± %.2f", mean(tps), stdev(tps)) : strfmt("%.2f", mean(tps));
}

// Characters on screen of a UTF-8 string (the table has "±"), counting code points.
size_t display_width(const std::string &s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xc0) != 0x80;
    return n;
}

// A markdown table with padded columns; right_align[i] right-aligns column i (numbers).
std::string markdown_table(const std::vector<std::string> &header, const std::vector<bool> &right_align,
                           const std::vector<std::vector<std::string>> &rows) {
    std::vector<size_t> w(header.size(), 3);
    for (size_t c = 0; c < header.size(); c++) w[c] = std::max(w[c], display_width(header[c]));
    for (const auto &row : rows)
        for (size_t c = 0; c < row.size(); c++) w[c] = std::max(w[c], display_width(row[c]));
    auto line = [&](const std::vector<std::string> &cells) {
        std::string s = "|";
        for (size_t c = 0; c < cells.size(); c++) {
            const std::string pad(w[c] - display_width(cells[c]), ' ');
            s += " " + (right_align[c] ? pad + cells[c] : cells[c] + pad) + " |";
        }
        return s + "\n";
    };
    std::string out = line(header) + "|";
    for (size_t c = 0; c < header.size(); c++)
        out += right_align[c] ? " " + std::string(w[c] - 1, '-') + ": |" : " " + std::string(w[c], '-') + " |";
    out += "\n";
    for (const auto &row : rows) out += line(row);
    return out;
}

void print_table(const ModelFacts &m, const std::string &budget, const std::string &routing,
                 const std::vector<TestResult> &results) {
    std::vector<std::vector<std::string>> rows;
    for (const TestResult &r : results) {
        const std::vector<double> tps = rates(r);
        rows.push_back({m.name, format_bytes(m.size_bytes), budget, routing, r.test.name, rate_text(tps)});
    }
    std::fputs(markdown_table({"model", "size", "budget", "routing", "test", "t/s"},
                              {false, true, true, false, false, true}, rows)
                   .c_str(),
               stdout);
}

// What decoding reads of the weights per token, the rate that makes at each tgN's speed, and that rate's share of
// what a device-to-device copy moves (copy_gbs, 0: not measured).
void print_decode_bytes(uint64_t per_token, double copy_gbs, const std::vector<TestResult> &results) {
    std::string text;
    for (const TestResult &r : results)
        if (r.test.n_gen > 0 && r.test.n_seq == 1) {  // a pass of several sequences shares what it reads
            const double gbs = double(per_token) * mean(rates(r)) / 1e9;
            text += strfmt("%s%s %.1f GB/s", text.empty() ? "" : ", ", r.test.name.c_str(), gbs);
            if (copy_gbs > 0) text += strfmt(" (%.1f%%)", 100.0 * gbs / copy_gbs);
        }
    if (text.empty()) return;
    std::printf("\ndecode reads %s of weights per token (k of the routed experts): %s\n",
                format_bytes(per_token).c_str(), text.c_str());
    if (copy_gbs > 0)
        std::printf(
            "(percent of the %.0f GB/s a device-to-device copy moves, read plus written, measured after the "
            "runs)\n",
            copy_gbs);
}

void print_cache_summary(const std::vector<TestResult> &results, const std::string &backend, double upload_gbs) {
    std::vector<std::vector<std::string>> rows;
    for (const TestResult &r : results) {
        if (!cache_used(r.cache)) continue;
        const json j = cache_json(r.cache, wall_seconds(r));
        rows.push_back(
            {r.test.name, strfmt("%llu", (unsigned long long)r.cache.expert_cache_hits),
             strfmt("%llu", (unsigned long long)j["misses"].get<uint64_t>()),
             j["hit_rate"].is_null() ? "-" : strfmt("%.1f%%", 100.0 * j["hit_rate"].get<double>()),
             j["cpu_share"].is_null() ? "-" : strfmt("%.1f%%", 100.0 * j["cpu_share"].get<double>()),
             format_bytes(r.cache.bytes_streamed), strfmt("%.2f", j["effective_h2d_gb_per_s"].get<double>()),
             upload_gbs > 0 ? strfmt("%.0f%%", 100.0 * j["effective_h2d_gb_per_s"].get<double>() / upload_gbs) : "-",
             r.cache.hybrid.host_ms > 0 ? strfmt("%.2f", j["host_expert_gb_per_s"].get<double>()) : "-"});
    }
    std::printf("\n");
    if (rows.empty()) {
        std::printf(
            "expert cache: no lookups and nothing streamed during the timed runs (%s: every expert resident, "
            "or no expert cache)\n",
            backend.c_str());
        return;
    }
    std::printf(
        "expert cache over the timed runs (tests where it changed); on CPU = share of the misses computed on the "
        "host; effective GB/s = bytes streamed host-to-device / wall time of the timed runs; of bus = that over the "
        "pinned host-to-device copy rate below; CPU GB/s = expert bytes the host read / its compute time:\n\n");
    std::fputs(markdown_table(
                   {"test", "hits", "misses", "hit rate", "on CPU", "streamed", "effective GB/s", "of bus", "CPU GB/s"},
                   {false, true, true, true, true, true, true, true, true}, rows)
                   .c_str(),
               stdout);
}

// Device memory after the runs (GPU backends): Strata's allocations, the driver's count (with the CUDA runtime), the
// budget. Null where the backend has no device memory.
json device_memory_json(const Backend &be) {
    Backend::DeviceMemory dm;
    if (!be.device_memory(dm)) return nullptr;
    return {{"allocated_bytes", dm.held},
            {"driver_bytes", dm.driver ? json(dm.driver) : json(nullptr)},
            {"budget_bytes", dm.budget}};
}

// Each participant's (a split model's parts in turn).
void print_device_memory(Engine &eng) {
    for (size_t i = 0; i < eng.n_parts(); i++) {
        Backend::DeviceMemory dm;
        if (!eng.part_backend(i).device_memory(dm)) continue;
        const std::string who = eng.n_parts() > 1 ? strfmt(" (part %zu, %s)", i, eng.part_backend(i).name().c_str()) : "";
        std::printf("%sdevice memory after the runs%s: %s allocated by Strata, %s as the driver counts it, budget %s\n",
                    i ? "" : "\n", who.c_str(), format_bytes(dm.held).c_str(),
                    dm.driver ? format_bytes(dm.driver).c_str() : "unknown", format_bytes(dm.budget).c_str());
    }
}

// STRATA_PREFILL_TIMING=1 / STRATA_DECODE_TIMING=1: the run's prompt or decode-sized passes (warm-up included) by
// MoE layer and phase; null when off.
json timing_json(const std::vector<LayerTiming> &layers) {
    json out = json::array();
    for (const LayerTiming &L : layers) {
        if (L.layer < 0) continue;
        json ph = json::object();
        for (int p = 0; p < k_timing_phases; p++) {
            const PhaseTime &t = L.phase[size_t(p)];
            ph[timing_phase_name(TimingPhase(p))] = {{"host_ms", t.host_ms}, {"device_ms", t.device_ms}};
        }
        out.push_back({{"layer", L.layer}, {"passes", L.passes}, {"tokens", L.tokens}, {"phases", ph}});
    }
    return out.empty() ? json(nullptr) : out;
}

// A split model's participants (null for one): each one's device, layers and budget.
json parts_json(const Engine &eng, const EngineConfig &cfg) {
    if (eng.n_parts() < 2) return nullptr;
    json out = json::array();
    for (size_t i = 0; i < eng.n_parts(); i++) {
        const auto [l0, l1] = eng.part_layers(i);
        const uint64_t b = i < cfg.parts.size() ? cfg.parts[i].vram_budget : 0;
        out.push_back({{"backend", eng.part_backend(i).name()},
                       {"first_layer", l0},
                       {"last_layer", l1 - 1},
                       {"vram_budget_bytes", b ? json(b) : json(nullptr)}});
    }
    return out;
}

// The table's budget column: the budget, one per participant of a split model, or "-".
std::string budget_text(const EngineConfig &cfg) {
    if (cfg.parts.empty()) return cfg.vram_budget ? format_bytes(cfg.vram_budget) : "-";
    std::string s;
    for (const PartConfig &p : cfg.parts) s += (s.empty() ? "" : ",") + (p.vram_budget ? format_bytes(p.vram_budget) : "-");
    return s;
}

json report_json(const ModelFacts &m, const EngineConfig &cfg, const std::string &routing, uint64_t per_token,
                 double copy_gbs, double upload_gbs, const ExpertCacheStats &strata_stats, int repetitions,
                 const std::vector<TestResult> &results, const std::string &backend, const Backend &be) {
    json j;
    j["model"] = {{"path", m.path},
                  {"name", m.name},
                  {"architecture", m.arch},
                  {"size_bytes", m.size_bytes},
                  {"size_gib", double(m.size_bytes) / double(uint64_t(1) << 30)}};
    j["backend"] = backend;
    j["vram_budget_bytes"] = cfg.vram_budget ? json(cfg.vram_budget) : json(nullptr);
    j["n_ctx"] = cfg.n_ctx;
    j["chunk"] = cfg.n_batch;
    j["kv_type"] = kv_type_name(cfg.kv_type);
    j["routing"] = routing;
    {
        const PrefetchStats pf = strata_stats.prefetch;
        j["next_layer_prediction"] =
            pf.picks ? json({{"picks", pf.picks}, {"predicted", pf.predicted}, {"prefetched", pf.prefetched}})
                     : json(nullptr);
        j["next_layer_streamed"] = pf.streamed_next;
        j["next_layer_streamed_used"] = pf.streamed_next_used;
        j["predicted_schedule_recall"] = {{"predicted", pf.recall_predicted}, {"missed", pf.recall_missed}};
        j["auto_schedule_by_cost"] = {{"full", pf.cost_full}, {"predicted", pf.cost_predicted}};
    }
    j["prefill_timing"] = timing_json(strata_stats.timing);
    j["decode_timing"] = timing_json(strata_stats.decode_timing);
    j["decode_weight_bytes_per_token"] = per_token;
    j["device_copy_gb_per_s"] = copy_gbs > 0 ? json(copy_gbs) : json(nullptr);
    j["upload_gb_per_s"] = upload_gbs > 0 ? json(upload_gbs) : json(nullptr);  // pinned host-to-device copies
    j["repetitions"] = repetitions;
    json tests = json::array();
    ExpertCacheStats total;
    double total_s = 0;
    for (const TestResult &r : results) {
        const std::vector<double> tps = rates(r);
        json t;
        t["test"] = r.test.name;
        t["depth"] = r.test.depth;        // context tokens before the test, not timed
        t["n_prompt"] = r.test.n_prompt;  // tg: the 1-token prompt, not timed
        t["n_gen"] = r.test.n_gen;
        t["n_seq"] = r.test.n_seq;
        t["timed_tokens"] = r.test.timed_tokens();
        t["seconds"] = r.seconds;
        t["tokens_per_second"] = tps;
        t["tps_mean"] = mean(tps);
        t["tps_sd"] = stdev(tps);
        t["wall_seconds"] = wall_seconds(r);
        t["expert_cache"] = cache_json(r.cache, wall_seconds(r));
        if (upload_gbs > 0)
            t["expert_cache"]["effective_share_of_upload"] =
                t["expert_cache"]["effective_h2d_gb_per_s"].get<double>() / upload_gbs;
        if (r.test.n_gen > 0 && r.test.n_seq == 1) {
            t["weight_read_gb_per_s"] = double(per_token) * mean(tps) / 1e9;
            if (copy_gbs > 0) t["weight_read_share_of_copy"] = double(per_token) * mean(tps) / 1e9 / copy_gbs;
        }
        tests.push_back(std::move(t));
        total = stats_sum(total, r.cache);
        total_s += wall_seconds(r);
    }
    j["tests"] = std::move(tests);
    j["expert_cache"] = cache_json(total, total_s);
    j["device_memory"] = device_memory_json(be);
    return j;
}

}  // namespace

Run add_bench(CLI::App &app) {
    struct Args {
        std::string model, prompts = "512", gens = "128", depths = "0", kv_type = "f16", routing_trace,
                           routing = "model";
        uint64_t routing_seed = 1;
        DeviceOptions dev;
        int repetitions = 3, threads = 0, parallel = 1;
        int64_t chunk = EngineConfig{}.n_batch;
        bool json = false;
    };
    auto a = std::make_shared<Args>();
    CLI::App *sub = app.add_subcommand("bench", "Measure prompt and generation throughput (llama-bench style)");
    sub->add_option("-m,--model", a->model, "GGUF model file")->required();
    sub->add_option("-p,--n-prompt", a->prompts, "Prompt lengths to prefill, comma-separated (a ppN test each)")
        ->capture_default_str();
    sub->add_option("-n,--n-gen", a->gens, "Generation lengths, comma-separated (a tgN test each)")
        ->capture_default_str();
    sub->add_option("-d,--depth", a->depths,
                    "Context tokens each sequence holds before each test (prefilled, not timed), comma-separated: "
                    "every test runs at every depth")
        ->capture_default_str();
    sub->add_option("--parallel", a->parallel,
                    "Sequences decoding together in the tgN tests (a token of each per pass; t/s counts them all)")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    sub->add_option("-r,--repetitions", a->repetitions, "Timed runs of each test, after one untimed warm-up")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--chunk", a->chunk, "Prompt tokens per forward pass (the engine's batch size)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("-t,--threads", a->threads, "CPU threads (0: all)")->check(threads_range());
    sub->add_option("--kv-type", a->kv_type, "KV cache type: f16, q8_0 or f32")->capture_default_str();
    add_device_options(sub, a->dev);
    add_routing_trace_option(sub, a->routing_trace);
    sub->add_option("--routing", a->routing,
                    "Which experts the tokens go to: model (the router), uniform (seeded draws, k distinct experts "
                    "per token and layer: an expert cache's worst case) or zipf:S (popularity ~ 1/rank^S); the "
                    "weights are the router's for the experts drawn")
        ->capture_default_str();
    sub->add_option("--routing-seed", a->routing_seed, "Seed of the --routing draws")->capture_default_str();
    sub->add_flag("--json", a->json, "Print one JSON object instead of the tables");

    return [a] {
        RouteOverride route;
        try {
            route = parse_route_override(a->routing);
        } catch (const Error &e) {
            usage_fail("%s", e.what());
        }
        route.seed = a->routing_seed;
        const std::vector<BenchTest> tests =
            make_tests(parse_counts("-p/--n-prompt", a->prompts), parse_counts("-n/--n-gen", a->gens), a->parallel,
                       parse_counts("-d/--depth", a->depths, 0));

        EngineConfig cfg;
        cfg.n_threads = a->threads;
        cfg.n_ctx = context_for(tests);
        cfg.n_seq_max = std::max(cfg.n_seq_max, int32_t(a->parallel));
        cfg.n_batch = a->chunk;
        cfg.kv_type = parse_kv_type(a->kv_type);
        apply_device_options(a->dev, cfg);
        std::fprintf(stderr, "strata: loading %s\n", a->model.c_str());
        std::unique_ptr<Engine> eng = make_engine(a->model, cfg);
        const std::string backend = eng->backend().name();
        std::fprintf(stderr, "strata: %s on %s, context %lld, chunk %lld, %d repetition%s\n",
                     eng->hparams().arch_name.c_str(), backend.c_str(), (long long)cfg.n_ctx,
                     (long long)std::min(cfg.n_batch, std::max<int64_t>(eng->plan().chunk_tokens, 1)),
                     a->repetitions, a->repetitions == 1 ? "" : "s");

        if (route.active()) {
            if (eng->hparams().n_expert < 1) usage_fail("--routing: %s has no routed experts", a->model.c_str());
            eng->set_route_override(route);
        }
        const std::string routing = route_override_name(route);
        std::unique_ptr<RoutingTraceWriter> trace = open_routing_trace(a->routing_trace, *eng);
        std::vector<TestResult> results;
        for (size_t i = 0; i < tests.size(); i++) {
            results.push_back(run_test(*eng, tests[i], a->repetitions, uint64_t(i)));
            const std::vector<double> tps = rates(results.back());
            std::fprintf(stderr, "strata: %s: %s t/s\n", tests[i].name.c_str(), rate_text(tps).c_str());
        }
        close_routing_trace(trace, a->routing_trace, *eng);

        const ModelFacts m = model_facts(*eng, a->model);
        const double copy_gbs = eng->backend().copy_rate_gbs();
        // The bus, measured where anything crossed it.
        const bool streamed =
            std::any_of(results.begin(), results.end(), [](const TestResult &r) { return r.cache.bytes_streamed > 0; });
        const double upload_gbs = streamed ? eng->backend().upload_rate_gbs() : 0.0;
        if (a->json) {
            json j = report_json(m, cfg, routing, decode_weight_bytes(eng->model()), copy_gbs, upload_gbs,
                                 eng->expert_stats(), a->repetitions, results, backend, eng->backend());
            j["parts"] = parts_json(*eng, cfg);
            std::printf("%s\n", j.dump(2).c_str());
            return 0;
        }
        print_table(m, budget_text(cfg), routing, results);
        print_decode_bytes(decode_weight_bytes(eng->model()), copy_gbs, results);
        const PrefetchStats pf = eng->expert_stats().prefetch;
        if (pf.picks)
            std::printf(
                "\nnext-layer prediction (STRATA_DECODE_PREFETCH): %.1f%% of %llu routed picks predicted, %llu "
                "experts filled ahead\n",
                100.0 * double(pf.predicted) / double(pf.picks), (unsigned long long)pf.picks,
                (unsigned long long)pf.prefetched);
        if (pf.streamed_next) {
            std::printf(
                "\nfull or predicted prefill schedule (STRATA_PREFILL_SCHEDULE): %llu experts filled ahead of their "
                "layer's routing, %llu of them then routed to",
                (unsigned long long)pf.streamed_next, (unsigned long long)pf.streamed_next_used);
            if (pf.recall_predicted + pf.recall_missed)
                std::printf("; the predicted schedule filled %llu of the %llu routed experts without a slot (recall "
                            "%.1f%%: auto's line at %.3f of a layer's experts)",
                            (unsigned long long)pf.recall_predicted,
                            (unsigned long long)(pf.recall_predicted + pf.recall_missed),
                            100.0 * double(pf.recall_predicted) / double(pf.recall_predicted + pf.recall_missed),
                            full_share_threshold(double(pf.recall_predicted) /
                                                 double(pf.recall_predicted + pf.recall_missed)));
            if (pf.cost_full + pf.cost_predicted)
                std::printf("; by the measured rates (STRATA_PREFILL_COST) %llu layers full, %llu predicted",
                            (unsigned long long)pf.cost_full, (unsigned long long)pf.cost_predicted);
            std::printf("\n");
        }
        print_cache_summary(results, backend, upload_gbs);
        if (upload_gbs > 0)
            std::printf("\npinned host-to-device copies: %.1f GB/s (measured after the runs)\n", upload_gbs);
        const ExpertCacheStats st = eng->expert_stats();
        if (st.loans)
            std::printf(
                "\nprompt loans: %llu, %.0f expert slots lent on average (at most %lld) as scratch to passes of "
                "%lld-%lld tokens\n",
                (unsigned long long)st.loans, double(st.loaned_slots) / double(st.loans), (long long)st.loan_slots,
                (long long)eng->plan().resident_chunk_tokens + 1, (long long)eng->plan().chunk_tokens);
        if (st.mapped_misses)
            std::printf(
                "\nmapped misses (STRATA_DECODE_MAPPED): %llu read in place from host memory by the device's kernels "
                "since start, %llu of them filled into a slot afterwards (admission, STRATA_DECODE_ADMIT)\n",
                (unsigned long long)st.mapped_misses, (unsigned long long)st.mapped_admitted);
        if (st.favourite_fills)
            std::printf("\nprompt favourites (STRATA_PROMPT_FAVOURITES): %llu experts filled as decoding began, for "
                        "the experts the prompts routed most rows to, since start\n",
                        (unsigned long long)st.favourite_fills);
        if (st.decode_modes.alone + st.decode_modes.split)
            std::printf(
                "\ndecode mode (STRATA_DECODE_CHOOSE, by measured time): %llu passes by the device alone (misses read "
                "in place), %llu split with the host (misses copied in), %llu switches, since start\n",
                (unsigned long long)st.decode_modes.alone, (unsigned long long)st.decode_modes.split,
                (unsigned long long)st.decode_modes.switches);
        if (st.hybrid.host_experts) {
            const MmvqHostTiming ht = mmvq_host_timing();
            std::printf(
                "\nhost-computed misses: %llu, at %.1f GB/s of expert bytes while computing; mat-vec form %s "
                "(256 Q4_K rows of 2048: AVX2 %.1f us, AVX-512 %s); %llu layers' rows handed over at the host's "
                "signal (STRATA_DECODE_HANDOFF), %llu layers' fills issued early (STRATA_DECODE_EARLY_FILLS)\n",
                (unsigned long long)st.hybrid.host_experts,
                st.hybrid.host_ms > 0 ? double(st.hybrid.host_bytes) / st.hybrid.host_ms / 1e6 : 0.0,
                cpu_isa_name(mmvq_host_form()), ht.avx2_us,
                ht.avx512_us > 0 ? strfmt("%.1f us", ht.avx512_us).c_str() : "not run here",
                (unsigned long long)st.hybrid.handoffs, (unsigned long long)st.hybrid.early_fills);
        }
        if (const uint64_t n = eng->backend().scratch_overflows())
            std::printf("\nscratch outgrew the plan %llu times (each an allocation during a pass)\n",
                        (unsigned long long)n);
        print_device_memory(*eng);
        if (!st.timing.empty()) std::printf("\n%s", timing_table(st.timing, TimingKind::Prompt).c_str());
        if (!st.decode_timing.empty())
            std::printf("\n%s", timing_table(st.decode_timing, TimingKind::Decode).c_str());
        return 0;
    };
}

}  // namespace strata::cli
