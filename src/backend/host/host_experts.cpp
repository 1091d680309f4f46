// Experts on a host pool (host_experts.h; the protocol is there).
#include "backend/host/host_experts.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "format/quant.h"

namespace strata {

namespace {

constexpr int64_t k_piece_rows = 64;

// Threads meeting between phases: the last to arrive lets the others go on. Spins, yielding, so that more threads
// than cores still make progress.
class SpinBarrier {
  public:
    explicit SpinBarrier(int n) : n_(n) {}
    void wait() {
        const int gen = gen_.load(std::memory_order_acquire);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
            arrived_.store(0, std::memory_order_relaxed);
            gen_.store(gen + 1, std::memory_order_release);
            return;
        }
        while (gen_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
    }

  private:
    const int n_;
    std::atomic<int> arrived_{0}, gen_{0};
};

int64_t pieces(int64_t n) {
    return (n + k_piece_rows - 1) / k_piece_rows;
}

}  // namespace

HostExperts::HostExperts(int n_threads) : pool_(std::max(1, std::min(n_threads, hardware_threads()))) {}

void HostExperts::run(const std::vector<HostExpertJob> &jobs) {
    int64_t n_rows = 0;
    for (const HostExpertJob &j : jobs) {
        STRATA_ASSERT(j.gate.k == j.up.k && j.gate.n == j.up.n && j.down.k == j.gate.n && j.n_rows >= 0);
        for (const HostMatrix *m : {&j.gate, &j.up, &j.down})
            if (!mmvq_host_supported(m->type) || m->k % dtype_info(dot_act_type(m->type)).block_size != 0)
                fail("internal: no host mat-vec in the GPU's order for %s rows of %lld", dtype_name(m->type),
                     (long long)m->k);
        n_rows += j.n_rows;
    }
    if (n_rows == 0) return;
    if (int64_t(rows_.size()) < n_rows) rows_.resize(size_t(n_rows));
    gu_.clear();
    dn_.clear();
    int32_t at = 0;
    for (const HostExpertJob &j : jobs)
        for (int64_t r = 0; r < j.n_rows; r++, at++) {
            Row &row = rows_[size_t(at)];
            row.job = &j;
            row.x = j.x + r * j.gate.k;
            row.y = j.y + r * j.down.n;
            row.qg.resize(size_t(j.gate.k)), row.qu.resize(size_t(j.gate.k)), row.qd.resize(size_t(j.down.k));
            row.dg.resize(size_t(j.gate.k / 32)), row.du.resize(size_t(j.gate.k / 32));
            row.dd.resize(size_t(j.down.k / 32));
            row.g.resize(size_t(j.gate.n)), row.u.resize(size_t(j.gate.n));
            for (int64_t p = 0; p < pieces(j.gate.n); p++)
                gu_.push_back({at, 0, p * k_piece_rows}), gu_.push_back({at, 1, p * k_piece_rows});
            for (int64_t p = 0; p < pieces(j.down.n); p++) dn_.push_back({at, 2, p * k_piece_rows});
        }
    std::atomic<int64_t> next[4] = {{0}, {0}, {0}, {0}};
    SpinBarrier barrier(pool_.size());
    auto rows = [&](const Piece &p) {
        Row &row = rows_[size_t(p.row)];
        const HostExpertJob &j = *row.job;
        const HostMatrix &m = p.m == 0 ? j.gate : p.m == 1 ? j.up : j.down;
        const int64_t r1 = std::min(m.n, p.r0 + k_piece_rows);
        const int8_t *q = p.m == 0 ? row.qg.data() : p.m == 1 ? row.qu.data() : row.qd.data();
        const ActScale *ds = p.m == 0 ? row.dg.data() : p.m == 1 ? row.du.data() : row.dd.data();
        float *out = (p.m == 0 ? row.g.data() : p.m == 1 ? row.u.data() : row.y) + p.r0;
        mmvq_host_rows(m, p.r0, r1, q, ds, out);
    };
    pool_.run([&](int, int) {
        for (int64_t i; (i = next[0]++) < n_rows;) {
            Row &row = rows_[size_t(i)];
            const HostExpertJob &j = *row.job;
            quantize_act_gpu(dot_act_type(j.gate.type), row.x, j.gate.k, row.qg.data(), row.dg.data());
            quantize_act_gpu(dot_act_type(j.up.type), row.x, j.up.k, row.qu.data(), row.du.data());
        }
        barrier.wait();
        for (int64_t i; (i = next[1]++) < int64_t(gu_.size());) rows(gu_[size_t(i)]);
        barrier.wait();
        for (int64_t i; (i = next[2]++) < n_rows;) {
            Row &row = rows_[size_t(i)];
            const HostExpertJob &j = *row.job;
            quantize_act_gpu(dot_act_type(j.down.type), row.g.data(), j.down.k, row.qd.data(), row.dd.data(),
                             row.u.data());
        }
        barrier.wait();
        for (int64_t i; (i = next[3]++) < int64_t(dn_.size());) rows(dn_[size_t(i)]);
    });
}

}  // namespace strata
