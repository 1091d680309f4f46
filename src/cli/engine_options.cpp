// Shared engine options of the CLI.
#include "cli/engine_options.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/usage.h"
#include "core/error.h"
#include "core/units.h"

namespace strata::cli {

void add_device_options(CLI::App *sub, DeviceOptions &o) {
    sub->add_option("--device", o.device,
                    "Where to run: cuda, cpu, or auto (cuda when built with CUDA and a GPU is visible)")
        ->capture_default_str();
    sub->add_option("--gpu", o.gpu, "Which CUDA device")->capture_default_str()->check(at_least(0));
    sub->add_option("--vram-budget", o.vram_budget,
                    "Device memory the process may hold on the GPU, CUDA runtime included, e.g. 12G (default: what "
                    "is free); experts that do not fit stay in host memory and are copied in when routed. With "
                    "--gpus, one per participant (12G,8G) or one for all");
    sub->add_option("--gpus", o.gpus,
                    "Split the model's layers over several participants, in layer order: CUDA device numbers or cpu, "
                    "e.g. 0,1 (a device may appear twice: two participants on one GPU, each with its own budget)");
    sub->add_option("--split", o.split,
                    "With --gpus: layers per participant, e.g. 30,18 (default: chosen from each participant's budget "
                    "and the rates it measures at start)");
    sub->add_option("--host-mem", o.host_mem,
                    "Where experts without a GPU slot live: auto (a pinned copy in host RAM where it fits, else the "
                    "mapped file), pinned (the pinned copy, or refuse), mmap (the mapped file through a pinned "
                    "stager: host RAM smaller than the model)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "pinned", "mmap"}));
    sub->add_option("--expert-cache-policy", o.cache_policy,
                    "Which expert a full GPU expert cache gives up: lfu (least often requested, counts halved "
                    "every 32 tokens), next (expected to be needed last, by those counts and the cycle of layers) "
                    "or lru (least recently used)")
        ->capture_default_str()
        ->check(CLI::IsMember({"lru", "lfu", "next"}));
    sub->add_option("--cpu-share", o.cpu_share,
                    "GPU under a budget: the share of each layer's expert-cache misses that decoding computes on the "
                    "CPU while the others are copied in (same results either way): auto (a cost model of measured "
                    "times), or a fraction from 0 (none) to 1 (all)")
        ->capture_default_str();
    sub->add_option("--cpu-threads", o.cpu_threads,
                    "Threads for experts computed on the CPU (0: the cores less one, at most 16)")
        ->capture_default_str()
        ->check(at_least(0));
}

namespace {

std::vector<std::string> split_list(const std::string &s) {
    std::vector<std::string> v;
    size_t at = 0;
    while (true) {
        const size_t comma = s.find(',', at);
        v.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) return v;
        at = comma + 1;
    }
}

// --gpus, --split and a --vram-budget list into cfg.parts.
void apply_split_options(const DeviceOptions &o, EngineConfig &cfg) {
    for (const std::string &g : split_list(o.gpus)) {
        PartConfig p;
        if (g == "cpu") {
            p.device = Device::Cpu;
        } else {
            char *end = nullptr;
            const long d = std::strtol(g.c_str(), &end, 10);
            if (g.empty() || *end != '\0' || d < 0 || d > 255)
                usage_fail("--gpus: expected CUDA device numbers or cpu separated by commas, got '%s'", o.gpus.c_str());
            p.device = Device::Cuda;
            p.cuda_device = int(d);
        }
        cfg.parts.push_back(p);
    }
    if (!o.vram_budget.empty()) {
        const std::vector<std::string> b = split_list(o.vram_budget);
        if (b.size() != 1 && b.size() != cfg.parts.size())
            usage_fail("--vram-budget %s: expected one budget, or one per participant of --gpus (%zu)",
                       o.vram_budget.c_str(), cfg.parts.size());
        for (size_t i = 0; i < cfg.parts.size(); i++) {
            if (cfg.parts[i].device == Device::Cpu) continue;
            try {
                cfg.parts[i].vram_budget = parse_size(b[b.size() == 1 ? 0 : i], "--vram-budget");
            } catch (const Error &e) {
                throw UsageError(e.what());
            }
        }
    }
    if (!o.split.empty()) {
        const std::vector<std::string> n = split_list(o.split);
        if (n.size() != cfg.parts.size())
            usage_fail("--split %s: expected layers for each of the %zu participants of --gpus", o.split.c_str(),
                       cfg.parts.size());
        for (size_t i = 0; i < n.size(); i++) {
            char *end = nullptr;
            const long long v = std::strtoll(n[i].c_str(), &end, 10);
            if (n[i].empty() || *end != '\0' || v < 1)
                usage_fail("--split: expected a positive number of layers per participant, got '%s'", o.split.c_str());
            cfg.parts[i].n_layers = v;
        }
    }
}

}  // namespace

void apply_device_options(const DeviceOptions &o, EngineConfig &cfg) {
    try {
        cfg.device = parse_device(o.device);
    } catch (const Error &e) {
        throw UsageError(e.what());
    }
    cfg.cuda_device = o.gpu;
    cfg.host_mem = o.host_mem == "pinned" ? HostMem::Pinned : o.host_mem == "mmap" ? HostMem::Mmap : HostMem::Auto;
    cfg.expert_cache_policy = parse_slot_policy(o.cache_policy);
    if (o.cpu_share != "auto") {
        char *end = nullptr;
        const double v = std::strtod(o.cpu_share.c_str(), &end);
        if (o.cpu_share.empty() || *end != '\0' || !(v >= 0.0 && v <= 1.0))
            usage_fail("--cpu-share: expected auto or a fraction from 0 to 1, got '%s'", o.cpu_share.c_str());
        cfg.cpu_share = v;
    }
    cfg.cpu_threads = o.cpu_threads;
    cfg.log = [](const std::string &line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    if (!o.gpus.empty()) return apply_split_options(o, cfg);
    if (!o.split.empty()) usage_fail("--split: give the participants with --gpus first");
    if (o.vram_budget.find(',') != std::string::npos)
        usage_fail("--vram-budget %s: one budget per participant needs --gpus", o.vram_budget.c_str());
    if (o.vram_budget.empty()) return;
    uint64_t budget = 0;
    try {
        budget = parse_size(o.vram_budget, "--vram-budget");
    } catch (const Error &e) {
        throw UsageError(e.what());
    }
    // The budget bounds GPU memory. A run on the CPU (asked for, or the only device here) holds the model in host
    // memory: say so once and go on without it, so that nothing later reports a budget that was not applied.
    const bool on_cpu = cfg.device == Device::Cpu || (cfg.device == Device::Auto && !cuda_available());
    if (on_cpu) {
        std::fprintf(stderr,
                     "strata: note: --vram-budget %s is ignored: it bounds GPU memory, and this runs on the CPU\n",
                     o.vram_budget.c_str());
        return;
    }
    cfg.vram_budget = budget;
}

KvType parse_kv_type(const std::string &s) {
    if (s == "f16") return KvType::F16;
    if (s == "q8_0") return KvType::Q8_0;
    if (s == "f32") return KvType::F32;
    usage_fail("--kv-type: expected f16, q8_0 or f32, got '%s'", s.c_str());
}

void add_routing_trace_option(CLI::App *sub, std::string &path) {
    sub->add_option("--routing-trace", path,
                    "Write every MoE layer's routing (expert ids and weights per token) to this file "
                    "(docs/routing-trace.md; summarise with python -m tools.trace.summary)");
}

std::unique_ptr<RoutingTraceWriter> open_routing_trace(const std::string &path, Engine &eng) {
    if (path.empty()) return nullptr;
    const HParams &hp = eng.hparams();
    if (hp.n_expert < 1) fail("--routing-trace: %s has no routed experts", hp.arch_name.c_str());
    auto w = std::make_unique<RoutingTraceWriter>(path, hp.n_layer, hp.n_expert, hp.n_expert_used);
    eng.set_routing_observer(w.get());
    return w;
}

void close_routing_trace(std::unique_ptr<RoutingTraceWriter> &w, const std::string &path, Engine &eng) {
    if (!w) return;
    eng.set_routing_observer(nullptr);
    w->close();
    std::fprintf(stderr, "strata: routing trace: %lld passes, %lld layer records in %s\n", (long long)w->passes(),
                 (long long)w->records(), path.c_str());
    w.reset();
}

void add_expert_profile_option(CLI::App *sub, std::string &path) {
    sub->add_option("--expert-profile", path,
                    "GPU under a budget: keep the experts prompts routed most rows to in this file across runs (read "
                    "at start where it exists, to fill the expert cache as decoding begins; written at the end)");
}

void load_expert_profile(const std::string &path, Engine &eng) {
    if (const std::string said = start_expert_profile(path, eng); !said.empty())
        std::fprintf(stderr, "strata: %s\n", said.c_str());
}

void save_expert_profile(const std::string &path, const Engine &eng) {
    if (const std::string said = end_expert_profile(path, eng); !said.empty())
        std::fprintf(stderr, "strata: %s\n", said.c_str());
}

}  // namespace strata::cli
