#include "backend/host/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define STRATA_STREAM_COPY_X86 1
#endif

namespace strata {

void stream_copy(void *dst, const void *src, size_t n) {
#ifdef STRATA_STREAM_COPY_X86
    auto *d = static_cast<uint8_t *>(dst);
    const auto *s = static_cast<const uint8_t *>(src);
    // The head up to dst's first 64-byte line, then whole lines (SSE2 stores: the write-combining buffer gathers a
    // line's four 16-byte stores into one write, so wider registers would not store fewer lines), then the tail.
    const size_t head = std::min(n, size_t((64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63));
    std::memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 32));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 48));
        _mm_stream_si128(reinterpret_cast<__m128i *>(d), a);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 48), e);
    }
    std::memcpy(d, s, n);
    // Non-temporal stores are not ordered with later stores: without the fence a flag set after the copy could be
    // seen before the bytes.
    _mm_sfence();
#else
    std::memcpy(dst, src, n);
#endif
}

}  // namespace strata
