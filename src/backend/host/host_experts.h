// Experts computed on the host with the GPU's decode arithmetic (mmvq_host.h), spread over a pool of threads: the
// CPU half of decoding's hybrid misses (strata/decode_hybrid.h).
//
// Protocol of run(): one job of the pool per call, every thread taking part; four phases, each a shared list of
// pieces taken by an atomic counter, with a spinning barrier between them (a condition variable's wake-up is tens
// of microseconds, a whole phase can be less):
//   1. each row's input quantized for the gate and the up matrix;
//   2. gate and up, 64 output rows a piece;
//   3. each row's silu(gate) * up quantized for the down matrix;
//   4. down, 64 output rows a piece.
// Each output value is written by one piece only, so the results do not depend on the threads or the order.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backend/host/mmvq_host.h"
#include "core/threads.h"

namespace strata {

// One expert's rows: n_rows inputs of gate.k floats (packed) to n_rows outputs of down.n floats (packed).
struct HostExpertJob {
    HostMatrix gate, up, down;
    const float *x = nullptr;
    float *y = nullptr;
    int64_t n_rows = 0;
};

class HostExperts {
  public:
    explicit HostExperts(int n_threads);
    int threads() const { return pool_.size(); }
    // Every job's outputs, as expert_ffn_host computes them row by row.
    void run(const std::vector<HostExpertJob> &jobs);

  private:
    struct Row {  // one input row of one job, with its buffers
        const HostExpertJob *job;
        const float *x;
        float *y;
        std::vector<int8_t> qg, qu, qd;
        std::vector<ActScale> dg, du, dd;
        std::vector<float> g, u;
    };
    struct Piece {  // of phases 2 and 4: a row, a matrix (0 gate, 1 up, 2 down), the first output row
        int32_t row;
        int8_t m;
        int64_t r0;
    };
    ThreadPool pool_;
    std::vector<Row> rows_;  // kept from call to call with their buffers: no allocation once they are big enough
    std::vector<Piece> gu_, dn_;
};

}  // namespace strata
