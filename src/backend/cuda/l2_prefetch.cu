// The L2 prefetch kernel (l2_prefetch.cuh). Each thread takes every (blocks x threads)-th line (or 64 KiB piece) of
// the ranges in turn; an address is rounded down to its line (to 16 bytes for the bulk form, whose last piece is cut to
// 16-byte multiples within the range).
#include "backend/cuda/l2_prefetch.cuh"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int k_threads = 256;
constexpr uint64_t k_line = 128, k_piece = 64 << 10;

template <int MODE>
__device__ __forceinline__ void ask(const uint8_t *p, uint64_t bytes) {
    (void)bytes;
    if constexpr (MODE == 2) {
        asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
    } else if constexpr (MODE == 3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(uint32_t(bytes)) : "memory");
#else
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
    } else {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

// This thread's lines of one range: from the range's first line (16-byte pieces for the bulk form: its address and
// size must be multiples of 16).
template <int MODE>
__device__ __forceinline__ void ask_range(const uint8_t *p, uint64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool bulk = MODE == 3;
#else
    constexpr bool bulk = false;
#endif
    const uint64_t step = bulk ? k_piece : k_line;
    const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x, n_t = uint64_t(gridDim.x) * blockDim.x;
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(bulk ? 15 : k_line - 1);
    const uint64_t span = reinterpret_cast<uintptr_t>(p) + bytes - a0;
    for (uint64_t o = t * step; o < span; o += n_t * step) {
        const uint64_t left = span - o, size = left < step ? left / 16 * 16 : step;  // never past the range
        if (size > 0) ask<MODE>(reinterpret_cast<const uint8_t *>(a0 + o), size);
    }
}

template <int MODE>
__global__ __launch_bounds__(k_threads) void k_l2_prefetch(L2Ranges r) {
    for (int i = 0; i < r.n; i++) ask_range<MODE>(r.p[i], r.bytes[i]);
}

template <int MODE>
__global__ __launch_bounds__(k_threads) void k_l2_prefetch_table(const uint8_t *table, uint64_t stride, int n,
                                                                 uint64_t bytes) {
    for (int i = 0; i < n; i++)
        ask_range<MODE>(*reinterpret_cast<const uint8_t *const *>(table + uint64_t(i) * stride), bytes);
}

}  // namespace

void launch_l2_prefetch(const L2Ranges &r, int mode, int blocks, cudaStream_t stream) {
    if (r.n == 0) return;
    STRATA_ASSERT(r.n <= k_l2_ranges && blocks > 0);
    if (mode == 2)
        k_l2_prefetch<2><<<blocks, k_threads, 0, stream>>>(r);
    else if (mode == 3)
        k_l2_prefetch<3><<<blocks, k_threads, 0, stream>>>(r);
    else
        k_l2_prefetch<1><<<blocks, k_threads, 0, stream>>>(r);
    STRATA_CUDA_LAUNCH_CHECK("k_l2_prefetch");
}

void launch_l2_prefetch_table(const uint8_t *table, size_t stride, int n, uint64_t bytes, int mode, int blocks,
                              cudaStream_t stream) {
    if (n <= 0) return;
    STRATA_ASSERT(blocks > 0 && stride % alignof(const void *) == 0);
    if (mode == 2)
        k_l2_prefetch_table<2><<<blocks, k_threads, 0, stream>>>(table, stride, n, bytes);
    else if (mode == 3)
        k_l2_prefetch_table<3><<<blocks, k_threads, 0, stream>>>(table, stride, n, bytes);
    else
        k_l2_prefetch_table<1><<<blocks, k_threads, 0, stream>>>(table, stride, n, bytes);
    STRATA_CUDA_LAUNCH_CHECK("k_l2_prefetch_table");
}

}  // namespace strata::cuda
