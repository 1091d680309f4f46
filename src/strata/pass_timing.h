// Where a pass's time goes, MoE layer by MoE layer: prompt passes (STRATA_PREFILL_TIMING=1) and decode-sized ones
// (fewer than k_timing_min_tokens tokens, STRATA_DECODE_TIMING=1), each kind counted apart; off, nothing is
// measured or recorded. The MoE schedule (moe_schedule.h) ends each phase of a layer's MoE step as it issues it:
//   route     the router and top-k on the device;
//   readback  the routing ids read back (the host waits for the device to get there), and what the host decides
//             from them (a benchmark's routing override, the hybrid split);
//   group     the host grouping (token, expert) pairs by expert;
//   upload    the streamed schedule (moe_schedule.h) acquiring slots and issuing their fills on the copy stream,
//             batch by batch (host time; the compute stream has nothing queued in it);
//   copy_wait the compute stream waiting for the fills of the slots the next batch reads (device time: from the
//             end of the work before to the end of the wait);
//   experts   the rows gathered and the expert FFNs (where a layer does not stream, its fills issued and waited for
//             too);
//   host      the misses the host computes (decode_hybrid.h) and the upload of their rows; empty without them;
//   combine   each token's outputs summed;
//   shared    the shared expert;
// and mixer, the time from the previous MoE layer's end to this one's start within a pass (attention or Gated
// DeltaNet, norms, the dense FFN of a layer without experts; the first MoE layer of a pass has none).
// Host time is the issuing thread's wall time in a phase. Device time is the span between two marks on the backend's
// stream (Backend::mark_device), read when the device has passed them, never waiting: after each readback (the
// device has then reached it) and in settle(). A backend without marks (the CPU) reports host time only, and there
// a phase's host time is its compute. Passes of fewer than k_timing_min_tokens tokens are not counted.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace strata {

enum class TimingPhase { Mixer, Route, Readback, Group, Upload, CopyWait, Experts, Host, Combine, Shared };
constexpr int k_timing_phases = 10;
const char *timing_phase_name(TimingPhase p);

constexpr int64_t k_timing_min_tokens = 64;

struct PhaseTime {
    double host_ms = 0, device_ms = 0;
    uint64_t calls = 0;
};
struct LayerTiming {
    int64_t layer = -1;  // layer index
    uint64_t passes = 0, tokens = 0;
    std::array<PhaseTime, k_timing_phases> phase{};
    uint64_t device_lost = 0;  // spans whose marks were gone before they could be read
};

enum class TimingKind { Prompt, Decode };
const char *timing_env(TimingKind k);  // STRATA_PREFILL_TIMING or STRATA_DECODE_TIMING

class PassTiming {
  public:
    PassTiming(Backend &be, TimingKind kind);  // on where the kind's variable is 1
    PassTiming(Backend &be, TimingKind kind, bool on);
    bool on() const { return on_; }
    TimingKind kind() const { return kind_; }
    // A layer's MoE step begins (tokens: the pass's); false, and nothing recorded until the next begin, where
    // timing is off or the pass is not of this kind.
    bool layer_begin(int64_t il, int64_t tokens);
    void phase_end(TimingPhase p);  // the phase running since the last end (or the begin) ends here
    void layer_end();
    // Reads every device span the device has passed; synced: the device has reached the last mark but one (after a
    // readback), so a span before it that cannot be read is lost (the backend reused its marks).
    void settle(bool synced = false);
    const std::vector<LayerTiming> &layers() const { return layers_; }  // by layer index; layer -1: never timed

  private:
    struct Pending {
        size_t layer;
        int phase;
        uint64_t a, b;
    };
    using Clock = std::chrono::steady_clock;
    Backend &be_;
    TimingKind kind_;
    bool on_ = false, active_ = false;
    size_t cur_ = 0;
    Clock::time_point t_, t_end_;       // the last phase boundary; the previous MoE layer's end in this pass
    bool ended_ = false;                // t_end_ is this pass's
    uint64_t mark_ = 0, last_end_ = 0;  // the last phase boundary's mark; the previous MoE layer's end in this pass
    int64_t last_il_ = -1;
    std::vector<LayerTiming> layers_;
    std::vector<Pending> pending_;
};

// The timing as a table: one row per timed layer (device ms, or host ms where there is no device time), then the
// sum over layers with each phase's host and device ms and share of the device time; kind names the passes.
std::string timing_table(const std::vector<LayerTiming> &layers, TimingKind kind = TimingKind::Prompt);

}  // namespace strata
