// CUDA device discovery, and what each device's kernels may use (programmatic dependent launch).
#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/device.h"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"

namespace strata::cuda {

std::vector<DeviceInfo> list_devices() {
    std::vector<DeviceInfo> out;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver or no device: clear the sticky error, report none
        return out;
    }
    for (int i = 0; i < n; i++) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        DeviceInfo d;
        d.index = i;
        d.name = prop.name;
        d.sm_major = prop.major;
        d.sm_minor = prop.minor;
        d.total_bytes = prop.totalGlobalMem;
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.free_bytes = free_b;
        out.push_back(d);
    }
    return out;
}

bool pdl_enabled() {
    static const bool allowed = env_switch("STRATA_CUDA_PDL", true);
    if (!allowed) return false;
    constexpr int k_devices = 64;
    static std::atomic<int> known[k_devices];  // 0 not read yet, 1 off, 2 on
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= k_devices) return false;
    int v = known[dev].load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0;
        v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 ? 2 : 1;
        known[dev].store(v, std::memory_order_relaxed);
    }
    return v == 2;
}

}  // namespace strata::cuda
