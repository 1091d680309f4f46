// The engine's CPU matmul: each activation row is quantized once to the weight type's activation format, then every
// output is one vec_dot (integer dot products, SIMD where the CPU has it) of a weight row with an activation row.
// Work is cut into tiles of weight rows x tokens, spread over the thread pool. The plain dequantize-and-multiply
// version it is tested against is cpu_matmul_reference.cpp.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_dot.h"
#include "core/error.h"
#include "format/quant.h"

namespace strata {

namespace {

// A tile is up to k_tile_rows weight rows by k_tile_tokens tokens. Within a tile, each activation row stays in L1
// while it meets the tile's weight rows, and the weight rows (at most 16 x ~8 KB) stay in L2 across its tokens.
constexpr int64_t k_tile_rows = 16;
constexpr int64_t k_tile_tokens = 64;

}  // namespace

void cpu_matmul_isa(ThreadPool &pool, const Weight &w, const Act &x, const Act &y, CpuIsa isa) {
    const int64_t K = w.ne[0], N = w.ne[1], T = x.rows;
    STRATA_ASSERT(x.cols == K && y.cols == N && y.rows == T);
    if (T == 0 || N == 0) return;

    const DType vt = dot_act_type(w.type);
    const VecDotKernel kernel = vec_dot_kernel(w.type, isa);
    if (!kernel.dot) {
        // Types stored as weights only in unusual files (the activation formats Q8_1, Q8_K): the loader accepts
        // every dequantizable type, so compute them through the reference path rather than refuse.
        cpu_matmul_reference(pool, w, x, y);
        return;
    }

    // Activation rows as the dot products read them: x itself for float weights, else quantized once per row.
    const uint8_t *xq = reinterpret_cast<const uint8_t *>(x.data);
    size_t xq_stride = size_t(x.stride) * sizeof(float);
    if (vt != DType::F32) {
        if (K % dtype_info(vt).block_size != 0)
            fail("matmul with '%.*s': row length %lld is not a multiple of %s blocks", int(w.name.size()),
                 w.name.data(), (long long)K, dtype_name(vt));
        const QuantizeActFn quantize = quantize_act_fn(vt, isa);
        STRATA_ASSERT(quantize != nullptr);
        xq_stride = row_bytes(vt, K);
        thread_local std::vector<uint8_t> buffer;  // the calling thread's, reused across calls
        if (buffer.size() < size_t(T) * xq_stride) buffer.resize(size_t(T) * xq_stride);
        uint8_t *dst = buffer.data();
        pool.parallel_for(T, std::max<int64_t>(1, 8192 / K), [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; t++) quantize(x.row(t), dst + size_t(t) * xq_stride, K);
        });
        xq = dst;
    }

    // Fewer rows per tile when there are too few tiles to keep every thread busy (decode: one token, N rows).
    int64_t tile_rows = k_tile_rows;
    const int64_t token_blocks = (T + k_tile_tokens - 1) / k_tile_tokens;
    while (tile_rows > 1 && ((N + tile_rows - 1) / tile_rows) * token_blocks < 4 * int64_t(pool.size()))
        tile_rows /= 2;
    const int64_t row_tiles = (N + tile_rows - 1) / tile_rows;

    // Tiles in row-tile-major order: a thread's contiguous share covers whole row tiles, so each thread streams
    // its own weight rows from memory once and the activations (shared, small) from cache.
    pool.parallel_for(row_tiles * token_blocks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t tile = begin; tile < end; tile++) {
            const int64_t n0 = (tile / token_blocks) * tile_rows, n1 = std::min(N, n0 + tile_rows);
            const int64_t t0 = (tile % token_blocks) * k_tile_tokens, t1 = std::min(T, t0 + k_tile_tokens);
            // Up to max_rows tokens at a time against each weight row: the row is unpacked once for all of them.
            for (int64_t t = t0; t < t1; t += kernel.max_rows) {
                const int nx = int(std::min<int64_t>(kernel.max_rows, t1 - t));
                const uint8_t *xr = xq + size_t(t) * xq_stride;
                for (int64_t n = n0; n < n1; n++) {
                    const uint8_t *wr = w.host + size_t(n) * w.row_bytes;
                    if (nx == 1 || !kernel.dot_rows) {
                        for (int j = 0; j < nx; j++) y.row(t + j)[n] = kernel.dot(K, wr, xr + size_t(j) * xq_stride);
                    } else {
                        float out[8];
                        kernel.dot_rows(K, wr, xr, xq_stride, out, nx);
                        for (int j = 0; j < nx; j++) y.row(t + j)[n] = out[j];
                    }
                }
            }
        }
    });
}

void cpu_matmul(ThreadPool &pool, const Weight &w, const Act &x, const Act &y) {
    cpu_matmul_isa(pool, w, x, y, cpu_isa_active());
}

void CpuBackend::matmul(const Weight &w, Act x, Act out) { cpu_matmul(pool_, w, x, out); }

}  // namespace strata
