// Which of two ways a decode-sized pass runs where both apply, chosen by the time passes take (STRATA_DECODE_CHOOSE,
// on; the MoE schedule asks, moe_schedule.h):
//   - Alone: the device alone, every layer's misses read in place from the pinned host copy (mapped misses), routed
//     on the device, nothing read back, the pass replayed as a CUDA graph; the cache holds what prompts left;
//   - Split: the hybrid split (decode_hybrid.h), the host computing some misses while the device copies the rest
//     into slots (STRATA_DECODE_SPLIT_MAPPED=1: reads them in place), each layer's routing read back.
// Neither is faster everywhere: on one H200 at 12 GiB under uniform routing the 30B-A3B decoded at 72.9 tok/s alone
// against 69.0 split, Next-80B at 44.4 against 48.7 (bench/RESULTS.md, tenth round); which wins depends on the host's
// cores and memory, the expert size and the hit rate, which moves with the routing. Both give the same bits.
//
// Protocol, per pass size (tokens, 1..k_max_tokens; a size's passes are timed against each other only): the time
// of a pass is the host's time from its start to the next pass's start, taken only where the next pass has the same
// size and starts within k_gap_us (a server idle between requests gives no sample). A run is k_run passes in one
// mode; the first pass of a run after a switch is not sampled (a graph is recorded, a cache settles). Exploring,
// runs alternate from Split until each mode has k_min_samples samples, or for k_explore_max passes of the size at
// most (sizes that interleave give few samples); then every pass takes the mode whose recent samples (the last
// k_window) have the lower median (a mode without samples loses to one with; neither: Split), and after
// k_probe_every passes the other mode runs one run (a probe) so that a change (the cache filling, other load on
// the host) is seen. A probe's mode starts it with no samples, so it is judged on what it measures then; each probe
// that leaves the choice as it was doubles the interval to the next (up to k_probe_max passes), a change of mode
// sets it back to k_probe_every.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace strata {

enum class DecodeMode { Alone, Split };

struct DecodeModeStats {
    uint64_t alone = 0, split = 0;  // decode-sized passes run each way while both applied
    uint64_t switches = 0;          // passes whose mode differs from the previous pass of that size
};

class DecodeModeChooser {
  public:
    static constexpr int64_t k_max_tokens = 16;
    static constexpr int k_run = 4, k_min_samples = 6, k_window = 8;
    static constexpr int64_t k_probe_every = 64, k_probe_max = 1024, k_explore_max = 64;
    static constexpr double k_gap_us = 1e6;

    // The mode of a pass of n_tokens (1..k_max_tokens) that starts at t_us (a steady clock); what passed since the
    // previous pass's start is that pass's time where it was of the same size.
    DecodeMode next(int64_t n_tokens, double t_us);
    // A pass the chooser has no say in started (a prompt, a traced pass): the previous pass gives no sample.
    void other_pass() { last_n_ = -1; }
    const DecodeModeStats &stats() const { return stats_; }
    // The median of a mode's recent samples for passes of n_tokens (0: none yet).
    double median_us(int64_t n_tokens, DecodeMode m) const;

  private:
    struct Samples {
        std::array<double, k_window> v{};
        int n = 0;  // samples so far (the window holds the last min(n, k_window))
        double median() const;
        void add(double us) { v[std::size_t(n++ % k_window)] = us; }
    };
    struct Size {
        Samples s[2];  // by mode
        DecodeMode mode = DecodeMode::Split;
        int run = 0;  // passes of the current run so far
        bool exploring = true;
        int64_t since_probe = 0;  // passes since the last probe ended
        int64_t probe_every = k_probe_every;
        DecodeMode held = DecodeMode::Split;  // the mode a probe interrupted
        int64_t passes = 0;                   // of this size so far
        bool probing = false;
        bool started = false;
    };
    std::array<Size, k_max_tokens + 1> sizes_{};
    int64_t last_n_ = -1;
    double last_t_ = 0.0;
    DecodeMode last_mode_ = DecodeMode::Split;
    bool last_sampled_ = false;  // the previous pass's time counts
    DecodeModeStats stats_;
};

}  // namespace strata
