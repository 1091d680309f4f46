// A pool of threads for many short calls in a row (decoding's host experts, one call of 10-200 us a layer): between
// calls its workers spin, so that the next call finds them awake, and sleep only after idle_us without one; a call
// wakes only the threads it asks for. Not ThreadPool (threads.h), whose workers sleep at once: one call at a time,
// and fn must not throw (a worker's exception ends the process).
//
// Protocol: each worker owns a slot (a cache line of its own) holding a call number `go` and a `sleeping` flag.
//   1. run(nth, fn): the caller writes the call (fn, nth), zeroes `done_`, then stores (release) a new call number
//      in the slots of workers 1..nth-1 only, and after a seq_cst fence notifies the `go` of each of them whose
//      `sleeping` it reads set; it runs fn(0, nth) itself and spins until `done_` counts nth - 1 (acquire: the
//      workers' writes are seen).
//   2. A worker waits for its `go` to change: pause instructions for k_pause_us, then yields, and after idle_us
//      without a call sets `sleeping`, and after a seq_cst fence reads `go` again and waits on it (a futex). The two
//      fences are ordered one way or the other, so either the caller sees `sleeping` or the worker sees the new
//      call: none is lost.
//   3. The worker runs fn(ith, nth), then adds one to `done_` (release).
// Only the workers a call woke read its fields, and the caller changes them only after all of those counted.
// The destructor wakes every worker to return and joins them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace strata {

// Waiting for something a running thread is about to do: pause instructions first, then yields, so that more
// threads than cores still make progress.
class SpinWait {
  public:
    void once();

  private:
    int spins_ = 0;
};

class SpinPool {
  public:
    // n_threads counts the caller (n_threads - 1 workers, at least none); idle_us: how long a worker spins after a
    // call before it sleeps.
    explicit SpinPool(int n_threads, int idle_us = 2000);
    ~SpinPool();
    SpinPool(const SpinPool &) = delete;
    SpinPool &operator=(const SpinPool &) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // fn(ith, nth) once on each of nth threads (clamped to 1..size(); ith 0 is the caller); returns when all are
    // done. Threads ith >= nth are not woken.
    template <class F>
    void run(int nth, const F &fn) {
        const Call call = [](const void *f, int ith, int n) noexcept { (*static_cast<const F *>(f))(ith, n); };
        post(nth, call, &fn);
    }

  private:
    using Call = void (*)(const void *, int, int) noexcept;
    struct alignas(64) Slot {
        std::atomic<uint32_t> go{0};
        std::atomic<bool> sleeping{false};
    };
    void post(int nth, Call call, const void *ctx);
    void worker(int ith);

    const int idle_us_;
    std::unique_ptr<Slot[]> slots_;  // [size()], slot 0 unused (the caller's)
    std::vector<std::thread> workers_;
    uint32_t calls_ = 0;
    Call call_ = nullptr;
    const void *ctx_ = nullptr;
    int nth_ = 1;
    std::atomic<bool> stop_{false};
    alignas(64) std::atomic<int> done_{0};
};

}  // namespace strata
