// Decoding's misses split between the bus and the host (decode_hybrid.h; the protocol is there).
#include "strata/decode_hybrid.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/env.h"
#include "core/threads.h"

namespace strata {

namespace {

// The pool: the cores less one for the thread that drives the device, at most 16. Cores, not hardware threads: two
// spinning workers on one core's siblings share its units (on one H200 machine whose 16 threads behaved so, a call
// of three experts took 233 us on 8 threads and 384 on 15; on one of 16 cores 15 threads were the quickest).
int host_threads(int asked) {
    if (asked > 0) return asked;
    return std::clamp(physical_cores() - 1, 1, 16);
}

// Smoothing of the host's times: a new figure moves the estimate a quarter of the way.
constexpr double k_alpha = 0.25;

void smooth(double &est, double v) {
    est = est > 0.0 ? est + k_alpha * (v - est) : v;
}

// The device fit's forgetting: each layer's sample weighs this much less than the next one's.
constexpr double k_forget = 0.97;

}  // namespace

void SplitModel::device(int64_t d, double us) {
    const double x = double(d);
    s1_ = k_forget * s1_ + 1.0;
    sd_ = k_forget * sd_ + x;
    sdd_ = k_forget * sdd_ + x * x;
    ss_ = k_forget * ss_ + us;
    sds_ = k_forget * sds_ + x * us;
    fit();
}

void SplitModel::fit() {
    const double det = s1_ * sdd_ - sd_ * sd_;
    if (sd_ <= 0.0) return;  // no layer with a miss yet
    if (det > 1e-6 * s1_ * sdd_) {
        g_ = (s1_ * sds_ - sd_ * ss_) / det;
        d0_ = (ss_ - g_ * sd_) / s1_;
    } else {  // every layer with the same count of misses: all of it per miss
        g_ = ss_ / sd_;
        d0_ = 0.0;
    }
    if (g_ < 0.0) {  // noise: a miss never makes the device quicker
        g_ = ss_ / sd_;
        d0_ = 0.0;
    }
    d0_ = std::max(d0_, 0.0);
    fitted_ = true;
}

void SplitModel::host(int64_t n, double us) {
    if (n <= 0) return;
    if (n <= k_max) smooth(h_[n], us);
}

bool SplitModel::ready() const {
    if (!fitted_) return false;
    for (int n = 1; n <= k_max; n++)
        if (h_[n] > 0.0) return true;
    return false;
}

double SplitModel::device_us(int64_t d) const {
    return d <= 0 ? d0_ : d0_ + g_ * double(d);
}

double SplitModel::host_us(int64_t n) const {
    if (n <= 0) return 0.0;
    if (n <= k_max && h_[n] > 0.0) return h_[n];
    // the nearest measured count, scaled
    for (int64_t dn = 1; dn <= k_max; dn++)
        for (int64_t c : {n - dn, n + dn})
            if (c >= 1 && c <= k_max && h_[c] > 0.0) return h_[c] * double(n) / double(c);
    return 0.0;
}

int64_t SplitModel::best(int64_t m) const {
    if (m <= 0 || !ready()) return 0;
    int64_t best_n = 0;
    double best_t = device_us(m);
    for (int64_t n = 1; n <= m; n++) {
        const double t = std::max(device_us(m - n), host_us(n));
        if (t < best_t) best_t = t, best_n = n;
    }
    return best_n;
}

DecodeHybrid::DecodeHybrid(Backend &be, const HybridOptions &o)
    : be_(be), opt_(o), pool_(host_threads(o.threads), env_switch("STRATA_HOST_PIN", true)), fit_(env_switch("STRATA_DECODE_SPLIT_FIT", true)) {}

// The cost model's probe: how often the split sends the host one miss more than the model's choice.
constexpr int64_t k_hybrid_probe = 32;

int64_t DecodeHybrid::split(int64_t m) {
    if (m <= 0) return 0;
    if (opt_.share >= 0.0) return std::clamp<int64_t>(int64_t(std::lround(opt_.share * double(m))), 0, m);
    if (!fit_) {  // the per-expert rule: n c = (m - n) g, rounded
        if (c_us_ <= 0.0 || g_us_ <= 0.0) return (m + 1) / 2;
        int64_t n = std::clamp<int64_t>(int64_t(std::lround(double(m) * g_us_ / (g_us_ + c_us_))), 0, m);
        if (n == 0 && m >= 2 && ++since_probe_ >= k_hybrid_probe) n = 1;
        if (n > 0) since_probe_ = 0;
        return n;
    }
    // Until both sides are measured, half each way; then the model's choice, one more now and then.
    if (!model_.ready()) return (m + 1) / 2;
    int64_t n = model_.best(m);
    if (n < m && ++since_probe_ >= k_hybrid_probe) n++, since_probe_ = 0;
    return n;
}

void DecodeHybrid::read_device_times() {
    while (!pending_.empty()) {
        const Pending &p = pending_.front();
        const double ms = be_.device_ms(p.a, p.b);
        if (ms < 0.0) {
            if (pending_.size() < 64) return;  // not there yet
        } else {
            model_.device(p.n, 1e3 * ms);
            if (p.n > 0) smooth(g_us_, 1e3 * ms / double(p.n));
        }
        pending_.pop_front();
    }
}

void DecodeHybrid::device_part(int64_t dev_misses, uint64_t a, uint64_t b) {
    pending_.push_back({a, b, dev_misses});
    read_device_times();
}

void DecodeHybrid::compute(const std::vector<HostExpertJob> &jobs, uint64_t bytes, int64_t dev_misses) {
    start(jobs, bytes, dev_misses);
    finish();
}

void DecodeHybrid::start(const std::vector<HostExpertJob> &jobs, uint64_t bytes, int64_t dev_misses, HostSignal done) {
    t0_ = std::chrono::steady_clock::now();
    n_jobs_ = int64_t(jobs.size());
    bytes_ = bytes;
    dev_misses_ = dev_misses;
    signalled_ = done.word != nullptr;
    stats_.handoffs += signalled_;
    pool_.start(jobs, done);
}

void DecodeHybrid::finish() {
    pool_.finish();
    const auto end = signalled_ ? pool_.done_at() : std::chrono::steady_clock::now();
    const double us = std::chrono::duration<double, std::micro>(end - t0_).count();
    model_.host(n_jobs_, us);
    if (n_jobs_ > 0) smooth(c_us_, us / double(n_jobs_));
    read_device_times();
    stats_.host_experts += uint64_t(n_jobs_);
    stats_.host_bytes += bytes_;
    stats_.device_misses += uint64_t(dev_misses_);
    stats_.host_ms += us / 1e3;
    stats_.host_us_per_expert = n_jobs_ ? model_.host_us(n_jobs_) / double(n_jobs_) : 0.0;
    stats_.device_us_per_miss = model_.g_us();
}

}  // namespace strata
