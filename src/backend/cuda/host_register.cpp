#include "backend/cuda/host_register.h"

#include <map>
#include <mutex>

namespace strata::cuda {

namespace {

struct Registration {
    size_t bytes = 0;
    int users = 0;
};
std::mutex g_mu;
std::map<const void *, Registration> g_regs;

}  // namespace

cudaError_t host_register_shared(const void *base, size_t bytes, bool read_only) {
    const std::lock_guard<std::mutex> lock(g_mu);
    if (auto it = g_regs.find(base); it != g_regs.end()) {
        if (bytes > it->second.bytes) return cudaErrorHostMemoryAlreadyRegistered;  // a shorter range is pinned
        it->second.users++;
        return cudaSuccess;
    }
    const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    const cudaError_t err = cudaHostRegister(const_cast<void *>(base), bytes, flags);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return err;
    }
    g_regs[base] = {bytes, 1};
    return cudaSuccess;
}

void host_unregister_shared(const void *base) {
    const std::lock_guard<std::mutex> lock(g_mu);
    const auto it = g_regs.find(base);
    if (it == g_regs.end()) return;
    if (--it->second.users > 0) return;
    cudaHostUnregister(const_cast<void *>(base));
    cudaGetLastError();
    g_regs.erase(it);
}

}  // namespace strata::cuda
