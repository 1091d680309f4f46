#include "strata/decode_mode.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

namespace {
DecodeMode other(DecodeMode m) {
    return m == DecodeMode::Alone ? DecodeMode::Split : DecodeMode::Alone;
}
}  // namespace

double DecodeModeChooser::Samples::median() const {
    const int m = std::min(n, k_window);
    if (m == 0) return 0.0;
    std::array<double, k_window> w = v;
    std::nth_element(w.begin(), w.begin() + m / 2, w.begin() + m);
    return w[size_t(m / 2)];
}

double DecodeModeChooser::median_us(int64_t n_tokens, DecodeMode m) const {
    STRATA_ASSERT(n_tokens >= 1 && n_tokens <= k_max_tokens);
    return sizes_[size_t(n_tokens)].s[int(m)].median();
}

DecodeMode DecodeModeChooser::next(int64_t n, double t_us) {
    STRATA_ASSERT(n >= 1 && n <= k_max_tokens);
    Size &z = sizes_[size_t(n)];
    const double dt = t_us - last_t_;
    if (last_n_ == n && last_sampled_ && dt >= 0.0 && dt < k_gap_us) z.s[int(last_mode_)].add(dt);
    const DecodeMode before = z.mode;
    auto best = [&] {
        const Samples &a = z.s[int(DecodeMode::Alone)], &sp = z.s[int(DecodeMode::Split)];
        if (a.n == 0 || sp.n == 0) return a.n > 0 ? DecodeMode::Alone : DecodeMode::Split;
        return a.median() < sp.median() ? DecodeMode::Alone : DecodeMode::Split;
    };
    const bool first = !z.started;
    if (first) {
        z.started = true;
        z.mode = DecodeMode::Split;
    } else if (z.exploring) {
        if ((z.s[0].n >= k_min_samples && z.s[1].n >= k_min_samples) || z.passes >= k_explore_max) {
            z.exploring = false;
            z.mode = best();
            z.since_probe = 0;
        } else if (z.run >= k_run) {
            z.mode = other(z.mode);
        }
    } else if (z.probing) {
        if (z.run >= k_run) {
            z.probing = false;
            z.mode = best();
            z.since_probe = 0;
            z.probe_every = z.mode == z.held ? std::min(2 * z.probe_every, k_probe_max) : k_probe_every;
        }
    } else if (++z.since_probe >= z.probe_every) {
        z.probing = true;
        z.held = best();
        z.mode = other(z.held);
        z.s[int(z.mode)] = Samples{};  // judged on what it measures now
    } else {
        z.mode = best();
        if (z.mode != before) z.probe_every = k_probe_every;
    }
    const bool switched = z.mode != before;
    if (switched) {
        z.run = 0;
        stats_.switches++;
    }
    z.run++;
    z.passes++;
    (z.mode == DecodeMode::Alone ? stats_.alone : stats_.split)++;
    last_n_ = n;
    last_t_ = t_us;
    last_mode_ = z.mode;
    last_sampled_ = !first && !switched;  // the first pass, and the first after a switch, settle things: no sample
    return z.mode;
}

}  // namespace strata
