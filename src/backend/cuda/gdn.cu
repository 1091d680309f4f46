// Gated DeltaNet kernels. The recurrent kernels: by default a v-head's state in the registers of d_v / 32 blocks (32
// columns a block, 32 rows a warp); STRATA_CUDA_GDN_COLUMNS=0 one block a head with the state in shared memory;
// the chunked kernel follows cpu_gdn.cpp's chunk algorithm (REFERENCE.md §5) step for step, one block per v-head,
// with the chunk's matrices in a global workspace and the state updated in place in the cache.
#include "backend/cuda/gdn.cuh"

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int k_chunk = 64;

__global__ void k_gdn_conv(GdnShape s, Rows qkv, const float *w_conv, const float *state, float *state_tmp, float *xc) {
    pdl_wait();
    pdl_release();
    const int64_t t = blockIdx.y, n = qkv.rows, K = s.conv_kernel, C = s.conv_dim();
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
        auto xin = [&](int64_t row) {
            return row < K - 1 ? state[row * C + c] : qkv.data[(row - (K - 1)) * qkv.stride + c];
        };
        if (t < n) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) acc += w_conv[c * K + j] * xin(t + j);
            xc[t * C + c] = acc / (1.0f + expf(-acc));
        }
        // the new state: input rows n .. n + K - 2, written by blocks 0 .. K - 2
        if (t < K - 1) state_tmp[t * C + c] = xin(n + t);
    }
}

__global__ void k_gdn_qk_norm(GdnShape s, float *xc, float q_scale) {
    pdl_wait();
    pdl_release();
    const int64_t t = blockIdx.y, h = blockIdx.x;  // h < 2 n_k: q heads, then k heads
    float *x = xc + t * s.conv_dim() + h * s.d_k;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < s.d_k; i += 32) ss += x[i] * x[i];
    ss = warp_sum(ss);
    float sc = 1.0f / sqrtf(ss + 1e-6f);
    if (h < s.n_k) sc *= q_scale;
    for (int64_t i = threadIdx.x; i < s.d_k; i += 32) x[i] *= sc;
}

__global__ void k_gdn_gates(GdnShape s, Rows beta_in, Rows alpha_in, const float *dt_bias, const float *a_neg, float *g,
                            float *beta) {
    pdl_wait();
    pdl_release();
    const int64_t t = blockIdx.x;
    const int64_t r = s.n_v / s.n_k;
    for (int64_t j = threadIdx.x; j < s.n_v; j += blockDim.x) {
        float bj, aj;
        if (s.ba_grouped) {
            const int64_t grp = j / r, i = j % r;
            bj = beta_in.data[t * beta_in.stride + grp * 2 * r + i];
            aj = beta_in.data[t * beta_in.stride + grp * 2 * r + r + i];
        } else {
            bj = beta_in.data[t * beta_in.stride + j];
            aj = alpha_in.data[t * alpha_in.stride + j];
        }
        const float x = aj + dt_bias[j];
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        beta[t * s.n_v + j] = 1.0f / (1.0f + expf(-bj));
        g[t * s.n_v + j] = a_neg[j] * sp;
    }
}

__device__ __forceinline__ int64_t k_head_of(const GdnShape &s, int64_t j) {
    return s.vhead_tiled ? j % s.n_k : j / (s.n_v / s.n_k);
}

// One block per v-head, thread j owns state column j (d_v threads, rounded up to a warp multiple).
__global__ void k_delta_rule_recurrent(GdnShape s, const float *xc, const float *g, const float *beta, int64_t n,
                                       float *states, Rows out) {
    pdl_wait();
    pdl_release();
    extern __shared__ float smem[];
    const int64_t head = blockIdx.x, kh = k_head_of(s, head), dk = s.d_k, dv = s.d_v, C = s.conv_dim();
    float *S = smem, *qs = smem + dk * dv, *ks = qs + dk;
    float *Sg = states + head * dk * dv;
    for (int64_t i = threadIdx.x; i < dk * dv; i += blockDim.x) S[i] = Sg[i];
    const int64_t j = threadIdx.x;
    for (int64_t t = 0; t < n; t++) {
        __syncthreads();
        const float *row = xc + t * C;
        for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
            qs[i] = row[kh * dk + i];
            ks[i] = row[s.key_dim() + kh * dk + i];
        }
        __syncthreads();
        if (j < dv) {
            const float decay = expf(g[t * s.n_v + head]), b = beta[t * s.n_v + head];
            float kv = 0.0f;
            for (int64_t i = 0; i < dk; i++) {
                const float v = S[i * dv + j] * decay;
                S[i * dv + j] = v;
                kv += v * ks[i];
            }
            const float delta = (row[2 * s.key_dim() + head * dv + j] - kv) * b;
            float o = 0.0f;
            for (int64_t i = 0; i < dk; i++) {
                const float v = S[i * dv + j] + ks[i] * delta;
                S[i * dv + j] = v;
                o += v * qs[i];
            }
            out.data[t * out.stride + head * dv + j] = o;
        }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < dk * dv; i += blockDim.x) Sg[i] = S[i];
}

// The same recurrence for short runs (decoding), with the state in registers: block (v-head, 32 columns), warp w
// holds rows [32 w, 32 w + 32) of those columns, lane l column l, so the state is read and written once, coalesced,
// by d_v / 32 blocks a head instead of one. A column's dot products are summed a warp's rows in order, then over the
// warps in order (the one-block kernel sums all rows in order: other rounding, the same recurrence).
constexpr int k_rows_per_warp = 32;
constexpr int k_max_row_warps = 32;  // d_k <= 1024

__global__ void k_delta_rule_columns(GdnShape s, const float *xc, const float *g, const float *beta, int64_t n,
                                     float *states, Rows out) {
    pdl_wait();
    pdl_release();
    __shared__ float red[2][k_max_row_warps][32];
    const int64_t head = blockIdx.x, kh = k_head_of(s, head), dk = s.d_k, dv = s.d_v, C = s.conv_dim();
    const int w = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, n_w = int(blockDim.x) / 32;
    const int64_t j = int64_t(blockIdx.y) * 32 + lane, i0 = int64_t(w) * k_rows_per_warp;
    const bool col = j < dv;
    float *Sg = states + head * dk * dv;
    float S[k_rows_per_warp];
#pragma unroll
    for (int r = 0; r < k_rows_per_warp; r++) S[r] = col && i0 + r < dk ? Sg[(i0 + r) * dv + j] : 0.0f;
    for (int64_t t = 0; t < n; t++) {
        const float *row = xc + t * C;
        const bool mine = i0 + lane < dk;  // lane l brings row i0 + l's q and k
        const float qv = mine ? row[kh * dk + i0 + lane] : 0.0f,
                    kv = mine ? row[s.key_dim() + kh * dk + i0 + lane] : 0.0f;
        const float decay = expf(g[t * s.n_v + head]), b = beta[t * s.n_v + head];
        float part = 0.0f;
#pragma unroll
        for (int r = 0; r < k_rows_per_warp; r++) {
            S[r] *= decay;
            part += S[r] * __shfl_sync(0xffffffffu, kv, r);
        }
        red[0][w][lane] = part;
        __syncthreads();
        float kvj = 0.0f;
        for (int x = 0; x < n_w; x++) kvj += red[0][x][lane];
        const float delta = col ? (row[2 * s.key_dim() + head * dv + j] - kvj) * b : 0.0f;
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < k_rows_per_warp; r++) {
            S[r] += __shfl_sync(0xffffffffu, kv, r) * delta;
            o += S[r] * __shfl_sync(0xffffffffu, qv, r);
        }
        red[1][w][lane] = o;
        __syncthreads();
        if (w == 0 && col) {
            float oj = 0.0f;
            for (int x = 0; x < n_w; x++) oj += red[1][x][lane];
            out.data[t * out.stride + head * dv + j] = oj;
        }
    }
#pragma unroll
    for (int r = 0; r < k_rows_per_warp; r++)
        if (col && i0 + r < dk) Sg[(i0 + r) * dv + j] = S[r];
}

// STRATA_CUDA_GDN_COLUMNS=0 keeps short runs on the one-block-per-head kernel (read at every launch, so that a test
// can run both).
bool gdn_columns_enabled() {
    return env_switch("STRATA_CUDA_GDN_COLUMNS", true);
}

// Chunked form; workspace per head: W [C][d_k], U [C][d_v], A [C][C], QK [C][C].
__global__ void k_delta_rule_chunked(GdnShape s, const float *xc, const float *g, const float *beta, int64_t n,
                                     float *states, Rows out, float *workspace) {
    __shared__ float gam[k_chunk];
    const int64_t head = blockIdx.x, kh = k_head_of(s, head), dk = s.d_k, dv = s.d_v, C = s.conv_dim();
    const int64_t kd = s.key_dim(), nv = s.n_v;
    float *S = states + head * dk * dv;
    float *W = workspace + head * (k_chunk * (dk + dv) + 2 * k_chunk * k_chunk);
    float *U = W + k_chunk * dk, *A = U + k_chunk * dv, *QK = A + k_chunk * k_chunk;
    const int tid = threadIdx.x, nt = blockDim.x;
    auto q = [&](int64_t t, int64_t i) { return xc[t * C + kh * dk + i]; };
    auto k = [&](int64_t t, int64_t i) { return xc[t * C + kd + kh * dk + i]; };
    auto v = [&](int64_t t, int64_t i) { return xc[t * C + 2 * kd + head * dv + i]; };

    for (int64_t c0 = 0; c0 < n; c0 += k_chunk) {
        const int64_t L = min(int64_t(k_chunk), n - c0);
        __syncthreads();
        if (tid == 0) {
            float acc = 0.0f;
            for (int64_t r = 0; r < L; r++) gam[r] = acc += g[(c0 + r) * nv + head];
        }
        __syncthreads();
        // A_rs = beta_r (k_r . k_s) e^(gamma_r - gamma_s) and QK_rs = (q_r . k_s) e^(gamma_r - gamma_s), s <= r
        for (int64_t w = tid; w < L * L; w += nt) {
            const int64_t r = w / L, sidx = w % L;
            if (sidx > r) continue;
            float kk = 0.0f, qk = 0.0f;
            for (int64_t i = 0; i < dk; i++) {
                kk += k(c0 + r, i) * k(c0 + sidx, i);
                qk += q(c0 + r, i) * k(c0 + sidx, i);
            }
            const float dec = expf(gam[r] - gam[sidx]);
            A[r * k_chunk + sidx] = beta[(c0 + r) * nv + head] * kk * dec;
            QK[r * k_chunk + sidx] = qk * dec;
        }
        __syncthreads();
        // forward substitution, one row at a time
        for (int64_t r = 0; r < L; r++) {
            const float br = beta[(c0 + r) * nv + head];
            const float bw = br * expf(gam[r]);
            for (int64_t e = tid; e < dk + dv; e += nt) {
                if (e < dk) {
                    float x = bw * k(c0 + r, e);
                    for (int64_t sidx = 0; sidx < r; sidx++) x -= A[r * k_chunk + sidx] * W[sidx * dk + e];
                    W[r * dk + e] = x;
                } else {
                    const int64_t jj = e - dk;
                    float x = br * v(c0 + r, jj);
                    for (int64_t sidx = 0; sidx < r; sidx++) x -= A[r * k_chunk + sidx] * U[sidx * dv + jj];
                    U[r * dv + jj] = x;
                }
            }
            __syncthreads();
        }
        // V' = U - W S
        for (int64_t w = tid; w < L * dv; w += nt) {
            const int64_t r = w / dv, jj = w % dv;
            float x = U[r * dv + jj];
            for (int64_t i = 0; i < dk; i++) x -= W[r * dk + i] * S[i * dv + jj];
            U[r * dv + jj] = x;
        }
        __syncthreads();
        // O = e^gamma Q S + (QK . D . M) V'
        for (int64_t w = tid; w < L * dv; w += nt) {
            const int64_t r = w / dv, jj = w % dv;
            const float eg = expf(gam[r]);
            float o = 0.0f;
            for (int64_t i = 0; i < dk; i++) o += (q(c0 + r, i) * eg) * S[i * dv + jj];
            for (int64_t sidx = 0; sidx <= r; sidx++) o += QK[r * k_chunk + sidx] * U[sidx * dv + jj];
            out.data[(c0 + r) * out.stride + head * dv + jj] = o;
        }
        __syncthreads();
        // S <- e^gamma_L S + sum_r e^(gamma_L - gamma_r) k_r v'_r^T
        const float gL = gam[L - 1], eL = expf(gL);
        for (int64_t w = tid; w < dk * dv; w += nt) {
            const int64_t i = w / dv, jj = w % dv;
            float x = S[w] * eL;
            for (int64_t r = 0; r < L; r++) x += (k(c0 + r, i) * expf(gL - gam[r])) * U[r * dv + jj];
            S[w] = x;
        }
    }
}

__global__ void k_gdn_gated_norm(GdnShape s, Rows out, Rows z, const float *w) {
    pdl_wait();
    pdl_release();
    __shared__ float red[32];
    const int64_t t = blockIdx.y, j = blockIdx.x;
    float *o = out.data + t * out.stride + j * s.d_v;
    const float *zz = z.data + t * z.stride + j * s.d_v;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < s.d_v; i += blockDim.x) ss += o[i] * o[i];
    ss = block_sum(ss, red);
    const float sc = 1.0f / sqrtf(ss / float(s.d_v) + s.eps);
    for (int64_t i = threadIdx.x; i < s.d_v; i += blockDim.x) {
        const float zi = zz[i];
        o[i] = o[i] * sc * w[i] * (zi / (1.0f + expf(-zi)));
    }
}

}  // namespace

void launch_gdn_conv(const GdnShape &s, Rows qkv, const float *w_conv, float *state, float *state_tmp, float *xc,
                     cudaStream_t stream) {
    const int64_t n = qkv.rows, K = s.conv_kernel, C = s.conv_dim();
    if (n == 0) return;
    STRATA_ASSERT(n <= 65535 && K >= 1);
    // One block row per token, and at least K - 1 of them: block t < K - 1 also writes state row t.
    const int64_t rows = std::max(n, K - 1);
    pdl_launch(k_gdn_conv, dim3(std::min<unsigned>(ceil_div(C, 256), 64), unsigned(rows)), 256, 0, stream, s, qkv,
               w_conv, state, state_tmp, xc);
    STRATA_CUDA_LAUNCH_CHECK("k_gdn_conv");
    if (K > 1)
        STRATA_CUDA_CHECK(cudaMemcpyAsync(state, state_tmp, size_t((K - 1) * C) * 4, cudaMemcpyDeviceToDevice, stream));
}

void launch_gdn_qk_norm(const GdnShape &s, float *xc, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    pdl_launch(k_gdn_qk_norm, dim3(unsigned(2 * s.n_k), unsigned(n)), 32, 0, stream, s, xc, 1.0f / sqrtf(float(s.d_k)));
    STRATA_CUDA_LAUNCH_CHECK("k_gdn_qk_norm");
}

void launch_gdn_gates(const GdnShape &s, Rows beta_in, Rows alpha_in, const float *dt_bias, const float *a_neg,
                      float *g, float *beta, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    pdl_launch(k_gdn_gates, unsigned(n), 64, 0, stream, s, beta_in, alpha_in, dt_bias, a_neg, g, beta);
    STRATA_CUDA_LAUNCH_CHECK("k_gdn_gates");
}

int64_t gdn_chunk_workspace_floats(const GdnShape &s) {
    return s.n_v * (k_chunk * (s.d_k + s.d_v) + 2 * k_chunk * k_chunk);
}

void launch_gdn_delta_rule(const GdnShape &s, const float *xc, const float *g, const float *beta, int64_t n,
                           float *states, Rows out, float *workspace, bool chunked, cudaStream_t stream) {
    if (n == 0) return;
    if (chunked) {
        k_delta_rule_chunked<<<unsigned(s.n_v), 256, 0, stream>>>(s, xc, g, beta, n, states, out, workspace);
        STRATA_CUDA_LAUNCH_CHECK("k_delta_rule_chunked");
        return;
    }
    if (gdn_columns_enabled() && s.d_k <= k_rows_per_warp * k_max_row_warps) {
        const dim3 grid(unsigned(s.n_v), unsigned(ceil_div(s.d_v, 32)));
        const unsigned threads = unsigned(ceil_div(s.d_k, k_rows_per_warp)) * 32;
        pdl_launch(k_delta_rule_columns, grid, threads, 0, stream, s, xc, g, beta, n, states, out);
        STRATA_CUDA_LAUNCH_CHECK("k_delta_rule_columns");
        return;
    }
    const size_t smem = size_t(s.d_k * s.d_v + 2 * s.d_k) * sizeof(float);
    if (smem > 48 * 1024 && !allow_dynamic_smem(reinterpret_cast<const void *>(k_delta_rule_recurrent), smem)) {
        int dev = 0, max_optin = 0;
        STRATA_CUDA_CHECK(cudaGetDevice(&dev));
        STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        fail("CUDA Gated DeltaNet: a %lld x %lld state needs %zu bytes of shared memory; this GPU offers %d",
             (long long)s.d_k, (long long)s.d_v, smem, max_optin);
    }
    const unsigned threads = std::min<unsigned>(1024, ceil_div(s.d_v, 32) * 32);
    if (s.d_v > 1024) fail("CUDA Gated DeltaNet: head_v_dim %lld is above 1024", (long long)s.d_v);
    pdl_launch(k_delta_rule_recurrent, unsigned(s.n_v), threads, smem, stream, s, xc, g, beta, n, states, out);
    STRATA_CUDA_LAUNCH_CHECK("k_delta_rule_recurrent");
}

void launch_gdn_gated_norm(const GdnShape &s, Rows out, Rows z, const float *norm_w, cudaStream_t stream) {
    if (out.rows == 0) return;
    STRATA_ASSERT(out.rows <= 65535);
    const unsigned threads = s.d_v >= 128 ? 128 : 32;
    pdl_launch(k_gdn_gated_norm, dim3(unsigned(s.n_v), unsigned(out.rows)), threads, 0, stream, s, out, z, norm_w);
    STRATA_CUDA_LAUNCH_CHECK("k_gdn_gated_norm");
}

}  // namespace strata::cuda
