// Decoding's misses split between the bus and the host: of the experts a decode-sized pass routes to that are in
// no slot, some are computed on the CPU (backend/host/host_experts.h, the GPU's arithmetic bit for bit, so where an
// expert runs never changes a result) while the others are copied in and computed on the device.
//
// Protocol per MoE layer (MoeSchedule::run, after the routing has been read back):
//   1. split(): how many of the layer's m misses go to the host: a fixed share (--cpu-share), or the cost model
//      (SplitModel): the n for which the slower of the two paths, the host's n experts and the device's other
//      m - n misses beside its hits, is quickest, by times measured as decoding runs; where that gives the host
//      none, one miss in every k_hybrid_probe layers still goes to it (and where it gives n, n + 1 as often), so
//      the host's figures follow it as it is now (a first slow figure, caches cold and threads asleep, would
//      otherwise keep the host out for good);
//   2. the schedule starts the host's experts (start(): the pool's threads begin), issues the device's between two
//      device marks, then joins the host's (finish()): the pool computes while the device copies and computes its
//      own (with STRATA_DECODE_OVERLAP=0, compute() after the device's part is issued);
//   3. the host's outputs go up as rows of the experts' output (Backend::upload_rows), ordered before the combine;
//      or, with the handoff (moe_schedule.h), the host writes them where the device reads them, the device's copy,
//      queued after its part, starts at the signal the pool's last piece stores, and finish() comes later.
// The device time between the marks is read once the device has passed them (never waited for), a few layers
// later, and goes to the model with the layer's count of device misses; compute() times the host's part.
// STRATA_DECODE_CPU=0 turns the split off (every miss copied in, as before). STRATA_DECODE_SPLIT_FIT=0 takes the
// rule before the model: n = m g / (g + c) rounded, c and g per expert (the host's time over its experts, the
// device's over its misses), so that n c = (m - n) g, with the one-miss probe where that gives none.
#pragma once

#include <chrono>
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
    uint64_t handoffs = 0;                      // layers whose host rows the device took at the pool's signal
    uint64_t early_fills = 0;                   // layers whose device fills went before the shared expert
    double host_ms = 0.0;                       // the host's compute time in all
    double host_us_per_expert = 0.0, device_us_per_miss = 0.0;  // the cost model's current estimates (0: none yet)
};

// The cost model of the split. The device's part of a layer takes D(d) = D0 + g d for d misses copied in (D0: its
// hits, the launches), fitted by least squares over recent layers (older ones weigh less, by k_forget a layer); the
// host's takes H(n) for n experts, a smoothed time per n (the pool spreads one expert over fewer threads than four,
// so H is not proportional to n), where not measured yet the nearest measured one scaled by n. best(m): the n in
// 0..m with the least max(D(m - n), H(n)); 0 until both sides have figures. Times in microseconds.
class SplitModel {
  public:
    static constexpr int k_max = 32;  // H is kept for n up to this; more is scaled from it
    void device(int64_t d, double us);
    void host(int64_t n, double us);
    bool ready() const;
    int64_t best(int64_t m) const;
    double device_us(int64_t d) const;  // D(d)
    double host_us(int64_t n) const;    // H(n); 0 for n = 0
    double g_us() const { return g_; }  // the fitted time a miss adds to the device's part

  private:
    void fit();
    double s1_ = 0, sd_ = 0, sdd_ = 0, ss_ = 0, sds_ = 0;  // weighted sums for the fit
    double d0_ = 0, g_ = 0;
    bool fitted_ = false;
    double h_[k_max + 1] = {};  // H(n) measured, 0: not yet
};

class DecodeHybrid {
  public:
    DecodeHybrid(Backend &be, const HybridOptions &o);
    // How many of m misses the host takes.
    int64_t split(int64_t m);
    // The device's part of a layer of the split: dev_misses experts copied in (and its hits computed) between
    // marks a and b; for every layer of a pass the split takes, whether the host computes any of it or not.
    void device_part(int64_t dev_misses, uint64_t a, uint64_t b);
    // The host's jobs, timed (beside a device part of dev_misses misses).
    void compute(const std::vector<HostExpertJob> &jobs, uint64_t bytes, int64_t dev_misses);
    // compute() in two halves (HostExperts::start / finish): the host's threads begin on start(), the caller issues
    // the device's part, and finish() takes part and waits. The host's time is from start to finish: the path
    // its rows take, however long the caller was away.
    // With a signal (the handoff: Backend::rows_handoff) the host's time ends where its last output was written,
    // not at finish(), which may come any time later.
    void start(const std::vector<HostExpertJob> &jobs, uint64_t bytes, int64_t dev_misses, HostSignal done = {});
    void finish();
    // Whether the pool ends these jobs without the caller (HostExperts::runs_alone): a handoff's condition.
    bool runs_alone(const std::vector<HostExpertJob> &jobs) const { return pool_.runs_alone(jobs); }
    const HybridStats &stats() const { return stats_; }
    void note_early_fills() { stats_.early_fills++; }  // a split layer's fills went early (moe_schedule.h)
    int threads() const { return pool_.threads(); }
    bool pinned() const { return pool_.pinned(); }

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
    std::chrono::steady_clock::time_point t0_;  // the started compute's
    bool signalled_ = false;                    // the started compute stores a signal
    int64_t n_jobs_ = 0, dev_misses_ = 0;
    uint64_t bytes_ = 0;
    SplitModel model_;
    int64_t since_probe_ = 0;  // layers since the split last probed beyond the model's choice
    bool fit_;                 // STRATA_DECODE_SPLIT_FIT (off: the per-expert rule)
    double c_us_ = 0.0, g_us_ = 0.0;  // that rule's smoothed per-expert times (0: not measured yet)
    HybridStats stats_;
};

}  // namespace strata
