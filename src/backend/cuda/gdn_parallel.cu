// The chunked gated delta rule, parallel over chunks. Per chunk of 64 tokens and v-head (REFERENCE.md §5, with
// gamma the chunk's cumulative log decay), everything that does not depend on the state comes first, all chunks of a
// group at once:
//   A  = strict-lower(beta_r (k_r . k_s) e^(g_r - g_s)),  QK = lower(q_r . k_s e^(g_r - g_s))
//   W  = (I + A)^-1 diag(beta e^g) K,  U = (I + A)^-1 diag(beta) V      (forward substitution, a column per thread)
//   Qt = diag(e^g) Q - QK W,  O0 = QK U,  Kt_r = e^(g_L - g_r) k_r
// so that the pass over the state, one chunk after the other, is three products per chunk:
//   V' = U - W S,  O = Qt S + O0,  S <- e^(g_L) S + Kt^T V'
// The state's columns evolve independently, so the pass runs one block per v-head and 16-column slice of S.
// Padded rows of a short last chunk are zeros throughout and change nothing. fp32 everywhere.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/gdn.cuh"
#include "core/error.h"

namespace strata::cuda {

namespace {

constexpr int CH = 64;              // tokens per chunk
constexpr int k_group_chunks = 16;  // chunks whose prepared matrices are in the workspace at once
constexpr int AP = 68;              // pitch of the A and QK rows in shared memory (16-byte aligned rows)
constexpr int DS = 16;              // slice of the head dimension for the q/k products
constexpr int JB = 16;              // state columns per block of the state pass
constexpr int k_state_threads = 128;

template <int DK, int DV>
__host__ __device__ constexpr int64_t per_head_floats() {
    return int64_t(CH) * (3 * DK + 2 * DV);
}

__device__ __forceinline__ int64_t v_to_k_head(const GdnShape &s, int64_t j) {
    return s.vhead_tiled ? j % s.n_k : j / (s.n_v / s.n_k);
}

// One block per (v-head, chunk of the group), DK + DV threads: thread e owns column e of [W | U].
template <int DK, int DV>
__global__ __launch_bounds__(DK + DV) void k_gdn_prepare(GdnShape s, const float *xc, const float *g,
                                                         const float *beta, int64_t n, int64_t chunk0, float *ws,
                                                         float *decay) {
    constexpr int NT = DK + DV, TPT = 256 / NT;  // 4x4 tiles of the 64x64 products per thread
    static_assert(256 % NT == 0, "the product tiles divide over the threads");
    __shared__ __align__(16) float kq[2][DS][CH + 4];
    __shared__ __align__(16) float As[CH * AP], Qs[CH * AP];
    __shared__ float gam[CH], eg[CH], bet[CH];
    const int head = blockIdx.x, cc = blockIdx.y, tid = threadIdx.x;
    const int64_t c0 = (chunk0 + cc) * CH, C = s.conv_dim(), kd = s.key_dim(), nv = s.n_v;
    const int L = int(min(int64_t(CH), n - c0));
    const int64_t kh = v_to_k_head(s, head);
    if (tid == 0) {
        float acc = 0.0f;
        for (int r = 0; r < CH; r++) {
            if (r < L) acc += g[(c0 + r) * nv + head];
            gam[r] = acc;
            eg[r] = expf(acc);
            bet[r] = r < L ? beta[(c0 + r) * nv + head] : 0.0f;
        }
    }
    float ka[TPT][4][4], qa[TPT][4][4];
#pragma unroll
    for (int t = 0; t < TPT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) ka[t][i][j] = qa[t][i][j] = 0.0f;
    for (int d0 = 0; d0 < DK; d0 += DS) {
        __syncthreads();
        for (int i = tid; i < DS * CH; i += NT) {
            const int r = i / DS, d = i % DS;
            float kv = 0.0f, qv = 0.0f;
            if (r < L) {
                const float *row = xc + (c0 + r) * C;
                kv = row[kd + kh * DK + d0 + d];
                qv = row[kh * DK + d0 + d];
            }
            kq[0][d][r] = kv;
            kq[1][d][r] = qv;
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < TPT; t++) {
            const int ti = tid + t * NT, r0 = (ti / 16) * 4, s0 = (ti % 16) * 4;
#pragma unroll 8
            for (int d = 0; d < DS; d++) {
                const float4 kr = *reinterpret_cast<const float4 *>(&kq[0][d][r0]);
                const float4 qr = *reinterpret_cast<const float4 *>(&kq[1][d][r0]);
                const float4 ks = *reinterpret_cast<const float4 *>(&kq[0][d][s0]);
                const float kri[4] = {kr.x, kr.y, kr.z, kr.w}, qri[4] = {qr.x, qr.y, qr.z, qr.w};
                const float ksj[4] = {ks.x, ks.y, ks.z, ks.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        ka[t][i][j] += kri[i] * ksj[j];
                        qa[t][i][j] += qri[i] * ksj[j];
                    }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TPT; t++) {
        const int ti = tid + t * NT, r0 = (ti / 16) * 4, s0 = (ti % 16) * 4;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int r = r0 + i, c = s0 + j;
                const float dec = c <= r ? expf(gam[r] - gam[c]) : 0.0f;
                As[r * AP + c] = c < r ? bet[r] * ka[t][i][j] * dec : 0.0f;
                Qs[r * AP + c] = c <= r ? qa[t][i][j] * dec : 0.0f;
            }
    }
    __syncthreads();

    // Forward substitution for this thread's column: x_r = rhs_r - sum_{s<r} A_rs x_s.
    const int e = tid;
    const bool is_k = e < DK;
    const float *rows = xc + c0 * C;
    const int64_t col = is_k ? kd + kh * DK + e : 2 * kd + int64_t(head) * DV + (e - DK);
    float x[CH];
#pragma unroll
    for (int r = 0; r < CH; r++) {
        float acc = r < L ? rows[r * C + col] * (is_k ? bet[r] * eg[r] : bet[r]) : 0.0f;
#pragma unroll
        for (int c4 = 0; c4 < r; c4 += 4) {
            const float4 a = *reinterpret_cast<const float4 *>(&As[r * AP + c4]);
            acc -= a.x * x[c4];
            if (c4 + 1 < r) acc -= a.y * x[c4 + 1];
            if (c4 + 2 < r) acc -= a.z * x[c4 + 2];
            if (c4 + 3 < r) acc -= a.w * x[c4 + 3];
        }
        x[r] = acc;
    }

    float *W = ws + (int64_t(cc) * nv + head) * per_head_floats<DK, DV>();
    float *Qt = W + CH * DK, *Kt = Qt + CH * DK, *U = Kt + CH * DK, *O0 = U + CH * DV;
    const float g_last = gam[CH - 1];
#pragma unroll
    for (int r = 0; r < CH; r++) {
        float o = 0.0f;
#pragma unroll
        for (int c4 = 0; c4 <= r; c4 += 4) {
            const float4 q = *reinterpret_cast<const float4 *>(&Qs[r * AP + c4]);
            o += q.x * x[c4];
            if (c4 + 1 <= r) o += q.y * x[c4 + 1];
            if (c4 + 2 <= r) o += q.z * x[c4 + 2];
            if (c4 + 3 <= r) o += q.w * x[c4 + 3];
        }
        if (is_k) {
            const float qv = r < L ? rows[r * C + kh * DK + e] : 0.0f;
            const float kv = r < L ? rows[r * C + kd + kh * DK + e] : 0.0f;
            W[r * DK + e] = x[r];
            Qt[r * DK + e] = eg[r] * qv - o;
            Kt[r * DK + e] = expf(g_last - gam[r]) * kv;
        } else {
            U[r * DV + (e - DK)] = x[r];
            O0[r * DV + (e - DK)] = o;
        }
    }
    if (tid == 0) decay[cc * nv + head] = eg[CH - 1];
}

// A 64 x DK matrix of the workspace into shared memory.
template <int DK>
__device__ __forceinline__ void load_rows(float *dst, const float *src, int tid) {
    const float4 *s4 = reinterpret_cast<const float4 *>(src);
    float4 *d4 = reinterpret_cast<float4 *>(dst);
#pragma unroll 4
    for (int i = tid; i < CH * DK / 4; i += k_state_threads) d4[i] = s4[i];
}

// One block per (v-head, JB columns of the state); the chunks of the group one after the other.
template <int DK, int DV>
__global__ __launch_bounds__(k_state_threads) void k_gdn_state_pass(GdnShape s, const float *ws, const float *decay,
                                                                    int64_t n, int64_t chunk0, int n_chunks,
                                                                    float *states, Rows out) {
    constexpr int RPT = CH / (k_state_threads / JB);  // rows of a product per thread
    constexpr int IPT = DK / (k_state_threads / JB);  // state rows updated per thread
    static_assert(CH % (k_state_threads / JB) == 0 && IPT % 4 == 0, "thread tiles");
    __shared__ __align__(16) float buf[CH * DK];
    __shared__ __align__(16) float Ss[DK * JB];
    __shared__ float Vp[CH * (JB + 1)];
    const int head = blockIdx.x / (DV / JB), jb = blockIdx.x % (DV / JB), tid = threadIdx.x;
    const int j = tid % JB, grp = tid / JB;
    const int64_t nv = s.n_v;
    float *S = states + int64_t(head) * DK * DV + jb * JB;
    for (int i = tid; i < DK * JB; i += k_state_threads) Ss[i] = S[(i / JB) * DV + i % JB];

    // rows grp*RPT .. of (buf . S) for this thread's column
    auto product = [&](float *acc) {
#pragma unroll
        for (int a = 0; a < RPT; a++) acc[a] = 0.0f;
#pragma unroll 2
        for (int i = 0; i < DK; i += 4) {
            const float s0 = Ss[i * JB + j], s1 = Ss[(i + 1) * JB + j], s2 = Ss[(i + 2) * JB + j],
                        s3 = Ss[(i + 3) * JB + j];
#pragma unroll
            for (int a = 0; a < RPT; a++) {
                const float4 w = *reinterpret_cast<const float4 *>(&buf[(grp * RPT + a) * DK + i]);
                acc[a] += w.x * s0;
                acc[a] += w.y * s1;
                acc[a] += w.z * s2;
                acc[a] += w.w * s3;
            }
        }
    };

    for (int cc = 0; cc < n_chunks; cc++) {
        const float *W = ws + (int64_t(cc) * nv + head) * per_head_floats<DK, DV>();
        const float *Qt = W + CH * DK, *Kt = Qt + CH * DK, *U = Kt + CH * DK, *O0 = U + CH * DV;
        const int64_t c0 = (chunk0 + cc) * CH;
        const int L = int(min(int64_t(CH), n - c0));
        float acc[RPT];

        __syncthreads();
        load_rows<DK>(buf, W, tid);
        __syncthreads();
        product(acc);
#pragma unroll
        for (int a = 0; a < RPT; a++) {
            const int r = grp * RPT + a;
            Vp[r * (JB + 1) + j] = U[r * DV + jb * JB + j] - acc[a];
        }
        __syncthreads();
        load_rows<DK>(buf, Qt, tid);
        __syncthreads();
        product(acc);
#pragma unroll
        for (int a = 0; a < RPT; a++) {
            const int r = grp * RPT + a;
            if (r < L)
                out.data[(c0 + r) * out.stride + int64_t(head) * DV + jb * JB + j] =
                    acc[a] + O0[r * DV + jb * JB + j];
        }
        __syncthreads();
        load_rows<DK>(buf, Kt, tid);
        __syncthreads();
        // S rows grp*IPT .. for this thread's column: e^(g_L) S + Kt^T V'
        const float eL = decay[cc * nv + head];
        float sv[IPT];
#pragma unroll
        for (int q = 0; q < IPT; q++) sv[q] = eL * Ss[(grp * IPT + q) * JB + j];
#pragma unroll 4
        for (int r = 0; r < CH; r++) {
            const float v = Vp[r * (JB + 1) + j];
#pragma unroll
            for (int q = 0; q < IPT; q += 4) {
                const float4 k4 = *reinterpret_cast<const float4 *>(&buf[r * DK + grp * IPT + q]);
                sv[q] += k4.x * v;
                sv[q + 1] += k4.y * v;
                sv[q + 2] += k4.z * v;
                sv[q + 3] += k4.w * v;
            }
        }
        // Every thread reads and writes only its own elements of Ss here; the products above are done (barrier).
#pragma unroll
        for (int q = 0; q < IPT; q++) Ss[(grp * IPT + q) * JB + j] = sv[q];
    }
    __syncthreads();
    for (int i = tid; i < DK * JB; i += k_state_threads) S[(i / JB) * DV + i % JB] = Ss[i];
}

template <int DK, int DV>
void run_parallel(const GdnShape &s, const float *xc, const float *g, const float *beta, int64_t n, float *states,
                  Rows out, float *ws, cudaStream_t stream) {
    const int64_t n_chunks = (n + CH - 1) / CH;
    float *decay = ws + k_group_chunks * s.n_v * per_head_floats<DK, DV>();
    for (int64_t c = 0; c < n_chunks; c += k_group_chunks) {
        const int m = int(std::min<int64_t>(k_group_chunks, n_chunks - c));
        k_gdn_prepare<DK, DV><<<dim3(unsigned(s.n_v), unsigned(m)), DK + DV, 0, stream>>>(s, xc, g, beta, n, c, ws,
                                                                                         decay);
        STRATA_CUDA_LAUNCH_CHECK("k_gdn_prepare");
        k_gdn_state_pass<DK, DV><<<unsigned(s.n_v * (DV / JB)), k_state_threads, 0, stream>>>(s, ws, decay, n, c, m,
                                                                                             states, out);
        STRATA_CUDA_LAUNCH_CHECK("k_gdn_state_pass");
    }
}

}  // namespace

bool gdn_parallel_supports(const GdnShape &s) {
    return (s.d_k == 64 && s.d_v == 64) || (s.d_k == 128 && s.d_v == 128);
}

int64_t gdn_parallel_workspace_floats(const GdnShape &s) {
    const int64_t per_head = CH * (3 * s.d_k + 2 * s.d_v);
    return k_group_chunks * s.n_v * (per_head + 1);
}

void launch_gdn_delta_rule_parallel(const GdnShape &s, const float *xc, const float *g, const float *beta, int64_t n,
                                    float *states, Rows out, float *workspace, cudaStream_t stream) {
    if (n == 0) return;
    STRATA_ASSERT(gdn_parallel_supports(s) && s.n_v <= 65535);
    if (s.d_k == 64) return run_parallel<64, 64>(s, xc, g, beta, n, states, out, workspace, stream);
    return run_parallel<128, 128>(s, xc, g, beta, n, states, out, workspace, stream);
}

}  // namespace strata::cuda
