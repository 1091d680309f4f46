// Command-line options every engine-running subcommand shares (where to run, which GPU, the VRAM budget), so
// `run`, `serve` and `bench` spell and check them the same way.
#pragma once

#include <string>

#include "runtime/engine.h"

namespace CLI {
class App;
}

namespace strata::cli {

struct DeviceOptions {
    std::string device = "auto", vram_budget;
    int gpu = 0;
};

void add_device_options(CLI::App *sub, DeviceOptions &o);
// Fills cfg.device, cuda_device, vram_budget and the log sink; throws strata::Error naming a bad flag.
void apply_device_options(const DeviceOptions &o, EngineConfig &cfg);

// The value of --kv-type: "f16", "q8_0" or "f32"; throws naming the flag otherwise.
KvType parse_kv_type(const std::string &s);

}  // namespace strata::cli
