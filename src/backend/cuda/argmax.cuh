// Each row's arg-max on the device (argmax.cu).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "backend/cuda/elementwise.cuh"

namespace strata::cuda {

// The parts a row of `cols` values is scanned in: the workspace launch_argmax_rows needs is rows * argmax_parts(cols)
// floats at part_v and as many ints at part_i.
int argmax_parts(int64_t cols);
// ids_dev[r] = the first index of row r's largest value (a NaN never larger; 0 where the row's first value is NaN),
// as core/argmax.h's argmax gives it.
void launch_argmax_rows(Rows x, float *part_v, int *part_i, int32_t *ids_dev, cudaStream_t stream);

}  // namespace strata::cuda
