// Test driver for the expert slot table: replays an access stream through ExpertSlotTable as the MoE schedule drives
// it and prints which accesses hit, so Python can compare the table with tools/trace's simulation of the same policy.
// Not a user tool.
//
//   slot_replay POLICY < stream.txt
//
// The stream: a first line "n_layers n_expert capacity decay_every", then one line per record (a layer's distinct
// experts in one pass) "pass decode layer e1 e2 ...". A new pass number begins a pass (begin_pass). A prompt record
// (decode 0) is acquired as one request; a decode record's hits are noted (note_requests) and its misses offered for
// admission (admit, factor 2), as a pass by the device alone is judged. Prints one line of 0/1 per access, in order.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "strata/expert_slots.h"

using namespace strata;

namespace {

int run(int argc, char **argv) {
    if (argc != 2) fail("usage: slot_replay lru|lfu|next < stream");
    const SlotPolicy policy = parse_slot_policy(argv[1]);
    int64_t n_layers = 0, n_expert = 0, capacity = 0;
    uint64_t decay_every = 0;
    std::string line;
    if (!std::getline(std::cin, line)) fail("slot_replay: no header line");
    std::istringstream head(line);
    if (!(head >> n_layers >> n_expert >> capacity >> decay_every) || n_layers <= 0 || n_expert <= 0 || capacity <= 0)
        fail("slot_replay: header '%s': expected n_layers n_expert capacity decay_every", line.c_str());
    ExpertSlotTable t(std::vector<int64_t>(size_t(n_layers), n_expert), std::vector<size_t>(size_t(n_layers), 1),
                      capacity, policy, decay_every);
    long long last_pass = -1;
    std::string out;
    while (std::getline(std::cin, line)) {
        std::istringstream rec(line);
        long long pass = 0;
        int decode = 0;
        int64_t il = 0;
        if (!(rec >> pass >> decode >> il)) continue;
        if (il < 0 || il >= n_layers) fail("slot_replay: layer %lld out of range", (long long)il);
        std::vector<int32_t> ids, hits, misses;
        for (int32_t e; rec >> e;) {
            if (e < 0 || e >= n_expert) fail("slot_replay: expert %d out of range", e);
            ids.push_back(e);
        }
        if (pass != last_pass) t.begin_pass(), last_pass = pass;
        for (const int32_t e : ids) {
            const bool hit = t.slot_of(il, e) >= 0;
            out += hit ? '1' : '0';
            (hit ? hits : misses).push_back(e);
        }
        std::vector<SlotFill> fills;
        if (decode) {
            t.note_requests(il, hits.data(), int64_t(hits.size()));
            for (const int32_t e : misses) t.admit(il, e, 2.0, fills);
        } else {
            std::vector<int32_t> slots(ids.size());
            t.acquire(il, ids.data(), int64_t(ids.size()), slots.data(), false, fills);
        }
    }
    std::printf("%s\n", out.c_str());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "slot_replay: %s\n", e.what());
        return 1;
    }
}
