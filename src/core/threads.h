// A fixed pool of worker threads for data-parallel loops (quantization, CPU matmuls). One parallel_for at a time
// per pool; the calling thread takes part, so a pool of n threads starts n-1 workers.
//
// Protocol (one job at a time; `generation_`, `pending_`, `sleepers_` and `waiting_` are atomics, seq_cst where two
// threads each write one and read the other):
//   1. run(): the caller writes job_, sets pending_ to the workers' count, bumps generation_; if any worker counts
//      itself in sleepers_, it notifies cv_start_ under mu_. Then it runs its own share, fn(0, n).
//   2. A worker waits for generation_ to move: for spin_us after its last job it polls (pause, then yield: SpinWait),
//      then it takes mu_, counts itself in sleepers_ and sleeps on cv_start_ until generation_ moves (it reads
//      generation_ after counting itself, the caller sleepers_ after bumping it: one sees the other).
//   3. The worker runs fn(ith, n), keeps the first exception under mu_, and takes one off pending_; the one that
//      takes it to zero notifies cv_done_ under mu_ where the caller says it is waiting.
//   4. The caller, its share done, polls pending_ for spin_us, then sets waiting_ and sleeps on cv_done_ until
//      pending_ is zero (the same pairing as 2, with waiting_ and pending_).
// With spin_us 0 both sides sleep at once. A pool serving many short calls in a row (the CPU backend's ops while
// decoding: hundreds a token, tens of microseconds each) spins, since waking a sleeping thread costs more than the
// work on some machines (tens of microseconds to milliseconds on a virtual machine's idle cores).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
public:
    // n_threads <= 0: one per hardware thread; spin_us: how long the threads poll for the next job or the job's end
    // before they sleep.
    explicit ThreadPool(int n_threads, int spin_us = 0);
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
    const int spin_us_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    const std::function<void(int, int)> *job_ = nullptr;  // written before generation_ moves, read after
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0}, sleepers_{0};
    std::atomic<bool> waiting_{false}, stop_{false};
    std::exception_ptr error_;  // under mu_
};

// Threads the machine offers (at least 1).
int hardware_threads();
// Cores, not their hardware threads: distinct (package, core) pairs among the online CPUs in
// /sys/devices/system/cpu (hardware_threads() where that cannot be read). Two threads spinning on one core's
// siblings share its execution units, so a pool of busy-waiting workers sizes itself by this.
int physical_cores();
// The logical CPUs this process may run on (sched_getaffinity), grouped by physical core: each core's CPUs ascending,
// cores in the order of their first CPU. Empty where the affinity or the topology cannot be read.
std::vector<std::vector<int>> allowed_cores();
// Pins a thread to one logical CPU; false where the system refuses.
bool pin_thread(std::thread &t, int cpu);
// Lets a thread run on any of `cpus` again.
void unpin_thread(std::thread &t, const std::vector<int> &cpus);

}  // namespace strata
