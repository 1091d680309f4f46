// CPU reference ops: the chunked delta rule equals the recurrent one, the reference matmul equals a plain
// dequantize-then-multiply (the fast matmul is tested in test_vec_dot.cpp), norms and RoPE do what their definitions
// say.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "format/quant.h"

using namespace strata;

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = d(rng);
    return v;
}

void l2norm_rows(std::vector<float> &x, int64_t n, int64_t d, float scale) {
    for (int64_t t = 0; t < n; t++) {
        float ss = 0;
        for (int64_t i = 0; i < d; i++) ss += x[size_t(t * d + i)] * x[size_t(t * d + i)];
        for (int64_t i = 0; i < d; i++) x[size_t(t * d + i)] *= scale / std::sqrt(ss + 1e-6f);
    }
}

}  // namespace

class DeltaRule : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DeltaRule, ChunkedEqualsRecurrent) {
    const auto [n, chunk] = GetParam();
    const int64_t dk = 16, dv = 24;
    std::vector<float> q = randn(size_t(n * dk), 1), k = randn(size_t(n * dk), 2), v = randn(size_t(n * dv), 3);
    l2norm_rows(q, n, dk, 1.0f / std::sqrt(float(dk)));
    l2norm_rows(k, n, dk, 1.0f);
    std::vector<float> g(static_cast<size_t>(n)), beta(static_cast<size_t>(n));
    std::mt19937_64 rng(4);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int t = 0; t < n; t++) {
        g[size_t(t)] = -2.0f * u(rng);  // log decay in (-2, 0]
        beta[size_t(t)] = u(rng);
    }
    std::vector<float> s0 = randn(size_t(dk * dv), 5, 0.3f);
    std::vector<float> s_rec = s0, s_chk = s0, o_rec(static_cast<size_t>(n * dv)), o_chk(static_cast<size_t>(n * dv));
    DeltaRuleIo io{q.data(), k.data(), v.data(), g.data(), beta.data(), dk, dk, dv, 1, o_rec.data(), dv};
    delta_rule_recurrent(io, n, dk, dv, s_rec.data());
    io.o = o_chk.data();
    delta_rule_chunked(io, n, dk, dv, s_chk.data(), chunk);
    for (size_t i = 0; i < o_rec.size(); i++) ASSERT_NEAR(o_chk[i], o_rec[i], 2e-5f * (1 + std::fabs(o_rec[i]))) << i;
    for (size_t i = 0; i < s_rec.size(); i++) ASSERT_NEAR(s_chk[i], s_rec[i], 2e-5f * (1 + std::fabs(s_rec[i]))) << i;
    // and the state really moved: a broken update that left it alone would pass the comparison above only if
    // both forms were broken the same way
    double moved = 0;
    for (size_t i = 0; i < s0.size(); i++) moved += std::fabs(s_rec[i] - s0[i]);
    EXPECT_GT(moved, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeltaRule,
                         ::testing::Values(std::make_tuple(1, 64), std::make_tuple(7, 4), std::make_tuple(64, 64),
                                           std::make_tuple(100, 64), std::make_tuple(130, 16),
                                           std::make_tuple(33, 1)));

TEST(CpuMatmul, EqualsDequantizeThenMultiply) {
    ThreadPool pool(3);
    const int64_t K = 512, N = 37, T = 5;
    for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K,
                       DType::Q6_K, DType::IQ4_XS}) {
        std::vector<float> wf = randn(size_t(K * N), 11, 0.05f);
        std::vector<uint8_t> wq(row_bytes(type, K) * size_t(N));
        for (int64_t n = 0; n < N; n++) quantize_row(type, wf.data() + n * K, wq.data() + size_t(n) * row_bytes(type, K), K);
        Weight w;
        w.type = type;
        w.ne[0] = K;
        w.ne[1] = N;
        w.ne[2] = 1;
        w.host = wq.data();
        w.row_bytes = row_bytes(type, K);
        w.expert_stride = w.row_bytes * size_t(N);
        std::vector<float> x = randn(size_t(T * K), 12), y(static_cast<size_t>(T * N));
        cpu_matmul_reference(pool, w, Act{x.data(), T, K, K}, Act{y.data(), T, N, N});

        const DType vt = dot_act_type(type);
        for (int64_t t = 0; t < T; t++) {
            std::vector<float> xr(x.begin() + t * K, x.begin() + (t + 1) * K);
            if (vt != DType::F32) {
                std::vector<uint8_t> b(row_bytes(vt, K));
                quantize_row(vt, xr.data(), b.data(), K);
                dequantize_row(vt, b.data(), xr.data(), K);
            }
            for (int64_t n = 0; n < N; n++) {
                std::vector<float> wr(static_cast<size_t>(K));
                dequantize_row(type, wq.data() + size_t(n) * w.row_bytes, wr.data(), K);
                double ref = 0;
                for (int64_t i = 0; i < K; i++) ref += double(wr[size_t(i)]) * xr[size_t(i)];
                ASSERT_NEAR(y[size_t(t * N + n)], ref, 1e-4 * (1 + std::fabs(ref))) << dtype_name(type);
            }
        }
    }
}

TEST(CpuOps, RmsNormPerGroup) {
    ThreadPool pool(2);
    std::vector<float> x = {1, 2, 3, 4, -1, -1, 1, 1};
    std::vector<float> w = {1, 2}, y(8);
    cpu_rms_norm(pool, Act{x.data(), 2, 4, 4}, w.data(), 2, 0.0f, Act{y.data(), 2, 4, 4});
    // group [1, 2]: rms = sqrt(2.5)
    EXPECT_NEAR(y[0], 1 / std::sqrt(2.5f), 1e-6);
    EXPECT_NEAR(y[1], 2 * 2 / std::sqrt(2.5f), 1e-6);
    EXPECT_NEAR(y[2], 3 / std::sqrt(12.5f), 1e-6);
    EXPECT_NEAR(y[4], -1.0f, 1e-6);
    EXPECT_NEAR(y[7], 2.0f, 1e-6);
}

TEST(CpuOps, RopeRotatesPairsAndKeepsTheRest) {
    ThreadPool pool(1);
    const int64_t hd = 8, n_rot = 4;
    std::vector<float> x(2 * hd * 2);  // 2 tokens, 2 heads
    for (size_t i = 0; i < x.size(); i++) x[i] = float(i % 7) - 3.0f;
    std::vector<float> orig = x;
    BatchInfo b;
    b.segs.push_back({0, 5, 2, 0});
    b.n_tokens = 2;
    cpu_rope_neox(pool, Act{x.data(), 2, 2 * hd, 2 * hd}, RopeParams{hd, n_rot, 10000.0f}, b);
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < 2; h++) {
            const float *o = orig.data() + t * 2 * hd + h * hd, *r = x.data() + t * 2 * hd + h * hd;
            for (int i = 0; i < 2; i++) {
                float ang = float(5 + t) * std::pow(10000.0f, -2.0f * float(i) / float(n_rot));
                EXPECT_NEAR(r[i], o[i] * std::cos(ang) - o[i + 2] * std::sin(ang), 1e-5);
                EXPECT_NEAR(r[i + 2], o[i + 2] * std::cos(ang) + o[i] * std::sin(ang), 1e-5);
            }
            for (int i = n_rot; i < hd; i++) EXPECT_EQ(r[i], o[i]);
        }
}
