// CUDA device discovery.
#include <cuda_runtime.h>

#include "backend/cuda/device.h"

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

}  // namespace strata::cuda
