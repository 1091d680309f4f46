// The host's arg-max (core/argmax.h).
#include "core/argmax.h"

#include <cstring>

namespace strata {

namespace {

// Eight floats as one value (GCC/Clang vector extensions): SIMD whether or not the build lets the auto-vectorizer
// run (cmake/CompilerChecks.cmake may turn it off). Used inside functions only: a 32-byte vector passed or returned
// by value changes the ABI where AVX is off, and GCC warns of it.
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

}  // namespace

// The first index of the largest value, as a scan that moves on only to a strictly larger value picks it (a NaN is
// never larger, and one at index 0 is never left). Two passes over 8-float vectors: the largest value (v > m ? v :
// m skips NaNs), then the first index holding it. A single scan carries its comparison from one element to the next:
// several times slower over a 152k vocabulary, a cost paid every token.
int32_t argmax(const float *logits, int64_t n) {
    if (n <= 1 || logits[0] != logits[0]) return 0;
    const float x0 = logits[0];
    f32x8 m0 = {x0, x0, x0, x0, x0, x0, x0, x0}, m1 = m0, v0, v1;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {  // lane-wise v > m ? v : m: a NaN never replaces m
        std::memcpy(&v0, logits + i, sizeof v0);
        std::memcpy(&v1, logits + i + 8, sizeof v1);
        m0 = v0 > m0 ? v0 : m0;
        m1 = v1 > m1 ? v1 : m1;
    }
    m0 = m1 > m0 ? m1 : m0;
    float best = m0[0];
    for (int j = 1; j < 8; j++) best = m0[j] > best ? m0[j] : best;
    for (; i < n; i++) best = logits[i] > best ? logits[i] : best;
    // -0 and +0 compare equal, as they do in the scan: the first of either is its pick too
    for (i = 0; i + 8 <= n; i += 8) {
        std::memcpy(&v0, logits + i, sizeof v0);
        const i32x8 eq = v0 == best;
        int32_t any = 0;
        for (int j = 0; j < 8; j++) any |= eq[j];
        if (any) break;
    }
    for (; i < n; i++)
        if (logits[i] == best) return int32_t(i);
    return 0;  // not reached: best is one of the values
}

}  // namespace strata
