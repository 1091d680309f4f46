// Weights brought into the L2 cache ahead of the kernel that reads them (CudaBackend::prefetch): a decoding pass's
// mat-vecs each read a few MB that no kernel before them touched, while between them the latency-bound kernels
// (norms, the router, attention) leave the memory bus idle for 10-12 us a layer. A small kernel on a side stream asks
// for the next matrices' lines in that time; the mat-vec then finds them in L2. It reads nothing into registers and
// writes nothing, so no result changes.
#pragma once

#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>

namespace strata::cuda {

constexpr int k_l2_ranges = 8;

// Up to k_l2_ranges device byte ranges, brought in in order.
struct L2Ranges {
    const uint8_t *p[k_l2_ranges] = {};
    uint64_t bytes[k_l2_ranges] = {};
    int n = 0;
};

// mode 1: a prefetch.global.L2 per 128-byte line; 2: the same with the evict_last priority (the lines outlive the
// streaming reads of the experts); 3: on sm_90 and later one cp.async.bulk.prefetch.L2 per 64 KiB (the SM's tensor
// memory accelerator walks the range), else as 1. blocks x 256 threads issue the lines.
void launch_l2_prefetch(const L2Ranges &r, int mode, int blocks, cudaStream_t stream);

// The same for n matrices of `bytes` each whose device addresses a kernel before wrote to a table on the device: the
// pointer at table + i * stride (the routed experts' down matrices, from their pair groups).
void launch_l2_prefetch_table(const uint8_t *table, size_t stride, int n, uint64_t bytes, int mode, int blocks,
                              cudaStream_t stream);

}  // namespace strata::cuda
