// The reference matmul: activations go through the weight type's activation format (as the integer dot products
// of fast paths see them), weight rows are dequantized, and everything accumulates in fp32 in a fixed order.
// Tiled so each dequantized weight tile is reused across a block of tokens while it is in cache. The engine's matmul
// (integer dot products, SIMD) is in cpu_matmul.cpp; this one is what it is tested against.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_dot.h"
#include "core/error.h"
#include "format/quant.h"

namespace strata {

namespace {

// Eight partial sums, then combined pairwise: a fixed order the compiler can vectorise.
inline float dot_f32(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

constexpr int64_t k_tile_rows = 16;    // weight rows dequantized together
constexpr int64_t k_tile_tokens = 64;  // tokens per pass over a weight tile

}  // namespace

void cpu_matmul_reference(ThreadPool &pool, const Weight &w, const Act &x, const Act &y) {
    const int64_t K = w.ne[0], N = w.ne[1], T = x.rows;
    STRATA_ASSERT(x.cols == K && y.cols == N && y.rows == T);
    if (T == 0) return;

    // Activations as the dot products see them: quantize to the paired format and back.
    const DType vt = dot_act_type(w.type);
    const float *xs = x.data;
    int64_t x_stride = x.stride;
    std::vector<float> xq;
    if (vt != DType::F32) {
        if (K % dtype_info(vt).block_size != 0)
            fail("matmul with '%.*s': row length %lld is not a multiple of %s blocks", int(w.name.size()),
                 w.name.data(), (long long)K, dtype_name(vt));
        xq.resize(size_t(T * K));
        pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
            std::vector<uint8_t> blocks(row_bytes(vt, K));
            for (int64_t t = t0; t < t1; t++) {
                quantize_row(vt, x.row(t), blocks.data(), K);
                dequantize_row(vt, blocks.data(), xq.data() + t * K, K);
            }
        });
        xs = xq.data();
        x_stride = K;
    } else if (!x.contiguous()) {
        x_stride = x.stride;
    }

    const int64_t n_tiles = (N + k_tile_rows - 1) / k_tile_rows;
    pool.parallel_for(n_tiles, 1, [&](int64_t tile0, int64_t tile1) {
        std::vector<float> wt(static_cast<size_t>(k_tile_rows * K));
        for (int64_t tile = tile0; tile < tile1; tile++) {
            const int64_t n0 = tile * k_tile_rows, nn = std::min(k_tile_rows, N - n0);
            for (int64_t i = 0; i < nn; i++)
                dequantize_row(w.type, w.host + size_t(n0 + i) * w.row_bytes, wt.data() + i * K, K);
            for (int64_t t0 = 0; t0 < T; t0 += k_tile_tokens) {
                const int64_t t1 = std::min(T, t0 + k_tile_tokens);
                for (int64_t t = t0; t < t1; t++) {
                    const float *xr = xs + t * x_stride;
                    float *yr = y.row(t);
                    for (int64_t i = 0; i < nn; i++) yr[n0 + i] = dot_f32(wt.data() + i * K, xr, K);
                }
            }
        }
    });
}

}  // namespace strata
