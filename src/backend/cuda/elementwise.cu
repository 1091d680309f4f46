// Elementwise ops, row gathers, RMSNorm and NeoX RoPE on the device.
#include "backend/cuda/elementwise.cuh"

#include <algorithm>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/norm_row.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/exact_math.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

// Grid: x over column chunks, y over rows; more rows than a grid's y takes are launched in slices.
struct Grid2 {
    dim3 grid;
    unsigned threads;
};
Grid2 rows_grid(int64_t rows, int64_t cols) {
    const unsigned threads = cols >= 256 ? 256 : cols >= 64 ? 64 : 32;
    return {dim3(std::min<unsigned>(ceil_div(cols, threads), 64), unsigned(rows)), threads};
}

#define FOR_COLS(c, cols) \
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < (cols); c += int64_t(gridDim.x) * blockDim.x)

__global__ void k_add(Rows a, Rows b, Rows out) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    FOR_COLS(c, a.cols) out.data[r * out.stride + c] = a.data[r * a.stride + c] + b.data[r * b.stride + c];
}

__global__ void k_mul_sigmoid(Rows x, Rows g) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    FOR_COLS(c, x.cols) x.data[r * x.stride + c] *= 1.0f / (1.0f + expf(-g.data[r * g.stride + c]));
}

__global__ void k_silu_mul(Rows g, Rows u) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    FOR_COLS(c, g.cols) {
        const float v = g.data[r * g.stride + c];
        g.data[r * g.stride + c] = exact::silu_mul(v, u.data[r * u.stride + c]);
    }
}

__global__ void k_gather_rows(Rows src, const int32_t *rows, Rows dst) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    const float *s = src.data + int64_t(rows[r]) * src.stride;
    FOR_COLS(c, dst.cols) dst.data[r * dst.stride + c] = s[c];
}

__global__ void k_deinterleave(Rows src, int64_t width, Rows a, Rows b) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    FOR_COLS(c, a.cols) {
        const int64_t pair = c / width, i = c % width;
        a.data[r * a.stride + c] = src.data[r * src.stride + 2 * pair * width + i];
        b.data[r * b.stride + c] = src.data[r * src.stride + (2 * pair + 1) * width + i];
    }
}

// One block per (row, group); sum of squares in f32 over a fixed tree.
__global__ void k_rms_norm(Rows x, const float *w, int64_t group, float eps, Rows out) {
    pdl_wait();
    pdl_release();
    __shared__ float red[32];
    const int64_t r = blockIdx.y, g0 = int64_t(blockIdx.x) * group;
    const float *xr = x.data + r * x.stride + g0;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / float(group) + eps);
    float *yr = out.data + r * out.stride + g0;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// Groups of 1024..8192 columns (a whole hidden row), group % 4 == 0 and 16-byte aligned rows: 256 threads, each with
// KPT float4s of the group and of w in registers, so every load of the row is in flight at once (the loop above
// waits for one load per step: 8 us for a 2048-wide row against about 2 here). ADD: x += y first, the sum stored
// back to x, so a residual add and the next norm are one pass; the norm's arithmetic is the same either way.
template <int KPT, bool ADD>
__global__ void __launch_bounds__(256)
    k_rms_norm_wide(Rows x, Rows y, const float *w, int64_t group, float eps, Rows out, NormQ8 q8) {
    pdl_wait();
    pdl_release();
    __shared__ float red[32], pick[24];
    const int64_t r = blockIdx.y, g0 = int64_t(blockIdx.x) * group;
    float4 *xr = reinterpret_cast<float4 *>(x.data + r * x.stride + g0);
    const int n4 = int(group >> 2);
    float4 v[KPT], wv[KPT];
    wide_row_load<KPT>(x.data + r * x.stride + g0, ADD ? y.data + r * y.stride + g0 : nullptr, w, n4, v, wv);
    if (ADD) {
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const int i = int(threadIdx.x) + j * 256;
            if (i < n4) xr[i] = v[j];
        }
    }
    if (q8.form) q8.q += r * group, q8.ds += r * (group / 32);  // whole rows only (one group a row)
    rms_norm_wide_row<KPT>(v, wv, n4, group, eps, red, reinterpret_cast<float4 *>(out.data + r * out.stride + g0), q8,
                           pick);
}

__global__ void k_rope_neox(Rows x, int64_t head_dim, int64_t half, const float *inv_freq, const int2 *seq_pos) {
    pdl_wait();
    pdl_release();
    const int64_t r = blockIdx.y;
    const int64_t n_head = x.cols / head_dim;
    const float p = float(seq_pos[r].y);
    for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < n_head * half;
         w += int64_t(gridDim.x) * blockDim.x) {
        const int64_t h = w / half, i = w % half;
        const float angle = __fmul_rn(p, inv_freq[i]);
        float sn, cs;
        sincosf(angle, &sn, &cs);
        float *hd = x.data + r * x.stride + h * head_dim;
        const float2 o = rope_pair(hd[i], hd[i + half], cs, sn);
        hd[i] = o.x;
        hd[i + half] = o.y;
    }
}

constexpr int64_t k_grid_rows = 65535;

Rows slice(const Rows &a, int64_t r0, int64_t n) {
    return {a.data + r0 * a.stride, n, a.cols, a.stride};
}

// f(r0, n) for consecutive slices of at most k_grid_rows rows.
template <class F>
void for_row_slices(int64_t rows, F &&f) {
    for (int64_t r0 = 0; r0 < rows; r0 += k_grid_rows) f(r0, std::min(k_grid_rows, rows - r0));
}

// One unit (16, 4 or 1 bytes, as the addresses and sizes allow) a thread, over the whole rows x units grid.
template <typename U>
__global__ void k_copy_from_host(U *dst, size_t dst_pitch_u, const U *src, size_t row_u, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / row_u, c = i - r * row_u;
        dst[r * dst_pitch_u + c] = src[i];
    }
}

template <typename U>
void copy_from_host_as(void *dst, size_t dst_pitch, const void *src, size_t row_bytes, size_t rows,
                       cudaStream_t stream) {
    const size_t row_u = row_bytes / sizeof(U), n = row_u * rows;
    const unsigned threads = 256, blocks = unsigned(std::min<size_t>(ceil_div(n, threads), 1024));
    k_copy_from_host<U><<<blocks, threads, 0, stream>>>(static_cast<U *>(dst), dst_pitch / sizeof(U),
                                                        static_cast<const U *>(src), row_u, n);
}

// k_copy_from_host after the host's signal: thread 0 of each block polls the word (acquire, system scope: the host's
// stores before its release of the word are seen), the block's barrier passes that on, and the rows are read with
// loads that fetch again (ld.global.cv), none of it before the word said they were written.
template <typename U>
__global__ void k_copy_from_host_after(U *dst, size_t dst_pitch_u, const U *src, size_t row_u, size_t n,
                                       const uint32_t *signal, uint32_t ticket) {
    if (threadIdx.x == 0)
        for (;;) {
            uint32_t v;
            asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(signal) : "memory");
            if (int32_t(v - ticket) >= 0) break;
            __nanosleep(100);
        }
    __syncthreads();
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / row_u, c = i - r * row_u;
        dst[r * dst_pitch_u + c] = __ldcv(src + i);
    }
}

template <typename U>
void copy_from_host_after_as(void *dst, size_t dst_pitch, const void *src, size_t row_bytes, size_t rows,
                             const uint32_t *signal, uint32_t ticket, cudaStream_t stream) {
    const size_t row_u = row_bytes / sizeof(U), n = row_u * rows;
    const unsigned threads = 256, blocks = unsigned(std::clamp<size_t>(ceil_div(n, threads), 1, 64));
    k_copy_from_host_after<U><<<blocks, threads, 0, stream>>>(static_cast<U *>(dst), dst_pitch / sizeof(U),
                                                              static_cast<const U *>(src), row_u, n, signal, ticket);
}

}  // namespace

void launch_copy_from_host_after(void *dst, size_t dst_pitch, const void *src_dev, size_t row_bytes, size_t rows,
                                 const uint32_t *signal_dev, uint32_t ticket, cudaStream_t stream) {
    STRATA_ASSERT((uintptr_t(dst) | uintptr_t(src_dev) | dst_pitch | row_bytes) % 4 == 0);
    // every block waits, also one without rows: the copy ends only after the signal either way
    rows = row_bytes ? rows : 0;
    if ((uintptr_t(dst) | uintptr_t(src_dev) | dst_pitch | row_bytes) % 16 == 0)
        copy_from_host_after_as<uint4>(dst, dst_pitch, src_dev, row_bytes, rows, signal_dev, ticket, stream);
    else
        copy_from_host_after_as<uint32_t>(dst, dst_pitch, src_dev, row_bytes, rows, signal_dev, ticket, stream);
    STRATA_CUDA_LAUNCH_CHECK("k_copy_from_host_after");
}

void launch_copy_from_host(void *dst, size_t dst_pitch, const void *src_dev, size_t row_bytes, size_t rows,
                           cudaStream_t stream) {
    if (rows == 0 || row_bytes == 0) return;
    const auto aligned = [&](size_t a) {
        return (uintptr_t(dst) | uintptr_t(src_dev) | dst_pitch | row_bytes) % a == 0;
    };
    if (aligned(16))
        copy_from_host_as<uint4>(dst, dst_pitch, src_dev, row_bytes, rows, stream);
    else if (aligned(4))
        copy_from_host_as<uint32_t>(dst, dst_pitch, src_dev, row_bytes, rows, stream);
    else
        copy_from_host_as<uint8_t>(dst, dst_pitch, src_dev, row_bytes, rows, stream);
    STRATA_CUDA_LAUNCH_CHECK("k_copy_from_host");
}

void launch_add(Rows a, Rows b, Rows out, cudaStream_t stream) {
    if (a.rows == 0) return;
    for_row_slices(a.rows, [&](int64_t r0, int64_t n) {
        const Grid2 g = rows_grid(n, a.cols);
        pdl_launch(k_add, g.grid, g.threads, 0, stream, slice(a, r0, n), slice(b, r0, n), slice(out, r0, n));
    });
    STRATA_CUDA_LAUNCH_CHECK("k_add");
}

void launch_mul_sigmoid(Rows x, Rows gate, cudaStream_t stream) {
    if (x.rows == 0) return;
    for_row_slices(x.rows, [&](int64_t r0, int64_t n) {
        const Grid2 g = rows_grid(n, x.cols);
        pdl_launch(k_mul_sigmoid, g.grid, g.threads, 0, stream, slice(x, r0, n), slice(gate, r0, n));
    });
    STRATA_CUDA_LAUNCH_CHECK("k_mul_sigmoid");
}

void launch_silu_mul(Rows gt, Rows u, cudaStream_t stream) {
    if (gt.rows == 0) return;
    for_row_slices(gt.rows, [&](int64_t r0, int64_t n) {
        const Grid2 g = rows_grid(n, gt.cols);
        pdl_launch(k_silu_mul, g.grid, g.threads, 0, stream, slice(gt, r0, n), slice(u, r0, n));
    });
    STRATA_CUDA_LAUNCH_CHECK("k_silu_mul");
}

void launch_gather_rows(Rows src, const int32_t *rows_dev, Rows dst, cudaStream_t stream) {
    if (dst.rows == 0) return;
    for_row_slices(dst.rows, [&](int64_t r0, int64_t n) {
        const Grid2 g = rows_grid(n, dst.cols);
        pdl_launch(k_gather_rows, g.grid, g.threads, 0, stream, src, rows_dev + r0, slice(dst, r0, n));
    });
    STRATA_CUDA_LAUNCH_CHECK("k_gather_rows");
}

void launch_deinterleave(Rows src, int64_t width, Rows a, Rows b, cudaStream_t stream) {
    if (src.rows == 0) return;
    for_row_slices(src.rows, [&](int64_t r0, int64_t n) {
        const Grid2 g = rows_grid(n, a.cols);
        pdl_launch(k_deinterleave, g.grid, g.threads, 0, stream, slice(src, r0, n), width, slice(a, r0, n),
                   slice(b, r0, n));
    });
    STRATA_CUDA_LAUNCH_CHECK("k_deinterleave");
}

namespace {

bool aligned16(const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

bool wide_rows(const Rows &a, int64_t group) {
    return group >= 1024 && group <= 8192 && group % 4 == 0 && aligned16(a.data) && a.stride % 4 == 0;
}

template <bool ADD>
void launch_wide(Rows x, Rows y, const float *w, int64_t group, float eps, Rows out, cudaStream_t stream,
                 NormQ8 q8 = {}) {
    const int64_t n4 = group / 4;
    for_row_slices(x.rows, [&](int64_t r0, int64_t n) {
        const dim3 grid(unsigned(x.cols / group), unsigned(n));
        const Rows xs = slice(x, r0, n), ys = ADD ? slice(y, r0, n) : xs, os = slice(out, r0, n);
        NormQ8 qs = q8;
        if (qs.form) qs.q += r0 * group, qs.ds += r0 * (group / 32);
        if (n4 <= 256)
            pdl_launch(k_rms_norm_wide<1, ADD>, grid, 256, 0, stream, xs, ys, w, group, eps, os, qs);
        else if (n4 <= 512)
            pdl_launch(k_rms_norm_wide<2, ADD>, grid, 256, 0, stream, xs, ys, w, group, eps, os, qs);
        else if (n4 <= 1024)
            pdl_launch(k_rms_norm_wide<4, ADD>, grid, 256, 0, stream, xs, ys, w, group, eps, os, qs);
        else
            pdl_launch(k_rms_norm_wide<8, ADD>, grid, 256, 0, stream, xs, ys, w, group, eps, os, qs);
    });
    STRATA_CUDA_LAUNCH_CHECK("k_rms_norm_wide");
}

}  // namespace

bool norm_quantizes(const Rows &x, const Rows &out, int64_t group, const float *w, int form) {
    return (form == 1 || form == 2) && group == x.cols && group % (form == 2 ? 256 : 32) == 0 &&
           wide_rows(x, group) && wide_rows(out, group) && aligned16(w);
}

void launch_rms_norm(Rows x, const float *w, int64_t group, float eps, Rows out, cudaStream_t stream,
                     const NormQ8 &q8) {
    if (x.rows == 0) return;
    STRATA_ASSERT(group > 0 && x.cols % group == 0);
    STRATA_ASSERT(!q8.form || norm_quantizes(x, out, group, w, q8.form));
    if (wide_rows(x, group) && wide_rows(out, group) && aligned16(w))
        return launch_wide<false>(x, x, w, group, eps, out, stream, q8);
    const unsigned threads = group >= 1024 ? 256 : group >= 128 ? 128 : 32;
    for_row_slices(x.rows, [&](int64_t r0, int64_t n) {
        pdl_launch(k_rms_norm, dim3(unsigned(x.cols / group), unsigned(n)), threads, 0, stream, slice(x, r0, n), w,
                   group, eps, slice(out, r0, n));
    });
    STRATA_CUDA_LAUNCH_CHECK("k_rms_norm");
}

void launch_add_rms_norm(Rows x, Rows y, const float *w, int64_t group, float eps, Rows out, cudaStream_t stream,
                         const NormQ8 &q8) {
    if (x.rows == 0) return;
    STRATA_ASSERT(group > 0 && x.cols % group == 0 && y.rows == x.rows && y.cols == x.cols);
    STRATA_ASSERT(!q8.form || (norm_quantizes(x, out, group, w, q8.form) && wide_rows(y, group)));
    if (wide_rows(x, group) && wide_rows(y, group) && wide_rows(out, group) && aligned16(w))
        return launch_wide<true>(x, y, w, group, eps, out, stream, q8);
    launch_add(x, y, x, stream);
    launch_rms_norm(x, w, group, eps, out, stream);
}

void launch_rope_neox(Rows x, int64_t head_dim, int64_t n_rot, const float *inv_freq_dev, const int2 *seq_pos_dev,
                      cudaStream_t stream) {
    if (x.rows == 0 || n_rot == 0) return;
    const int64_t work = (x.cols / head_dim) * (n_rot / 2);
    const unsigned threads = work >= 128 ? 128 : 32;
    for_row_slices(x.rows, [&](int64_t r0, int64_t n) {
        pdl_launch(k_rope_neox, dim3(std::min<unsigned>(ceil_div(work, threads), 64), unsigned(n)), threads, 0, stream,
                   slice(x, r0, n), head_dim, n_rot / 2, inv_freq_dev, seq_pos_dev + r0);
    });
    STRATA_CUDA_LAUNCH_CHECK("k_rope_neox");
}

}  // namespace strata::cuda
