// The auto prefill schedule's choice between full and predicted from measured rates (moe_schedule.h, Schedules;
// STRATA_PREFILL_COST, on; =0: the recall's line alone, full_share_threshold).
//
// A streamed prompt pass fills the next MoE layer's experts ahead of its routing while the device works on the rest
// of this layer and the next mixer: a window of W seconds in which the copy stream has the bus to itself and the
// compute needs none of those experts yet. Then the layer's experts compute (C seconds), each missing one after its
// copy. For the next layer of m missing experts, a routed share r (this layer's: the layers of a pass route alike),
// at most `ahead` of them filled ahead (the ring), one expert's copy e seconds (its bytes over the bus rate measured at
// start), and the prediction's measured recall q:
//   full       fills f = min(m, ahead) in id order; r (m - f) are routed and copied only after the routing;
//              f (1 - r) are not routed, and each evicts a cached expert that a later pass needs in a share r of
//              cases (a copy then): f (1 - r) r copies more;
//   predicted  fills p = min(q r m, ahead), every one routed; r m - p copied after the routing.
// Each schedule's time from the routing to the layer's last expert: the copies ahead not hidden by the window, then
// the late copies, or the compute where that takes longer (the streamed schedule computes what has arrived while the
// rest copies):
//   full       max(max(f e - W, 0) + r (m - f) e, C) + f (1 - r) r e
//   predicted  max(max(p e - W, 0) + (r m - p) e, C)
// Full where its time is not above predicted's (a tie goes to full, which needs no next-layer router). With W = C =
// 0 full never wins below r = 1: the window is what pays for full's extra copies (Next-80B's chunks route every
// expert and full won; the 30B-A3B's route 68% of them and predicted won; bench/RESULTS.md, eleventh round).
// W and C are measured: every k_cost_sample_every-th prompt pass (the first included) is timed by layer and phase
// (pass_timing.h: device marks, read without waiting), and per layer the experts' device time per token gives C, the
// rest of the layer's cycle (mixer, routing, read-back, grouping, combine, shared expert; the copy waits left out)
// per token W, both scaled to the pass's tokens. Until a layer of the pass's kind is measured, or where the bus rate
// is not (a backend without a copy engine), the recall's line decides as before. The choice moves only copies: the
// results do not change.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/pass_timing.h"

namespace strata {

struct NextLayerCost {
    double expert_s = 0;   // one expert's copy
    double window_s = 0;   // W
    double compute_s = 0;  // C
    int64_t missing = 0;   // m
    int64_t ahead = 0;     // at most this many filled ahead
    double share = 0;      // r
    double recall = 0;     // q
};
struct ScheduleCost {
    double full_s = 0, predicted_s = 0;
    bool full() const { return full_s <= predicted_s; }
};
ScheduleCost next_layer_cost(const NextLayerCost &c);

constexpr uint64_t k_cost_sample_every = 8;

class PrefillCost {
  public:
    explicit PrefillCost(Backend &be);  // STRATA_PREFILL_COST
    bool on() const { return on_; }
    // The pinned host-to-device rate (GB/s) the copies run at; 0: not measured (the model stays off).
    void set_bus_rate(double gbs) { bus_gbs_ = gbs; }
    double bus_gbs() const { return bus_gbs_; }
    // A pass of T tokens starts: the rates refreshed from the timing so far (`timed`: where STRATA_PREFILL_TIMING
    // times every pass, its layers; else this model's own samples), and whether this pass is sampled.
    void start_pass(int64_t T, const PassTiming &timed);
    // This pass's timing where it is sampled (nullptr: not sampled or the model is off).
    PassTiming *sampling() { return sampled_ ? &timing_ : nullptr; }
    // W and C for layer il (its own rates, else the mean of the measured layers') at T tokens; false: none measured.
    bool rates(int64_t il, int64_t T, double &window_s, double &compute_s) const;
    // One expert of `bytes` over the bus; 0 where the bus rate is not measured.
    double expert_seconds(uint64_t bytes) const { return bus_gbs_ > 0 ? double(bytes) / (bus_gbs_ * 1e9) : 0.0; }

  private:
    struct Rate {
        double window_per_token = 0, compute_per_token = 0;
        bool measured = false;
    };
    void refresh(const std::vector<LayerTiming> &layers);
    bool on_;
    double bus_gbs_ = 0;
    PassTiming timing_;
    uint64_t passes_ = 0;
    bool sampled_ = false;
    std::vector<Rate> rate_;  // by layer index
    Rate mean_;
};

}  // namespace strata
