// Experts on a host pool (host_experts.h; the protocol is there).
#include "backend/host/host_experts.h"

#include <algorithm>

#include "core/error.h"
#include "core/threads.h"
#include "format/quant.h"

namespace strata {

namespace {

constexpr int64_t k_piece_rows = 64;
// One thread per four pieces at most: with fewer, its start (about a microsecond awake, tens asleep) and its share
// of the memory bus weigh against its share of the work. Measured on the H200 machine's 16-core host
// (bench_host_experts, one row of a 30B Q4_K expert, 32 pieces of down): 131 us a call on 8 threads, 271 on 12,
// 367 on 16 (bench/RESULTS.md).
constexpr int64_t k_pieces_per_thread = 4;

int64_t pieces(int64_t n) {
    return (n + k_piece_rows - 1) / k_piece_rows;
}

void wait_stage(const std::atomic<int32_t> &stage, int32_t at_least) {
    for (SpinWait w; stage.load(std::memory_order_acquire) < at_least;) w.once();
}

}  // namespace

HostExperts::HostExperts(int n_threads, bool pin)
    : pool_(std::max(1, std::min(n_threads, hardware_threads())), 2000, pin) {
    (void)mmvq_host_form();  // its one-time timing here, at start, rather than inside the first call
}

int HostExperts::threads_for(const std::vector<HostExpertJob> &jobs) const {
    int64_t n_gu = 0, n_dn = 0;
    for (const HostExpertJob &j : jobs) n_gu += j.n_rows * 2 * pieces(j.gate.n), n_dn += j.n_rows * pieces(j.down.n);
    const int64_t n = std::max(n_gu, n_dn);
    return int(std::clamp<int64_t>((n + k_pieces_per_thread - 1) / k_pieces_per_thread, 1, pool_.size()));
}

void HostExperts::run(const std::vector<HostExpertJob> &jobs) {
    start(jobs);
    finish();
}

void HostExperts::finish() {
    if (!started_) return;
    started_ = false;
    pool_.join();
}

void HostExperts::start(const std::vector<HostExpertJob> &jobs, HostSignal done) {
    STRATA_ASSERT(!started_);
    done_ = done;
    int64_t n_rows = 0;
    for (const HostExpertJob &j : jobs) {
        STRATA_ASSERT(j.gate.k == j.up.k && j.gate.n == j.up.n && j.down.k == j.gate.n && j.n_rows >= 0);
        for (const HostMatrix *m : {&j.gate, &j.up, &j.down})
            if (!mmvq_host_supported(m->type) || m->k % dtype_info(dot_act_type(m->type)).block_size != 0)
                fail("internal: no host mat-vec in the GPU's order for %s rows of %lld", dtype_name(m->type),
                     (long long)m->k);
        n_rows += j.n_rows;
    }
    if (n_rows == 0) {
        signal_done();
        return;
    }
    if (int64_t(rows_.size()) < n_rows) rows_.resize(size_t(n_rows));
    if (n_sync_ < n_rows) sync_.reset(new RowSync[size_t(n_rows)]), n_sync_ = n_rows;
    gu_.clear();
    dn_.clear();
    int32_t at = 0;
    for (const HostExpertJob &j : jobs)
        for (int64_t r = 0; r < j.n_rows; r++, at++) {
            Row &row = rows_[size_t(at)];
            row.job = &j;
            row.x = j.x + r * j.gate.k;
            row.y = j.y + r * j.down.n;
            row.same_act = dot_act_type(j.gate.type) == dot_act_type(j.up.type);
            row.qg.resize(size_t(j.gate.k)), row.dg.resize(size_t(j.gate.k / 32));
            if (!row.same_act) row.qu.resize(size_t(j.gate.k)), row.du.resize(size_t(j.gate.k / 32));
            row.qd.resize(size_t(j.down.k)), row.dd.resize(size_t(j.down.k / 32));
            row.g.resize(size_t(j.gate.n)), row.u.resize(size_t(j.gate.n));
            sync_[size_t(at)].stage.store(0, std::memory_order_relaxed);
            sync_[size_t(at)].gu_left.store(int32_t(2 * pieces(j.gate.n)), std::memory_order_relaxed);
            for (int64_t p = 0; p < pieces(j.gate.n); p++)
                gu_.push_back({at, 0, p * k_piece_rows}), gu_.push_back({at, 1, p * k_piece_rows});
            for (int64_t p = 0; p < pieces(j.down.n); p++) dn_.push_back({at, 2, p * k_piece_rows});
        }
    for (Counter &c : next_) c.n.store(0, std::memory_order_relaxed);
    dn_left_.store(int64_t(dn_.size()), std::memory_order_relaxed);
    // The pool's start publishes all of the above to the threads it wakes.
    work_rows_ = n_rows;
    started_ = true;
    pool_.start(threads_for(jobs), work_fn_);
}

void HostExperts::work(int64_t n_rows) {
    auto rows = [&](const Piece &p) {
        Row &row = rows_[size_t(p.row)];
        const HostExpertJob &j = *row.job;
        const HostMatrix &m = p.m == 0 ? j.gate : p.m == 1 ? j.up : j.down;
        const int64_t r1 = std::min(m.n, p.r0 + k_piece_rows);
        const bool gate_act = p.m == 0 || (p.m == 1 && row.same_act);
        const int8_t *q = gate_act ? row.qg.data() : p.m == 1 ? row.qu.data() : row.qd.data();
        const ActScale *ds = gate_act ? row.dg.data() : p.m == 1 ? row.du.data() : row.dd.data();
        float *out = (p.m == 0 ? row.g.data() : p.m == 1 ? row.u.data() : row.y) + p.r0;
        mmvq_host_rows(m, p.r0, r1, q, ds, out);
    };
    for (int64_t i; (i = next_[0].n++) < n_rows;) {
        Row &row = rows_[size_t(i)];
        const HostExpertJob &j = *row.job;
        quantize_act_gpu(dot_act_type(j.gate.type), row.x, j.gate.k, row.qg.data(), row.dg.data());
        if (!row.same_act) quantize_act_gpu(dot_act_type(j.up.type), row.x, j.up.k, row.qu.data(), row.du.data());
        sync_[size_t(i)].stage.store(1, std::memory_order_release);
    }
    for (int64_t i; (i = next_[1].n++) < int64_t(gu_.size());) {
        const Piece &p = gu_[size_t(i)];
        RowSync &s = sync_[size_t(p.row)];
        wait_stage(s.stage, 1);
        rows(p);
        if (s.gu_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // the row's last: its gate and up are all seen
            Row &row = rows_[size_t(p.row)];
            const HostExpertJob &j = *row.job;
            quantize_act_gpu(dot_act_type(j.down.type), row.g.data(), j.down.k, row.qd.data(), row.dd.data(),
                             row.u.data());
            s.stage.store(2, std::memory_order_release);
        }
    }
    for (int64_t i; (i = next_[2].n++) < int64_t(dn_.size());) {
        const Piece &p = dn_[size_t(i)];
        wait_stage(sync_[size_t(p.row)].stage, 2);
        rows(p);
        if (dn_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) signal_done();  // the call's last output
    }
}

void HostExperts::signal_done() {
    done_at_ = std::chrono::steady_clock::now();
    if (done_.word) std::atomic_ref<uint32_t>(*done_.word).store(done_.value, std::memory_order_release);
}

}  // namespace strata
