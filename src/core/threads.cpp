// The worker pool: workers sleep on a condition variable between jobs; a job is a generation number bump.
#include "core/threads.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace strata {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

int physical_cores() {
    static const int n = [] {
        std::set<std::pair<int, int>> cores;
        const int n_cpu = hardware_threads();
        for (int c = 0, seen = 0; seen < n_cpu && c < 4096; c++) {
            const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
            std::ifstream core(dir + "core_id"), pkg(dir + "physical_package_id");
            int core_id = -1, pkg_id = -1;
            if (!(core >> core_id)) continue;  // offline, or not there
            if (!(pkg >> pkg_id)) pkg_id = 0;
            cores.insert({pkg_id, core_id});
            seen++;
        }
        return cores.empty() ? n_cpu : std::min(int(cores.size()), n_cpu);
    }();
    return n;
}

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = hardware_threads();
    for (int i = 1; i < n_threads; i++) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_start_.notify_all();
    for (std::thread &t : workers_) t.join();
}

void ThreadPool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int, int)> *job;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
        }
        std::exception_ptr err;
        try {
            (*job)(ith, size());
        } catch (...) {
            err = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (err && !error_) error_ = err;
        if (--pending_ == 0) cv_done_.notify_one();
    }
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
    if (workers_.empty()) {
        fn(0, 1);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &fn;
        pending_ = int(workers_.size());
        error_ = nullptr;
        generation_++;
    }
    cv_start_.notify_all();
    std::exception_ptr err;
    try {
        fn(0, size());
    } catch (...) {
        err = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending_ == 0; });
    if (!err) err = error_;
    job_ = nullptr;
    if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    int64_t max_pieces = (n + grain - 1) / grain;
    int nth = int(std::min<int64_t>(size(), max_pieces));
    if (nth <= 1) {
        fn(0, n);
        return;
    }
    run([&](int ith, int) {
        if (ith >= nth) return;
        int64_t begin = n * ith / nth, end = n * (ith + 1) / nth;
        if (begin < end) fn(begin, end);
    });
}

}  // namespace strata
