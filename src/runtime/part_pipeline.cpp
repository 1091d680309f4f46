// The pipeline of a split model's parts (part_pipeline.h; its protocol at the top).
#include "runtime/part_pipeline.h"

#include <condition_variable>
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

}  // namespace strata
