// CUDA error reporting.
#include "backend/cuda/cuda_check.h"

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

}  // namespace strata::cuda
