// The CUDA backend: every op of backend.h on one GPU, carrying out a placement plan (backend/placement.h): non-expert
// weights uploaded once (packed GGUF bytes, 1-D weights as f32), the expert slots the plan gives (filled from host
// memory as the strata layer asks), caches and scratch in device memory, within the plan's budget. No CUDA headers
// here: the engine and the CLI include this file in CPU-only builds too (callers guard with STRATA_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace strata {

struct CudaOptions {
    int device = 0;
    bool graphs = true;  // decoding passes as CUDA graphs where eligible (STRATA_CUDA_GRAPHS=0/1 overrides)
};

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions &o);

// Usable CUDA devices (0 without a driver or a GPU).
int cuda_device_count();

// Device memory and graph counters of a CUDA backend (be must be one).
struct CudaDeviceStats {
    uint64_t device_bytes = 0;  // device memory the backend's own allocations hold now
    uint64_t budget_bytes = 0;  // the budget for everything on the device, CUDA runtime included
    uint64_t driver_bytes = 0;  // the driver's count for this process less other backends' allocations (0: unknown)
    uint64_t graph_launches = 0, graph_instantiations = 0;  // decoding passes run as CUDA graphs; graphs built
    uint64_t graph_replays = 0;  // of the graph launches, those replayed without recording the pass
    uint64_t ahead_steps = 0;    // of the replays, greedy steps replayed ahead of the host (Backend::replay_ahead)
};
CudaDeviceStats cuda_device_stats(const Backend &be);

}  // namespace strata
