// Device memory as the driver counts it for this process, and what Strata's own allocations account for.
//
// A --vram-budget bounds everything the process holds on a GPU, the CUDA context included (runtime data, loaded
// kernels, local memory), since that is what the card has to fit. The driver's figure comes from NVML, loaded at
// run time (libnvidia-ml ships with the driver; no build dependency). Where NVML is absent or does not list this
// process (a container whose PIDs differ from the host's), callers fall back to an estimate and say so.
#pragma once

#include <cstdint>
#include <optional>

namespace strata::cuda {

// Bytes the driver attributes to this process on the given CUDA device; nullopt where it cannot be read.
std::optional<uint64_t> process_device_bytes(int cuda_device);

// Bytes all CUDA backends of this process hold through their own allocations on a device (kept by dev_alloc/free).
uint64_t tracked_device_bytes(int cuda_device);
void track_device_bytes(int cuda_device, int64_t delta);

}  // namespace strata::cuda
