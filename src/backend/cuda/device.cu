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

int device_fact(DeviceFact f) {
    constexpr int k_devices = 64, k_facts = int(DeviceFact::Count);
    static std::atomic<int> known[k_devices][k_facts];  // the fact + 1; 0: not read yet
    static constexpr cudaDeviceAttr attr[k_facts] = {
        cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin, cudaDevAttrComputeCapabilityMajor};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= k_devices) {
        cudaGetLastError();
        return 0;
    }
    std::atomic<int> &k = known[dev][int(f)];
    int v = k.load(std::memory_order_relaxed);
    if (v == 0) {
        if (cudaDeviceGetAttribute(&v, attr[int(f)], dev) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        k.store(v + 1, std::memory_order_relaxed);
        return v;
    }
    return v - 1;
}

bool pdl_enabled() {
    static const bool allowed = env_switch("STRATA_CUDA_PDL", true);
    return allowed && device_fact(DeviceFact::CcMajor) >= 9;
}

bool early_reads_enabled() {
    static const bool on = env_switch("STRATA_CUDA_EARLY_READS", true);
    return on && pdl_enabled();
}

}  // namespace strata::cuda
