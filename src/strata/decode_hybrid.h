// Decoding's misses split between the bus and the host: of the experts a decode-sized pass routes to that are in
// no slot, some are computed on the CPU (backend/host/host_experts.h, the GPU's arithmetic bit for bit, so where an
// expert runs never changes a result) while the others are copied in and computed on the device.
//
// Protocol per MoE layer (MoeSchedule::run, after the routing has been read back):
//   1. split(): how many of the layer's m misses go to the host: a fixed share (--cpu-share), or the cost model:
//      per-expert host time c and per-expert device time g (copy and compute of a miss), both measured as decoding
//      runs, so that the host's n * c and the device's (m - n) * g come out even; where that gives the host none,
//      one miss in every k_hybrid_probe layers still goes to it, so c follows the host as it is now (a first slow
//      figure, caches cold and threads asleep, would otherwise keep the host out for good);
//   2. the schedule reads the pass's input rows back, issues the device's experts between two device marks, then
//      calls compute() for the host's: the pool computes while the device copies and computes its own;
//   3. the host's outputs go up as rows of the experts' output (Backend::upload_rows), ordered before the combine.
// The device time between the marks is read once the device has passed them (never waited for), a few layers
// later, and corrects g; compute() times the host's part and corrects c.
// STRATA_DECODE_CPU=0 turns the split off (every miss copied in, as before).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/host/host_experts.h"

namespace strata {

struct HybridOptions {
    bool on = true;       // STRATA_DECODE_CPU (default on where the backend can)
    double share = -1.0;  // fixed share of each layer's misses on the host (0..1); negative: the cost model
    int threads = 0;      // host threads (0: the physical cores less one, at most 16)
};

// Host and device work of the split so far.
struct HybridStats {
    uint64_t host_experts = 0, host_bytes = 0;  // misses computed on the host, and the expert bytes they read
    uint64_t device_misses = 0;                 // misses copied in while the host computed others
    double host_ms = 0.0;                       // the host's compute time in all
    double host_us_per_expert = 0.0, device_us_per_miss = 0.0;  // the cost model's current estimates (0: none yet)
};

class DecodeHybrid {
  public:
    DecodeHybrid(Backend &be, const HybridOptions &o);
    // How many of m misses the host takes.
    int64_t split(int64_t m);
    // The host's jobs, timed; `dev_misses` experts the device copies in between marks a and b.
    void compute(const std::vector<HostExpertJob> &jobs, uint64_t bytes, int64_t dev_misses, uint64_t a, uint64_t b);
    const HybridStats &stats() const { return stats_; }
    int threads() const { return pool_.threads(); }

  private:
    void read_device_times();

    Backend &be_;
    HybridOptions opt_;
    HostExperts pool_;
    struct Pending {
        uint64_t a, b;
        int64_t n;
    };
    std::deque<Pending> pending_;
    double c_us_ = 0.0, g_us_ = 0.0;  // smoothed per-expert times (0: not measured yet)
    int64_t since_host_ = 0;           // layers since the host last took a miss
    HybridStats stats_;
};

}  // namespace strata
