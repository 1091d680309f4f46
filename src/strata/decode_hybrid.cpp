// Decoding's misses split between the bus and the host (decode_hybrid.h; the protocol is there).
#include "strata/decode_hybrid.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/threads.h"

namespace strata {

namespace {

// The pool: the cores less one for the thread that drives the device, at most 16. Cores, not hardware threads:
// on the H200 machine (8 cores, 16 threads) a call of three experts took 233 us on 8 threads and 384 on 15.
int host_threads(int asked) {
    if (asked > 0) return asked;
    return std::clamp(physical_cores() - 1, 1, 16);
}

// Smoothing of the measured times: a new figure moves the estimate a quarter of the way.
constexpr double k_alpha = 0.25;

void smooth(double &est, double v) {
    est = est > 0.0 ? est + k_alpha * (v - est) : v;
}

}  // namespace

DecodeHybrid::DecodeHybrid(Backend &be, const HybridOptions &o) : be_(be), opt_(o), pool_(host_threads(o.threads)) {}

// The cost model's probe: how often a layer whose model share is none still sends the host one miss.
constexpr int64_t k_hybrid_probe = 32;

int64_t DecodeHybrid::split(int64_t m) {
    if (m <= 0) return 0;
    if (opt_.share >= 0.0) return std::clamp<int64_t>(int64_t(std::lround(opt_.share * double(m))), 0, m);
    // Until both are measured, half each way; then n with n c = (m - n) g.
    if (c_us_ <= 0.0 || g_us_ <= 0.0) return (m + 1) / 2;
    int64_t n = std::clamp<int64_t>(int64_t(std::lround(double(m) * g_us_ / (g_us_ + c_us_))), 0, m);
    if (n == 0 && m >= 2 && ++since_host_ >= k_hybrid_probe) n = 1;
    if (n > 0) since_host_ = 0;
    return n;
}

void DecodeHybrid::read_device_times() {
    while (!pending_.empty()) {
        const Pending &p = pending_.front();
        const double ms = be_.device_ms(p.a, p.b);
        if (ms < 0.0) {
            if (pending_.size() < 64) return;  // not there yet
        } else if (p.n > 0) {
            smooth(g_us_, 1e3 * ms / double(p.n));
        }
        pending_.pop_front();
    }
}

void DecodeHybrid::compute(const std::vector<HostExpertJob> &jobs, uint64_t bytes, int64_t dev_misses, uint64_t a,
                           uint64_t b) {
    if (dev_misses > 0) pending_.push_back({a, b, dev_misses});
    const auto t0 = std::chrono::steady_clock::now();
    pool_.run(jobs);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (!jobs.empty()) smooth(c_us_, us / double(jobs.size()));
    read_device_times();
    stats_.host_experts += jobs.size();
    stats_.host_bytes += bytes;
    stats_.device_misses += uint64_t(dev_misses);
    stats_.host_ms += us / 1e3;
    stats_.host_us_per_expert = c_us_;
    stats_.device_us_per_miss = g_us_;
}

}  // namespace strata
