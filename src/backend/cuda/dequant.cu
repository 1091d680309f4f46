// Whole-row dequantization launchers (embedding lookups, tests) and the i-quant tables in device memory.
#include "backend/cuda/dequant.cuh"

#include <mutex>

#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quant_device.cuh"
#include "core/error.h"
#include "format/iq_grids.h"

namespace strata::cuda {

namespace {

template <class T, size_t N>
T *upload_table(const T (&host)[N]) {
    void *p = nullptr;
    STRATA_CUDA_CHECK(cudaMalloc(&p, sizeof(host)));
    STRATA_CUDA_CHECK(cudaMemcpy(p, host, sizeof(host), cudaMemcpyHostToDevice));
    return static_cast<T *>(p);
}

constexpr int k_max_devices = 64;

}  // namespace

// Uploaded once per device and kept for the life of the process (33 KB).
const IqGrids &iq_grids() {
    static std::mutex mu;
    static IqGrids grids[k_max_devices];
    static bool ready[k_max_devices] = {};
    int dev = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&dev));
    STRATA_ASSERT(dev >= 0 && dev < k_max_devices);
    std::lock_guard<std::mutex> lock(mu);
    if (!ready[dev]) {
        IqGrids g;
        g.iq2xxs = upload_table(iq::iq2xxs_grid);
        g.iq2xs = upload_table(iq::iq2xs_grid);
        g.iq2s = upload_table(iq::iq2s_grid);
        g.iq1s = upload_table(iq::iq1s_grid);
        g.iq3xxs = upload_table(iq::iq3xxs_grid);
        g.iq3s = upload_table(iq::iq3s_grid);
        g.ksigns = upload_table(iq::ksigns_iq2xs);
        // Kernels on other (non-blocking) streams read these next: make sure the copies have landed.
        STRATA_CUDA_CHECK(cudaDeviceSynchronize());
        grids[dev] = g;
        ready[dev] = true;
    }
    return grids[dev];
}

bool cuda_can_dequantize(DType t) {
    // clang-format off
    switch (t) {
#define X(T_) case DType::T_:
        STRATA_CUDA_DTYPES(X)
#undef X
        return true;
        default: return false;
    }
    // clang-format on
}

namespace {

template <DType T>
__global__ void k_dequantize_rows(const uint8_t *src, size_t row_bytes, int64_t k, float *dst, IqGrids g) {
    const int64_t r = blockIdx.x;
    const uint8_t *row = src + size_t(r) * row_bytes;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) dst[r * k + i] = row_elem<T>(row, i, g);
}

template <DType T>
__global__ void k_embed_rows(const uint8_t *src, size_t row_bytes, int64_t k, const int32_t *ids, float *dst,
                             int64_t dst_stride, IqGrids g) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.x;
    const uint8_t *row = src + size_t(ids[r]) * row_bytes;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) dst[r * dst_stride + i] = row_elem<T>(row, i, g);
}

}  // namespace

void dequantize_rows(DType t, const void *src, size_t row_bytes, int64_t n_rows, int64_t k, float *dst,
                     cudaStream_t stream) {
    if (n_rows == 0 || k == 0) return;
    const IqGrids &g = iq_grids();
    const unsigned grid = unsigned(n_rows);
    // clang-format off
    switch (t) {
#define X(T_)                                                                                                    \
    case DType::T_:                                                                                              \
        k_dequantize_rows<DType::T_><<<grid, 256, 0, stream>>>(static_cast<const uint8_t *>(src), row_bytes, k, \
                                                               dst, g);                                          \
        break;
        STRATA_CUDA_DTYPES(X)
#undef X
        default: fail("CUDA: no device dequantizer for %s", dtype_name(t));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_dequantize_rows");
}

void embed_rows(DType t, const void *src, size_t row_bytes, int64_t k, const int32_t *ids, int64_t n, float *dst,
                int64_t dst_stride, cudaStream_t stream) {
    if (n == 0) return;
    const IqGrids &g = iq_grids();
    const unsigned grid = unsigned(n);
    // clang-format off
    switch (t) {
#define X(T_)                                                                                                     \
    case DType::T_:                                                                                               \
        pdl_launch(k_embed_rows<DType::T_>, grid, 256, 0, stream, static_cast<const uint8_t *>(src), row_bytes, k, ids, \
                                                          dst, dst_stride, g);                                    \
        break;
        STRATA_CUDA_DTYPES(X)
#undef X
        default: fail("CUDA: no device dequantizer for %s", dtype_name(t));
    }
    // clang-format on
    STRATA_CUDA_LAUNCH_CHECK("k_embed_rows");
}

}  // namespace strata::cuda
