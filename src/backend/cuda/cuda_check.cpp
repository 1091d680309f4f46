// CUDA error reporting.
#include "backend/cuda/cuda_check.h"

#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace strata::cuda {

void throw_cuda_error(cudaError_t err, const char *call, const char *file, int line) {
    // Clear a non-sticky error so the next request starts clean; a sticky one (a kernel fault) stays and fails
    // every later call with the same message, which is the best a process can do without resetting the device.
    cudaGetLastError();
    const char *base = file;
    for (const char *p = file; *p; p++)
        if (*p == '/') base = p + 1;
    throw Error(strfmt("CUDA error: %s failed with %s (%s) at %s:%d", call, cudaGetErrorName(err),
                       cudaGetErrorString(err), base, line));
}

bool allow_dynamic_smem(const void *func, size_t bytes) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    static std::mutex m;
    static std::map<std::pair<const void *, int>, bool> set;  // (function, device): whether the limit took
    const std::lock_guard<std::mutex> lock(m);
    const auto key = std::make_pair(func, dev);
    if (const auto it = set.find(key); it != set.end()) return it->second;
    const bool ok = bytes <= size_t(1) << 30 &&
                    cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess;
    if (!ok) cudaGetLastError();
    set.emplace(key, ok);
    return ok;
}

}  // namespace strata::cuda
