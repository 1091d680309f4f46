// Command-line options every engine-running subcommand shares (where to run, which GPU, the VRAM budget), so
// `run`, `serve` and `bench` spell and check them the same way.
#pragma once

#include <memory>
#include <string>

#include "runtime/engine.h"
#include "runtime/routing_trace.h"

namespace CLI {
class App;
}

namespace strata::cli {

struct DeviceOptions {
    std::string device = "auto", vram_budget, host_mem = "auto", cache_policy = "lfu", cpu_share = "auto";
    std::string gpus, split;  // a split model: participants (--gpus 0,1), layers per participant (--split 24,24)
    int gpu = 0, cpu_threads = 0;
};

void add_device_options(CLI::App *sub, DeviceOptions &o);
// Fills cfg.device, cuda_device, vram_budget and the log sink; throws strata::Error naming a bad flag.
void apply_device_options(const DeviceOptions &o, EngineConfig &cfg);

// The value of --kv-type: "f16", "q8_0" or "f32"; throws naming the flag otherwise.
KvType parse_kv_type(const std::string &s);

// --routing-trace FILE (run and bench): the writer, attached to eng (nullptr when path is empty).
void add_routing_trace_option(CLI::App *sub, std::string &path);
std::unique_ptr<RoutingTraceWriter> open_routing_trace(const std::string &path, Engine &eng);
// Closes the trace and says what it holds on stderr.
void close_routing_trace(std::unique_ptr<RoutingTraceWriter> &w, const std::string &path, Engine &eng);

// --expert-profile FILE (run and serve; runtime/expert_profile.h): the prompts' favourite scores of earlier runs,
// read where the file exists and given to eng at start (a file of another model's shape is refused), and written
// back at the end. Both say what they did on stderr, and do nothing where eng has no partial expert cache.
void add_expert_profile_option(CLI::App *sub, std::string &path);
void load_expert_profile(const std::string &path, Engine &eng);
void save_expert_profile(const std::string &path, const Engine &eng);

}  // namespace strata::cli
