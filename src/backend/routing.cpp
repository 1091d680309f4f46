// The router's arithmetic (backend.h): softmax and the chosen experts' weights, one token at a time.
#include <algorithm>
#include <cmath>

#include "backend/backend.h"

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

}  // namespace strata
