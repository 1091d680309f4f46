// The MoE steps on the CPU (backend.h; their order is strata/moe_schedule.h's): router softmax and top-k per token,
// each expert's gate/up/down over its rows with the expert read in place from the mapped file, the weighted sum in
// expert-id order, and the shared expert scaled by its sigmoid gate.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace strata {

namespace {

// One expert's matrix, as a plain 2-D weight at `bytes`.
Weight expert_matrix(const Weight &w, const void *bytes) {
    Weight m = w;
    m.host = static_cast<const uint8_t *>(bytes);
    m.ne[2] = 1;
    return m;
}

inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }

// Softmax over one token's router logits in fp32, then the top k (ties to the lower expert id), renormalised.
void route_topk_row(const float *logits, int64_t n_expert, const MoeParams &p, int32_t *ids, float *weights) {
    std::vector<float> prob(static_cast<size_t>(n_expert));
    router_softmax(logits, n_expert, prob.data());
    std::vector<int32_t> order(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    // a NaN (from NaN logits) ranks below every number, so the order stays strict and k distinct experts come out
    auto key = [&](int32_t e) { return prob[size_t(e)] == prob[size_t(e)] ? prob[size_t(e)] : -FLT_MAX; };
    std::partial_sort(order.begin(), order.begin() + p.n_expert_used, order.end(), [&](int32_t a, int32_t b) {
        return key(a) > key(b) || (key(a) == key(b) && a < b);
    });
    std::copy(order.begin(), order.begin() + p.n_expert_used, ids);
    chosen_weights(prob.data(), p, ids, weights);
}

}  // namespace

void CpuBackend::route_topk(Act logits, const MoeParams &p, int32_t *ids, float *weights) {
    STRATA_ASSERT(logits.cols == p.n_expert && p.n_expert_used >= 1 && p.n_expert_used <= p.n_expert);
    const int64_t k = p.n_expert_used;
    for (int64_t t = 0; t < logits.rows; t++) route_topk_row(logits.row(t), p.n_expert, p, ids + t * k, weights + t * k);
}

ExpertSrc CpuBackend::expert_in_place(const ExpertWeights &w, int32_t e) const {
    return {w.gate->expert_host(e), w.up->expert_host(e), w.down->expert_host(e)};
}

void CpuBackend::expert_ffn(const ExpertWeights &w, Act xs, const std::vector<ExpertGroup> &groups, Act ys) {
    const int64_t n_ff = w.gate->ne[1];
    STRATA_ASSERT(xs.cols == w.gate->ne[0] && ys.cols == w.down->ne[1] && xs.rows == ys.rows);
    for (const ExpertGroup &grp : groups) {
        if (grp.n_rows == 0) continue;
        STRATA_ASSERT(grp.row0 >= 0 && grp.row0 + grp.n_rows <= xs.rows);
        const Act x = xs.rows_view(grp.row0, grp.n_rows), y = ys.rows_view(grp.row0, grp.n_rows);
        const ScratchMark mk = scratch_mark();
        Act g = alloc(grp.n_rows, n_ff), u = alloc(grp.n_rows, n_ff);
        matmul(expert_matrix(*w.gate, grp.src.gate), x, g);
        matmul(expert_matrix(*w.up, grp.src.up), x, u);
        silu_mul(g, u);
        matmul(expert_matrix(*w.down, grp.src.down), g, y);
        scratch_release(mk);
    }
}

void CpuBackend::moe_combine(Act ys, const std::vector<int32_t> &yrow, const std::vector<int32_t> &widx,
                             const float *weights, int64_t k, Act out) {
    STRATA_ASSERT(int64_t(yrow.size()) == out.rows * k && widx.size() == yrow.size() && ys.cols == out.cols);
    const int64_t n = out.cols;
    for (int64_t t = 0; t < out.rows; t++) {
        float *o = out.row(t);
        std::fill_n(o, n, 0.0f);
        for (int64_t j = 0; j < k; j++) {
            const float w = weights[widx[size_t(t * k + j)]];
            const float *yr = ys.row(yrow[size_t(t * k + j)]);
            for (int64_t c = 0; c < n; c++) o[c] += w * yr[c];
        }
    }
}

void CpuBackend::silu_mul(Act g, Act u) {
    STRATA_ASSERT(g.rows == u.rows && g.cols == u.cols);
    for (int64_t r = 0; r < g.rows; r++) {
        float *gr = g.row(r);
        const float *ur = u.row(r);
        for (int64_t c = 0; c < g.cols; c++) gr[c] = siluf(gr[c]) * ur[c];
    }
}

void CpuBackend::shared_expert_add(Act x, const Weight &gate, Act y, Act out) {
    STRATA_ASSERT(y.rows == x.rows && out.rows == x.rows && y.cols == out.cols && gate.ne[0] == x.cols);
    const float *gate_w = vec_f32(gate);
    for (int64_t t = 0; t < x.rows; t++) {
        const float *xr = x.row(t);
        float gd = 0;
        for (int64_t c = 0; c < x.cols; c++) gd += gate_w[c] * xr[c];
        const float sg = 1.0f / (1.0f + std::exp(-gd));
        float *o = out.row(t);
        const float *yr = y.row(t);
        for (int64_t c = 0; c < out.cols; c++) o[c] += sg * yr[c];
    }
}

}  // namespace strata
