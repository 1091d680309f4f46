// The AVX-512 rows of the host mat-vec in the GPU's order (mmvq_host_avx512.cpp); mmvq_host.cpp chooses them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/host/mmvq_host.h"

namespace strata::mmvq_detail {

// out[r - r0] = mmvq_host_dot of rows [r0, r1), bit for bit; false (nothing written) where this build or the
// type has no AVX-512 form.
bool mmvq_rows_avx512(DType t, const uint8_t *data, size_t row_bytes, int64_t k, int64_t r0, int64_t r1,
                      const int8_t *q, const ActScale *ds, float *out);

}  // namespace strata::mmvq_detail
