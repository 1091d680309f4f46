// Which layers each participant of a split model runs (runtime/engine.h): contiguous runs, in layer order, chosen so
// that each part fits its device and the slowest part's time per decoded token is as small as it can be.
//
// The cost model, per part p over its layers: everything but the routed experts stays in the part's memory
// (resident bytes R), and the experts take what is left of its capacity C_p after R and its fixed bytes F_p (runtime,
// scratch) as cache; with routing spread over the experts, a fraction c = min(1, (C_p - F_p - R) / X) of a token's
// routed expert bytes K are hits. A token then costs (R_read + K) / read_gbs_p for the reads and (1 - c) K / bus_gbs_p
// for the misses crossing the bus. The rates are the participant's own, measured at start (Backend::start_rates);
// a participant without device memory (the CPU) holds everything where it lies (c = 1).
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct SplitLayer {
    double resident_bytes = 0;  // what the layer keeps in a part's memory: matrices, vectors, caches
    double read_bytes = 0;      // of those, what a decoded token reads (matrices and vectors; a cache row is small)
    double expert_bytes = 0;    // all of its routed experts
    double routed_bytes = 0;    // the routed experts a token reads (k of them)
};

struct SplitPart {
    bool device_memory = true;  // false: the CPU (no capacity limit, no bus)
    double capacity_bytes = 0;  // what the part may hold (its budget, or its free memory)
    double fixed_bytes = 0;     // held whatever its layers: runtime, scratch, staging
    double read_gbs = 1.0;      // rate of its reads (a device: its memory's copy rate)
    double bus_gbs = 1.0;       // rate its misses cross at
    double first_bytes = 0;     // extra bytes it holds if it runs the first layer (the token embedding)
    double last_bytes = 0;      // ... the last (output norm and matrix; read every token)
};

// Per-token seconds of a part running layers [l0, l1), or a negative value where they do not fit it (its cache must
// have room for at least one layer's routed experts of a token beside everything resident).
double split_part_seconds(const std::vector<SplitLayer> &layers, const SplitPart &p, int64_t l0, int64_t l1);

// The boundaries (parts.size() + 1 of them, from 0 to layers.size()) of the split whose slowest part is fastest,
// every part running at least one layer; throws strata::Error naming the parts' capacities where no split fits.
std::vector<int64_t> split_layers(const std::vector<SplitLayer> &layers, const std::vector<SplitPart> &parts);

}  // namespace strata
