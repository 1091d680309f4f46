// The host copy of the GPU's decode mat-vec (backend/host/mmvq_host.h): its activation quantization is the
// reference quantizer's (the same int8 values and scale per block as format/quant.h's Q8_0 and Q8_K), and its dot
// products of every mat-vec type equal the exact dot of the dequantized weights and activations within float
// rounding. That the GPU gives the same bits is tested on the device (tests/cuda/test_cuda_ops.cpp, MmvqHost).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/host/mmvq_host.h"
#include "core/fp16.h"
#include "format/quant.h"
#include "format/quant_blocks.h"

using namespace strata;

namespace {

std::vector<float> normals(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = nd(rng);
    return v;
}

}  // namespace

TEST(MmvqHost, ActivationsAreTheReferenceQuantization) {
    const int64_t k = 1024;
    std::vector<float> x = normals(size_t(k), 1);
    x[5] = 0.0f, x[300] = -7.5f, x[301] = 7.5f;  // a tie of magnitudes in one Q8_K block: the first one sets d
    std::vector<int8_t> q(static_cast<size_t>(k));
    std::vector<ActScale> ds(size_t(k / 32));

    quantize_act_gpu(DType::Q8_K, x.data(), k, q.data(), ds.data());
    std::vector<BlockQ8K> kb(size_t(k / 256));
    quantize_row(DType::Q8_K, x.data(), kb.data(), k);
    for (int64_t b = 0; b < k / 256; b++)
        for (int i = 0; i < 8; i++) {
            const int64_t sb = b * 8 + i;
            EXPECT_EQ(ds[size_t(sb)].d, kb[size_t(b)].d) << sb;
            int sum = 0;
            for (int e = 0; e < 32; e++) {
                ASSERT_EQ(q[size_t(sb * 32 + e)], kb[size_t(b)].qs[i * 32 + e]) << sb << " " << e;
                sum += kb[size_t(b)].qs[i * 32 + e];
            }
            EXPECT_EQ(ds[size_t(sb)].s, kb[size_t(b)].d * float(sum)) << sb;
        }

    quantize_act_gpu(DType::Q8_0, x.data(), k, q.data(), ds.data());
    std::vector<BlockQ8_0> zb(size_t(k / 32));
    quantize_row(DType::Q8_0, x.data(), zb.data(), k);
    for (int64_t b = 0; b < k / 32; b++) {
        EXPECT_EQ(ds[size_t(b)].d, f16_to_f32(zb[size_t(b)].d)) << b;
        for (int e = 0; e < 32; e++) ASSERT_EQ(q[size_t(b * 32 + e)], zb[size_t(b)].qs[e]) << b << " " << e;
    }
}

TEST(MmvqHost, DotsOfEveryTypeAreTheExactDotWithinRounding) {
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::IQ4_XS, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                    DType::IQ2_XXS, DType::IQ1_M}) {
        ASSERT_TRUE(mmvq_host_supported(t));
        for (int64_t k : {256, 768, 2048, 2304}) {  // fewer sub-blocks than lanes, several per lane, a partial turn
            const DType vt = dot_act_type(t);
            const int64_t rows = 6;
            const std::vector<float> wf = normals(size_t(rows * k), uint32_t(k) + 7, 0.05f);
            std::vector<uint8_t> w(row_bytes(t, k) * size_t(rows));
            for (int64_t r = 0; r < rows; r++)
                quantize_row(t, wf.data() + r * k, w.data() + size_t(r) * row_bytes(t, k), k);
            const std::vector<float> x = normals(size_t(k), uint32_t(k) + 11);
            std::vector<int8_t> q(static_cast<size_t>(k));
            std::vector<ActScale> ds(size_t(k / 32));
            quantize_act_gpu(vt, x.data(), k, q.data(), ds.data());
            std::vector<float> wd(static_cast<size_t>(k));
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t *row = w.data() + size_t(r) * row_bytes(t, k);
                dequantize_row(t, row, wd.data(), k);
                double exact = 0, mag = 0;
                for (int64_t i = 0; i < k; i++) {
                    const double xv = double(ds[size_t(i / 32)].d) * double(q[size_t(i)]);
                    exact += double(wd[size_t(i)]) * xv;
                    mag += std::fabs(double(wd[size_t(i)]) * xv);
                }
                const float got = mmvq_host_dot(t, row, k, q.data(), ds.data());
                EXPECT_NEAR(double(got), exact, 1e-5 * mag + 1e-30) << dtype_name(t) << " k " << k << " row " << r;
            }
        }
    }
}

// The vectorized forms (eight rows at a time with AVX2, sixteen with AVX-512 and VNNI) give the row-by-row form's
// bits, for every type, row counts that are not a multiple of eight or sixteen, ranges that start inside a matrix
// and (rows of 1152 bytes and more) span several of the staged pieces (k_host_stage_bytes), large scales, and
// weights of -128 (Q8_0 rows can hold them: their magnitude is 128 unsigned).
TEST(MmvqHost, VectorizedRowsAreTheRowByRowBits) {
    std::vector<CpuIsa> forms;
    for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512})
        if (cpu_isa_hardware() >= isa) forms.push_back(isa);
    if (forms.empty()) GTEST_SKIP() << "this CPU runs no AVX2";
    if (cpu_isa_hardware() < CpuIsa::avx512) std::printf("(no AVX-512 VNNI here: the AVX2 form only)\n");
    for (CpuIsa isa : forms)
        for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::IQ4_XS, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                        DType::IQ2_XXS, DType::IQ1_M})
            for (int64_t k : {256, 768, 2048, 2304})
                for (float wscale : {0.05f, 300.0f}) {
                    const int64_t rows = 113;
                    const size_t rb = row_bytes(t, k);
                    const std::vector<float> wf = normals(size_t(rows * k), uint32_t(k) + 3, wscale);
                    std::vector<uint8_t> w(rb * size_t(rows));
                    for (int64_t r = 0; r < rows; r++) quantize_row(t, wf.data() + r * k, w.data() + size_t(r) * rb, k);
                    if (t == DType::Q8_0)  // a run of -128 weights in a few rows
                        for (int64_t r = 0; r < rows; r += 5) std::memset(w.data() + size_t(r) * rb + 2, 0x80, 20);
                    const HostMatrix m{t, w.data(), rb, k, rows};
                    const std::vector<float> x = normals(size_t(k), uint32_t(k) + 5, wscale);
                    std::vector<int8_t> q(static_cast<size_t>(k));
                    std::vector<ActScale> ds(size_t(k / 32));
                    quantize_act_gpu(dot_act_type(t), x.data(), k, q.data(), ds.data());
                    for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {3, 17}, {5, 6}, {7, 109}}) {
                        std::vector<float> a(size_t(r1 - r0)), b(size_t(r1 - r0));
                        mmvq_host_rows(m, r0, r1, q.data(), ds.data(), a.data(), isa);
                        mmvq_host_rows(m, r0, r1, q.data(), ds.data(), b.data(), CpuIsa::scalar);
                        for (int64_t r = 0; r < r1 - r0; r++)
                            ASSERT_EQ(std::memcmp(&a[size_t(r)], &b[size_t(r)], 4), 0)
                                << cpu_isa_name(isa) << " " << dtype_name(t) << " k " << k << " scale " << wscale
                                << " row " << r0 + r << ": " << a[size_t(r)] << " vs " << b[size_t(r)];
                    }
                }
}

// exact_math.h's e^x (the one the GPU's silu uses, so that the host can reproduce an expert's down-matrix input):
// within 2 ulp of the correctly rounded value over the float range, exact at 0, the edges as expected.
TEST(MmvqHost, ExpIsWithinTwoUlp) {
    auto ulps = [](float a, float b) {
        int32_t ia, ib;
        std::memcpy(&ia, &a, 4);
        std::memcpy(&ib, &b, 4);
        return std::abs(int64_t(ia) - int64_t(ib));
    };
    int64_t worst = 0;
    float at = 0;
    for (int i = 0; i <= 400000; i++) {
        const float x = -87.0f + 175.0f * float(i) / 400000.0f;
        const float want = float(std::exp(double(x)));
        const int64_t u = ulps(host_exp(x), want);
        if (u > worst) worst = u, at = x;
    }
    EXPECT_LE(worst, 2) << "at x = " << at;
    EXPECT_EQ(host_exp(0.0f), 1.0f);
    EXPECT_EQ(host_exp(100.0f), INFINITY);
    EXPECT_EQ(host_exp(-200.0f), 0.0f);
    EXPECT_TRUE(std::isnan(host_exp(NAN)));
    EXPECT_GT(host_exp(-100.0f), 0.0f);  // subnormal, not flushed
    // silu(v) * m within a few ulp of the double-precision value
    for (float v : {-30.0f, -3.5f, -0.25f, 0.0f, 0.125f, 2.0f, 17.0f}) {
        const double want = double(v) / (1.0 + std::exp(-double(v))) * 1.5;
        EXPECT_NEAR(double(host_silu_mul(v, 1.5f)), want, 4e-7 * std::fabs(want) + 1e-30) << v;
    }
    EXPECT_EQ(host_silu_mul(-200.0f, 1.0f), -0.0f);  // e^200 is infinite: v / inf
}

// The gated form: silu(gate) * up quantized, as the GPU quantizes an expert's down-matrix input.
TEST(MmvqHost, GatedActivationsAreSiluTimesUpQuantized) {
    const int64_t k = 768;
    const std::vector<float> g = normals(size_t(k), 3), u = normals(size_t(k), 4);
    std::vector<float> prod(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; i++) prod[size_t(i)] = host_silu_mul(g[size_t(i)], u[size_t(i)]);
    for (DType vt : {DType::Q8_0, DType::Q8_K}) {
        const int64_t kk = vt == DType::Q8_K ? 512 : k;
        std::vector<int8_t> q1(static_cast<size_t>(kk)), q2(static_cast<size_t>(kk));
        std::vector<ActScale> d1(size_t(kk / 32)), d2(size_t(kk / 32));
        quantize_act_gpu(vt, g.data(), kk, q1.data(), d1.data(), u.data());
        quantize_act_gpu(vt, prod.data(), kk, q2.data(), d2.data());
        EXPECT_EQ(std::memcmp(q1.data(), q2.data(), q1.size()), 0);
        EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(ActScale)), 0);
    }
}

// One token through an expert on the host: the float expert FFN of the dequantized weights, to within what 8-bit
// activations cost (a few tenths of a percent of the output's norm).
TEST(MmvqHost, ExpertFfnIsTheFloatFfnWithinActivationRounding) {
    const int64_t E = 512, F = 768;
    for (auto [gu, dn] : {std::pair<DType, DType>{DType::Q4_K, DType::Q6_K},
                          {DType::Q8_0, DType::Q8_0},
                          {DType::IQ4_XS, DType::Q5_K}}) {
        const DType types[3] = {gu, gu, dn};
        const int64_t ks[3] = {E, E, F}, ns[3] = {F, F, E};
        std::vector<std::vector<uint8_t>> bytes(3);
        std::vector<std::vector<float>> deq(3);
        HostMatrix m[3];
        for (int i = 0; i < 3; i++) {
            const size_t rb = row_bytes(types[i], ks[i]);
            const std::vector<float> f = normals(size_t(ks[i] * ns[i]), uint32_t(50 + i), 0.05f);
            bytes[size_t(i)].resize(rb * size_t(ns[i]));
            deq[size_t(i)].resize(size_t(ks[i] * ns[i]));
            for (int64_t r = 0; r < ns[i]; r++) {
                quantize_row(types[i], f.data() + r * ks[i], bytes[size_t(i)].data() + size_t(r) * rb, ks[i]);
                dequantize_row(types[i], bytes[size_t(i)].data() + size_t(r) * rb, deq[size_t(i)].data() + r * ks[i],
                               ks[i]);
            }
            m[i] = {types[i], bytes[size_t(i)].data(), rb, ks[i], ns[i]};
        }
        const std::vector<float> x = normals(size_t(E), 9);
        std::vector<float> y(static_cast<size_t>(E));
        expert_ffn_host(m[0], m[1], m[2], x.data(), y.data());
        std::vector<double> h(static_cast<size_t>(F));
        for (int64_t j = 0; j < F; j++) {
            double g = 0, u = 0;
            for (int64_t i = 0; i < E; i++)
                g += double(deq[0][size_t(j * E + i)]) * x[size_t(i)],
                    u += double(deq[1][size_t(j * E + i)]) * x[size_t(i)];
            h[size_t(j)] = g / (1.0 + std::exp(-g)) * u;
        }
        double err = 0, norm = 0;
        for (int64_t e = 0; e < E; e++) {
            double want = 0;
            for (int64_t j = 0; j < F; j++) want += double(deq[2][size_t(e * F + j)]) * h[size_t(j)];
            err += (double(y[size_t(e)]) - want) * (double(y[size_t(e)]) - want);
            norm += want * want;
        }
        EXPECT_LT(std::sqrt(err / norm), 2e-2) << dtype_name(gu) << " / " << dtype_name(dn);
    }
}

TEST(MmvqHost, RefusesOtherTypes) {
    EXPECT_FALSE(mmvq_host_supported(DType::F32));
    EXPECT_FALSE(mmvq_host_supported(DType::Q3_K));
}

// The default form is a vectorized one wherever the CPU runs AVX2, never above what the CPU runs and STRATA_CPU_ISA
// allows, and the AVX-512 form only where it was timed faster.
TEST(MmvqHost, DefaultFormIsTheFasterOneTimed) {
    const CpuIsa form = mmvq_host_form();
    const MmvqHostTiming t = mmvq_host_timing();
    const CpuIsa top = std::min(cpu_isa_hardware(), cpu_isa_requested().value_or(CpuIsa::avx512));
    EXPECT_LE(int(form), int(top));
    if (top < CpuIsa::avx2) {
        EXPECT_EQ(form, CpuIsa::scalar);
        return;
    }
    EXPECT_GT(t.avx2_us, 0.0);
    if (top >= CpuIsa::avx512) {
        EXPECT_GT(t.avx512_us, 0.0);
    }
    EXPECT_EQ(form == CpuIsa::avx512, t.avx512_us > 0 && t.avx512_us < t.avx2_us);
    std::printf("(form %s: AVX2 %.1f us, AVX-512 %.1f us)\n", cpu_isa_name(form), t.avx2_us, t.avx512_us);
}
