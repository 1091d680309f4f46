// Shared engine options of the CLI.
#include "cli/engine_options.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/error.h"
#include "core/units.h"

namespace strata::cli {

void add_device_options(CLI::App *sub, DeviceOptions &o) {
    sub->add_option("--device", o.device,
                    "Where to run: cuda, cpu, or auto (cuda when built with CUDA and a GPU is visible)")
        ->capture_default_str();
    sub->add_option("--gpu", o.gpu, "Which CUDA device")->capture_default_str();
    sub->add_option("--vram-budget", o.vram_budget,
                    "Device memory the process may hold on the GPU, CUDA runtime included, e.g. 12G (default: what "
                    "is free); experts that do not fit stay in host memory and are copied in when routed");
}

void apply_device_options(const DeviceOptions &o, EngineConfig &cfg) {
    cfg.device = parse_device(o.device);
    if (o.gpu < 0) fail("--gpu must be >= 0 (got %d)", o.gpu);
    cfg.cuda_device = o.gpu;
    if (!o.vram_budget.empty()) {
        cfg.vram_budget = parse_size(o.vram_budget, "--vram-budget");
        if (cfg.device == Device::Cpu) fail("--vram-budget applies to --device cuda");
    }
    cfg.log = [](const std::string &line) { std::fprintf(stderr, "%s\n", line.c_str()); };
}

KvType parse_kv_type(const std::string &s) {
    if (s == "f16") return KvType::F16;
    if (s == "q8_0") return KvType::Q8_0;
    if (s == "f32") return KvType::F32;
    fail("--kv-type: expected f16, q8_0 or f32, got '%s'", s.c_str());
}

}  // namespace strata::cli
