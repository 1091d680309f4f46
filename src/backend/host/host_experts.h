// Experts computed on the host with the GPU's decode arithmetic (mmvq_host.h), spread over a pool of threads: the
// CPU half of decoding's hybrid misses (strata/decode_hybrid.h).
//
// Protocol of run() (or start() then finish()): one call of a spinning pool (core/spin_pool.h: its workers are still
// awake when decoding calls again a layer later) on one thread per k_pieces_per_thread pieces of the work, at most the
// pool (threads_for); the others are not woken, and a woken one that starts only after the caller has found every
// list taken is let off. The caller lays the call out (rows, pieces, each row's stage 0 and countdown), which the
// pool's start publishes (the caller's own part comes in finish());
// then each thread takes pieces of three lists in turn, each list by an atomic counter. No barrier: a piece waits
// only for its own row's stage, set (release) by the thread that ends the stage before and read (acquire) by the
// pieces that need it:
//   1. a row: its input quantized for the gate and the up matrix (once where both take the same layout); stage 1;
//   2. 64 output rows of a row's gate or up, after its stage 1; the thread whose piece ends the row's countdown of
//      gate and up pieces (acq_rel: it sees the others' outputs) quantizes silu(gate) * up for the down matrix;
//      stage 2;
//   3. 64 output rows of a row's down, after its stage 2.
// A thread reaches a list only when the one before is all taken, so a stage it waits for is in the hands of a
// thread already working on it: nothing waits in a cycle. Each output value is written by one piece only, with the
// same code whatever the threads, so the results depend neither on their number nor on their order.
// The thread whose down piece ends the call's countdown of down pieces (acq_rel: it sees every other output) notes
// the time (done_at) and stores the call's signal word, where start() was given one (release), so that a reader of
// the word sees every output without a join: decoding's handoff to the device (Backend::rows_handoff). Where the
// call wakes a worker (runs_alone), the workers end it without the caller, who may then join at any later point.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/host/mmvq_host.h"
#include "core/spin_pool.h"

namespace strata {

// A word the call stores `value` into once every output is written (std::atomic_ref, release); word null: none.
struct HostSignal {
    uint32_t *word = nullptr;
    uint32_t value = 0;
};

// One expert's rows: n_rows inputs of gate.k floats (packed) to n_rows outputs of down.n floats (packed).
struct HostExpertJob {
    HostMatrix gate, up, down;
    const float *x = nullptr;
    float *y = nullptr;
    int64_t n_rows = 0;
};

class HostExperts {
  public:
    // pin: the pool's workers pinned one a physical core (core/spin_pool.h).
    explicit HostExperts(int n_threads, bool pin = false);
    int threads() const { return pool_.size(); }
    bool pinned() const { return !pool_.pinned_cpus().empty(); }
    // The threads run() takes for these jobs: one per four pieces of its longest list, at most threads().
    int threads_for(const std::vector<HostExpertJob> &jobs) const;
    // Every job's outputs, as expert_ffn_host computes them row by row.
    void run(const std::vector<HostExpertJob> &jobs);
    // run() in two halves: start() lays the call out and wakes the threads, which begin at once; finish() takes
    // part and returns when every output is written. Between them the caller may do other work but must leave the
    // jobs, their inputs and outputs alone; each start() is finished before the next.
    void start(const std::vector<HostExpertJob> &jobs, HostSignal done = {});
    void finish();
    // Whether start() on these jobs wakes a worker, who ends the call without the caller's finish().
    bool runs_alone(const std::vector<HostExpertJob> &jobs) const { return threads_for(jobs) >= 2; }
    // After finish(): when the call's last output was written (its start where it had no rows).
    std::chrono::steady_clock::time_point done_at() const { return done_at_; }

  private:
    struct Row {  // one input row of one job, with its buffers
        const HostExpertJob *job;
        const float *x;
        float *y;
        bool same_act;  // gate and up take the same activation layout: qu, du unused, qg and dg serve both
        std::vector<int8_t> qg, qu, qd;
        std::vector<ActScale> dg, du, dd;
        std::vector<float> g, u;
    };
    struct alignas(64) RowSync {          // a row's progress in a call, a cache line of its own
        std::atomic<int32_t> stage{0};    // 0, then 1 (input quantized), then 2 (down's input quantized)
        std::atomic<int32_t> gu_left{0};  // gate and up pieces not done yet
    };
    struct Piece {  // of lists 2 and 3: a row, a matrix (0 gate, 1 up, 2 down), the first output row
        int32_t row;
        int8_t m;
        int64_t r0;
    };
    void work(int64_t n_rows);  // one thread's part of a call
    void signal_done();         // the call's outputs are all written
    struct Work {
        HostExperts *self;
        void operator()(int, int) const { self->work(self->work_rows_); }
    };
    Work work_fn_{this};
    int64_t work_rows_ = 0;
    bool started_ = false;

    SpinPool pool_;
    std::vector<Row> rows_;  // kept from call to call with their buffers: no allocation once they are big enough
    std::unique_ptr<RowSync[]> sync_;  // [n_sync_], reset by each call
    int64_t n_sync_ = 0;
    std::vector<Piece> gu_, dn_;
    struct alignas(64) Counter {  // the next piece of a list, a cache line of its own (away from gu_ and dn_)
        std::atomic<int64_t> n{0};
    };
    Counter next_[3];
    alignas(64) std::atomic<int64_t> dn_left_{0};  // down pieces not done yet
    HostSignal done_;
    std::chrono::steady_clock::time_point done_at_{};
};

}  // namespace strata
