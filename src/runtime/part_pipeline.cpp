// The pipeline of a split model's parts (part_pipeline.h; its protocol at the top).
#include "runtime/part_pipeline.h"

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

size_t run_part_pipeline(size_t n_parts, size_t n_passes, const PartPipeline &p, size_t *done_passes) {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<size_t> done(n_parts, 0);
    std::exception_ptr error;
    auto worker = [&](size_t part) {
        try {
            if (p.bind) p.bind(part);
            for (size_t j = 0; j < n_passes; j++) {
                {
                    std::unique_lock<std::mutex> lock(mu);
                    cv.wait(lock, [&] {
                        if (error) return true;
                        const bool input = part == 0 || done[part - 1] > j;
                        const bool room = part + 1 == n_parts || j < 2 || done[part + 1] + 1 >= j;
                        return input && room;
                    });
                    if (error) return;
                }
                p.run(part, j);
                if (part + 1 == n_parts && p.finished) p.finished(j);
                {
                    std::lock_guard<std::mutex> lock(mu);
                    done[part] = j + 1;
                }
                cv.notify_all();
            }
        } catch (...) {
            {
                std::lock_guard<std::mutex> lock(mu);
                if (!error) error = std::current_exception();
            }
            cv.notify_all();
        }
    };
    std::vector<std::thread> threads;
    for (size_t part = 1; part < n_parts; part++) threads.emplace_back(worker, part);
    worker(0);
    for (std::thread &t : threads) t.join();
    if (done_passes) *done_passes = done[n_parts - 1];
    if (error) std::rethrow_exception(error);
    return done[n_parts - 1];
}

std::vector<size_t> micro_pass_starts(const std::vector<int64_t> &seg_tokens, size_t n) {
    const size_t s = seg_tokens.size(), m = std::min(s, n);
    if (m <= 1) return {0};
    std::vector<int64_t> sum(s + 1, 0);
    for (size_t i = 0; i < s; i++) sum[i + 1] = sum[i] + seg_tokens[i];
    // best[g][i]: the smallest largest micro-pass over the first i segments cut into g; from[g][i]: where the last
    // of those g starts.
    const int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(m + 1, std::vector<int64_t>(s + 1, inf));
    std::vector<std::vector<size_t>> from(m + 1, std::vector<size_t>(s + 1, 0));
    best[0][0] = 0;
    for (size_t g = 1; g <= m; g++)
        for (size_t i = g; i <= s; i++)
            for (size_t k = g - 1; k < i; k++) {
                if (best[g - 1][k] == inf) continue;
                const int64_t v = std::max(best[g - 1][k], sum[i] - sum[k]);
                if (v < best[g][i]) best[g][i] = v, from[g][i] = k;
            }
    std::vector<size_t> starts(m);
    for (size_t g = m, i = s; g > 0; g--) i = starts[g - 1] = from[g][i];
    return starts;
}

}  // namespace strata
