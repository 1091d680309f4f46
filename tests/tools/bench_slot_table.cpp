// Benchmark of the expert slot table's host time under decoding's requests (not a test, not run in CI): a table shaped
// as the 30B-A3B's at 12 GiB (48 MoE layers of 128 experts, 2,300 slots), uniform routing (8 distinct experts a layer
// a token), 400 tokens; each policy driven as a split pass drives it (acquire: every miss filled) and as a pass by the
// device alone is judged after it (hits noted, misses offered for admission). Prints microseconds a token.
//
//   build/bin/bench_slot_table [slots]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "strata/expert_slots.h"

using namespace strata;

int main(int argc, char **argv) {
    const int L = 48, E = 128, k = 8, tokens = 400;
    const int slots = argc > 1 ? std::atoi(argv[1]) : 2300;
    if (slots < k || slots > L * E) {
        std::fprintf(stderr, "bench_slot_table: slots %s: expected %d to %d\n", argv[1], k, L * E);
        return 1;
    }
    for (SlotPolicy p : {SlotPolicy::Lfu, SlotPolicy::Next}) {
        for (int mode = 0; mode < 2; mode++) {  // 0: acquire every request (split), 1: note hits + admit misses
            ExpertSlotTable t(std::vector<int64_t>(L, E), std::vector<size_t>(L, 1), slots, p, 32 * L * k);
            std::mt19937 rng(1);
            std::vector<SlotFill> fills;
            double secs = 0;
            for (int tok = 0; tok < tokens; tok++) {
                t.begin_pass();
                for (int il = 0; il < L; il++) {
                    std::vector<int32_t> ids;
                    while ((int)ids.size() < k) {
                        int32_t e = int32_t(rng() % E);
                        bool dup = false;
                        for (int32_t x : ids) dup |= x == e;
                        if (!dup) ids.push_back(e);
                    }
                    auto t0 = std::chrono::steady_clock::now();
                    fills.clear();
                    if (mode == 0) {
                        std::vector<int32_t> s(k);
                        t.acquire(il, ids.data(), k, s.data(), false, fills);
                    } else {
                        std::vector<int32_t> hits, misses;
                        for (int32_t e : ids) (t.slot_of(il, e) >= 0 ? hits : misses).push_back(e);
                        t.note_requests(il, hits.data(), int64_t(hits.size()));
                        for (int32_t e : misses) t.admit(il, e, 2.0, fills);
                    }
                    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                }
            }
            std::printf("%s %s: %.1f us a token\n", slot_policy_name(p), mode ? "admit" : "acquire",
                        secs / tokens * 1e6);
        }
    }
}
