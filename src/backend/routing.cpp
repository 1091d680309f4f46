// The router's arithmetic (backend.h): softmax and the chosen experts' weights, one token at a time; the host's
// benchmark draws (route_draws.h) and the default Backend::route_draws.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "backend/backend.h"
#include "backend/route_draws.h"
#include "core/error.h"

namespace strata {

void router_softmax(const float *logits, int64_t n_expert, float *prob) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < n_expert; e++) mx = std::max(mx, logits[e]);
    float sum = 0;
    for (int64_t e = 0; e < n_expert; e++) sum += prob[e] = std::exp(logits[e] - mx);
    for (int64_t e = 0; e < n_expert; e++) prob[e] /= sum;
}

void chosen_weights(const float *prob, const MoeParams &p, const int32_t *ids, float *weights) {
    const int64_t k = p.n_expert_used;
    float wsum = 0;
    for (int64_t j = 0; j < k; j++) wsum += weights[j] = prob[ids[j]];
    if (p.norm_weights) {
        wsum = std::max(wsum, 6.103515625e-5f);
        for (int64_t j = 0; j < k; j++) weights[j] /= wsum;
    }
    if (p.weights_scale != 0.0f)
        for (int64_t j = 0; j < k; j++) weights[j] *= p.weights_scale;
}

void router_weights(const float *logits, const MoeParams &p, int32_t *ids, float *weights) {
    std::vector<float> prob(static_cast<size_t>(p.n_expert));
    router_softmax(logits, p.n_expert, prob.data());
    std::sort(ids, ids + p.n_expert_used, [&](int32_t a, int32_t b) {
        return prob[size_t(a)] > prob[size_t(b)] || (prob[size_t(a)] == prob[size_t(b)] && a < b);
    });
    chosen_weights(prob.data(), p, ids, weights);
}

const ZipfTable &zipf_table(int64_t n, double s, uint64_t seed, int64_t il) {
    static std::mutex mu;
    static std::map<std::tuple<int64_t, double, uint64_t, int64_t>, ZipfTable> cache;
    std::lock_guard<std::mutex> lock(mu);
    ZipfTable &t = cache[{n, s, seed, il}];
    if (t.cdf.empty()) {
        t.cdf.resize(size_t(n));
        double acc = 0;
        for (int64_t r = 0; r < n; r++) t.cdf[size_t(r)] = acc += 1.0 / std::pow(double(r + 1), s);
        for (double &c : t.cdf) c /= acc;
        t.expert_of_rank.resize(size_t(n));
        std::iota(t.expert_of_rank.begin(), t.expert_of_rank.end(), 0);
        DrawStream st{draw_key(seed, il, -1, -1)};
        for (int64_t i = n - 1; i > 0; i--) {  // Fisher-Yates
            const int64_t j = std::min<int64_t>(i, int64_t(st.next() * double(i + 1)));
            std::swap(t.expert_of_rank[size_t(i)], t.expert_of_rank[size_t(j)]);
        }
    }
    return t;
}

void draw_experts(const RouteDraws &d, int64_t il, int64_t pass, int64_t row, int64_t n_expert, int64_t k,
                  int32_t *ids) {
    STRATA_ASSERT(k >= 1 && k <= n_expert);
    const ZipfTable *z = d.kind == RouteDraws::Zipf ? &zipf_table(n_expert, d.skew, d.seed, il) : nullptr;
    draw_row(d.seed, il, pass, row, n_expert, k, z ? z->cdf.data() : nullptr, z ? z->expert_of_rank.data() : nullptr,
             ids);
}

// On the host: the logits come back, the draws and their weights go up.
void Backend::route_draws(Act logits, const MoeParams &p, const RouteDraws &d, int64_t il, bool new_pass, int32_t *ids,
                          Act weights) {
    const int64_t T = logits.rows, n = p.n_expert, k = p.n_expert_used;
    STRATA_ASSERT(logits.cols == n && weights.rows * weights.cols == T * k);
    if (new_pass) draw_pass_++;
    std::vector<float> lg(size_t(T * n)), wh(size_t(T * k));
    std::vector<int32_t> ih(size_t(T * k));
    download(logits, lg.data());
    for (int64_t t = 0; t < T; t++) {
        int32_t *row = ih.data() + t * k;
        draw_experts(d, il, draw_pass_, t, n, k, row);
        router_weights(lg.data() + t * n, p, row, wh.data() + t * k);
    }
    upload_i32(ih.data(), T * k, ids);
    upload(wh.data(), weights);
}

}  // namespace strata
