// Experts on the host pool (backend/host/host_experts.h): every job's outputs are expert_ffn_host's, bit for bit,
// whatever the number of threads, jobs and rows.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/host/host_experts.h"
#include "format/quant.h"

using namespace strata;

namespace {

struct Expert {
    std::vector<uint8_t> bytes[3];
    HostMatrix m[3];
};

Expert make_expert(DType gu, DType dn, int64_t E, int64_t F, uint32_t seed) {
    Expert x;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    const DType types[3] = {gu, gu, dn};
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
