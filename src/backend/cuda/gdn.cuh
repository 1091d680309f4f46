// Gated DeltaNet on the device, one sequence segment at a time: causal conv with carried state and SiLU, per-head
// L2 norms of q and k, the gates, the gated delta rule (recurrent for short runs, chunked for long ones; both
// exact forms of the same recurrence) and the gated RMSNorm.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "backend/cuda/elementwise.cuh"

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::cuda {

struct GdnShape {
    int64_t n_k, n_v, d_k, d_v, conv_kernel;
    bool ba_grouped, vhead_tiled;
    float eps;
    STRATA_HOST_DEVICE int64_t key_dim() const { return n_k * d_k; }
    STRATA_HOST_DEVICE int64_t conv_dim() const { return 2 * n_k * d_k + n_v * d_v; }
};

// xc[t] = silu(causal depthwise conv over [state; qkv rows]) (n rows of conv_dim), then the state becomes the last
// conv_kernel - 1 input rows. w_conv: [conv_dim][conv_kernel] f32; state: [conv_kernel - 1][conv_dim] f32;
// state_tmp: the same size, scratch.
void launch_gdn_conv(const GdnShape &s, Rows qkv, const float *w_conv, float *state, float *state_tmp, float *xc,
                     cudaStream_t stream);

// q and k heads of xc L2-normalised in place, q also scaled by 1/sqrt(d_k).
void launch_gdn_qk_norm(const GdnShape &s, float *xc, int64_t n, cudaStream_t stream);

// beta = sigmoid(b), g = a_neg * softplus(a + dt_bias), n x n_v each (b and a from beta_in / alpha_in, or both from
// beta_in when ba_grouped).
void launch_gdn_gates(const GdnShape &s, Rows beta_in, Rows alpha_in, const float *dt_bias, const float *a_neg,
                      float *g, float *beta, int64_t n, cudaStream_t stream);

// The delta rule over n tokens of one sequence for every v-head: states [n_v][d_k][d_v] f32 updated in place,
// out rows get n_v * d_v values. Chunked when n >= 16 (workspace: gdn_chunk_workspace_floats(s)).
int64_t gdn_chunk_workspace_floats(const GdnShape &s);
void launch_gdn_delta_rule(const GdnShape &s, const float *xc, const float *g, const float *beta, int64_t n,
                           float *states, Rows out, float *workspace, bool chunked, cudaStream_t stream);

// The chunked delta rule parallel over chunks (gdn_parallel.cu) for head sizes 64 and 128: the same recurrence,
// workspace gdn_parallel_workspace_floats(s) whatever n.
bool gdn_parallel_supports(const GdnShape &s);
int64_t gdn_parallel_workspace_floats(const GdnShape &s);
void launch_gdn_delta_rule_parallel(const GdnShape &s, const float *xc, const float *g, const float *beta, int64_t n,
                                    float *states, Rows out, float *workspace, cudaStream_t stream);

// out = rmsnorm(out per v-head) * w * silu(z).
void launch_gdn_gated_norm(const GdnShape &s, Rows out, Rows z, const float *norm_w, cudaStream_t stream);

}  // namespace strata::cuda
