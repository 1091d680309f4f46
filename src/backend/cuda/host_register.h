// Host memory registered with CUDA (pinned in place) once per process however many backends use it: the parts of a
// split model share one mapping of the file, and a second cudaHostRegister of the same range fails
// (cudaErrorHostMemoryAlreadyRegistered). Registrations are portable (every device may copy from them) and counted;
// the last release unregisters.
#pragma once

#include <cuda_runtime_api.h>
#include <cstddef>

namespace strata::cuda {

// Registers [base, base + bytes) (read-only where read_only), or counts one more user of a registration of the same
// base that covers it; cudaSuccess or the error of the registration.
cudaError_t host_register_shared(const void *base, size_t bytes, bool read_only);
// One user fewer of base's registration; the last unregisters it.
void host_unregister_shared(const void *base);

}  // namespace strata::cuda
