// A pool of threads for many short calls in a row (decoding's host experts, one call of 10-200 us a layer): between
// calls its workers spin, so that the next call finds them awake, and sleep only after idle_us without one; a call
// wakes only the threads it asks for, and waits only for those that started before the caller's own part was done.
// Not ThreadPool (threads.h), whose workers sleep at once and each take a fixed share: one call at a time, fn must
// take its work from shared counters, and must not throw (a worker's exception ends the process).
//
// Protocol: each worker owns a slot (a cache line of its own) holding `go`, a call number and its state (posted,
// running, let off), and a `sleeping` flag.
//   1. run(nth, fn), or start(nth, fn): the caller writes the call (fn, nth), zeroes `done_`, stores (release) `go` =
//      (call, posted) in the slots of workers 1..nth-1 only, and after a seq_cst fence notifies the `go` of each of
//      them whose `sleeping` it reads set. Then (at once in run(), in join() after start()) it runs fn(0, nth)
//      itself: when that returns, all the work has been taken.
//   2. A worker waits for its `go` to change: pause instructions for k_pause_us, then yields, and after idle_us
//      without a call sets `sleeping`, and after a seq_cst fence reads `go` again and waits on it (a futex). The two
//      fences are ordered one way or the other, so either the caller sees `sleeping` or the worker sees the call.
//   3. A worker that finds (call, posted) swaps it for (call, running) (acquire: it sees the call's fields), runs
//      fn(ith, nth), and adds one to `done_` (release).
//   4. The caller, its fn done, swaps each posted slot that is still (call, posted) for (call, let off): that worker
//      woke too late (asleep, or not scheduled) and will not touch the call. It spins until `done_` counts the
//      others (acquire: their writes are seen). So a call never waits for a thread to wake, only for pieces that
//      started.
// Only the workers that swapped in `running` read a call's fields, and the caller changes them only after all of
// those counted. The destructor wakes every worker to return and joins them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace strata {

// Waiting for something a running thread is about to do: a few pause instructions, then yields, so that a thread
// waited for on this very core (more threads than cores) gets it at once.
class SpinWait {
  public:
    void once();

  private:
    int spins_ = 0;
};

class SpinPool {
  public:
    // n_threads counts the caller (n_threads - 1 workers, at least none); idle_us: how long a worker spins after a
    // call before it sleeps. pin: each worker pinned to a physical core of its own among those the process may run
    // on, not the core the constructing thread runs on (left to the caller) nor one a pinned worker of another pool
    // holds (a split model has a pool a part), and to its first logical CPU; where there are not that many cores,
    // none is pinned.
    explicit SpinPool(int n_threads, int idle_us = 2000, bool pin = false);
    ~SpinPool();
    SpinPool(const SpinPool &) = delete;
    SpinPool &operator=(const SpinPool &) = delete;

    int size() const { return int(workers_.size()) + 1; }
    // The logical CPU each worker is pinned to (ith 1.. at [ith - 1]); empty where they are not pinned.
    const std::vector<int> &pinned_cpus() const { return pinned_; }

    // fn(ith, nth) on the caller (ith 0) and on those of workers 1..nth-1 (nth clamped to 1..size()) that start
    // before the caller's own fn(0, nth) returns, at most once each; returns when all of those are done. Threads
    // ith >= nth are not woken.
    template <class F>
    void run(int nth, const F &fn) {
        start(nth, fn);
        join();
    }
    // run() in two halves: start() wakes the workers on fn, which must live until join(); the caller may do other
    // work meanwhile (the workers take what they can); join() runs the caller's own fn(0, nth), lets off the
    // workers that have not started and waits for the others, as run() does. Each start() is joined before the
    // next start() or run().
    template <class F>
    void start(int nth, const F &fn) {
        const Call call = [](const void *f, int ith, int n) noexcept { (*static_cast<const F *>(f))(ith, n); };
        publish(nth, call, &fn);
    }
    void join();

  private:
    using Call = void (*)(const void *, int, int) noexcept;
    struct alignas(64) Slot {
        std::atomic<uint32_t> go{0};  // call number << 2 | k_posted, k_running or k_let_off
        std::atomic<bool> sleeping{false};
    };
    void publish(int nth, Call call, const void *ctx);
    void worker(int ith);

    const int idle_us_;
    std::unique_ptr<Slot[]> slots_;  // [size()], slot 0 unused (the caller's)
    std::vector<std::thread> workers_;
    std::vector<int> pinned_;
    uint32_t calls_ = 0;
    uint32_t posted_ = 0;  // the started call's `go` value (nth_ > 1)
    Call call_ = nullptr;
    const void *ctx_ = nullptr;
    int nth_ = 1;
    std::atomic<bool> stop_{false};
    alignas(64) std::atomic<int> done_{0};
};

}  // namespace strata
