#include "strata/prefill_cost.h"

#include <algorithm>

#include "core/env.h"

namespace strata {

ScheduleCost next_layer_cost(const NextLayerCost &c) {
    const double m = double(std::max<int64_t>(c.missing, 0)), ahead = double(std::max<int64_t>(c.ahead, 0));
    const double r = std::clamp(c.share, 0.0, 1.0), q = std::clamp(c.recall, 0.0, 1.0), e = c.expert_s;
    const double W = std::max(c.window_s, 0.0), C = std::max(c.compute_s, 0.0);
    const double f = std::min(m, ahead), p = std::min(q * r * m, ahead);
    ScheduleCost s;
    s.full_s = std::max(std::max(f * e - W, 0.0) + r * (m - f) * e, C) + f * (1.0 - r) * r * e;
    s.predicted_s = std::max(std::max(p * e - W, 0.0) + (r * m - p) * e, C);
    return s;
}

PrefillCost::PrefillCost(Backend &be)
    : on_(env_switch("STRATA_PREFILL_COST", true)), timing_(be, TimingKind::Prompt, true) {}

void PrefillCost::start_pass(int64_t T, const PassTiming &timed) {
    sampled_ = false;
    if (!on_ || bus_gbs_ <= 0 || T < k_timing_min_tokens) return;
    if (timed.on()) {
        refresh(timed.layers());  // every pass is timed already (settled as its read-backs go)
        return;
    }
    timing_.settle();
    refresh(timing_.layers());
    sampled_ = passes_++ % k_cost_sample_every == 0;
}

void PrefillCost::refresh(const std::vector<LayerTiming> &layers) {
    rate_.assign(layers.size(), Rate{});
    double w = 0, c = 0;
    int n = 0;
    for (size_t il = 0; il < layers.size(); il++) {
        const LayerTiming &L = layers[il];
        // a pass's first MoE layer has no mixer span (nothing before it is timed): its cycle is not whole
        if (L.layer < 0 || L.tokens == 0 || L.phase[size_t(TimingPhase::Mixer)].calls == 0) continue;
        // device time where the backend marks it, else the host's (a backend that computes on the issuing thread)
        bool device = false;
        for (const PhaseTime &t : L.phase) device = device || t.device_ms > 0;
        double total = 0;
        for (const PhaseTime &t : L.phase) total += device ? t.device_ms : t.host_ms;
        const auto at = [&](TimingPhase p) {
            const PhaseTime &t = L.phase[size_t(p)];
            return device ? t.device_ms : t.host_ms;
        };
        const double experts = at(TimingPhase::Experts), waits = at(TimingPhase::CopyWait);
        if (experts <= 0) continue;
        Rate &r = rate_[il];
        r.compute_per_token = experts * 1e-3 / double(L.tokens);
        r.window_per_token = std::max(total - experts - waits, 0.0) * 1e-3 / double(L.tokens);
        r.measured = true;
        w += r.window_per_token, c += r.compute_per_token, n++;
    }
    mean_ = n ? Rate{w / n, c / n, true} : Rate{};
}

bool PrefillCost::rates(int64_t il, int64_t T, double &window_s, double &compute_s) const {
    const Rate &r = il >= 0 && size_t(il) < rate_.size() && rate_[size_t(il)].measured ? rate_[size_t(il)] : mean_;
    if (!on_ || bus_gbs_ <= 0 || !r.measured) return false;
    window_s = r.window_per_token * double(T);
    compute_s = r.compute_per_token * double(T);
    return true;
}

}  // namespace strata
