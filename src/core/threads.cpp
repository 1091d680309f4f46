// The worker pool (threads.h; its protocol at the top): a job is a generation number bump.
#include "core/threads.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "core/spin_pool.h"

namespace strata {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

namespace {

// Logical CPU c's (package, core) from sysfs; false where its topology is not there (offline, or no sysfs).
bool core_of(int c, std::pair<int, int> &key) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::ifstream core(dir + "core_id"), pkg(dir + "physical_package_id");
    int core_id = -1, pkg_id = -1;
    if (!(core >> core_id)) return false;
    if (!(pkg >> pkg_id)) pkg_id = 0;
    key = {pkg_id, core_id};
    return true;
}

}  // namespace

int physical_cores() {
    static const int n = [] {
        std::set<std::pair<int, int>> cores;
        const int n_cpu = hardware_threads();
        for (int c = 0, seen = 0; seen < n_cpu && c < 4096; c++) {
            std::pair<int, int> key;
            if (!core_of(c, key)) continue;  // offline, or not there
            cores.insert(key);
            seen++;
        }
        return cores.empty() ? n_cpu : std::min(int(cores.size()), n_cpu);
    }();
    return n;
}

std::vector<std::vector<int>> allowed_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
    std::map<std::pair<int, int>, std::vector<int>> by_core;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        std::pair<int, int> key;
        if (!core_of(c, key)) return {};
        by_core[key].push_back(c);
    }
    std::vector<std::vector<int>> out;
    for (auto &kv : by_core) out.push_back(std::move(kv.second));
    std::sort(out.begin(), out.end(), [](const auto &a, const auto &b) { return a[0] < b[0]; });
    return out;
}

bool pin_thread(std::thread &t, int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(t.native_handle(), sizeof(set), &set) == 0;
}

void unpin_thread(std::thread &t, const std::vector<int> &cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus)
        if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
    pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
}

ThreadPool::ThreadPool(int n_threads, int spin_us) : spin_us_(std::max(0, spin_us)) {
    if (n_threads <= 0) n_threads = hardware_threads();
    for (int i = 1; i < n_threads; i++) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    {
        std::lock_guard<std::mutex> lock(mu_);
        cv_start_.notify_all();
    }
    for (std::thread &t : workers_) t.join();
}

namespace {

// Polls done() for spin_us (pause, then yield); false where it still does not hold.
template <class F>
bool spin_until(int spin_us, const F &done) {
    if (spin_us <= 0) return done();
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
    SpinWait w;
    for (int i = 0;; i++) {
        if (done()) return true;
        if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return false;
        w.once();
    }
}

}  // namespace

void ThreadPool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        auto moved = [&] { return stop_.load() || generation_.load() != seen; };
        if (!spin_until(spin_us_, moved)) {
            std::unique_lock<std::mutex> lock(mu_);
            sleepers_.fetch_add(1);
            cv_start_.wait(lock, moved);
            sleepers_.fetch_sub(1);
        }
        if (stop_.load()) return;
        seen = generation_.load();
        const std::function<void(int, int)> *job = job_;
        std::exception_ptr err;
        try {
            (*job)(ith, size());
        } catch (...) {
            err = std::current_exception();
        }
        if (err) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = err;
        }
        if (pending_.fetch_sub(1) == 1 && waiting_.load()) {
            std::lock_guard<std::mutex> lock(mu_);
            cv_done_.notify_one();
        }
    }
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
    if (workers_.empty()) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    error_ = nullptr;  // no worker touches it between jobs
    pending_.store(int(workers_.size()));
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        cv_start_.notify_all();
    }
    std::exception_ptr err;
    try {
        fn(0, size());
    } catch (...) {
        err = std::current_exception();
    }
    auto done = [&] { return pending_.load() == 0; };
    if (!spin_until(spin_us_, done)) {
        std::unique_lock<std::mutex> lock(mu_);
        waiting_.store(true);
        cv_done_.wait(lock, done);
        waiting_.store(false);
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!err) err = error_;
    }
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
