#include "strata/pass_timing.h"

#include "core/env.h"
#include "core/error.h"

namespace strata {

const char *timing_phase_name(TimingPhase p) {
    static const char *names[k_timing_phases] = {"mixer",     "route",   "readback", "group",   "upload",
                                                 "copy_wait", "experts", "host",     "combine", "shared"};
    return names[int(p)];
}

const char *timing_env(TimingKind k) {
    return k == TimingKind::Prompt ? "STRATA_PREFILL_TIMING" : "STRATA_DECODE_TIMING";
}

PassTiming::PassTiming(Backend &be, TimingKind kind) : PassTiming(be, kind, env_switch(timing_env(kind), false)) {}

PassTiming::PassTiming(Backend &be, TimingKind kind, bool on) : be_(be), kind_(kind), on_(on) {}

bool PassTiming::layer_begin(int64_t il, int64_t tokens) {
    const bool prompt = tokens >= k_timing_min_tokens;
    active_ = on_ && prompt == (kind_ == TimingKind::Prompt) && il >= 0;
    if (!active_) return false;
    const Clock::time_point now = Clock::now();
    if (il <= last_il_) last_end_ = 0, ended_ = false;  // a new pass: no mixer span back into the last one
    last_il_ = il;
    if (layers_.size() <= size_t(il)) layers_.resize(size_t(il) + 1);
    cur_ = size_t(il);
    LayerTiming &L = layers_[cur_];
    L.layer = il;
    L.passes++;
    L.tokens += uint64_t(tokens);
    mark_ = be_.mark_device();
    if (last_end_ && mark_) pending_.push_back({cur_, int(TimingPhase::Mixer), last_end_, mark_});
    PhaseTime &mixer = L.phase[size_t(TimingPhase::Mixer)];
    if (ended_) mixer.host_ms += std::chrono::duration<double, std::milli>(now - t_end_).count(), mixer.calls++;
    t_ = Clock::now();
    return true;
}

void PassTiming::phase_end(TimingPhase p) {
    if (!active_) return;
    const Clock::time_point now = Clock::now();
    const uint64_t m = be_.mark_device();
    PhaseTime &pt = layers_[cur_].phase[size_t(p)];
    pt.host_ms += std::chrono::duration<double, std::milli>(now - t_).count();
    pt.calls++;
    if (mark_ && m) pending_.push_back({cur_, int(p), mark_, m});
    mark_ = m;
    t_ = Clock::now();  // the marks' own cost is not the next phase's
    if (p == TimingPhase::Readback) settle(true);
}

void PassTiming::layer_end() {
    if (!active_) return;
    last_end_ = mark_;
    t_end_ = Clock::now();
    ended_ = true;
    active_ = false;
}

void PassTiming::settle(bool synced) {
    size_t keep = 0;
    for (const Pending &q : pending_) {
        const double ms = be_.device_ms(q.a, q.b);
        if (ms >= 0) {
            layers_[q.layer].phase[size_t(q.phase)].device_ms += ms;
        } else if (synced && q.b < mark_) {
            layers_[q.layer].device_lost++;  // the device is past it, yet unreadable: its marks were reused
        } else {
            pending_[keep++] = q;
        }
    }
    pending_.resize(keep);
}

std::string timing_table(const std::vector<LayerTiming> &layers, TimingKind kind) {
    bool device = false;
    std::array<PhaseTime, k_timing_phases> sum{};
    uint64_t lost = 0;
    for (const LayerTiming &L : layers) {
        if (L.layer < 0) continue;
        lost += L.device_lost;
        for (int p = 0; p < k_timing_phases; p++) {
            sum[size_t(p)].host_ms += L.phase[size_t(p)].host_ms;
            sum[size_t(p)].device_ms += L.phase[size_t(p)].device_ms;
            sum[size_t(p)].calls += L.phase[size_t(p)].calls;
            device = device || L.phase[size_t(p)].device_ms > 0;
        }
    }
    std::string out = strfmt("%s passes by MoE layer (%s=1), %s ms summed over passes\n\n",
                             kind == TimingKind::Prompt ? "prompt" : "decode", timing_env(kind),
                             device ? "device" : "host");
    out += "| layer | passes |";
    for (int p = 0; p < k_timing_phases; p++) out += strfmt(" %s |", timing_phase_name(TimingPhase(p)));
    out += "\n|---:|---:|";
    for (int p = 0; p < k_timing_phases; p++) out += "---:|";
    out += "\n";
    for (const LayerTiming &L : layers) {
        if (L.layer < 0) continue;
        out += strfmt("| %lld | %llu |", (long long)L.layer, (unsigned long long)L.passes);
        for (int p = 0; p < k_timing_phases; p++) {
            const PhaseTime &t = L.phase[size_t(p)];
            out += strfmt(" %.2f |", device ? t.device_ms : t.host_ms);
        }
        out += "\n";
    }
    double dev_total = 0;
    for (const PhaseTime &t : sum) dev_total += t.device_ms;
    out += "\n| phase | host ms | device ms | share of device |\n|---|---:|---:|---:|\n";
    for (int p = 0; p < k_timing_phases; p++) {
        const PhaseTime &t = sum[size_t(p)];
        out += strfmt("| %s | %.2f | %.2f | %.1f%% |\n", timing_phase_name(TimingPhase(p)), t.host_ms, t.device_ms,
                      dev_total > 0 ? 100.0 * t.device_ms / dev_total : 0.0);
    }
    if (lost) out += strfmt("\n(%llu device spans could not be read)\n", (unsigned long long)lost);
    return out;
}

}  // namespace strata
