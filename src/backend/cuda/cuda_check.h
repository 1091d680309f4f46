// Checked CUDA runtime calls for host code: a failed call throws strata::Error naming the call, the error and the
// place, so the request that hit it fails and the process goes on. No device code here.
#pragma once

#include <cuda_runtime_api.h>

namespace strata::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char *call, const char *file, int line);

inline void check(cudaError_t err, const char *call, const char *file, int line) {
    if (err != cudaSuccess) throw_cuda_error(err, call, file, line);
}

// Lets `func` (a __global__ function) take `bytes` of dynamic shared memory on the current device; false where that
// device cannot give them. The limit is a device's: a process that launches on several devices sets it on each, once
// (the answer is kept per function and device).
bool allow_dynamic_smem(const void *func, size_t bytes);

}  // namespace strata::cuda

#define STRATA_CUDA_CHECK(call) ::strata::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad launch configuration shows here; a fault inside the kernel at the next checked call.
#define STRATA_CUDA_LAUNCH_CHECK(kernel_name) \
    ::strata::cuda::check(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)
