// The spinning pool (spin_pool.h; the protocol is there).
#include "core/spin_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/threads.h"

namespace strata {

namespace {

// The CPUs pinned pools' workers hold, process-wide.
std::mutex &pinned_mu() {
    static std::mutex m;
    return m;
}
std::set<int> &pinned_cpus_taken() {
    static std::set<int> s;
    return s;
}

// A SpinWait's pauses before it yields (about 10 ns each on older cores, 40 on Skylake and later), and how long an
// idle worker pauses before it yields.
constexpr int k_pause_spins = 64;
constexpr int64_t k_pause_us = 50;

// The state in a slot's `go`, under the call number.
constexpr uint32_t k_posted = 1, k_running = 2, k_let_off = 3;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

void SpinWait::once() {
    if (spins_ < k_pause_spins) {
        spins_++;
        cpu_relax();
    } else {
        std::this_thread::yield();
    }
}

SpinPool::SpinPool(int n_threads, int idle_us, bool pin)
    : idle_us_(std::max(0, idle_us)), slots_(new Slot[size_t(std::max(1, n_threads))]) {
    for (int i = 1; i < n_threads; i++) workers_.emplace_back([this, i] { worker(i); });
    if (!pin || workers_.empty()) return;
    // One core a worker: not the constructing thread's, nor one another pool's pinned worker holds.
    std::lock_guard<std::mutex> lock(pinned_mu());
    const int here = sched_getcpu();
    std::vector<int> cpus;
    for (const std::vector<int> &core : allowed_cores())
        if (std::find(core.begin(), core.end(), here) == core.end() && !pinned_cpus_taken().count(core[0]))
            cpus.push_back(core[0]);
    if (cpus.size() < workers_.size()) return;
    for (size_t w = 0; w < workers_.size(); w++)
        if (!pin_thread(workers_[w], cpus[w])) {
            std::vector<int> all;  // undone: the ones pinned so far may run anywhere again
            for (const std::vector<int> &core : allowed_cores()) all.insert(all.end(), core.begin(), core.end());
            for (size_t u = 0; u < w; u++) unpin_thread(workers_[u], all);
            return;
        }
    pinned_.assign(cpus.begin(), cpus.begin() + int64_t(workers_.size()));
    pinned_cpus_taken().insert(pinned_.begin(), pinned_.end());
}

SpinPool::~SpinPool() {
    if (!pinned_.empty()) {
        std::lock_guard<std::mutex> lock(pinned_mu());
        for (int c : pinned_) pinned_cpus_taken().erase(c);
    }
    stop_.store(true, std::memory_order_seq_cst);
    calls_++;
    for (int i = 1; i < size(); i++) {
        slots_[size_t(i)].go.store(calls_ << 2, std::memory_order_seq_cst);
        slots_[size_t(i)].go.notify_one();
    }
    for (std::thread &t : workers_) t.join();
}

void SpinPool::worker(int ith) {
    Slot &slot = slots_[size_t(ith)];
    uint32_t seen = 0;
    for (;;) {
        const int64_t t0 = now_us();
        int64_t idle = 0;  // microseconds without a call, read every 64 pauses and at every yield
        uint32_t go;
        for (int spins = 0; (go = slot.go.load(std::memory_order_acquire)) == seen; spins++) {
            if (idle >= k_pause_us || (spins & 63) == 63) idle = now_us() - t0;
            if (idle >= idle_us_) {
                slot.sleeping.store(true, std::memory_order_relaxed);
                std::atomic_thread_fence(std::memory_order_seq_cst);
                if (slot.go.load(std::memory_order_relaxed) == seen) slot.go.wait(seen, std::memory_order_relaxed);
                slot.sleeping.store(false, std::memory_order_relaxed);
            } else if (idle < k_pause_us) {
                cpu_relax();
            } else {
                std::this_thread::yield();
            }
        }
        if (stop_.load(std::memory_order_acquire)) return;
        if ((go & 3) != k_posted) {  // let off: the call went on without this thread
            seen = go;
            continue;
        }
        const uint32_t running = (go & ~3u) | k_running;
        // Failing: let off meanwhile, or already the next call (let off from this one); seen stays, so look again.
        if (!slot.go.compare_exchange_strong(go, running, std::memory_order_acquire)) continue;
        seen = running;
        call_(ctx_, ith, nth_);
        done_.fetch_add(1, std::memory_order_release);
    }
}

void SpinPool::publish(int nth, Call call, const void *ctx) {
    call_ = call, ctx_ = ctx, nth_ = std::clamp(nth, 1, size());
    if (nth_ == 1) return;
    done_.store(0, std::memory_order_relaxed);
    calls_++;
    posted_ = (calls_ << 2) | k_posted;
    // Release stores, then one fence before reading the flags (the worker fences between its two steps): the stores'
    // cache-line transfers overlap instead of each waiting for the one before.
    for (int i = 1; i < nth_; i++) slots_[size_t(i)].go.store(posted_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (int i = 1; i < nth_; i++)
        if (slots_[size_t(i)].sleeping.load(std::memory_order_relaxed)) slots_[size_t(i)].go.notify_one();
}

void SpinPool::join() {
    call_(ctx_, 0, nth_);
    if (nth_ == 1) return;
    int running = 0;  // workers that started: to wait for; the others are let off
    for (int i = 1; i < nth_; i++) {
        std::atomic<uint32_t> &go = slots_[size_t(i)].go;
        uint32_t expect = posted_;
        if (go.load(std::memory_order_relaxed) != posted_ ||
            !go.compare_exchange_strong(expect, (posted_ & ~3u) | k_let_off, std::memory_order_relaxed))
            running++;
    }
    for (SpinWait w; done_.load(std::memory_order_acquire) < running;) w.once();
}

}  // namespace strata
