// The arg-max of a row of floats, as greedy decoding picks it: on the host here, and on a device by a backend's own
// kernel giving the same index.
#pragma once

#include <cstdint>

namespace strata {

// The first index of the largest value (a NaN never counts as larger; one at index 0 is the pick); 0 where n <= 1.
int32_t argmax(const float *x, int64_t n);

}  // namespace strata
