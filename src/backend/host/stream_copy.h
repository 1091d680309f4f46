// A copy whose stores bypass the caches (x86 non-temporal stores), for filling buffers that a device's DMA reads
// next, such as the CUDA stager's pinned buffers: an ordinary store first reads the destination line into the cache
// and later writes it back, so a copy from memory to memory moves each line three times; a non-temporal store writes
// the line once, and the destination does not push the source out of the cache either. The bytes are memcpy's.
#pragma once

#include <cstddef>

namespace strata {

// Copies n bytes from src to dst (not overlapping) with non-temporal stores for the 64-byte lines of dst that the
// copy fills whole, and fences them before it returns, so a thread or device that the caller then signals sees them.
// Where the CPU has no such stores (not x86-64), a memcpy.
void stream_copy(void *dst, const void *src, size_t n);

}  // namespace strata
