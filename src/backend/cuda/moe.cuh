// MoE routing and combination on the device: softmax top-k per token (ties to the lower expert id, renormalised,
// scaled), the weighted sum of expert outputs in expert-id order, and the shared expert's sigmoid gate.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/matmul.cuh"

namespace strata::cuda {

// logits: n_tokens x n_expert. ids, weights: n_tokens x k (device), in rank order (most probable first). regs: the
// warp's form (the same picks and weights either way): 1 the register form where it takes the shape (k <= 32, at
// most 512 experts), 0 the shared-memory form, -1 as STRATA_CUDA_ROUTER_REGS says (default on).
void launch_router_topk(Rows logits, int64_t k, bool norm, float scale, int32_t *ids, float *weights,
                        cudaStream_t stream, int regs = -1);

// Benchmark routing (route_draws.h): for each token, k distinct experts drawn for (seed, il, *pass, row) instead of
// the top k (cdf / expert_of_rank: the layer's Zipf table on the device, or null for uniform draws), in rank order
// by the softmax of the logits, weighted as launch_router_topk weights its choice. new_pass: *pass goes up by one
// first (a device counter, so that a recorded pass replayed counts too).
void launch_route_draws(Rows logits, int64_t k, bool norm, float scale, uint64_t seed, int64_t il, int64_t *pass,
                        bool new_pass, const double *cdf, const int32_t *expert_of_rank, int32_t *ids, float *weights,
                        cudaStream_t stream);

// The router's logits and launch_router_topk's ids and weights in one launch, for decode: a: the router (F32, F16 or
// BF16, a shape the split mat-vec takes) times a.single's x rows into a.y, as launch_mmv_generic computes them (the
// same bits), then the top-k as launch_router_topk ranks them (the same bits). done: a device counter at zero, left at
// zero.
// Where pairs.table is set, the same launch then makes launch_moe_pair_groups' groups (gate, up and down: 3 n_tokens k
// entries from pairs.groups), yrow and widx from those ids (the same entries; no mapped table, no counts).
struct RouterPairs {
    const uint8_t *const *table = nullptr;
    MatmulGroup *groups = nullptr;
    int32_t *yrow = nullptr, *widx = nullptr;
};
bool router_fused_supported(DType t, int64_t n_expert, int64_t k_row, int64_t n_tokens);
// one: a pass of one token in the kernel's one-token form (fewer registers and instructions, an F32 router's weights
// loaded as words where aligned; the same bits): -1 as STRATA_CUDA_ROUTER_ONE says (opt-in), 0 no, 1 yes.
void launch_router_fused(const MatmulArgs &a, int64_t k, bool norm, float scale, int32_t *ids, float *weights,
                         unsigned *done, cudaStream_t stream, const RouterPairs &pairs = {}, int one = -1);
// The residual step before the router, done by the same launch (launch_router_norm): resid += y, normed =
// rms_norm(resid) with w over the whole row (launch_add_rms_norm's bits, with q8's form where it is set), and the
// router's input is normed. a.x is unused.
struct RouterNorm {
    Rows resid, y, normed;
    const float *w = nullptr;
    float eps = 0.0f;
    NormQ8 q8;
};
// Whether launch_router_norm takes it: an F32 router of rows of at most 4096 (each block's weights loaded before its
// wait), rows of 1024..4096 columns that launch_add_rms_norm takes in its one-row-a-block form.
bool router_norm_supported(const MatmulArgs &a, const RouterNorm &rn);
// launch_router_fused with the residual step first: every block forms the normed row itself (its scale by the norm's
// tree) and takes the values its threads multiply from it; the block that finishes last writes resid, normed and q8's
// form, then ranks. The same bits as launch_add_rms_norm and then launch_router_fused.
void launch_router_norm(const MatmulArgs &a, int64_t k, bool norm, float scale, int32_t *ids, float *weights,
                        unsigned *done, cudaStream_t stream, const RouterPairs &pairs, const RouterNorm &rn);

// out[t] = sum over j < k of weights[widx[t k + j]] * ys[yrow[t k + j]]: entries in the order to add them (by
// expert id), starting from zero.
void launch_moe_combine(Rows ys, const int32_t *yrow, const int32_t *widx, const float *weights, int64_t k, Rows out,
                        cudaStream_t stream);

// A decoding MoE layer's last steps in one launch (a block per token; rows <= 65535): out = launch_moe_combine's sum,
// then, where shared_w is set, out += sigmoid(shared_w . x) shared_y (launch_shared_expert_add), then, where norm_w is
// set, resid += out and normed = rms_norm(resid) with norm_w over whole rows (launch_add_rms_norm). The same bits as
// those launches, where moe_tail_fuses holds for out (and for resid and normed where norm_w is set, norm_w 16-byte
// aligned): rows of 1024..8192 floats, a multiple of 4, 16-byte aligned, the norm's group the whole row. q8: the normed
// rows' 8-bit form too (NormQ8; norm_w set, the row a multiple of the form's block).
// Also ys and shared_y (where shared_w is set) 16-byte aligned rows, and k <= k_moe_tail_max_k. early: the kernel
// reads yrow, widx, weights, resid and norm_w before its pdl_wait() (early_reads_enabled(), pdl.cuh): only where the
// kernel launched just before writes none of them (the caller knows its launches: the down matrices' mat-vec). ahead:
// each thread loads its columns of the first pairs' rows before adding any (a decoding pass's few rows; the same bits).
constexpr int64_t k_moe_tail_max_k = 32;
bool moe_tail_fuses(const Rows &out, int64_t norm_group);
void launch_moe_tail(Rows ys, const int32_t *yrow, const int32_t *widx, const float *weights, int64_t k, Rows x,
                     const float *shared_w, Rows shared_y, Rows out, Rows resid, const float *norm_w, float eps,
                     Rows normed, cudaStream_t stream, const NormQ8 &q8 = {}, bool early = false, bool ahead = false);

// Decoding with every expert resident (or mapped), without the host: for each token t and rank j, pair i = t k + j gets
// the matmul groups {gate of ids[i], x row t, 1 row, row i}, {up of ids[i], x row t, 1 row, row M + i} (M = n_tokens k:
// gate and up write one buffer of 2M rows) and {down of ids[i], row i, 1 row, row i}, from
// the layer's table of expert matrices (table[3 e + 0..2]: gate, up, down device pointers); and yrow/widx list each
// token's pairs in expert-id order for launch_moe_combine (the order the reference adds them in). counts (non-null:
// a mapped table, from_host[e] 1 where expert e is read from the host copy): counts[0] += pairs read from slots,
// counts[1] += pairs read from the host.
void launch_moe_pair_groups(const int32_t *ids, int64_t n_tokens, int64_t k, const uint8_t *const *table,
                            MatmulGroup *gate, MatmulGroup *up, MatmulGroup *down, int32_t *yrow, int32_t *widx,
                            const uint8_t *from_host, unsigned long long *counts, cudaStream_t stream);

// Rows of quantized activations (k int8 values and k / 32 {d, d * sum} a row, k a multiple of 32): row i of
// (q_out, ds_out) = row rows[i] of (q, ds), for n rows.
void launch_gather_q8(const int8_t *q, const float2 *ds, int64_t k, const int32_t *rows, int64_t n, int8_t *q_out,
                      float2 *ds_out, cudaStream_t stream);

// out[t] += sigmoid(w . x[t]) * y[t] (w: x.cols floats on the device).
void launch_shared_expert_add(Rows x, const float *w, Rows y, Rows out, cudaStream_t stream);

}  // namespace strata::cuda
