// Seeded expert draws for benchmark routing (strata bench --routing; strata/route_override.h): k distinct experts per
// token from a counter-based stream keyed on (seed, layer, pass, row), uniform or Zipf-distributed over a seeded
// permutation of the layer's experts. The arithmetic is integer and exact double, written once here for the host and
// the CUDA kernels, so a backend that draws on its device draws the same experts as the host.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define STRATA_DRAW_FN __host__ __device__ __forceinline__
#else
#define STRATA_DRAW_FN inline
#endif

namespace strata {

struct RouteDraws {
    enum Kind : int32_t { Uniform = 1, Zipf = 2 };
    Kind kind = Uniform;
    double skew = 0.0;  // Zipf's exponent S
    uint64_t seed = 1;
};

STRATA_DRAW_FN uint64_t draw_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

STRATA_DRAW_FN uint64_t draw_key(uint64_t seed, int64_t il, int64_t pass, int64_t row) {
    return draw_mix(draw_mix(draw_mix(seed) ^ uint64_t(il)) ^ uint64_t(pass) * 0x100000001b3ull) ^ uint64_t(row);
}

// Draw i of a key, uniform in [0, 1).
struct DrawStream {
    uint64_t key, i = 0;
    STRATA_DRAW_FN double next() { return double(draw_mix(key ^ draw_mix(++i)) >> 11) * 0x1.0p-53; }
};

// Which expert a draw u picks: uniform over n, or (cdf, expert_of_rank non-null) the first rank whose cumulative
// probability reaches u, as std::lower_bound finds it, and the expert holding that rank.
STRATA_DRAW_FN int32_t draw_pick(double u, int64_t n, const double *cdf, const int32_t *expert_of_rank) {
    if (!cdf) {
        const int64_t e = int64_t(u * double(n));
        return int32_t(e < n - 1 ? e : n - 1);
    }
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return expert_of_rank[lo < n - 1 ? lo : n - 1];
}

// k distinct experts for row `row` of pass `pass` at layer il into ids (a repeat is drawn again: k is a small share
// of n). cdf / expert_of_rank: the layer's Zipf table, or null for uniform draws.
STRATA_DRAW_FN void draw_row(uint64_t seed, int64_t il, int64_t pass, int64_t row, int64_t n, int64_t k,
                             const double *cdf, const int32_t *expert_of_rank, int32_t *ids) {
    DrawStream st{draw_key(seed, il, pass, row)};
    for (int64_t j = 0; j < k; j++) {
        int32_t e;
        bool again;
        do {
            e = draw_pick(st.next(), n, cdf, expert_of_rank);
            again = false;
            for (int64_t j2 = 0; j2 < j; j2++) again = again || ids[j2] == e;
        } while (again);
        ids[j] = e;
    }
}

// The Zipf table of layer il for n experts: P(rank r) ~ 1/(r+1)^S, cumulative, and a seeded permutation giving the
// expert of each rank (made once per (n, S, seed, layer), kept for the process; host only).
struct ZipfTable {
    std::vector<double> cdf;
    std::vector<int32_t> expert_of_rank;
};
const ZipfTable &zipf_table(int64_t n, double s, uint64_t seed, int64_t il);

// The host's draw: k distinct experts for row `row` of pass `pass` at layer il.
void draw_experts(const RouteDraws &d, int64_t il, int64_t pass, int64_t row, int64_t n_expert, int64_t k,
                  int32_t *ids);

}  // namespace strata
