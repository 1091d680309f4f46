// The CUDA backend: every op of backend.h on one GPU. Non-expert weights are uploaded once (packed GGUF bytes, 1-D
// weights as f32); routed experts are reached per layer through a slot table (expert_cache.h), all resident when
// they fit and otherwise refilled on demand from pinned host memory; caches and scratch live in device memory.
// A placement plan under a VRAM budget decides how many expert slots there are. No CUDA headers here: the engine and
// the CLI include this file in CPU-only builds too (callers guard with STRATA_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace strata {

struct CudaOptions {
    int device = 0;
    uint64_t vram_budget_bytes = 0;  // all the process may hold on the device, CUDA runtime included; 0: what is free
    int64_t expert_slots = 0;        // 0: as many as the budget allows (all experts when they fit); n: at most n
    uint64_t scratch_bytes = 0;      // scratch allocated at start; 0: the estimate for n_batch (tests set less)
    bool graphs = false;             // decoding passes as CUDA graphs where eligible (also STRATA_CUDA_GRAPHS=1)
    CacheConfig cache;               // what init_caches will be asked for (the plan sizes it first)
    int64_t n_batch = 512;           // the most tokens in one forward pass (sizes the scratch)
    std::function<void(const std::string &)> log;  // the plan line and notes (nullptr: quiet)
};

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions &o);

// Usable CUDA devices (0 without a driver or a GPU).
int cuda_device_count();

// Expert placement and traffic of a CUDA backend (be must be one).
struct CudaExpertStats {
    int64_t n_slots = 0, n_experts = 0;
    uint64_t hits = 0, misses = 0, bytes_uploaded = 0;
    uint64_t device_bytes = 0;  // device memory the backend's own allocations hold now
    uint64_t budget_bytes = 0;  // the budget for everything on the device, CUDA runtime included
    uint64_t graph_launches = 0, graph_instantiations = 0;  // decoding passes run as CUDA graphs; graphs built
    uint64_t driver_bytes = 0;  // the driver's count for this process less other backends' allocations (0: unknown)
};
CudaExpertStats cuda_expert_stats(const Backend &be);

}  // namespace strata
