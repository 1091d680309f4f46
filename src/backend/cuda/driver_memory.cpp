// NVML through dlopen: the few entry points needed to read one process's device memory, declared here (the CUDA
// toolkit does not ship nvml.h everywhere, and the library is part of the driver, not of the build).
#include "backend/cuda/driver_memory.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

namespace strata::cuda {
namespace {

using NvmlDevice = void *;
struct NvmlProcessInfo {  // nvmlProcessInfo_v2_t (the layout of the _v2 and _v3 queries)
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
};
constexpr int k_nvml_success = 0;
constexpr int k_nvml_insufficient_size = 7;

struct Nvml {
    int (*init)() = nullptr;
    int (*by_pci_bus_id)(const char *, NvmlDevice *) = nullptr;
    int (*compute_processes)(NvmlDevice, unsigned int *, NvmlProcessInfo *) = nullptr;
    bool ok = false;
};

const Nvml &nvml() {
    static Nvml n;
    static std::once_flag once;
    std::call_once(once, [] {
        void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        n.init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
        n.by_pci_bus_id =
            reinterpret_cast<int (*)(const char *, NvmlDevice *)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
        void *procs = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
        if (!procs) procs = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
        n.compute_processes = reinterpret_cast<int (*)(NvmlDevice, unsigned int *, NvmlProcessInfo *)>(procs);
        n.ok = n.init && n.by_pci_bus_id && n.compute_processes && n.init() == k_nvml_success;
    });
    return n;
}

constexpr int k_max_devices = 64;
std::array<std::atomic<int64_t>, k_max_devices> g_tracked{};

}  // namespace

std::optional<uint64_t> process_device_bytes(int cuda_device) {
    const Nvml &n = nvml();
    if (!n.ok) return std::nullopt;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess) {
        cudaGetLastError();
        return std::nullopt;
    }
    NvmlDevice dev = nullptr;
    if (n.by_pci_bus_id(bus, &dev) != k_nvml_success) return std::nullopt;
    std::vector<NvmlProcessInfo> procs(16);
    for (int attempt = 0; attempt < 4; attempt++) {
        unsigned int count = unsigned(procs.size());
        const int rc = n.compute_processes(dev, &count, procs.data());
        if (rc == k_nvml_insufficient_size) {
            procs.resize(size_t(count) + 16);
            continue;
        }
        if (rc != k_nvml_success) return std::nullopt;
        const unsigned int self = unsigned(getpid());
        for (unsigned int i = 0; i < count; i++)
            if (procs[i].pid == self) return uint64_t(procs[i].used_gpu_memory);
        return std::nullopt;  // not listed: another PID namespace, or no context yet
    }
    return std::nullopt;
}

uint64_t tracked_device_bytes(int cuda_device) {
    if (cuda_device < 0 || cuda_device >= k_max_devices) return 0;
    return uint64_t(g_tracked[size_t(cuda_device)].load());
}

void track_device_bytes(int cuda_device, int64_t delta) {
    if (cuda_device >= 0 && cuda_device < k_max_devices) g_tracked[size_t(cuda_device)] += delta;
}

}  // namespace strata::cuda
