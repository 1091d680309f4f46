// A fixed pool of worker threads for data-parallel loops (quantization, CPU matmuls). One parallel_for at a time
// per pool; the calling thread takes part, so a pool of n threads starts n-1 workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads <= 0: one per hardware thread
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // Calls fn(ith, nth) once on each of nth = size() threads and returns when all are done. The first exception
    // thrown by any call is rethrown here after the others finish.
    void run(const std::function<void(int ith, int nth)> &fn);

    // fn(begin, end) over [0, n) in contiguous pieces of at least `grain` items, spread over the threads.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)> &fn);

private:
    void worker(int ith);

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    const std::function<void(int, int)> *job_ = nullptr;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

// Threads the machine offers (at least 1).
int hardware_threads();
// Cores, not their hardware threads: distinct (package, core) pairs among the online CPUs in
// /sys/devices/system/cpu (hardware_threads() where that cannot be read). Two threads spinning on one core's
// siblings share its execution units, so a pool of busy-waiting workers sizes itself by this.
int physical_cores();

}  // namespace strata
