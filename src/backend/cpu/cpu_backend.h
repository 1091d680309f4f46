// The CPU backend: reference implementations of every op, multithreaded over a worker pool. Weights stay in the
// mapped file; activations, KV cache and recurrent states live in host memory this backend owns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vec_dot.h"
#include "core/threads.h"

namespace strata {

// The CPU matmul y[t, n] = sum_k W[n, k] * xq[t, k], where xq is x in the weight's activation format
// (dot_act_type, format/quant.h): integer dot products per row pair at the level cpu_isa_active() picks, or at a
// given level (at most cpu_isa_supported()).
void cpu_matmul(ThreadPool &pool, const Weight &w, const Act &x, const Act &y);
void cpu_matmul_isa(ThreadPool &pool, const Weight &w, const Act &x, const Act &y, CpuIsa isa);

// The reference it is tested against: xq quantized and dequantized again, W rows dequantized, fp32 dot products in
// a fixed order.
void cpu_matmul_reference(ThreadPool &pool, const Weight &w, const Act &x, const Act &y);

// Ops with plain loops, exposed for tests and for other backends' reference checks.
void cpu_rms_norm(ThreadPool &pool, const Act &x, const float *w, int64_t group, float eps, const Act &out);
void cpu_rope_neox(ThreadPool &pool, const Act &x, const RopeParams &rp, const BatchInfo &b);

// Gated delta rule on one (sequence, v-head), exact in both forms. q, k: [n, d_k] (L2-normalised, q already
// scaled), v: [n, d_v], g (log decay) and beta: [n]; state S: [d_k, d_v] updated in place; o: [n, d_v].
// Row strides (in floats) for q, k, v, o allow views into wider activations.
struct DeltaRuleIo {
    const float *q, *k, *v, *g, *beta;
    int64_t q_stride, k_stride, v_stride, gb_stride;
    float *o;
    int64_t o_stride;
};
void delta_rule_recurrent(const DeltaRuleIo &io, int64_t n, int64_t d_k, int64_t d_v, float *state);
void delta_rule_chunked(const DeltaRuleIo &io, int64_t n, int64_t d_k, int64_t d_v, float *state, int64_t chunk);

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(int n_threads);
    ~CpuBackend() override;

    std::string name() const override;
    void prepare(WeightSet &ws, const Placement &plan) override;
    void init_caches(const CacheShape &shape) override;
    Act alloc(int64_t rows, int64_t cols) override;
    int32_t *alloc_i32(int64_t n) override;
    void reset_scratch() override;
    // Blocks allocated after a mark are freed at its release (ops are synchronous here).
    ScratchMark scratch_mark() override { return {scratch_.size(), 0}; }
    void scratch_release(ScratchMark m) override { scratch_.resize(std::min(scratch_.size(), m.a)); }
    void download(const Act &src, float *host) override;
    void download_i32(const int32_t *src, int64_t n, int32_t *host) override;
    void upload(const float *host, Act dst) override;
    void upload_i32(const int32_t *host, int64_t n, int32_t *dst) override;
    void copy_seq(int32_t src, int32_t dst, int64_t n_pos) override;
    void clear_seq(int32_t seq) override;
    size_t recurrent_state_bytes() const override;
    void save_recurrent_state(int32_t seq, void *dst) override;
    void load_recurrent_state(int32_t seq, const void *src) override;

    void embed(const Weight &tok_embd, const int32_t *ids, Act out) override;
    void rms_norm(Act x, const Weight &w, float eps, Act out) override;
    void matmul(const Weight &w, Act x, Act out) override;
    void add(Act a, Act b, Act out) override;
    void mul_sigmoid(Act x, Act gate) override;
    void silu_mul(Act g, Act u) override;
    void gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) override;
    void deinterleave(Act src, int64_t width, Act a, Act b) override;
    void rope(Act x, const RopeParams &rp, const BatchInfo &b) override;
    void attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale,
                   const BatchInfo &b, Act out) override;
    void gdn(int64_t il, const GdnWeights &w, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
             const BatchInfo &b, Act out) override;
    // MoE steps: experts are read in place, from the mapped file.
    void route_topk(Act logits, const MoeParams &p, int32_t *ids, float *weights) override;
    bool experts_in_place() const override { return true; }
    ExpertSrc expert_in_place(const ExpertWeights &w, int32_t e) const override;
    void expert_ffn(const ExpertWeights &w, Act xs, const std::vector<ExpertGroup> &groups, Act ys) override;
    void moe_combine(Act ys, const std::vector<int32_t> &yrow, const std::vector<int32_t> &widx, const float *weights,
                     int64_t k, Act out) override;
    void shared_expert_add(Act x, const Weight &gate, Act y, Act out) override;

    ThreadPool &pool() { return pool_; }

  private:
    struct Caches;
    const float *vec_f32(const Weight &w);  // a 1-D weight as f32 (converted once in prepare)

    // Its ops come hundreds a token while decoding: the threads poll this long for the next before they sleep
    // (core/threads.h).
    static constexpr int k_pool_spin_us = 2000;
    ThreadPool pool_;
    std::vector<std::unique_ptr<std::byte[]>> scratch_;  // blocks handed out by alloc() and alloc_i32()
    std::vector<std::pair<const uint8_t *, std::vector<float>>> vectors_;
    std::unique_ptr<Caches> caches_;
};

}  // namespace strata
