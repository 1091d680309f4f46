// The layer split of a model over several participants (split_plan.h).
#include "strata/split_plan.h"

#include <algorithm>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/units.h"

namespace strata {

double split_part_seconds(const std::vector<SplitLayer> &layers, const SplitPart &p, int64_t l0, int64_t l1) {
    double R = 0, read = 0, X = 0, K = 0, one_expert_layer = 0;
    for (int64_t il = l0; il < l1; il++) {
        const SplitLayer &L = layers[size_t(il)];
        R += L.resident_bytes, read += L.read_bytes, X += L.expert_bytes, K += L.routed_bytes;
        one_expert_layer = std::max(one_expert_layer, L.routed_bytes);
    }
    if (l0 == 0) R += p.first_bytes;
    if (l1 == int64_t(layers.size())) R += p.last_bytes, read += p.last_bytes;
    double cached = 1.0;
    if (p.device_memory) {
        const double room = p.capacity_bytes - p.fixed_bytes - R;
        // a part needs slots for at least one layer's routed experts of a token to compute it at all
        if (room < one_expert_layer) return -1.0;
        cached = X > 0 ? std::min(1.0, room / X) : 1.0;
    }
    return (read + K) / (p.read_gbs * 1e9) + (1.0 - cached) * K / (p.bus_gbs * 1e9);
}

std::vector<int64_t> split_layers(const std::vector<SplitLayer> &layers, const std::vector<SplitPart> &parts) {
    const int64_t n = int64_t(layers.size()), P = int64_t(parts.size());
    if (P < 1 || n < P)
        fail("a split of %lld layers over %lld participants: each needs at least one layer", (long long)n,
             (long long)P);
    // best[p][l]: the smallest slowest-part time of parts 0..p-1 over layers [0, l); from[p][l] its last boundary.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(size_t(P + 1), std::vector<double>(size_t(n + 1), inf));
    std::vector<std::vector<int64_t>> from(size_t(P + 1), std::vector<int64_t>(size_t(n + 1), -1));
    best[0][0] = 0;
    for (int64_t p = 1; p <= P; p++)
        for (int64_t l = p; l <= n - (P - p); l++)
            for (int64_t k = p - 1; k < l; k++) {
                if (best[size_t(p - 1)][size_t(k)] == inf) continue;
                const double s = split_part_seconds(layers, parts[size_t(p - 1)], k, l);
                if (s < 0) continue;
                const double t = std::max(best[size_t(p - 1)][size_t(k)], s);
                if (t < best[size_t(p)][size_t(l)]) best[size_t(p)][size_t(l)] = t, from[size_t(p)][size_t(l)] = k;
            }
    if (best[size_t(P)][size_t(n)] == inf) {
        std::string caps;
        for (const SplitPart &p : parts)
            caps += (caps.empty() ? "" : ", ") + (p.device_memory ? format_bytes(uint64_t(p.capacity_bytes)) : "host");
        fail("the model's %lld layers do not fit the participants (%s): give them more memory or add one",
             (long long)n, caps.c_str());
    }
    std::vector<int64_t> b(size_t(P + 1));
    b[size_t(P)] = n;
    for (int64_t p = P; p > 0; p--) b[size_t(p - 1)] = from[size_t(p)][size_t(b[size_t(p)])];
    return b;
}

}  // namespace strata
