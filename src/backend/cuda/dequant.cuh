// Device dequantization of every weight type the CPU reference knows, element for element equal to format/quant.h
// (same float operations in the same order, no contraction). Launchers for whole rows (embeddings, tests); the
// per-element functions behind them live in quant_device.cuh for the matmul kernels.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "format/dtype.h"

namespace strata::cuda {

// The i-quant lookup tables in device memory (uploaded once per device on first use).
struct IqGrids {
    const uint64_t *iq2xxs, *iq2xs, *iq2s, *iq1s;
    const uint32_t *iq3xxs, *iq3s;
    const uint8_t *ksigns;
};
const IqGrids &iq_grids();  // of the current device

// Whether the device code can dequantize this type (every type format/quant.h dequantizes).
bool cuda_can_dequantize(DType t);

// dst[r * k + i] = element i of row r, rows of `row_bytes` bytes from src (device pointers); k a multiple of the
// type's block size.
void dequantize_rows(DType t, const void *src, size_t row_bytes, int64_t n_rows, int64_t k, float *dst,
                     cudaStream_t stream);

// Rows ids[0..n) of a weight matrix into dst rows (stride dst_stride floats); ids are device int32.
void embed_rows(DType t, const void *src, size_t row_bytes, int64_t k, const int32_t *ids, int64_t n, float *dst,
                int64_t dst_stride, cudaStream_t stream);

}  // namespace strata::cuda
