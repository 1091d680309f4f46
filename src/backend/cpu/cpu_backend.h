// The CPU backend: reference implementations of every op, multithreaded over a worker pool. Weights stay in the
// mapped file; activations, KV cache and recurrent states live in host memory this backend owns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vec_dot.h"
#include "core/threads.h"

namespace strata {

// The CPU matmul y[t, n] = sum_k W[n, k] * xq[t, k], where xq is x in the weight's activation format
// (cpu_vec_dot_type, vec_dot.h): integer dot products per row pair at the level cpu_isa_active() picks, or at a
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
    void prepare(Model &m) override;
    void init_caches(const HParams &hp, const CacheConfig &cfg) override;
    Act alloc(int64_t rows, int64_t cols) override;
    void reset_scratch() override;
    // Blocks allocated after a mark are freed at its release (ops are synchronous here).
    ScratchMark scratch_mark() override { return {scratch_.size(), 0}; }
    void scratch_release(ScratchMark m) override { scratch_.resize(std::min(scratch_.size(), m.a)); }
    void download(const Act &src, float *host) override;
    void copy_slot(int32_t src, int32_t dst, int64_t n_pos) override;
    void clear_slot(int32_t slot) override;
    size_t recurrent_state_bytes() const override;
    void save_recurrent_state(int32_t slot, void *dst) override;
    void load_recurrent_state(int32_t slot, const void *src) override;

    void embed(const Weight &tok_embd, const int32_t *ids, Act out) override;
    void rms_norm(Act x, const Weight &w, float eps, Act out) override;
    void matmul(const Weight &w, Act x, Act out) override;
    void add(Act a, Act b, Act out) override;
    void mul_sigmoid(Act x, Act gate) override;
    void gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) override;
    void deinterleave(Act src, int64_t width, Act a, Act b) override;
    void rope(Act x, const RopeParams &rp, const BatchInfo &b) override;
    void attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale,
                   const BatchInfo &b, Act out) override;
    void gdn(int64_t il, const LayerWeights &L, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
             const BatchInfo &b, Act out) override;
    void moe(const LayerWeights &L, Act x, const MoeParams &p, Act out) override;

    ThreadPool &pool() { return pool_; }

  private:
    struct Caches;
    const float *vec_f32(const Weight &w);  // a 1-D weight as f32 (converted once in prepare)

    ThreadPool pool_;
    std::vector<std::unique_ptr<float[]>> scratch_;  // blocks handed out by alloc()
    std::vector<std::pair<const uint8_t *, std::vector<float>>> vectors_;
    std::unique_ptr<Caches> caches_;
};

}  // namespace strata
