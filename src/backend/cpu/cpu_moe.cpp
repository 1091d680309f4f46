// The MoE block on the CPU: router softmax and top-k per token, tokens grouped by expert, one gate/up/down pass
// per used expert over its tokens, weighted sum; then the shared expert scaled by its sigmoid gate.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace strata {

namespace {

// One expert's matrix of a 3-D expert tensor, as a plain 2-D weight.
Weight expert_matrix(const Weight &w, int64_t e) {
    Weight m = w;
    m.host = w.expert_host(e);
    m.ne[2] = 1;
    return m;
}

inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

// Softmax over the router logits in fp32, then the top k (ties to the lower expert id), renormalised.
void route_topk(const float *logits, int64_t n_expert, const MoeParams &p, int32_t *ids, float *weights) {
    std::vector<float> prob(static_cast<size_t>(n_expert));
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; e++) mx = std::max(mx, logits[e]);
    float sum = 0;
    for (int64_t e = 0; e < n_expert; e++) sum += prob[size_t(e)] = std::exp(logits[e] - mx);
    for (float &x : prob) x /= sum;
    std::vector<int32_t> order(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + p.n_expert_used, order.end(), [&](int32_t a, int32_t b) {
        return prob[size_t(a)] > prob[size_t(b)] || (prob[size_t(a)] == prob[size_t(b)] && a < b);
    });
    float wsum = 0;
    for (int64_t k = 0; k < p.n_expert_used; k++) {
        ids[k] = order[size_t(k)];
        weights[k] = prob[size_t(order[size_t(k)])];
        wsum += weights[k];
    }
    if (p.norm_weights) {
        wsum = std::max(wsum, 6.103515625e-5f);
        for (int64_t k = 0; k < p.n_expert_used; k++) weights[k] /= wsum;
    }
    if (p.weights_scale != 0.0f)
        for (int64_t k = 0; k < p.n_expert_used; k++) weights[k] *= p.weights_scale;
}

void CpuBackend::moe(const LayerWeights &L, Act x, const MoeParams &p, Act out) {
    const int64_t T = x.rows, n_embd = x.cols, n_ff = L.gate_exps.ne[1], k_used = p.n_expert_used;
    STRATA_ASSERT(out.rows == T && out.cols == n_embd && L.down_exps.ne[1] == n_embd);

    Act logits = alloc(T, p.n_expert);
    matmul(L.gate_inp, x, logits);
    std::vector<int32_t> ids(static_cast<size_t>(T * k_used));
    std::vector<float> wts(static_cast<size_t>(T * k_used));
    for (int64_t t = 0; t < T; t++) route_topk(logits.row(t), p.n_expert, p, &ids[size_t(t * k_used)], &wts[size_t(t * k_used)]);

    // Group (token, weight) pairs by expert, in token order within each expert.
    std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(p.n_expert));
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < k_used; k++) by_expert[size_t(ids[size_t(t * k_used + k)])].push_back({t, wts[size_t(t * k_used + k)]});

    for (int64_t r = 0; r < T; r++) std::fill_n(out.row(r), n_embd, 0.0f);
    // Experts are visited in id order, so each token's outputs are summed in expert-id order: the result does not
    // depend on how tokens were batched.
    for (int64_t e = 0; e < p.n_expert; e++) {
        const auto &toks = by_expert[size_t(e)];
        if (toks.empty()) continue;
        const int64_t n = int64_t(toks.size());
        Act xe = alloc(n, n_embd), g = alloc(n, n_ff), u = alloc(n, n_ff), y = alloc(n, n_embd);
        for (int64_t i = 0; i < n; i++) std::memcpy(xe.row(i), x.row(toks[size_t(i)].first), size_t(n_embd) * 4);
        matmul(expert_matrix(L.gate_exps, e), xe, g);
        matmul(expert_matrix(L.up_exps, e), xe, u);
        for (int64_t i = 0; i < n; i++) {
            float *gr = g.row(i);
            const float *ur = u.row(i);
            for (int64_t c = 0; c < n_ff; c++) gr[c] = siluf(gr[c]) * ur[c];
        }
        matmul(expert_matrix(L.down_exps, e), g, y);
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = toks[size_t(i)].first;
            const float w = toks[size_t(i)].second;
            float *o = out.row(t);
            const float *yr = y.row(i);
            for (int64_t c = 0; c < n_embd; c++) o[c] += w * yr[c];
        }
    }

    if (L.gate_shexp.present()) {
        const int64_t n_sh = L.gate_shexp.ne[1];
        Act g = alloc(T, n_sh), u = alloc(T, n_sh), y = alloc(T, n_embd);
        matmul(L.gate_shexp, x, g);
        matmul(L.up_shexp, x, u);
        for (int64_t t = 0; t < T; t++) {
            float *gr = g.row(t);
            const float *ur = u.row(t);
            for (int64_t c = 0; c < n_sh; c++) gr[c] = siluf(gr[c]) * ur[c];
        }
        matmul(L.down_shexp, g, y);
        const float *gate_w = vec_f32(L.gate_inp_shexp);
        for (int64_t t = 0; t < T; t++) {
            const float *xr = x.row(t);
            float gd = 0;
            for (int64_t c = 0; c < n_embd; c++) gd += gate_w[c] * xr[c];
            const float sg = 1.0f / (1.0f + std::exp(-gd));
            float *o = out.row(t);
            const float *yr = y.row(t);
            for (int64_t c = 0; c < n_embd; c++) o[c] += sg * yr[c];
        }
    }
}

}  // namespace strata
