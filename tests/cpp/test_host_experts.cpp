// Experts on the host pool (backend/host/host_experts.h): every job's outputs are expert_ffn_host's, bit for bit,
// whatever the number of threads, jobs and rows.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backend/host/host_experts.h"
#include "backend/host/stream_copy.h"
#include "format/quant.h"

using namespace strata;

namespace {

struct Expert {
    std::vector<uint8_t> bytes[3];
    HostMatrix m[3];
};

Expert make_expert(DType g, DType u, DType dn, int64_t E, int64_t F, uint32_t seed) {
    Expert x;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    const DType types[3] = {g, u, dn};
    const int64_t ks[3] = {E, E, F}, ns[3] = {F, F, E};
    for (int i = 0; i < 3; i++) {
        const size_t rb = row_bytes(types[i], ks[i]);
        x.bytes[i].resize(rb * size_t(ns[i]));
        std::vector<float> f(static_cast<size_t>(ks[i]));
        for (int64_t r = 0; r < ns[i]; r++) {
            for (float &v : f) v = nd(rng);
            quantize_row(types[i], f.data(), x.bytes[i].data() + size_t(r) * rb, ks[i]);
        }
        x.m[i] = {types[i], x.bytes[i].data(), rb, ks[i], ns[i]};
    }
    return x;
}

Expert make_expert(DType gu, DType dn, int64_t E, int64_t F, uint32_t seed) {
    return make_expert(gu, gu, dn, E, F, seed);
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    std::vector<float> v(n);
    for (float &f : v) f = nd(rng);
    return v;
}

// expert_ffn_host's outputs for n_rows rows of x.
std::vector<float> reference(const Expert &e, const std::vector<float> &x, int64_t n_rows) {
    const int64_t E = e.m[0].k;
    std::vector<float> y(size_t(n_rows * E));
    for (int64_t r = 0; r < n_rows; r++) expert_ffn_host(e.m[0], e.m[1], e.m[2], x.data() + r * E, y.data() + r * E);
    return y;
}

}  // namespace

TEST(HostExperts, AreTheOneExpertFormBitForBit) {
    const int64_t E = 768, F = 512;  // rows of 256-element blocks (K types), several 64-row pieces each
    std::vector<Expert> ex;
    ex.push_back(make_expert(DType::Q4_K, DType::Q6_K, E, F, 1));
    ex.push_back(make_expert(DType::Q8_0, DType::Q8_0, E, F, 2));
    ex.push_back(make_expert(DType::IQ4_XS, DType::Q5_K, E, F, 3));
    const int64_t rows[3] = {1, 3, 2};
    std::mt19937 rng(9);
    std::normal_distribution<float> nd;
    std::vector<std::vector<float>> xs(3), want(3);
    for (int e = 0; e < 3; e++) {
        xs[size_t(e)].resize(size_t(rows[e] * E));
        for (float &v : xs[size_t(e)]) v = nd(rng);
        want[size_t(e)].resize(size_t(rows[e] * E));
        for (int64_t r = 0; r < rows[e]; r++)
            expert_ffn_host(ex[size_t(e)].m[0], ex[size_t(e)].m[1], ex[size_t(e)].m[2], xs[size_t(e)].data() + r * E,
                            want[size_t(e)].data() + r * E);
    }
    for (int threads : {1, 2, 5}) {
        HostExperts pool(threads);
        for (int rep = 0; rep < 2; rep++) {  // the pool and its buffers used again
            std::vector<std::vector<float>> got(3);
            std::vector<HostExpertJob> jobs;
            for (int e = 0; e < 3; e++) {
                got[size_t(e)].assign(size_t(rows[e] * E), -1.0f);
                jobs.push_back({ex[size_t(e)].m[0], ex[size_t(e)].m[1], ex[size_t(e)].m[2], xs[size_t(e)].data(),
                                got[size_t(e)].data(), rows[e]});
            }
            pool.run(jobs);
            for (int e = 0; e < 3; e++)
                EXPECT_EQ(std::memcmp(got[size_t(e)].data(), want[size_t(e)].data(), got[size_t(e)].size() * 4), 0)
                    << "threads " << threads << " expert " << e;
        }
    }
    HostExperts pool(2);
    pool.run({});  // nothing to do
}

// A call takes threads by its pieces (two each): a small one leaves the pool's other workers out, a big one takes
// them all, and either way the bits are expert_ffn_host's; small and big calls alternate on one pool, the gate and
// the up matrix with different activation layouts in one of them. (The pool has at most the machine's threads.)
TEST(HostExperts, TakeThreadsByTheWorkSameBits) {
    HostExperts pool(4);
    const Expert small = make_expert(DType::Q8_0, DType::Q8_0, 64, 64, 4);  // one piece each of gate, up, down
    const Expert big = make_expert(DType::Q8_0, DType::Q4_K, DType::Q6_K, 256, 512, 5);  // 8 + 8 pieces, then 4
    const std::vector<float> xs = gaussian(64, 6), xb = gaussian(2 * 256, 7);
    const std::vector<float> want_s = reference(small, xs, 1), want_b = reference(big, xb, 2);
    const std::vector<HostExpertJob> probe_s = {{small.m[0], small.m[1], small.m[2], xs.data(), nullptr, 1}};
    const std::vector<HostExpertJob> probe_b = {{big.m[0], big.m[1], big.m[2], xb.data(), nullptr, 2}};
    EXPECT_EQ(pool.threads_for(probe_s), 1);
    EXPECT_EQ(pool.threads_for(probe_b), pool.threads());
    for (int rep = 0; rep < 20; rep++) {
        std::vector<float> ys(want_s.size(), -1.0f), yb(want_b.size(), -1.0f);
        pool.run({{small.m[0], small.m[1], small.m[2], xs.data(), ys.data(), 1}});
        EXPECT_EQ(std::memcmp(ys.data(), want_s.data(), ys.size() * 4), 0) << "small, rep " << rep;
        pool.run({{big.m[0], big.m[1], big.m[2], xb.data(), yb.data(), 2}});
        EXPECT_EQ(std::memcmp(yb.data(), want_b.data(), yb.size() * 4), 0) << "big, rep " << rep;
    }
}

// A call given a signal word (decoding's handoff to the device): where it wakes a worker (runs_alone) the workers
// end it without the caller, the word holding the call's value once every output is written (read here with acquire,
// before any finish(), as the device reads it), the outputs then expert_ffn_host's bit for bit; done_at() is the
// time of the last output; a call without rows stores its value at once; the next call's value follows the last's.
TEST(HostExperts, SignalEveryOutputWrittenWithoutTheCaller) {
    HostExperts pool(3);
    if (pool.threads() < 2) GTEST_SKIP() << "one hardware thread: the pool has no worker";
    const Expert big = make_expert(DType::Q8_0, DType::Q4_K, DType::Q6_K, 256, 512, 8);
    const std::vector<float> xb = gaussian(3 * 256, 9), want = reference(big, xb, 3);
    const std::vector<HostExpertJob> probe = {{big.m[0], big.m[1], big.m[2], xb.data(), nullptr, 3}};
    ASSERT_TRUE(pool.runs_alone(probe));
    const Expert small = make_expert(DType::Q8_0, DType::Q8_0, 64, 64, 4);
    const std::vector<HostExpertJob> one = {{small.m[0], small.m[1], small.m[2], xb.data(), nullptr, 1}};
    EXPECT_FALSE(pool.runs_alone(one));  // the caller alone: no handoff
    alignas(64) uint32_t word = 0;
    for (uint32_t call = 1; call <= 30; call++) {
        std::vector<float> y(want.size(), -1.0f);
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<HostExpertJob> jobs = {{big.m[0], big.m[1], big.m[2], xb.data(), y.data(), 3}};  // kept
        pool.start(jobs, {&word, call});
        while (std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire) != call) std::this_thread::yield();
        EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * 4), 0) << "call " << call;
        pool.finish();
        EXPECT_GE(pool.done_at(), t0);
        EXPECT_LE(pool.done_at(), std::chrono::steady_clock::now());
    }
    pool.start({}, {&word, 31});
    EXPECT_EQ(word, 31u);
    pool.finish();
}

// The stager's copy (backend/host/stream_copy.h): memcpy's bytes for every alignment of source and destination and
// every length around the 64-byte lines, and nothing outside the destination's range is touched.
TEST(StreamCopy, IsMemcpyAtEveryAlignmentAndLength) {
    std::mt19937 rng(7);
    std::vector<uint8_t> src(4096 + 128), dst(4096 + 256), want;
    for (uint8_t &b : src) b = uint8_t(rng());
    const size_t lengths[] = {0, 1, 15, 16, 63, 64, 65, 127, 128, 129, 191, 1000, 4095, 4096};
    for (size_t n : lengths)
        for (size_t so = 0; so < 64; so += 7)
            for (size_t doff = 0; doff < 64; doff += 5) {
                std::fill(dst.begin(), dst.end(), uint8_t(0xA5));
                want = dst;
                std::memcpy(want.data() + 64 + doff, src.data() + so, n);
                stream_copy(dst.data() + 64 + doff, src.data() + so, n);
                ASSERT_EQ(dst, want) << "n=" << n << " src offset " << so << " dst offset " << doff;
            }
}
