// Every CUDA op against the CPU reference: exact device dequantizers and activation round trips for every type,
// matmuls of every weight type over awkward shapes (both kernel families), norms, RoPE, elementwise ops, attention
// over the KV cache types, Gated DeltaNet (both delta-rule forms), and the MoE block, whose output must not depend
// on how many expert slots there are.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/host_register.h"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/host/mmvq_host.h"
#include "core/argmax.h"
#include "core/env.h"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "format/quant.h"

using namespace strata;
using namespace strata::test;

namespace {

const DType k_all_types[] = {DType::F32,     DType::F16,    DType::BF16,  DType::Q4_0,    DType::Q4_1,   DType::Q5_0,
                             DType::Q5_1,    DType::Q8_0,   DType::Q8_1,  DType::MXFP4,   DType::IQ4_NL, DType::Q2_K,
                             DType::Q3_K,    DType::Q4_K,   DType::Q5_K,  DType::Q6_K,    DType::Q8_K,   DType::IQ4_XS,
                             DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S,  DType::IQ1_S,
                             DType::IQ1_M,   DType::TQ1_0,  DType::TQ2_0};

bool same_bits(float a, float b) {
    if (std::isnan(a) && std::isnan(b)) return true;
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
}

std::unique_ptr<Backend> cuda_backend() { return make_cuda_backend(CudaOptions{}); }

// A 1-D f32 weight over the floats of f (which must outlive it), as a model's norm vectors are.
void f32_vector(Weight &w, std::vector<float> &f, const char *name) {
    w.name = name;
    w.type = DType::F32;
    w.ne[0] = int64_t(f.size());
    w.ne[1] = 1;
    w.ne[2] = 1;
    w.host = reinterpret_cast<const uint8_t *>(f.data());
    w.row_bytes = f.size() * 4;
}

}  // namespace

// ---- dequantization ---------------------------------------------------------------------------------------------

class CudaDequant : public ::testing::TestWithParam<DType> {};

TEST_P(CudaDequant, BitExactWithTheReference) {
    const DType t = GetParam();
    const int64_t bs = dtype_info(t).block_size, k = 256 * 4, rows = 9;
    const size_t rb = row_bytes(t, k);
    // Two kinds of rows: quantized normal data at several scales, and random bytes (every bit pattern of every
    // field, scales that are subnormal, huge, infinite or NaN included).
    std::vector<uint8_t> bytes(rb * size_t(rows));
    std::mt19937_64 rng(uint64_t(t) * 7919 + 1);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *dst = bytes.data() + size_t(r) * rb;
        if (r < 5) {
            std::vector<float> f = randn(size_t(k), uint64_t(r) + 11, std::pow(10.0f, float(r) - 2.0f));
            quantize_row(t, f.data(), dst, k);
        } else {
            for (size_t i = 0; i < rb; i++) dst[i] = uint8_t(rng());
        }
    }
    ASSERT_EQ(k % bs, 0);
    DevBuf src(bytes.size()), dst(size_t(rows * k) * 4);
    CUDA_OK(cudaMemcpy(src.p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    cuda::dequantize_rows(t, src.p, rb, rows, k, dst.as<float>(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> got(static_cast<size_t>(rows * k)), want(static_cast<size_t>(k));
    CUDA_OK(cudaMemcpy(got.data(), dst.p, got.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < rows; r++) {
        dequantize_row(t, bytes.data() + size_t(r) * rb, want.data(), k);
        for (int64_t i = 0; i < k; i++)
            ASSERT_TRUE(same_bits(got[size_t(r * k + i)], want[size_t(i)]))
                << dtype_name(t) << " row " << r << " element " << i << ": " << got[size_t(r * k + i)] << " vs "
                << want[size_t(i)];
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaDequant, ::testing::ValuesIn(k_all_types),
                         [](const auto &info) { return std::string(dtype_name(info.param)); });

// The device's half conversions (the hardware's, a NaN's payload kept by a select) are the host's bit for bit, NaN
// payloads included: every half to float (through the F16 dequantizer), and floats to half (through an f16 cache
// store) over random bit patterns and the edges (ties at every rounding, the overflow bound, subnormal halves, f32
// subnormals, infinities, quiet and signalling NaNs of either sign).
TEST(CudaFp16, ConversionsAreTheHostsBitForBit) {
    std::vector<uint16_t> halves(65536);
    for (size_t i = 0; i < halves.size(); i++) halves[i] = uint16_t(i);
    DevBuf hsrc(halves.size() * 2), hdst(halves.size() * 4);
    CUDA_OK(cudaMemcpy(hsrc.p, halves.data(), halves.size() * 2, cudaMemcpyHostToDevice));
    cuda::dequantize_rows(DType::F16, hsrc.p, halves.size() * 2, 1, int64_t(halves.size()), hdst.as<float>(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint32_t> got32(halves.size());
    CUDA_OK(cudaMemcpy(got32.data(), hdst.p, got32.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < halves.size(); i++)
        ASSERT_EQ(got32[i], f32_to_bits(f16_to_f32(halves[i]))) << "half 0x" << std::hex << i;

    const int64_t cols = 4096, rows = 64;
    std::vector<uint32_t> bits(size_t(2 * cols * rows));
    std::mt19937_64 rng(77);
    for (uint32_t &b : bits) b = uint32_t(rng());
    size_t at = 0;
    const auto put_edge = [&](uint32_t b) {
        bits[at++] = b;
        bits[at++] = b | 0x80000000u;
    };
    for (uint32_t e = 90; e < 145; e++)  // every exponent a half's rounding sees, ties and their neighbours
        for (uint32_t low : {0x0u, 0xfffu, 0x1000u, 0x1001u, 0x2fffu, 0x3000u, 0x3001u, 0x7fffffu, 0x400000u, 0x401000u})
            put_edge((e << 23) | low);
    for (uint32_t b : {0x0u, 0x1u, 0x7fffffu, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u, 0x7f800000u,
                       0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7fa00100u, 0x7f802000u, 0x33000000u, 0x33000001u,
                       0x387fe000u, 0x387ff000u, 0x38800000u})
        put_edge(b);
    DevBuf fsrc(bits.size() * 4), kc(size_t(cols * rows) * 2), vc(size_t(cols * rows) * 2), sp(size_t(rows) * 8);
    std::vector<int2> seq_pos(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; r++) seq_pos[size_t(r)] = int2{0, int(r)};
    CUDA_OK(cudaMemcpy(fsrc.p, bits.data(), bits.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sp.p, seq_pos.data(), seq_pos.size() * 8, cudaMemcpyHostToDevice));
    const cuda::KvCacheView c{KvType::F16, kc.as<uint8_t>(), vc.as<uint8_t>(), size_t(cols) * 2, rows, cols};
    float *f = fsrc.as<float>();
    cuda::launch_kv_store(c, cuda::Rows{f, rows, cols, cols}, cuda::Rows{f + cols * rows, rows, cols, cols},
                          sp.as<int2>(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> got16(bits.size());
    CUDA_OK(cudaMemcpy(got16.data(), kc.p, size_t(cols * rows) * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got16.data() + cols * rows, vc.p, size_t(cols * rows) * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bits.size(); i++)
        ASSERT_EQ(got16[i], f32_to_f16(bits_to_f32(bits[i]))) << "float bits 0x" << std::hex << bits[i];
}

// A host range registered by two users (the parts of a split sharing the model file's mapping) is registered once:
// the second registration counts, the first release leaves it pinned, the last unregisters; a longer range than the
// one registered is refused.
TEST(CudaHostRegister, SharedRegistrationIsCounted) {
    const size_t bytes = size_t(4) << 20;
    std::vector<uint8_t> host(bytes + 4096);
    uint8_t *base = host.data() + (4096 - reinterpret_cast<uintptr_t>(host.data()) % 4096) % 4096;
    auto registered = [&] {
        unsigned flags = 0;
        const bool yes = cudaHostGetFlags(&flags, base) == cudaSuccess;
        cudaGetLastError();
        return yes;
    };
    ASSERT_FALSE(registered());
    ASSERT_EQ(cuda::host_register_shared(base, bytes, true), cudaSuccess);
    ASSERT_EQ(cuda::host_register_shared(base, bytes, true), cudaSuccess);
    EXPECT_EQ(cuda::host_register_shared(base, bytes + 4096, true), cudaErrorHostMemoryAlreadyRegistered);
    EXPECT_TRUE(registered());
    cuda::host_unregister_shared(base);
    EXPECT_TRUE(registered());
    cuda::host_unregister_shared(base);
    EXPECT_FALSE(registered());
}

// The device's arg-max (Backend::download_argmax) is the host's pick: rows of a vocabulary's width and narrow ones,
// the maximum repeated (the lowest index wins), NaNs (skipped, except one at index 0: the pick is 0), -0 against +0,
// all -inf, and a single column.
TEST(CudaArgmax, IsTheHostsPick) {
    auto be = cuda_backend();
    for (int64_t cols : {int64_t(151936), int64_t(4099), int64_t(300), int64_t(31), int64_t(1)}) {
        const int64_t rows = 9;
        std::vector<float> x = randn(size_t(rows * cols), uint64_t(cols), 4.0f);
        const auto at = [&](int64_t r, int64_t i) -> float & { return x[size_t(r * cols + std::min(i, cols - 1))]; };
        at(1, cols / 3) = 100.0f, at(1, cols / 2) = 100.0f, at(1, cols - 1) = 100.0f;
        at(2, 0) = std::nanf("");
        at(3, 1) = std::nanf(""), at(3, cols / 2) = std::nanf(""), at(3, cols - 1) = 50.0f;
        for (int64_t i = 0; i < cols; i++) at(4, i) = -INFINITY;
        for (int64_t i = 0; i < cols; i++) at(5, i) = i % 3 ? -1.0f : -0.0f;
        at(5, cols - 1) = 0.0f;
        for (int64_t i = 0; i < cols; i++) at(6, i) = std::nanf("");
        at(6, cols - 1) = 1.0f, at(6, 0) = -2.0f;
        at(7, cols - 1) = 1e30f;
        Act a = be->alloc(rows, cols);
        put(a, x, true);
        std::vector<int32_t> got(size_t(rows), -1);
        be->download_argmax(a, got.data());
        for (int64_t r = 0; r < rows; r++)
            EXPECT_EQ(got[size_t(r)], argmax(x.data() + r * cols, cols)) << cols << " columns, row " << r;
    }
}

// The generic matmul path takes activations through the reference's activation format: same values, bit for bit.
TEST(CudaActivations, RoundTripIsExact) {
    const int64_t k = 512, rows = 7;
    std::vector<float> x = randn(size_t(rows * k), 5, 3.0f);
    x[3] = 0.0f;                                           // zeros
    for (int i = 0; i < 32; i++) x[size_t(k + i)] = 0.0f;  // an all-zero block
    x[size_t(2 * k + 5)] = -x[size_t(2 * k + 9)];          // a tie in magnitude
    DevBuf xd(x.size() * 4), out(x.size() * 4);
    CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    for (DType vt : {DType::Q8_0, DType::Q8_1, DType::Q8_K}) {
        cuda::launch_act_round_trip(vt, xd.as<float>(), k, rows, k, out.as<float>(), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> got(x.size()), want(static_cast<size_t>(k));
        std::vector<uint8_t> blocks(row_bytes(vt, k));
        CUDA_OK(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost));
        for (int64_t r = 0; r < rows; r++) {
            quantize_row(vt, x.data() + r * k, blocks.data(), k);
            dequantize_row(vt, blocks.data(), want.data(), k);
            for (int64_t i = 0; i < k; i++)
                ASSERT_TRUE(same_bits(got[size_t(r * k + i)], want[size_t(i)]))
                    << dtype_name(vt) << " row " << r << " element " << i;
        }
    }
}

// The decode kernels' 8-bit activation form (launch_quantize_act, in the form STRATA_CUDA_Q8K_WIDE picks: the suite
// runs again with it off) against the host's copy bit for bit, on values that exercise the pick of each block's
// scale: zeros, an all-zero block, a NaN, equal magnitudes of either sign (the first index wins), and the gated form
// (silu(x) * m).
TEST(CudaActivations, EightBitFormIsTheHostsOnOddValues) {
    const int64_t k = 768, rows = 4;
    std::vector<float> x = randn(size_t(rows * k), 41, 2.0f), m = randn(size_t(rows * k), 42);
    for (int i = 0; i < 256; i++) x[size_t(256 + i)] = 0.0f;  // row 0's second 256 block: all zero
    x[size_t(k + 3)] = std::nanf("");
    x[size_t(2 * k + 300)] = 9.0f, x[size_t(2 * k + 290)] = -9.0f;  // a tie: index 290 (negative) is the pick
    x[size_t(3 * k + 40)] = -7.5f, x[size_t(3 * k + 200)] = 7.5f;   // a tie: index 40
    DevBuf xd(x.size() * 4), md(m.size() * 4), qd(x.size()), dd(x.size() / 32 * 8);
    CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(md.p, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
    for (DType vt : {DType::Q8_0, DType::Q8_K})
        for (bool gated : {false, true}) {
            cuda::launch_quantize_act(vt, xd.as<float>(), k, rows, k, qd.as<int8_t>(), dd.as<float2>(), nullptr,
                                      gated ? md.as<float>() : nullptr, k);
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<int8_t> qg(x.size()), qh(x.size());
            std::vector<ActScale> dg(x.size() / 32), dh(x.size() / 32);
            CUDA_OK(cudaMemcpy(qg.data(), qd.p, qg.size(), cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(dg.data(), dd.p, dg.size() * 8, cudaMemcpyDeviceToHost));
            for (int64_t r = 0; r < rows; r++)
                quantize_act_gpu(vt, x.data() + r * k, k, qh.data() + r * k, dh.data() + r * (k / 32),
                                 gated ? m.data() + r * k : nullptr);
            const std::string what = std::string(dtype_name(vt)) + (gated ? ", gated" : "");
            ASSERT_EQ(std::memcmp(qh.data(), qg.data(), qh.size()), 0) << what;
            ASSERT_EQ(std::memcmp(dh.data(), dg.data(), dh.size() * 8), 0) << what;
        }
}

// ---- matmul -----------------------------------------------------------------------------------------------------

struct MatmulCase {
    DType type;
    int64_t k, n, t;
};

class CudaMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(CudaMatmul, MatchesTheReference) {
    const MatmulCase c = GetParam();
    auto be = cuda_backend();
    ThreadPool pool(2);
    HostWeight hw;
    make_weight(hw, c.type, c.k, c.n, 1, uint64_t(c.type) * 31 + uint64_t(c.n), 0.05f, true);
    std::vector<float> x = randn(size_t(c.t * c.k), uint64_t(c.k + c.t), 1.0f);
    // The activations are a column view of a wider matrix: strides are honoured.
    std::vector<float> wide_host(static_cast<size_t>(c.t * (c.k + 3)), 7.0f);
    for (int64_t r = 0; r < c.t; r++)
        for (int64_t i = 0; i < c.k; i++) wide_host[size_t(r * (c.k + 3) + 1 + i)] = x[size_t(r * c.k + i)];
    Act wide = be->alloc(c.t, c.k + 3);
    put(wide, wide_host, true);
    Act xd = wide.cols_view(1, c.k), yd = be->alloc(c.t, c.n);
    be->matmul(hw.w, xd, yd);
    std::vector<float> got = get(*be, yd);

    std::vector<float> want(size_t(c.t * c.n));
    Act xh{x.data(), c.t, c.k, c.k}, yh{want.data(), c.t, c.n, c.n};
    cpu_matmul_reference(pool, hw.w, xh, yh);
    // Every kernel (the quantized mat-vec ones too) computes the reference's function (weights and quantized
    // activations dequantized, fp32 sums): float rounding apart, equal. The CPU's integer fast path is checked
    // against the same reference in tests/cpp/test_vec_dot.cpp, with its own bound.
    EXPECT_LE(max_abs_diff(want, got), 2e-5f * std::max(1.0f, max_abs(want)))
        << dtype_name(c.type) << " k=" << c.k << " n=" << c.n << " t=" << c.t;
}

std::vector<MatmulCase> matmul_cases() {
    std::vector<MatmulCase> out;
    for (DType t : k_all_types)
        for (auto [k, n, tok] : {std::tuple<int64_t, int64_t, int64_t>{256, 37, 1},
                                 {512, 130, 3},
                                 {512, 1, 8},
                                 {768, 65, 9},
                                 {256, 70, 70},
                                 {512, 33, 130},
                                 {1024, 100, 3}})  // few long rows: the split mat-vec kernel for generic types
            out.push_back({t, k, n, tok});
    // larger products for the tensor-core kernels: several k steps, weight-row blocks and activation tiles
    for (DType t : k_all_types) out.push_back({t, 2048, 260, 100});
    // row lengths that end in a partial k step of the tensor-core kernels (types with 32-element blocks)
    for (DType t : k_all_types)
        if (dtype_info(t).block_size == 32 && dtype_info(dot_act_type(t)).block_size == 32)
            out.push_back({t, 288, 70, 33});
    // row lengths that are no multiple of 32 (float types only)
    for (DType t : {DType::F32, DType::F16, DType::BF16})
        for (int64_t tok : {1, 5, 67}) out.push_back({t, 100, 19, tok});
    return out;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaMatmul, ::testing::ValuesIn(matmul_cases()), [](const auto &info) {
    const MatmulCase &c = info.param;
    return std::string(dtype_name(c.type)) + "_k" + std::to_string(c.k) + "_n" + std::to_string(c.n) + "_t" +
           std::to_string(c.t);
});

const DType k_mmvq_types[] = {DType::Q8_0, DType::Q4_0, DType::MXFP4,   DType::IQ4_XS, DType::Q4_K,
                              DType::Q5_K, DType::Q6_K, DType::IQ2_XXS, DType::IQ1_M};

// The args of an f32 matrix (n rows of k at w) times x (rows of k) into y (rows of n); groups left to the caller.
cuda::MatmulArgs f32_args(const void *w, int64_t k, int64_t n, const float *x, float *y) {
    cuda::MatmulArgs a;
    a.type = DType::F32;
    a.k = k;
    a.n = n;
    a.row_bytes = size_t(k) * 4;
    a.x = x;
    a.x_stride = k;
    a.y = y;
    a.y_stride = n;
    a.single = {w, 0, 0, 0};
    return a;
}

// n random weight rows of type t and R random activation rows of length k, the activations quantized on the device
// for t's mat-vec format, and the args of their product as one group of all R rows into yd (R x n).
struct QuantizedProduct {
    DType t;
    int64_t k, n, R;
    size_t rb;
    std::vector<uint8_t> w;
    std::vector<float> x;
    DevBuf wd, xd, qd, dd, yd;
    cuda::MatmulArgs a;
    QuantizedProduct(DType t_, int64_t k_, int64_t n_, int64_t R_, uint64_t w_seed, uint64_t x_seed)
        : t(t_), k(k_), n(n_), R(R_), rb(row_bytes(t_, k_)), w(rb * size_t(n_)), x(randn(size_t(R_ * k_), x_seed)),
          wd(w.size()), xd(x.size() * 4), qd(size_t(R_ * k_)), dd(size_t(R_ * k_ / 32) * 8), yd(size_t(R_ * n_) * 4) {
        const std::vector<float> wf = randn(size_t(n * k), w_seed, 0.05f);
        for (int64_t r = 0; r < n; r++) quantize_row(t, wf.data() + r * k, w.data() + size_t(r) * rb, k);
        EXPECT_EQ(cudaMemcpy(wd.p, w.data(), w.size(), cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        cuda::launch_quantize_act(dot_act_type(t), xd.as<float>(), k, R, k, qd.as<int8_t>(), dd.as<float2>(),
                                  nullptr);
        a.type = t;
        a.k = k;
        a.n = n;
        a.row_bytes = rb;
        a.xq = qd.as<int8_t>();
        a.xds = dd.as<float2>();
        a.y = yd.as<float>();
        a.y_stride = n;
        a.single = {wd.p, 0, int32_t(R), 0};
    }
};

// Products of one input with several matrices (Backend::matmuls: q, k and v; a GDN layer's projections): at decode
// sizes the matrices of one mat-vec type share a launch (up to four a launch), and every output row must be what its
// matrix's own launch (Backend::matmul) gives, bit for bit, and the reference's within the matmul bound. 1, 3 and 8
// activation rows, matrices of odd sizes beside 512-row ones, more of one type than a launch takes, a type
// mix (a Q8_0 pair launched together, Q6_K alone), outputs that are column views of a wider matrix (strides).
TEST(CudaMatmuls, OneLaunchIsTheSeparateLaunches) {
    auto be = cuda_backend();
    ThreadPool pool(2);
    struct Case {
        std::vector<DType> types;  // one per matrix
        std::vector<int64_t> n;
    };
    std::vector<Case> cases;
    for (DType t : k_mmvq_types) {
        cases.push_back({{t, t}, {1000, 512}});
        cases.push_back({{t, t, t}, {512, 37, 129}});
        cases.push_back({{t, t, t, t}, {96, 512, 5, 1027}});
        cases.push_back({{t, t, t, t, t}, {64, 3, 64, 200, 64}});  // a fifth matrix: a second launch, alone
    }
    cases.push_back({{DType::Q8_0, DType::Q6_K, DType::Q8_0}, {1000, 512, 37}});
    uint64_t seed = 4000;
    for (int64_t k : {512, 2304}) {  // fewer sub-blocks than lanes; several per lane and a partial turn
        for (const Case &c : cases) {
            const size_t m = c.n.size();
            std::vector<HostWeight> hw(m);
            for (size_t i = 0; i < m; i++) make_weight(hw[i], c.types[i], k, c.n[i], 1, seed++, 0.05f, true);
            for (int64_t T : {1, 3, 8}) {
                be->reset_scratch();
                const std::vector<float> x = randn(size_t(T * k), seed++);
                Act xd = be->alloc(T, k);
                put(xd, x, true);
                int64_t cols = 0;
                for (int64_t n : c.n) cols += n + 1;
                Act wide = be->alloc(T, cols);  // every output a column view, one column apart
                std::vector<Act> fused, sep;
                std::vector<Backend::MatmulOut> outs;
                int64_t c0 = 0;
                for (size_t i = 0; i < m; i++) {
                    fused.push_back(wide.cols_view(c0, c.n[i]));
                    c0 += c.n[i] + 1;
                    sep.push_back(be->alloc(T, c.n[i]));
                    outs.push_back({&hw[i].w, fused.back()});
                }
                be->matmuls(xd, outs);
                for (size_t i = 0; i < m; i++) be->matmul(hw[i].w, xd, sep[i]);
                for (size_t i = 0; i < m; i++) {
                    const std::string what = std::string(dtype_name(c.types[i])) + " k=" + std::to_string(k) +
                                             " matrix " + std::to_string(i) + " of " + std::to_string(m) + " (" +
                                             std::to_string(c.n[i]) + " rows), T=" + std::to_string(T);
                    const std::vector<float> got = get(*be, fused[i]), one = get(*be, sep[i]);
                    ASSERT_EQ(got.size(), one.size());
                    EXPECT_EQ(std::memcmp(got.data(), one.data(), got.size() * 4), 0) << what;
                    std::vector<float> want(size_t(T * c.n[i]));
                    Act xh{const_cast<float *>(x.data()), T, k, k}, yh{want.data(), T, c.n[i], c.n[i]};
                    cpu_matmul_reference(pool, hw[i].w, xh, yh);
                    EXPECT_LE(max_abs_diff(want, got), 2e-5f * std::max(1.0f, max_abs(want))) << what;
                }
            }
        }
    }
}

// The tensor-core matmul's forms (matmul.cuh, MmqForm) compute one function: for every type, a single group (the
// dense matrices of a prompt: Plain, Narrow, Wide and, for Q4_K, Staged and Q4Direct; for Q8_0, Q8Staged) and a tile
// list of several groups (the experts: Plain, Narrow, Staged and Q4Direct) give the same bits. Row counts that leave
// partial 64- and 128-row tiles, a weight-row count that leaves a partial 128-row block, row lengths with a partial k
// step and several steps (Q8_0's Wide form copies rows of whole words: k 320 and 2048, a partial and whole last step; k
// 288 is read a block a thread; Q8Staged takes k 256, fewer steps than it has stages, and 2048; Q4Direct k 256, one
// super-block of two steps, fewer than its stages, and 2048).
TEST(CudaMmq, FormsAreTheSameBits) {
    for (DType t : k_mmvq_types) {
        for (int64_t k : {288, 320, 256, 2048}) {
            if (k % dtype_info(t).block_size != 0 || k % dtype_info(dot_act_type(t)).block_size != 0) continue;
            const int64_t n = 200, R = 333;
            QuantizedProduct qp(t, k, n, R, uint64_t(k) * 7 + uint64_t(t), uint64_t(k) * 7 + 1);
            cuda::MatmulArgs &a = qp.a;
            DevBuf &wd = qp.wd, &yd = qp.yd;
            auto run = [&](cuda::MmqForm form) {
                std::vector<float> y(size_t(R * n));
                EXPECT_EQ(cudaMemset(yd.p, 0xff, y.size() * 4), cudaSuccess);  // NaN where nothing is written
                cuda::launch_mmq(a, nullptr, form);
                EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                EXPECT_EQ(cudaMemcpy(y.data(), yd.p, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
                return y;
            };
            const std::string what = std::string(dtype_name(t)) + ", k " + std::to_string(k);
            // one group of every row
            for (int32_t rows : {int32_t(R), int32_t(129), int32_t(64)}) {
                a.single = {wd.p, 0, rows, 0};
                a.tiles = nullptr;
                const std::vector<float> plain = run(cuda::MmqForm::Plain);
                for (int64_t i = 0; i < int64_t(rows) * n; i++)
                    ASSERT_FALSE(std::isnan(plain[size_t(i)])) << what << ": output " << i << " not written";
                for (cuda::MmqForm f : {cuda::MmqForm::Narrow, cuda::MmqForm::Wide, cuda::MmqForm::Staged,
                                        cuda::MmqForm::Q8Staged, cuda::MmqForm::Q4Direct, cuda::MmqForm::Auto})
                    EXPECT_EQ(std::memcmp(plain.data(), run(f).data(), plain.size() * 4), 0)
                        << what << ", " << rows << " rows, form " << int(f);
            }
            // three groups of one matrix at different rows, as the MoE passes them, in 64-row tiles
            const std::vector<cuda::MatmulGroup> gs = {{wd.p, 0, 70, 0}, {wd.p, 70, 9, 70}, {wd.p, 79, 254, 79}};
            std::vector<int2> tiles;
            for (int gi = 0; gi < 3; gi++)
                for (int32_t r = 0; r < gs[size_t(gi)].n_rows; r += cuda::k_mm_tile_rows) tiles.push_back(int2{gi, r});
            DevBuf gd(gs.size() * sizeof(cuda::MatmulGroup)), td(tiles.size() * sizeof(int2));
            CUDA_OK(cudaMemcpy(gd.p, gs.data(), gs.size() * sizeof(cuda::MatmulGroup), cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(int2), cudaMemcpyHostToDevice));
            a.groups = gd.as<cuda::MatmulGroup>();
            a.n_groups = 3;
            a.tiles = td.as<int2>();
            a.n_tiles = int32_t(tiles.size());
            const std::vector<float> plain = run(cuda::MmqForm::Plain);
            for (cuda::MmqForm f : {cuda::MmqForm::Narrow, cuda::MmqForm::Wide, cuda::MmqForm::Staged,
                                    cuda::MmqForm::Q8Staged, cuda::MmqForm::Q4Direct, cuda::MmqForm::Auto})
                EXPECT_EQ(std::memcmp(plain.data(), run(f).data(), plain.size() * 4), 0)
                    << what << ", three groups, form " << int(f);
            a.groups = nullptr;
            a.n_groups = 1;
        }
    }
}

// Several matrices of a prompt in one tensor-core launch (launch_mmq_parts: q, k and v) give each matrix's bits
// alone: three row slices of one matrix (300, 64 and 200 rows: partial 128-row blocks, a part within one block)
// against launches of each slice, in the Plain, Wide and Auto forms, for row counts with partial tiles; the parts'
// outputs interleaved in one buffer (columns a row apart), every output written and nothing else.
TEST(CudaMmq, PartsAreTheSeparateLaunchesBits) {
    for (DType t : k_mmvq_types) {
        for (int64_t k : {320, 2048}) {
            if (k % dtype_info(t).block_size != 0 || k % dtype_info(dot_act_type(t)).block_size != 0) continue;
            const std::vector<int64_t> ns = {300, 64, 200};
            const int64_t n = 564, R = 333, cols = n + 3;
            QuantizedProduct qp(t, k, n, R, uint64_t(k) * 11 + uint64_t(t), uint64_t(k) * 11 + 1);
            DevBuf wide(size_t(R * cols) * 4);
            const std::string what0 = std::string(dtype_name(t)) + ", k " + std::to_string(k);
            for (int32_t rows : {int32_t(R), int32_t(129), int32_t(40)}) {
                for (cuda::MmqForm f :
                     {cuda::MmqForm::Plain, cuda::MmqForm::Wide, cuda::MmqForm::Q8Staged, cuda::MmqForm::Auto}) {
                    const std::string what =
                        what0 + ", " + std::to_string(rows) + " rows, form " + std::to_string(int(f));
                    cuda::MatmulPart parts[3];
                    int64_t r0 = 0, c0 = 0;
                    for (int p = 0; p < 3; p++) {
                        parts[p] = {static_cast<const uint8_t *>(qp.wd.p) + size_t(r0) * qp.rb, ns[size_t(p)],
                                    wide.as<float>() + c0, cols};
                        r0 += ns[size_t(p)];
                        c0 += ns[size_t(p)] + 1;
                    }
                    ASSERT_EQ(cudaMemset(wide.p, 0xff, size_t(R * cols) * 4), cudaSuccess);  // NaN: not written
                    cuda::MatmulArgs a = qp.a;
                    a.single = {nullptr, 0, rows, 0};
                    cuda::launch_mmq_parts(a, parts, 3, nullptr, f);
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
                    std::vector<float> got(size_t(R * cols));
                    ASSERT_EQ(cudaMemcpy(got.data(), wide.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
                    r0 = 0, c0 = 0;
                    for (int p = 0; p < 3; p++) {
                        const int64_t np = ns[size_t(p)];
                        cuda::MatmulArgs b = qp.a;
                        b.n = np;
                        b.single = {parts[p].w, 0, rows, 0};
                        b.y_stride = np;
                        ASSERT_EQ(cudaMemset(qp.yd.p, 0xff, size_t(R * n) * 4), cudaSuccess);
                        cuda::launch_mmq(b, nullptr, f);
                        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
                        std::vector<float> one(size_t(rows * np));
                        ASSERT_EQ(cudaMemcpy(one.data(), qp.yd.p, one.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
                        for (int64_t r = 0; r < rows; r++) {
                            const float *g = got.data() + r * cols + c0;
                            ASSERT_FALSE(std::isnan(g[0]) || std::isnan(g[np - 1])) << what << ", part " << p;
                            ASSERT_EQ(std::memcmp(g, one.data() + r * np, size_t(np) * 4), 0)
                                << what << ", part " << p << ", row " << r;
                            if (p < 2) {
                                ASSERT_TRUE(std::isnan(g[np])) << what << ": a column between parts written";
                            }
                        }
                        for (int64_t r = rows; r < R; r++)
                            ASSERT_TRUE(std::isnan(got[size_t(r * cols + c0)])) << what << ": row " << r << " written";
                        r0 += np;
                        c0 += np + 1;
                    }
                }
            }
        }
    }
}

// A single group of f32 weights (a prompt's router) takes the pipelined f32 kernel, which gives the bits of the
// generic tiled kernel its tile lists take: the same rows as one group of 64-row tiles, with a partial block of
// weight rows (200) and row counts with partial tiles, every output written.
TEST(CudaMatmulGeneric, F32FormIsTheTileListsBits) {
    if (!env_switch("STRATA_CUDA_MM_F32", true))
        GTEST_SKIP() << "STRATA_CUDA_MM_F32=0 turns the f32 form off";
    {
        const int64_t k = 2048, n = 200, R = 333;
        const std::vector<float> w = randn(size_t(n * k), 77, 0.05f), x = randn(size_t(R * k), 78);
        DevBuf wd(w.size() * 4), xd(x.size() * 4), yd(size_t(R * n) * 4);
        CUDA_OK(cudaMemcpy(wd.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        cuda::MatmulArgs a = f32_args(wd.p, k, n, xd.as<float>(), yd.as<float>());
        auto run = [&]() {
            std::vector<float> y(size_t(R * n));
            EXPECT_EQ(cudaMemset(yd.p, 0xff, y.size() * 4), cudaSuccess);  // NaN where nothing is written
            cuda::launch_mm_generic(a, nullptr);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            EXPECT_EQ(cudaMemcpy(y.data(), yd.p, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
            return y;
        };
        for (int32_t rows : {int32_t(R), int32_t(64), int32_t(9), int32_t(17)}) {
            const std::string what = std::to_string(rows) + " rows";
            a.single = {wd.p, 0, rows, 0};
            a.groups = nullptr, a.n_groups = 1, a.tiles = nullptr, a.n_tiles = 0;
            ASSERT_TRUE(cuda::mm_f32_applies(a)) << what;
            const std::vector<float> small = run();
            for (int64_t i = 0; i < int64_t(rows) * n; i++)
                ASSERT_FALSE(std::isnan(small[size_t(i)])) << what << ": output " << i << " not written";
            const std::vector<cuda::MatmulGroup> gs = {a.single};
            std::vector<int2> tiles;
            for (int32_t r = 0; r < rows; r += cuda::k_mm_tile_rows) tiles.push_back(int2{0, r});
            DevBuf gd(sizeof(cuda::MatmulGroup)), td(tiles.size() * sizeof(int2));
            CUDA_OK(cudaMemcpy(gd.p, gs.data(), sizeof(cuda::MatmulGroup), cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(int2), cudaMemcpyHostToDevice));
            a.groups = gd.as<cuda::MatmulGroup>();
            a.tiles = td.as<int2>();
            a.n_tiles = int32_t(tiles.size());
            EXPECT_EQ(std::memcmp(small.data(), run().data(), size_t(rows * n) * 4), 0) << what;
        }
    }
}

// The short-context decode attention's split form (parts of k_flash_decode_part_keys positions, merged) against its
// one-block form and a double-precision reference: within rounding, for f16 and f32 caches, head sizes 64 and 128,
// a GQA group of 8, positions inside the first part, on a part boundary, and the last position the kernel takes; and
// a vector's result the same bits whether its tile is launched alone or beside others.
// The merge of split partials in its two forms, bit for bit: random partial outputs, maxima and sums for 1..70
// splits, splits that saw no key (maximum -inf), tiles of fewer vectors than the tile holds, head sizes 64/128/256.
TEST(CudaFlashMerge, VectorFormIsTheBlockForm) {
    const int n_kv = 3, group = 4, M = 16;
    for (int D : {64, 128, 256})
        for (int n_split : {1, 2, 33, 70}) {
            const std::vector<cuda::AttnTile> tiles{{0, 4, 0, 100}, {4, 3, 1, 7}};  // 16 and 12 vectors
            const int n_tiles = int(tiles.size()), rows = 7;
            const size_t n_ws = size_t(n_tiles) * n_kv * n_split * M * (D + 2);
            std::vector<float> ws = randn(n_ws, uint64_t(D * 100 + n_split), 2.0f);
            for (size_t i = 0; i < n_ws / size_t(D + 2); i++) {
                float *p = ws.data() + i * size_t(D + 2);
                p[D + 1] = std::fabs(p[D + 1]) + 0.5f;                 // a sum of weights: positive
                if (i % 5 == 3) p[D] = -INFINITY, p[D + 1] = 0.0f;    // a split that saw no key
            }
            DevBuf wd(n_ws * 4), td(tiles.size() * sizeof(cuda::AttnTile));
            const size_t n_out = size_t(rows) * n_kv * group * D;
            DevBuf o1(n_out * 4), o2(n_out * 4);
            CUDA_OK(cudaMemcpy(wd.p, ws.data(), n_ws * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(cuda::AttnTile), cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(o1.p, 0, n_out * 4));
            CUDA_OK(cudaMemset(o2.p, 0, n_out * 4));
            const int64_t cols = int64_t(n_kv) * group * D;
            const cuda::Rows r1{o1.as<float>(), rows, cols, cols}, r2{o2.as<float>(), rows, cols, cols};
            const auto *tp = static_cast<const cuda::AttnTile *>(td.p);
            cuda::launch_flash_merge(r1, D, M, group, n_kv, tp, n_tiles, n_split, wd.as<float>(), nullptr,
                                     cuda::MergeForm::Block);
            cuda::launch_flash_merge(r2, D, M, group, n_kv, tp, n_tiles, n_split, wd.as<float>(), nullptr,
                                     cuda::MergeForm::Vector);
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<float> a(n_out), b(n_out);
            CUDA_OK(cudaMemcpy(a.data(), o1.p, n_out * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(b.data(), o2.p, n_out * 4, cudaMemcpyDeviceToHost));
            ASSERT_EQ(std::memcmp(a.data(), b.data(), n_out * 4), 0) << "D " << D << ", " << n_split << " splits";
            size_t finite = 0;
            for (float x : b) finite += std::isfinite(x) && x != 0.0f;
            EXPECT_GT(finite, n_out / 2) << "D " << D << ", " << n_split << " splits";  // the outputs were written
        }
}

// The decoding attention's last launch making its output's Q8_0 form for the o matrix (the norms' NormQ8 form 1):
// the bytes launch_quantize_act makes from the output, from the short-context kernel in both forms (one block, split
// and merged) and from the tiled kernel's Vector merge; head sizes 64, 128 and 256 (two, four and eight values a
// lane). Some outputs are NaN-free blocks of mixed sign; a zero block (all of a vector's values 0) is included.
TEST(CudaAttentionQ8, OutputFormIsTheQuantizeKernels) {
    auto q8_of = [](const cuda::Rows &o, std::vector<int8_t> &q, std::vector<float2> &ds) {
        DevBuf qd(size_t(o.rows * o.cols)), dd(size_t(o.rows * o.cols / 32) * 8);
        cuda::launch_quantize_act(DType::Q8_0, o.data, o.stride, o.rows, o.cols, qd.as<int8_t>(), dd.as<float2>(),
                                  nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        q.resize(size_t(o.rows * o.cols));
        ds.resize(size_t(o.rows * o.cols / 32));
        CUDA_OK(cudaMemcpy(q.data(), qd.p, q.size(), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(ds.data(), dd.p, ds.size() * 8, cudaMemcpyDeviceToHost));
    };
    auto compare = [&](const cuda::Rows &o, const DevBuf &qd, const DevBuf &dd, const std::string &what) {
        std::vector<int8_t> want_q, got_q(size_t(o.rows * o.cols));
        std::vector<float2> want_d, got_d(size_t(o.rows * o.cols / 32));
        q8_of(o, want_q, want_d);
        CUDA_OK(cudaMemcpy(got_q.data(), qd.p, got_q.size(), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(got_d.data(), dd.p, got_d.size() * 8, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::memcmp(want_q.data(), got_q.data(), got_q.size()), 0) << what << ": levels";
        EXPECT_EQ(std::memcmp(want_d.data(), got_d.data(), got_d.size() * 8), 0) << what << ": scales";
        size_t nonzero = 0;
        for (int8_t v : got_q) nonzero += v != 0;
        EXPECT_GT(nonzero, got_q.size() / 2) << what;
    };
    for (int64_t D : {64, 128, 256}) {
        const int64_t n_kv = 2, group = 8, n_head = n_kv * group, n_ctx = 64, T = 3, cols = n_kv * D;
        const size_t rb = size_t(cols) * 2;
        const std::vector<float> kf = randn(size_t(T * n_ctx * cols), uint64_t(D) + 11),
                                 vf = randn(size_t(T * n_ctx * cols), uint64_t(D) + 12),
                                 q = randn(size_t(T * n_head * D), uint64_t(D) + 13);
        std::vector<uint16_t> kh(kf.size()), vh(vf.size());
        for (size_t i = 0; i < kf.size(); i++) kh[i] = f32_to_f16(kf[i]), vh[i] = f32_to_f16(vf[i]);
        const std::vector<int32_t> pos = {5, 8, 63};
        std::vector<cuda::AttnTile> tiles;
        for (int32_t r = 0; r < int32_t(T); r++) tiles.push_back({r, 1, r, pos[size_t(r)]});
        DevBuf kd(kh.size() * 2), vd(vh.size() * 2), qd(q.size() * 4), od(q.size() * 4),
            td(tiles.size() * sizeof(cuda::AttnTile)),
            ws(cuda::flash_decode_workspace_floats(int(T), n_kv, group, 1, D) * 4), q8q(q.size()),
            q8d(q.size() / 32 * 8);
        CUDA_OK(cudaMemcpy(kd.p, kh.data(), kh.size() * 2, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(vd.p, vh.data(), vh.size() * 2, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(qd.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(cuda::AttnTile), cudaMemcpyHostToDevice));
        const cuda::KvCacheView c{KvType::F16, kd.as<uint8_t>(), vd.as<uint8_t>(), rb, n_ctx, cols};
        const cuda::Rows qr{qd.as<float>(), T, n_head * D, n_head * D}, orow{od.as<float>(), T, n_head * D, n_head * D};
        const cuda::NormQ8 q8{q8q.as<int8_t>(), q8d.as<float2>(), 1};
        for (bool split : {false, true}) {
            CUDA_OK(cudaMemset(q8q.p, 0x55, q.size()));
            cuda::launch_flash_decode(c, qr, orow, n_head, n_kv, D, 1.0f / std::sqrt(float(D)), td.as<cuda::AttnTile>(),
                                      int(T), 1, nullptr, split ? ws.as<float>() : nullptr, q8);
            CUDA_OK(cudaDeviceSynchronize());
            compare(orow, q8q, q8d, "decode kernel, head " + std::to_string(D) + (split ? ", split" : ", one block"));
        }
        // the tiled kernel's merge (Vector form) from random partials, one vector's values all zero
        const int M = 16, n_split = 5, n_tiles = 2, rows = 3;
        const std::vector<cuda::AttnTile> mt{{0, 2, 0, 100}, {2, 1, 1, 7}};
        const size_t n_ws = size_t(n_tiles) * n_kv * n_split * M * (D + 2);
        std::vector<float> mw = randn(n_ws, uint64_t(D) + 14, 2.0f);
        for (size_t i = 0; i < n_ws / size_t(D + 2); i++) {
            float *p = mw.data() + i * size_t(D + 2);
            p[D + 1] = std::fabs(p[D + 1]) + 0.5f;
            if (i % 7 == 2) p[D] = -INFINITY, p[D + 1] = 0.0f;  // a split that saw no key
        }
        for (int s2 = 0; s2 < n_split; s2++)  // tile 0, KV head 0, vector 1: zeros in every split
            std::fill_n(mw.begin() + std::ptrdiff_t((size_t(s2) * M + 1) * size_t(D + 2)), D, 0.0f);
        const int64_t mcols = int64_t(n_kv) * group * D;
        DevBuf mwd(n_ws * 4), mtd(mt.size() * sizeof(cuda::AttnTile)), mo(size_t(rows * mcols) * 4),
            mq(size_t(rows * mcols)), mdd(size_t(rows * mcols / 32) * 8);
        CUDA_OK(cudaMemcpy(mwd.p, mw.data(), n_ws * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(mtd.p, mt.data(), mt.size() * sizeof(cuda::AttnTile), cudaMemcpyHostToDevice));
        const cuda::Rows mr{mo.as<float>(), rows, mcols, mcols};
        ASSERT_TRUE(cuda::flash_merge_quantizes(n_split));
        cuda::launch_flash_merge(mr, D, M, int(group), int(n_kv), mtd.as<cuda::AttnTile>(), n_tiles, n_split,
                                 mwd.as<float>(), nullptr, cuda::MergeForm::Vector,
                                 cuda::NormQ8{mq.as<int8_t>(), mdd.as<float2>(), 1});
        CUDA_OK(cudaDeviceSynchronize());
        compare(mr, mq, mdd, "tiled merge, head " + std::to_string(D));
    }
}

// The tensor-core prefill attention's heavy-first block order against the order of the tiles, bit for bit: two
// sequences (a 300-token prompt and 37 tokens after 90 cached positions), GQA groups of 8 and 1, head sizes 64, 128 and
// 256, whole and with the keys split over blocks (merged).
TEST(CudaFlashMma, HeavyFirstIsTheTileOrdersBits) {
    int sm_major = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sm_major, cudaDevAttrComputeCapabilityMajor, 0));
    if (!cuda::flash_mma_applies(KvType::F16, 128, 8, sm_major)) GTEST_SKIP() << "no tensor-core attention here";
    const int64_t n_ctx = 400;
    for (int64_t D : {64, 128, 256})
        for (int64_t group : {8, 1}) {
            const int64_t n_kv = 2, n_head = n_kv * group, kvc = n_kv * D, qc = n_head * D;
            const int64_t P0 = 300, P1 = 37, done1 = 90, rows = P0 + P1;
            // Keys and values of every position of both sequences, stored through the cache's own store.
            const int64_t n_pos = 2 * n_ctx;
            std::vector<float> k = randn(size_t(n_pos * kvc), uint64_t(D + group)),
                               v = randn(size_t(n_pos * kvc), uint64_t(D + group + 1));
            std::vector<int2> sp(static_cast<size_t>(n_pos));
            for (int64_t i = 0; i < n_pos; i++) sp[size_t(i)] = int2{int(i / n_ctx), int(i % n_ctx)};
            DevBuf kd(size_t(n_pos * kvc) * 4), vd(size_t(n_pos * kvc) * 4), spd(sp.size() * 8);
            DevBuf kc(size_t(n_pos * kvc) * 2), vc(size_t(n_pos * kvc) * 2);
            CUDA_OK(cudaMemcpy(kd.p, k.data(), k.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(vd.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(spd.p, sp.data(), sp.size() * 8, cudaMemcpyHostToDevice));
            const cuda::KvCacheView c{KvType::F16, kc.as<uint8_t>(), vc.as<uint8_t>(), size_t(kvc) * 2, n_ctx, kvc};
            cuda::launch_kv_store(c, cuda::Rows{kd.as<float>(), n_pos, kvc, kvc},
                                  cuda::Rows{vd.as<float>(), n_pos, kvc, kvc}, spd.as<int2>(), nullptr);
            // Rows 0..P0-1: sequence 0 from position 0; rows P0..: sequence 1 from position done1.
            const int rpt = cuda::flash_mma_rows_per_tile(group);
            std::vector<cuda::AttnTile> tiles;
            for (int64_t r = 0; r < P0; r += rpt)
                tiles.push_back({int32_t(r), int32_t(std::min<int64_t>(rpt, P0 - r)), 0, int32_t(r)});
            for (int64_t r = 0; r < P1; r += rpt)
                tiles.push_back({int32_t(P0 + r), int32_t(std::min<int64_t>(rpt, P1 - r)), 1, int32_t(done1 + r)});
            const int n_tiles = int(tiles.size());
            DevBuf td(tiles.size() * sizeof(cuda::AttnTile));
            CUDA_OK(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(cuda::AttnTile), cudaMemcpyHostToDevice));
            const std::vector<float> q = randn(size_t(rows * qc), uint64_t(D * 7 + group));
            DevBuf qd(q.size() * 4), o1(q.size() * 4), o2(q.size() * 4);
            CUDA_OK(cudaMemcpy(qd.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
            const float scale = 1.0f / std::sqrt(float(D));
            for (int n_split : {1, 3}) {
                const int chunk = n_split == 1 ? 1 << 30 : 128;
                const size_t n_ws = cuda::flash_mma_workspace_floats(n_tiles, n_kv, n_split, D);
                DevBuf ws(std::max<size_t>(n_ws, 1) * 4);
                std::vector<float> a(q.size()), b(q.size());
                for (int order = 0; order < 2; order++) {
                    DevBuf &o = order ? o2 : o1;
                    CUDA_OK(cudaMemset(o.p, 0xff, q.size() * 4));
                    cuda::launch_flash_attention_mma(c, cuda::Rows{qd.as<float>(), rows, qc, qc},
                                                     cuda::Rows{o.as<float>(), rows, qc, qc}, n_head, n_kv, D, scale,
                                                     td.as<cuda::AttnTile>(), n_tiles, n_split, chunk,
                                                     n_split > 1 ? ws.as<float>() : nullptr, nullptr, order == 1);
                }
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaMemcpy(a.data(), o1.p, a.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(b.data(), o2.p, b.size() * 4, cudaMemcpyDeviceToHost));
                size_t finite = 0;
                for (float x : a) finite += std::isfinite(x);
                EXPECT_EQ(finite, a.size()) << "D " << D << ", group " << group << ": every output written";
                EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
                    << "D " << D << ", group " << group << ", " << n_split << " splits";
            }
        }
}

// A decoding MoE layer's tail in one launch against the launches it replaces (combine, shared expert, residual add
// and norm), bit for bit: with and without the shared expert and the norm, 1 and 3 tokens, rows of 1024 to 6144
// floats (each KPT form), the normed rows written over the layer's input as the trunk does; the one launch with its
// reads before its wait and after it (early), its pairs' rows loaded one pair at a time and ahead.
TEST(CudaMoeTail, OneLaunchIsTheSeparateOnes) {
    const int64_t k = 8, n_pairs_per_token = k;
    for (int64_t E : {1024, 2048, 4096, 6144})
        for (int64_t T : {1, 3})
            for (int form = 0; form < 4; form++) {
                const bool shared = form & 1, norm = form & 2;
                const int64_t M = T * n_pairs_per_token;
                const uint64_t seed = uint64_t(E * 10 + T * 4 + form);
                std::vector<float> ys = randn(size_t(M * E), seed), x = randn(size_t(T * E), seed + 1),
                                   sy = randn(size_t(T * E), seed + 2), resid = randn(size_t(T * E), seed + 3, 4.0f),
                                   gw = randn(size_t(E), seed + 4, 0.05f), nw = randn(size_t(E), seed + 5),
                                   wts = randn(size_t(M), seed + 6);
                std::vector<int32_t> yrow(static_cast<size_t>(M)), widx(static_cast<size_t>(M));
                for (int64_t t = 0; t < T; t++)
                    for (int64_t j = 0; j < k; j++) {  // a token's pairs in some order of rows
                        yrow[size_t(t * k + j)] = int32_t(t * k + (j * 3) % k);
                        widx[size_t(t * k + j)] = int32_t(t * k + (j * 5) % k);
                    }
                DevBuf d_ys(ys.size() * 4), d_sy(sy.size() * 4), d_gw(gw.size() * 4), d_nw(nw.size() * 4),
                    d_w(wts.size() * 4), d_yrow(yrow.size() * 4), d_widx(widx.size() * 4);
                CUDA_OK(cudaMemcpy(d_ys.p, ys.data(), ys.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_sy.p, sy.data(), sy.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_gw.p, gw.data(), gw.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_nw.p, nw.data(), nw.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_w.p, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_yrow.p, yrow.data(), yrow.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_widx.p, widx.data(), widx.size() * 4, cudaMemcpyHostToDevice));
                // [separate, one launch, early, ahead, early and ahead][out, resid, normed]
                std::vector<float> got[5][3];
                DevBuf d_q(size_t(T * E)), d_ds(size_t(T * E / 32) * 8), d_q2(size_t(T * E)), d_ds2(size_t(T * E / 32) * 8);
                for (int fused = 0; fused < 5; fused++) {
                    DevBuf d_x(x.size() * 4), d_out(x.size() * 4), d_res(resid.size() * 4);
                    CUDA_OK(cudaMemcpy(d_x.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemcpy(d_res.p, resid.data(), resid.size() * 4, cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemset(d_out.p, 0xff, x.size() * 4));
                    const cuda::Rows r_ys{d_ys.as<float>(), M, E, E}, r_x{d_x.as<float>(), T, E, E},
                        r_sy{d_sy.as<float>(), T, E, E}, r_out{d_out.as<float>(), T, E, E},
                        r_res{d_res.as<float>(), T, E, E};
                    const auto *yr = static_cast<const int32_t *>(d_yrow.p), *wi = static_cast<const int32_t *>(d_widx.p);
                    ASSERT_TRUE(cuda::moe_tail_fuses(r_out, E));
                    if (fused) {
                        const cuda::NormQ8 q8{d_q.as<int8_t>(), d_ds.as<float2>(), norm ? (E % 256 == 0 ? 2 : 1) : 0};
                        cuda::launch_moe_tail(r_ys, yr, wi, d_w.as<float>(), k, r_x,
                                              shared ? d_gw.as<float>() : nullptr, r_sy, r_out, r_res,
                                              norm ? d_nw.as<float>() : nullptr, 1e-6f, r_x, nullptr, q8,
                                              fused % 2 == 0, fused >= 3);  // the 8-bit form: the last written
                    } else {
                        cuda::launch_moe_combine(r_ys, yr, wi, d_w.as<float>(), k, r_out, nullptr);
                        if (shared) cuda::launch_shared_expert_add(r_x, d_gw.as<float>(), r_sy, r_out, nullptr);
                        if (norm) cuda::launch_add_rms_norm(r_res, r_out, d_nw.as<float>(), E, 1e-6f, r_x, nullptr);
                    }
                    CUDA_OK(cudaDeviceSynchronize());
                    for (int i = 0; i < 3; i++) got[fused][i].resize(x.size());
                    CUDA_OK(cudaMemcpy(got[fused][0].data(), d_out.p, x.size() * 4, cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(got[fused][1].data(), d_res.p, x.size() * 4, cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(got[fused][2].data(), d_x.p, x.size() * 4, cudaMemcpyDeviceToHost));
                }
                for (int f = 1; f < 5; f++)
                    for (int i = 0; i < 3; i++)
                        ASSERT_EQ(std::memcmp(got[0][i].data(), got[f][i].data(), x.size() * 4), 0)
                            << "E " << E << ", T " << T << ", shared " << shared << ", norm " << norm << ", part " << i
                            << (f % 2 == 0 ? ", reads early" : "") << (f >= 3 ? ", loads ahead" : "");
                if (norm) {  // the normed rows' 8-bit form, as launch_quantize_act makes it from them
                    DevBuf d_n(x.size() * 4);
                    CUDA_OK(cudaMemcpy(d_n.p, got[1][2].data(), x.size() * 4, cudaMemcpyHostToDevice));
                    cuda::launch_quantize_act(E % 256 == 0 ? DType::Q8_K : DType::Q8_0, d_n.as<float>(), E, T, E,
                                              d_q2.as<int8_t>(), d_ds2.as<float2>(), nullptr);
                    CUDA_OK(cudaDeviceSynchronize());
                    std::vector<uint8_t> a(size_t(T * E) + size_t(T * E / 32) * 8), b(a.size());
                    CUDA_OK(cudaMemcpy(a.data(), d_q.p, size_t(T * E), cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(b.data(), d_q2.p, size_t(T * E), cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(a.data() + T * E, d_ds.p, size_t(T * E / 32) * 8, cudaMemcpyDeviceToHost));
                    CUDA_OK(cudaMemcpy(b.data() + T * E, d_ds2.p, size_t(T * E / 32) * 8, cudaMemcpyDeviceToHost));
                    EXPECT_EQ(a, b) << "E " << E << ", T " << T << ", shared " << shared << ": 8-bit form";
                }
                // the combination was written and the norm moved the input where asked
                EXPECT_TRUE(std::isfinite(got[1][0][0]) && got[1][0][0] != 0.0f);
                EXPECT_EQ(norm, std::memcmp(got[1][2].data(), x.data(), x.size() * 4) != 0);
            }
}

// A norm's 8-bit output made by the norm's kernel (NormQ8) against launch_quantize_act of its output, bit for bit:
// the Q8_0 and Q8_K forms, rows of 1024 to 4096 values (a partial turn of the kernel's threads at 2304), one and
// three rows, the residual form and the plain one; rows with a block of zeros, a NaN, equal magnitudes of either
// sign (the first by index is the Q8_K pick) and a huge value. And the MoE tail's normed rows likewise.
TEST(CudaNormQuant, EpilogueIsTheQuantizeKernel) {
    uint64_t seed = 8300;
    for (int form : {1, 2})
        for (int64_t E : {1024, 2048, 2304, 4096})
            for (int64_t T : {1, 3})
                for (int add = 0; add < 2; add++) {
                    const DType vt = form == 2 ? DType::Q8_K : DType::Q8_0;
                    std::vector<float> x = randn(size_t(T * E), seed++), y = randn(size_t(T * E), seed++),
                                       w = randn(size_t(E), seed++);
                    for (int64_t c = 256; c < 512; c++) x[size_t(c)] = 0.0f, y[size_t(c)] = 0.0f;  // a zero block
                    x[size_t(E / 2 + 3)] = 40.0f, x[size_t(E / 2 + 9)] = -40.0f;  // equal magnitudes
                    y[size_t(E / 2 + 3)] = 0.0f, y[size_t(E / 2 + 9)] = 0.0f;
                    if (T > 1) x[size_t(E + 700)] = std::nanf("");
                    if (T > 2) x[size_t(2 * E + 5)] = 1e30f;
                    DevBuf xd(x.size() * 4), yd(y.size() * 4), wd(w.size() * 4), o1(x.size() * 4), o2(x.size() * 4),
                        q1(x.size()), q2(x.size()), d1(x.size() / 32 * 8), d2(x.size() / 32 * 8), x2(x.size() * 4);
                    CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemcpy(x2.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemcpy(yd.p, y.data(), y.size() * 4, cudaMemcpyHostToDevice));
                    CUDA_OK(cudaMemcpy(wd.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
                    const cuda::Rows rx{xd.as<float>(), T, E, E}, rx2{x2.as<float>(), T, E, E},
                        ry{yd.as<float>(), T, E, E}, r1{o1.as<float>(), T, E, E}, r2{o2.as<float>(), T, E, E};
                    ASSERT_TRUE(cuda::norm_quantizes(rx, r1, E, wd.as<float>(), form));
                    const cuda::NormQ8 q8{q1.as<int8_t>(), d1.as<float2>(), form};
                    if (add) {
                        cuda::launch_add_rms_norm(rx, ry, wd.as<float>(), E, 1e-6f, r1, nullptr, q8);
                        cuda::launch_add_rms_norm(rx2, ry, wd.as<float>(), E, 1e-6f, r2, nullptr);
                    } else {
                        cuda::launch_rms_norm(rx, wd.as<float>(), E, 1e-6f, r1, nullptr, q8);
                        cuda::launch_rms_norm(rx2, wd.as<float>(), E, 1e-6f, r2, nullptr);
                    }
                    cuda::launch_quantize_act(vt, o2.as<float>(), E, T, E, q2.as<int8_t>(), d2.as<float2>(), nullptr);
                    CUDA_OK(cudaDeviceSynchronize());
                    const std::string what = std::string(dtype_name(vt)) + ", " + std::to_string(E) + " x " +
                                             std::to_string(T) + (add ? ", residual" : "");
                    auto same = [&](DevBuf &a, DevBuf &b, size_t n, const char *part) {
                        std::vector<uint8_t> ha(n), hb(n);
                        CUDA_OK(cudaMemcpy(ha.data(), a.p, n, cudaMemcpyDeviceToHost));
                        CUDA_OK(cudaMemcpy(hb.data(), b.p, n, cudaMemcpyDeviceToHost));
                        EXPECT_EQ(ha, hb) << what << ": " << part;
                    };
                    same(o1, o2, x.size() * 4, "normed rows");
                    same(q1, q2, x.size(), "levels");
                    same(d1, d2, x.size() / 32 * 8, "scales");
                }
}

TEST(CudaFlashDecode, SplitFormIsTheOneBlockForm) {
    for (KvType kt : {KvType::F16, KvType::F32})
        for (int64_t D : {64, 128}) {
            const int64_t n_kv = 4, group = 8, n_head = n_kv * group, n_ctx = 64, n_seq = 3, cols = n_kv * D;
            const size_t rb = kv_row_bytes(kt, cols);
            std::vector<float> kf = randn(size_t(n_seq * n_ctx * cols), uint64_t(D) + 1),
                               vf = randn(size_t(n_seq * n_ctx * cols), uint64_t(D) + 2);
            std::vector<uint8_t> kb(rb * size_t(n_seq * n_ctx)), vb(kb.size());
            for (int64_t r = 0; r < n_seq * n_ctx; r++)
                for (int64_t i = 0; i < cols; i++) {
                    float &a = kf[size_t(r * cols + i)], &b = vf[size_t(r * cols + i)];
                    if (kt == KvType::F16) {
                        const uint16_t ha = f32_to_f16(a), hb = f32_to_f16(b);
                        a = f16_to_f32(ha), b = f16_to_f32(hb);
                        std::memcpy(kb.data() + size_t(r) * rb + size_t(i) * 2, &ha, 2);
                        std::memcpy(vb.data() + size_t(r) * rb + size_t(i) * 2, &hb, 2);
                    } else {
                        std::memcpy(kb.data() + size_t(r) * rb + size_t(i) * 4, &a, 4);
                        std::memcpy(vb.data() + size_t(r) * rb + size_t(i) * 4, &b, 4);
                    }
                }
            // one query row per sequence, at positions 5, 8 (a part's first) and 63
            const std::vector<int32_t> pos = {5, 8, 63};
            const int64_t T = int64_t(pos.size());
            const std::vector<float> q = randn(size_t(T * n_head * D), uint64_t(D) + 3);
            std::vector<cuda::AttnTile> tiles;
            for (int32_t r = 0; r < int32_t(T); r++) tiles.push_back({r, 1, r, pos[size_t(r)]});
            DevBuf kd(kb.size()), vd(vb.size()), qd(q.size() * 4), od(q.size() * 4), o2(q.size() * 4),
                td(tiles.size() * sizeof(cuda::AttnTile)),
                ws(cuda::flash_decode_workspace_floats(int(T), n_kv, group, 1, D) * 4);
            CUDA_OK(cudaMemcpy(kd.p, kb.data(), kb.size(), cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(vd.p, vb.data(), vb.size(), cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(qd.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(cuda::AttnTile), cudaMemcpyHostToDevice));
            const cuda::KvCacheView c{kt, kd.as<uint8_t>(), vd.as<uint8_t>(), rb, n_ctx, cols};
            const float scale = 1.0f / std::sqrt(float(D));
            const cuda::Rows qr{qd.as<float>(), T, n_head * D, n_head * D}, orow{od.as<float>(), T, n_head * D, n_head * D},
                o2row{o2.as<float>(), T, n_head * D, n_head * D};
            cuda::launch_flash_decode(c, qr, orow, n_head, n_kv, D, scale, td.as<cuda::AttnTile>(), int(T), 1, nullptr);
            cuda::launch_flash_decode(c, qr, o2row, n_head, n_kv, D, scale, td.as<cuda::AttnTile>(), int(T), 1, nullptr,
                                      ws.as<float>());
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<float> one(q.size()), split(q.size());
            CUDA_OK(cudaMemcpy(one.data(), od.p, one.size() * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(split.data(), o2.p, split.size() * 4, cudaMemcpyDeviceToHost));
            const std::string what = std::string(kt == KvType::F16 ? "f16" : "f32") + " cache, head size " +
                                     std::to_string(D);
            for (int64_t r = 0; r < T; r++)
                for (int64_t h = 0; h < n_head; h++) {
                    const int64_t kvh = h / group, p = pos[size_t(r)];
                    std::vector<double> sc(size_t(p + 1));
                    double mx = -1e300;
                    for (int64_t j = 0; j <= p; j++) {
                        double d = 0;
                        for (int64_t i = 0; i < D; i++)
                            d += double(q[size_t((r * n_head + h) * D + i)]) *
                                 double(kf[size_t((r * n_ctx + j) * cols + kvh * D + i)]);
                        sc[size_t(j)] = d * scale;
                        mx = std::max(mx, sc[size_t(j)]);
                    }
                    double l = 0;
                    for (double &x : sc) l += (x = std::exp(x - mx));
                    for (int64_t i = 0; i < D; i++) {
                        double o = 0;
                        for (int64_t j = 0; j <= p; j++)
                            o += sc[size_t(j)] * double(vf[size_t((r * n_ctx + j) * cols + kvh * D + i)]);
                        const size_t at = size_t((r * n_head + h) * D + i);
                        const double want = o / l;
                        ASSERT_NEAR(split[at], want, 2e-5 * std::max(1.0, std::fabs(want)))
                            << what << ", row " << r << " head " << h << " dim " << i;
                        ASSERT_NEAR(split[at], one[at], 2e-5 * std::max(1.0f, std::fabs(one[at])))
                            << what << ", row " << r << " head " << h << " dim " << i;
                    }
                }
            // the merge with every part loaded before any is added: the same bits
            cuda::launch_flash_decode(c, qr, o2row, n_head, n_kv, D, scale, td.as<cuda::AttnTile>(), int(T), 1, nullptr,
                                      ws.as<float>(), {}, true);
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<float> ahead(q.size());
            CUDA_OK(cudaMemcpy(ahead.data(), o2.p, ahead.size() * 4, cudaMemcpyDeviceToHost));
            EXPECT_EQ(std::memcmp(ahead.data(), split.data(), split.size() * 4), 0) << what << ", merge loads ahead";
            // the last row's tile alone: the same bits
            cuda::launch_flash_decode(c, qr, o2row, n_head, n_kv, D, scale, td.as<cuda::AttnTile>() + 2, 1, 1, nullptr,
                                      ws.as<float>());
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<float> alone(q.size());
            CUDA_OK(cudaMemcpy(alone.data(), o2.p, alone.size() * 4, cudaMemcpyDeviceToHost));
            const size_t row2 = size_t(2 * n_head * D);
            EXPECT_EQ(std::memcmp(alone.data() + row2, split.data() + row2, size_t(n_head * D) * 4), 0) << what;
        }
}

// The host copy of the decode mat-vec (backend/host/mmvq_host.h) against the kernels bit for bit: the activations'
// 8-bit form (k_quantize_act_q8_0 / _q8_k) and every mat-vec type's dot products, one and three activation rows,
// row lengths with fewer sub-blocks than a warp's lanes, several per lane and a partial turn, a decoding row's loads
// one sub-block at a time and ahead (MatmulArgs::loads_ahead: 2 a lane at k 2048, 4 at 2304 and 5120). This is what
// lets a decoding expert run on the CPU without changing a bit of the result.
TEST(MmvqHost, IsTheKernelBitForBit) {
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::IQ4_XS, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                    DType::IQ2_XXS, DType::IQ1_M}) {
        for (int64_t k : {256, 768, 2048, 2304, 5120}) {
            const DType vt = dot_act_type(t);
            const int64_t n = 37, R = 3;
            QuantizedProduct qp(t, k, n, R, uint64_t(k) * 31 + 1, uint64_t(k) * 31 + 2);
            const size_t rb = qp.rb;
            const std::vector<uint8_t> &w = qp.w;
            const std::vector<float> &x = qp.x;
            DevBuf &xd = qp.xd, &qd = qp.qd, &dd = qp.dd, &yd = qp.yd;
            cuda::launch_mmvq(qp.a, nullptr);
            CUDA_OK(cudaDeviceSynchronize());
            std::vector<int8_t> qg(size_t(R * k));
            std::vector<ActScale> dg(size_t(R * k / 32));
            std::vector<float> yg(size_t(R * n));
            CUDA_OK(cudaMemcpy(qg.data(), qd.p, qg.size(), cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(dg.data(), dd.p, dg.size() * 8, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(yg.data(), yd.p, yg.size() * 4, cudaMemcpyDeviceToHost));
            const std::string what = std::string(dtype_name(t)) + ", k " + std::to_string(k);
            // the one-activation-row form on the first row, its loads one sub-block at a time and ahead: the same bits
            for (int ahead : {0, 1}) {
                cuda::MatmulArgs a1 = qp.a;
                a1.single.n_rows = 1;
                a1.loads_ahead = ahead;
                CUDA_OK(cudaMemset(yd.p, 0xff, yg.size() * 4));
                cuda::launch_mmvq(a1, nullptr, true);
                CUDA_OK(cudaDeviceSynchronize());
                std::vector<float> yf(static_cast<size_t>(n));  // y row 0: n values
                CUDA_OK(cudaMemcpy(yf.data(), yd.p, yf.size() * 4, cudaMemcpyDeviceToHost));
                ASSERT_EQ(std::memcmp(yf.data(), yg.data(), yf.size() * 4), 0)
                    << what << ", one activation row" << (ahead ? ", loads ahead" : "");
            }
            {  // a group table (a decoding token's experts), read after the wait and before it (groups_early; with
               // STRATA_CUDA_MMVQ_STAGE=1 its rows staged), loads one at a time and ahead: the bits of the single
               // launch
                const cuda::MatmulGroup gs[2] = {{qp.wd.p, 2, 1, 0}, {qp.wd.p, 0, 1, 1}};
                DevBuf gd(sizeof(gs));
                CUDA_OK(cudaMemcpy(gd.p, gs, sizeof(gs), cudaMemcpyHostToDevice));
                for (int form = 0; form < 4; form++) {
                    const bool early = form & 1;
                    cuda::MatmulArgs ag = qp.a;
                    ag.groups = gd.as<cuda::MatmulGroup>();
                    ag.n_groups = 2;
                    ag.groups_early = early;
                    ag.loads_ahead = form >> 1;
                    CUDA_OK(cudaMemset(yd.p, 0xff, yg.size() * 4));
                    cuda::launch_mmvq(ag, nullptr, true);
                    CUDA_OK(cudaDeviceSynchronize());
                    std::vector<float> yt(size_t(2 * n));
                    CUDA_OK(cudaMemcpy(yt.data(), yd.p, yt.size() * 4, cudaMemcpyDeviceToHost));
                    const std::string how = std::string(early ? ", early" : "") + (form >> 1 ? ", loads ahead" : "");
                    ASSERT_EQ(std::memcmp(yt.data(), yg.data() + 2 * n, size_t(n) * 4), 0)
                        << what << ", group of activation row 2" << how;
                    ASSERT_EQ(std::memcmp(yt.data() + n, yg.data(), size_t(n) * 4), 0)
                        << what << ", group of activation row 0" << how;
                }
            }
            {  // the gated form (an expert's down-matrix input): silu(x) * m quantized, on the device and here
                const std::vector<float> m = randn(size_t(R * k), uint64_t(k) * 31 + 3);
                DevBuf md(m.size() * 4), q2(size_t(R * k)), d2(size_t(R * k / 32) * 8);
                CUDA_OK(cudaMemcpy(md.p, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
                cuda::launch_quantize_act(vt, xd.as<float>(), k, R, k, q2.as<int8_t>(), d2.as<float2>(), nullptr,
                                          md.as<float>(), k);
                CUDA_OK(cudaDeviceSynchronize());
                std::vector<int8_t> qg2(size_t(R * k)), qh2(size_t(R * k));
                std::vector<ActScale> dg2(size_t(R * k / 32)), dh2(size_t(R * k / 32));
                CUDA_OK(cudaMemcpy(qg2.data(), q2.p, qg2.size(), cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(dg2.data(), d2.p, dg2.size() * 8, cudaMemcpyDeviceToHost));
                for (int64_t r = 0; r < R; r++)
                    quantize_act_gpu(vt, x.data() + r * k, k, qh2.data() + r * k, dh2.data() + r * (k / 32),
                                     m.data() + r * k);
                ASSERT_EQ(std::memcmp(qh2.data(), qg2.data(), qh2.size()), 0) << what << ", gated";
                ASSERT_EQ(std::memcmp(dh2.data(), dg2.data(), dh2.size() * 8), 0) << what << ", gated";
            }
            for (int64_t r = 0; r < R; r++) {
                std::vector<int8_t> qh(static_cast<size_t>(k));
                std::vector<ActScale> dh(static_cast<size_t>(k / 32));
                quantize_act_gpu(vt, x.data() + r * k, k, qh.data(), dh.data());
                ASSERT_EQ(std::memcmp(qh.data(), qg.data() + r * k, size_t(k)), 0) << what << ", row " << r;
                ASSERT_EQ(std::memcmp(dh.data(), dg.data() + r * (k / 32), dh.size() * 8), 0) << what << ", row " << r;
                for (int64_t j = 0; j < n; j++) {
                    const float h = mmvq_host_dot(t, w.data() + size_t(j) * rb, k, qh.data(), dh.data());
                    const float g = yg[size_t(r * n + j)];
                    ASSERT_EQ(std::memcmp(&h, &g, 4), 0)
                        << what << ", activation row " << r << ", weight row " << j << ": host " << h << ", GPU " << g;
                }
            }
        }
    }
}

// One token through one expert on the host (expert_ffn_host) and through the decode kernels in the order the MoE
// path launches them (x quantized, gate and up, silu(gate) * up quantized, down): the same bits, for every mat-vec
// type and the common mix of Q4_K gate and up with a Q6_K down matrix.
TEST(MmvqHost, ExpertOnTheHostIsTheKernels) {
    struct Mix {
        DType gu, down;
    };
    std::vector<Mix> mixes{{DType::Q4_K, DType::Q6_K}};
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::IQ4_XS, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                    DType::IQ2_XXS, DType::IQ1_M})
        mixes.push_back({t, t});
    const int64_t E = 512, F = 768;
    for (const Mix &mx : mixes) {
        std::vector<std::vector<uint8_t>> host(3);
        std::vector<std::unique_ptr<DevBuf>> dev;
        const DType types[3] = {mx.gu, mx.gu, mx.down};
        const int64_t ks[3] = {E, E, F}, ns[3] = {F, F, E};
        HostMatrix hm[3];
        for (int i = 0; i < 3; i++) {
            const size_t rb = row_bytes(types[i], ks[i]);
            const std::vector<float> f = randn(size_t(ks[i] * ns[i]), uint64_t(100 + i), 0.05f);
            host[size_t(i)].resize(rb * size_t(ns[i]));
            for (int64_t r = 0; r < ns[i]; r++)
                quantize_row(types[i], f.data() + r * ks[i], host[size_t(i)].data() + size_t(r) * rb, ks[i]);
            dev.push_back(std::make_unique<DevBuf>(host[size_t(i)].size()));
            CUDA_OK(cudaMemcpy(dev.back()->p, host[size_t(i)].data(), host[size_t(i)].size(), cudaMemcpyHostToDevice));
            hm[i] = {types[i], host[size_t(i)].data(), rb, ks[i], ns[i]};
        }
        const std::vector<float> x = randn(size_t(E), 7);
        DevBuf xd(size_t(E) * 4), q(static_cast<size_t>(F)), ds(size_t(F / 32) * 8), g(size_t(F) * 4), u(size_t(F) * 4),
            y(size_t(E) * 4);
        CUDA_OK(cudaMemcpy(xd.p, x.data(), size_t(E) * 4, cudaMemcpyHostToDevice));
        auto matvec = [&](int i, float *out) {
            cuda::MatmulArgs a;
            a.type = types[i];
            a.k = ks[i];
            a.n = ns[i];
            a.row_bytes = hm[i].row_bytes;
            a.xq = q.as<int8_t>();
            a.xds = ds.as<float2>();
            a.y = out;
            a.y_stride = ns[i];
            a.single = {dev[size_t(i)]->p, 0, 1, 0};
            cuda::launch_mmvq(a, nullptr);
        };
        cuda::launch_quantize_act(dot_act_type(mx.gu), xd.as<float>(), E, 1, E, q.as<int8_t>(), ds.as<float2>(),
                                  nullptr);
        matvec(0, g.as<float>());
        matvec(1, u.as<float>());
        cuda::launch_quantize_act(dot_act_type(mx.down), g.as<float>(), F, 1, F, q.as<int8_t>(), ds.as<float2>(),
                                  nullptr, u.as<float>(), F);
        matvec(2, y.as<float>());
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> yg(static_cast<size_t>(E)), yh(static_cast<size_t>(E));
        CUDA_OK(cudaMemcpy(yg.data(), y.p, size_t(E) * 4, cudaMemcpyDeviceToHost));
        expert_ffn_host(hm[0], hm[1], hm[2], x.data(), yh.data());
        EXPECT_EQ(std::memcmp(yg.data(), yh.data(), size_t(E) * 4), 0)
            << dtype_name(mx.gu) << " gate and up, " << dtype_name(mx.down) << " down";
    }
}

// ---- uploads ---------------------------------------------------------------------------------------------------

// The SMs' copy out of mapped pinned memory: every byte of every row where it belongs, nothing outside the rows
// touched, for the 16-, 4- and 1-byte forms (offsets and sizes that allow each), one row or several with a pitch.
TEST(CudaUpload, KernelCopyFromPinnedMemoryIsExact) {
    constexpr size_t k_host = 1 << 16, k_dev = 1 << 17;
    uint8_t *host = nullptr, *host_dev = nullptr;
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void **>(&host), k_host, cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&host_dev), host, 0));
    for (size_t i = 0; i < k_host; i++) host[i] = uint8_t(i * 131 + 7);
    DevBuf dev(k_dev);
    struct Case {
        size_t src_off, dst_off, row, rows, pitch;
    };
    const Case cases[] = {{0, 0, 16, 1, 16},      {0, 0, 163840 / 4, 1, 163840 / 4}, {256, 512, 12288, 1, 12288},
                          {4, 8, 7256, 1, 7256},  {3, 5, 17, 1, 17},                 {0, 0, 1, 1, 1},
                          {0, 64, 4096, 7, 8192}, {16, 32, 48, 100, 112},            {4, 4, 12, 33, 20},
                          {1, 2, 3, 9, 7}};
    std::vector<uint8_t> got(k_dev), want(k_dev);
    for (const Case &c : cases) {
        CUDA_OK(cudaMemset(dev.p, 0xA5, k_dev));
        cuda::launch_copy_from_host(dev.as<uint8_t>() + c.dst_off, c.pitch, host_dev + c.src_off, c.row, c.rows,
                                    nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), dev.p, k_dev, cudaMemcpyDeviceToHost));
        std::fill(want.begin(), want.end(), uint8_t(0xA5));
        for (size_t r = 0; r < c.rows; r++)
            std::memcpy(want.data() + c.dst_off + r * c.pitch, host + c.src_off + r * c.row, c.row);
        EXPECT_EQ(got, want) << "source +" << c.src_off << ", destination +" << c.dst_off << ", " << c.rows << " x "
                             << c.row << " bytes, pitch " << c.pitch;
    }
    CUDA_OK(cudaFreeHost(host));
}

// The host's rows handed over (Backend::rows_handoff): the copy queued before the host writes them starts only at
// the signal, so the rows read back are those written after a wait of the host's, never the buffer's earlier bytes;
// a signal stored before the copy is queued starts it at once; the two buffers in turn, then a larger handoff that
// grows them, the tickets going on.
TEST(CudaUpload, HandoffCopiesTheRowsWrittenBeforeTheSignal) {
    auto gpu = cuda_backend();
    for (int round = 0; round < 6; round++) {
        const int64_t rows = round < 4 ? 5 : 40, cols = round < 4 ? 96 : 2048;  // 40 x 2048 floats: past 64 KiB
        const Act dst = gpu->alloc(rows, cols), after = gpu->alloc(1, cols);
        std::vector<float> old(size_t(rows * cols), -7.0f), want(size_t(rows * cols));
        gpu->upload(old.data(), dst);
        const Backend::RowsHandoff h = gpu->rows_handoff(want.size() * sizeof(float));
        ASSERT_NE(h.host, nullptr);
        for (size_t i = 0; i < want.size(); i++) want[i] = float(round * 100000 + int(i));
        std::fill(h.host, h.host + want.size(), std::nanf(""));
        const bool early = round == 2;  // the signal before the copy is queued
        auto write = [&] {
            std::memcpy(h.host, want.data(), want.size() * sizeof(float));
            std::atomic_ref<uint32_t>(*h.signal).store(h.ticket, std::memory_order_release);
        };
        if (early) write();
        gpu->handoff_rows(h, dst);
        std::vector<float> one(size_t(cols), 1.0f);
        gpu->upload_rows(one.data(), after);  // work queued behind the copy
        std::thread host;
        if (!early)
            host = std::thread([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                write();
            });
        std::vector<float> got(want.size());
        gpu->download(dst, got.data());  // waits for the stream: the copy, so the signal
        if (host.joinable()) host.join();
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "round " << round;
        gpu->reset_scratch();
    }
}

// ---- norms, RoPE, elementwise -----------------------------------------------------------------------------------

TEST(CudaOps, NormsRopeAndElementwiseMatchTheCpu) {
    auto gpu = cuda_backend();
    auto cpu = make_cpu_backend(2);
    const int64_t T = 11, hd = 64, n_head = 4, cols = hd * n_head;
    std::vector<float> a = randn(size_t(T * cols), 1), b = randn(size_t(T * cols), 2), wv = randn(size_t(cols), 3);
    // Weights as a one-layer model's norms, prepared by both backends.
    Model m;
    m.hp.n_layer = 1;
    m.hp.n_embd = cols;
    m.layers.resize(1);
    std::vector<float> wnorm = wv, qnorm(wv.begin(), wv.begin() + hd);
    f32_vector(m.layers[0].attn_norm, wnorm, "attn_norm");
    f32_vector(m.layers[0].q_norm, qnorm, "q_norm");
    const auto gs = place(*gpu, m), cs = place(*cpu, m);

    BatchInfo bi;
    bi.segs = {{0, 5, 4, 0}, {1, 100, 7, 4}};
    bi.n_tokens = T;
    auto run = [&](Backend &be, bool dev) {
        std::vector<std::vector<float>> outs;
        Act x = be.alloc(T, cols), y = be.alloc(T, cols), o = be.alloc(T, cols);
        put(x, a, dev);
        put(y, b, dev);
        be.rms_norm(x, m.layers[0].attn_norm, 1e-6f, o);
        outs.push_back(get(be, o));
        be.rms_norm(o, m.layers[0].q_norm, 1e-6f, o);  // per head, in place
        outs.push_back(get(be, o));
        be.rope(o, RopeParams{hd, 16, 5e6f}, bi);  // partial rotary
        outs.push_back(get(be, o));
        be.rope(o, RopeParams{hd, hd, 1e6f}, bi);
        outs.push_back(get(be, o));
        be.add(x, y, o);
        outs.push_back(get(be, o));
        be.mul_sigmoid(o, y);
        outs.push_back(get(be, o));
        Act half_a = be.alloc(T, cols / 2), half_b = be.alloc(T, cols / 2);
        be.deinterleave(x, 32, half_a, half_b);
        outs.push_back(get(be, half_a));
        outs.push_back(get(be, half_b));
        Act g = be.alloc(3, cols);
        be.gather_rows(x, {10, 0, 4}, g);
        outs.push_back(get(be, g));
        return outs;
    };
    const auto want = run(*cpu, false), got = run(*gpu, true);
    const char *names[] = {"rms_norm",    "rms_norm per head", "rope partial",   "rope full",  "add",
                           "mul_sigmoid", "deinterleave a",    "deinterleave b", "gather_rows"};
    for (size_t i = 0; i < want.size(); i++)
        EXPECT_LE(max_abs_diff(want[i], got[i]), 2e-5f * std::max(1.0f, max_abs(want[i]))) << names[i];
}

// q and k of an attention layer normed and rotated in one launch: bit for bit what rms_norm and rope give on the
// GPU, and the CPU's results within the tolerance above; head sizes 64, 128, 256, partial and full rotation.
TEST(CudaOps, QkNormRopeIsTheSeparateOps) {
    for (auto [hd, n_rot] : {std::pair<int64_t, int64_t>{64, 16}, {64, 64}, {128, 128}, {256, 64}}) {
        auto gpu = cuda_backend();
        auto cpu = make_cpu_backend(2);
        const int64_t T = 9, nq = 4, nk = 2;
        std::vector<float> qn = randn(size_t(hd), 7), kn = randn(size_t(hd), 8);
        Model m;
        m.hp.n_layer = 1;
        m.hp.n_embd = hd;
        m.layers.resize(1);
        f32_vector(m.layers[0].q_norm, qn, "q_norm");
        f32_vector(m.layers[0].k_norm, kn, "k_norm");
        const auto gs = place(*gpu, m), cs = place(*cpu, m);
        BatchInfo bi;
        bi.segs = {{0, 3, 4, 0}, {1, 200, 5, 4}};
        bi.n_tokens = T;
        const std::vector<float> qa = randn(size_t(T * nq * hd), 9), ka = randn(size_t(T * nk * hd), 10);
        const RopeParams rp{hd, n_rot, 1e6f};
        auto run = [&](Backend &be, bool dev, bool fused) {
            Act q = be.alloc(T, nq * hd), k = be.alloc(T, nk * hd);
            put(q, qa, dev);
            put(k, ka, dev);
            if (fused)
                be.qk_norm_rope(q, k, m.layers[0].q_norm, m.layers[0].k_norm, 1e-6f, rp, bi);
            else
                be.Backend::qk_norm_rope(q, k, m.layers[0].q_norm, m.layers[0].k_norm, 1e-6f, rp, bi);
            std::vector<float> out = get(be, q), ko = get(be, k);
            out.insert(out.end(), ko.begin(), ko.end());
            return out;
        };
        const std::vector<float> want = run(*cpu, false, false), sep = run(*gpu, true, false),
                                 got = run(*gpu, true, true);
        const std::string what = "head " + std::to_string(hd) + ", n_rot " + std::to_string(n_rot);
        ASSERT_EQ(got.size(), sep.size());
        EXPECT_EQ(std::memcmp(got.data(), sep.data(), got.size() * 4), 0) << what;
        EXPECT_LE(max_abs_diff(want, got), 2e-5f * std::max(1.0f, max_abs(want))) << what;
    }
}

// The q/k norm's launch storing k and v in the cache as well (STRATA_CUDA_KV_FUSE=1): q and k
// bit for bit those of the launch without the store, and the cache's bytes those launch_kv_store puts from them, for
// f32, f16 and q8_0 caches, head sizes 64, 128 and 256, rows of two sequences at scattered positions; positions the
// rows do not name keep their bytes; and the same launch reading its positions, frequencies and weights before its
// programmatic wait (early: the same bits).
TEST(CudaOps, QkNormRopeStoresTheCachesBytes) {
    for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0})
        for (int64_t hd : {64, 128, 256}) {
            const int64_t T = 5, nq = 4, nk = 2, cols = nk * hd, n_ctx = 40, n_rot = hd / 2;
            const size_t rb = kt == KvType::F32   ? size_t(cols) * 4
                              : kt == KvType::F16 ? size_t(cols) * 2
                                                  : size_t(cols / 32) * 34;
            const size_t cache = rb * size_t(2 * n_ctx);
            const std::vector<float> qa = randn(size_t(T * nq * hd), 31), ka = randn(size_t(T * cols), 32),
                                     va = randn(size_t(T * cols), 33), wq = randn(size_t(hd), 34),
                                     wk = randn(size_t(hd), 35);
            std::vector<float> inv(size_t(n_rot / 2));
            for (size_t i = 0; i < inv.size(); i++) inv[i] = std::pow(1e6f, -2.0f * float(i) / float(n_rot));
            const std::vector<int2> sp = {{0, 3}, {1, 0}, {1, 17}, {0, 39}, {1, 38}};
            std::vector<uint8_t> fill(cache);
            for (size_t i = 0; i < cache; i++) fill[i] = uint8_t(i * 7 + 3);
            DevBuf wqd(wq.size() * 4), wkd(wk.size() * 4), invd(inv.size() * 4), spd(sp.size() * 8);
            CUDA_OK(cudaMemcpy(wqd.p, wq.data(), wq.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(wkd.p, wk.data(), wk.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(invd.p, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(spd.p, sp.data(), sp.size() * 8, cudaMemcpyHostToDevice));
            struct Out {
                std::vector<float> q, k;
                std::vector<uint8_t> kc, vc;
            };
            auto run = [&](bool fused, Out &o, bool early = false) {
                DevBuf qd(qa.size() * 4), kd(ka.size() * 4), vd(va.size() * 4), kc(cache), vc(cache);
                CUDA_OK(cudaMemcpy(qd.p, qa.data(), qa.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(kd.p, ka.data(), ka.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(vd.p, va.data(), va.size() * 4, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(kc.p, fill.data(), cache, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(vc.p, fill.data(), cache, cudaMemcpyHostToDevice));
                const cuda::KvCacheView c{kt, kc.as<uint8_t>(), vc.as<uint8_t>(), rb, n_ctx, cols};
                const cuda::Rows q{qd.as<float>(), T, nq * hd, nq * hd}, k{kd.as<float>(), T, cols, cols},
                    v{vd.as<float>(), T, cols, cols};
                if (fused) {
                    EXPECT_TRUE(cuda::qk_norm_rope_stores(c, hd));
                    cuda::launch_qk_norm_rope(q, k, wqd.as<float>(), wkd.as<float>(), hd, 1e-6f, n_rot,
                                              invd.as<float>(), spd.as<int2>(), nullptr, &c, v, early);
                } else {
                    cuda::launch_qk_norm_rope(q, k, wqd.as<float>(), wkd.as<float>(), hd, 1e-6f, n_rot,
                                              invd.as<float>(), spd.as<int2>(), nullptr);
                    cuda::launch_kv_store(c, k, v, spd.as<int2>(), nullptr);
                }
                CUDA_OK(cudaDeviceSynchronize());
                o = Out{std::vector<float>(qa.size()), std::vector<float>(ka.size()), std::vector<uint8_t>(cache),
                        std::vector<uint8_t>(cache)};
                CUDA_OK(cudaMemcpy(o.q.data(), qd.p, qa.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.k.data(), kd.p, ka.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.kc.data(), kc.p, cache, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.vc.data(), vc.p, cache, cudaMemcpyDeviceToHost));
            };
            Out sep, one, early;
            run(false, sep);
            run(true, one);
            run(true, early, true);  // its positions, frequencies and weights read before the kernel's wait
            ASSERT_FALSE(HasFatalFailure());
            const std::string what = std::string(kt == KvType::F32   ? "f32"
                                                 : kt == KvType::F16 ? "f16"
                                                                     : "q8_0") +
                                     " cache, head " + std::to_string(hd);
            EXPECT_EQ(std::memcmp(sep.q.data(), one.q.data(), qa.size() * 4), 0) << what << ": q";
            EXPECT_EQ(std::memcmp(sep.k.data(), one.k.data(), ka.size() * 4), 0) << what << ": k";
            EXPECT_EQ(sep.kc, one.kc) << what << ": k cache";
            EXPECT_EQ(sep.vc, one.vc) << what << ": v cache";
            EXPECT_EQ(std::memcmp(one.q.data(), early.q.data(), qa.size() * 4), 0) << what << ": q, early reads";
            EXPECT_EQ(std::memcmp(one.k.data(), early.k.data(), ka.size() * 4), 0) << what << ": k, early reads";
            EXPECT_EQ(one.kc, early.kc) << what << ": k cache, early reads";
            EXPECT_EQ(one.vc, early.vc) << what << ": v cache, early reads";
            EXPECT_NE(sep.kc, fill) << what << ": the rows were stored";
            // sequence 0's position 5: no row names it
            EXPECT_EQ(std::memcmp(one.kc.data() + rb * 5, fill.data() + rb * 5, rb), 0) << what << ": kept";
            EXPECT_EQ(std::memcmp(one.vc.data() + rb * 5, fill.data() + rb * 5, rb), 0) << what << ": kept";
        }
}

// Whole hidden rows (1024..8192 columns take the register-held kernel, others the loop): rms_norm against the CPU,
// and the residual add folded into the norm (add_rms_norm) bit for bit what add and rms_norm give on the GPU, with
// the sum left in x; a row view with an odd offset takes the loop kernel, with the same contract.
TEST(CudaOps, WideNormsAndTheFoldedResidualAdd) {
    for (int64_t cols : {2048, 4096, 5120, 7168, 1000, 12288}) {
        auto gpu = cuda_backend();
        auto cpu = make_cpu_backend(2);
        const int64_t T = 5;
        Model m;
        m.hp.n_layer = 1;
        m.hp.n_embd = cols;
        m.layers.resize(1);
        std::vector<float> wn = randn(size_t(cols), 21);
        f32_vector(m.layers[0].attn_norm, wn, "attn_norm");
        const auto gs = place(*gpu, m), cs = place(*cpu, m);
        const std::vector<float> a = randn(size_t(T * cols), 22), b = randn(size_t(T * cols), 23);
        const Weight &w = m.layers[0].attn_norm;
        auto run = [&](Backend &be, bool dev, bool folded, int64_t col0) {
            const int64_t wide = cols + 4;  // rows 16-byte aligned from column 0
            Act xs = be.alloc(T, wide), ys = be.alloc(T, wide), o = be.alloc(T, cols);
            Act x = xs.cols_view(col0, cols), y = ys.cols_view(col0, cols);
            std::vector<float> pa(size_t(T * wide)), pb(pa.size());
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = 0; c < cols; c++) {
                    pa[size_t(t * wide + col0 + c)] = a[size_t(t * cols + c)];
                    pb[size_t(t * wide + col0 + c)] = b[size_t(t * cols + c)];
                }
            put(xs, pa, dev);
            put(ys, pb, dev);
            std::vector<float> out;
            be.rms_norm(y, w, 1e-6f, o);
            out = get(be, o);
            if (folded)
                be.add_rms_norm(x, y, w, 1e-6f, o);
            else
                be.Backend::add_rms_norm(x, y, w, 1e-6f, o);
            const std::vector<float> n = get(be, o), sum = get(be, x);
            out.insert(out.end(), n.begin(), n.end());
            out.insert(out.end(), sum.begin(), sum.end());
            return out;
        };
        for (int64_t col0 : {0, 1}) {
            const std::vector<float> want = run(*cpu, false, false, col0), sep = run(*gpu, true, false, col0),
                                     got = run(*gpu, true, true, col0);
            const std::string what = std::to_string(cols) + " columns from column " + std::to_string(col0);
            ASSERT_EQ(got.size(), sep.size());
            EXPECT_EQ(std::memcmp(got.data(), sep.data(), got.size() * 4), 0) << what;
            EXPECT_LE(max_abs_diff(want, got), 2e-5f * std::max(1.0f, max_abs(want))) << what;
        }
    }
}

// ---- attention --------------------------------------------------------------------------------------------------

struct AttentionCase {
    KvType kv;
    int64_t head_dim, n_head, n_head_kv, prompt;  // prompt: tokens of the first sequence's prefill
};

class CudaAttention : public ::testing::TestWithParam<AttentionCase> {};

// Head sizes 64, 128 and 256 take the tiled kernel (decode steps its small tiles, with keys split over blocks where
// there are too few blocks to fill the GPU; over at most 64 positions the decode kernel, a warp per query vector),
// others the one-block-per-row kernel; every case against the CPU.
// Prefill over an f16 cache takes the tensor-core kernel (fp16 hi/lo splits of q and the softmax weights), held to
// the same bound.
TEST_P(CudaAttention, PrefillAndDecodeMatchTheCpu) {
    const AttentionCase ac = GetParam();
    const KvType kt = ac.kv;
    const int64_t hd = ac.head_dim, nh = ac.n_head, nkv = ac.n_head_kv, P = ac.prompt;
    HParams hp;
    hp.n_layer = 1;
    hp.n_head = nh;
    hp.n_head_kv = nkv;
    hp.head_dim_k = hp.head_dim_v = hd;
    auto gpu = cuda_backend();
    auto cpu = make_cpu_backend(2);
    Model m;
    m.hp = hp;
    m.layers.resize(1);
    const auto gs = place(*gpu, m, 0, 2, P + 16, kt), cs = place(*cpu, m, 0, 2, P + 16, kt);
    const int64_t qc = nh * hd, kvc = nkv * hd;
    // Prefill of two sequences (P and 9 tokens, more than one key tile), then three decode steps of both.
    std::vector<BatchInfo> steps;
    BatchInfo p;
    p.segs = {{0, 0, P, 0}, {1, 0, 9, P}};
    p.n_tokens = P + 9;
    steps.push_back(p);
    for (int s = 0; s < 3; s++) {
        BatchInfo d;
        d.segs = {{1, 9 + s, 1, 0}, {0, P + s, 1, 1}};
        d.n_tokens = 2;
        steps.push_back(d);
    }
    uint64_t seed = 100;
    const float scale = 1.0f / std::sqrt(float(hd));
    auto run = [&](Backend &be, bool dev, const BatchInfo &bi, const std::vector<float> &q, const std::vector<float> &k,
                   const std::vector<float> &v) {
        const int64_t T = bi.n_tokens;
        be.reset_scratch();
        Act qa = be.alloc(T, qc), ka = be.alloc(T, kvc), va = be.alloc(T, kvc), o = be.alloc(T, qc);
        put(qa, q, dev);
        put(ka, k, dev);
        put(va, v, dev);
        be.attention(0, qa, ka, va, nh, nkv, hd, scale, bi, o);
        return get(be, o);
    };
    std::vector<float> q, k, v, got;
    for (const BatchInfo &bi : steps) {
        const int64_t T = bi.n_tokens;
        q = randn(size_t(T * qc), seed++), k = randn(size_t(T * kvc), seed++), v = randn(size_t(T * kvc), seed++);
        const auto want = run(*cpu, false, bi, q, k, v);
        got = run(*gpu, true, bi, q, k, v);
        EXPECT_LE(max_abs_diff(want, got), 2e-5f * std::max(1.0f, max_abs(want)))
            << kv_type_name(kt) << " step with " << T << " rows";
    }
    // Over short contexts (no split of the keys) a decoding row does not depend on the rows beside it: the last
    // step's second row again, alone (its K and V stored again with the same values), gives the same bits.
    if (P + 3 <= 64) {
        BatchInfo one;
        one.segs = {{0, P + 2, 1, 0}};
        one.n_tokens = 1;
        const std::vector<float> q1(q.begin() + qc, q.end()), k1(k.begin() + kvc, k.end()),
            v1(v.begin() + kvc, v.end());
        const std::vector<float> alone = run(*gpu, true, one, q1, k1, v1);
        EXPECT_EQ(std::memcmp(alone.data(), got.data() + qc, size_t(qc) * 4), 0) << kv_type_name(kt) << ": alone";
    }
}

std::vector<AttentionCase> attention_cases() {
    std::vector<AttentionCase> out;
    for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0}) {
        out.push_back({kt, 64, 8, 2, 70});
        out.push_back({kt, 128, 16, 2, 700});  // group of 8; decode splits its 700 keys over blocks
        out.push_back({kt, 256, 4, 2, 300});
        out.push_back({kt, 96, 6, 3, 70});  // the untiled kernel
        // decode steps over at most 64 positions: the decode kernel (30B-A3B's heads; head sizes 64 and 256; no GQA)
        out.push_back({kt, 128, 32, 4, 3});
        out.push_back({kt, 64, 8, 2, 40});
        out.push_back({kt, 256, 4, 2, 52});
        out.push_back({kt, 128, 4, 4, 20});
    }
    out.push_back({KvType::F16, 128, 4, 4, 1200});  // no GQA, a long prompt
    return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(attention_cases()), [](const auto &info) {
    const AttentionCase &c = info.param;
    return std::string(kv_type_name(c.kv)) + "_d" + std::to_string(c.head_dim) + "_h" + std::to_string(c.n_head) +
           "_kv" + std::to_string(c.n_head_kv) + "_p" + std::to_string(c.prompt);
});

// ---- Gated DeltaNet -----------------------------------------------------------------------------------------------

namespace {

struct GdnModel {
    Model m;
    std::vector<float> conv, dt, a, norm;
    GdnParams p;
};

void make_gdn_model(GdnModel &g, bool grouped, bool tiled, int64_t d = 64) {
    GdnParams &p = g.p;
    p.n_k_heads = 2;
    p.n_v_heads = 4;
    p.head_k_dim = d;
    p.head_v_dim = d;
    p.conv_kernel = 4;
    p.ba_grouped = grouped;
    p.vhead_tiled = tiled;
    p.eps = 1e-6f;
    HParams &hp = g.m.hp;
    hp.n_layer = 1;
    hp.recurrent = {true};
    hp.ssm_conv_kernel = 4;
    hp.ssm_d_state = d;
    hp.ssm_n_group = 2;
    hp.ssm_dt_rank = 4;
    hp.ssm_d_inner = 4 * d;
    const int64_t conv_dim = 2 * 2 * d + 4 * d;
    g.conv = randn(size_t(conv_dim * 4), 41, 0.3f);
    g.dt = randn(4, 42, 0.5f);
    g.a = randn(4, 43, 0.5f);
    for (float &x : g.a) x = -std::exp(x);
    g.norm = randn(size_t(d), 44, 0.2f);
    for (float &x : g.norm) x += 1.0f;
    g.m.layers.resize(1);
    LayerWeights &L = g.m.layers[0];
    L.recurrent = true;
    auto vec = [](Weight &w, std::vector<float> &f, int64_t ne0, int64_t ne1, const char *name) {
        w.name = name;
        w.type = DType::F32;
        w.ne[0] = ne0;
        w.ne[1] = ne1;
        w.ne[2] = 1;
        w.host = reinterpret_cast<const uint8_t *>(f.data());
        w.row_bytes = size_t(ne0) * 4;
    };
    vec(L.ssm_conv1d, g.conv, 4, conv_dim, "ssm_conv1d");
    vec(L.ssm_dt_bias, g.dt, 4, 1, "ssm_dt");
    vec(L.ssm_a, g.a, 4, 1, "ssm_a");
    vec(L.ssm_norm, g.norm, d, 1, "ssm_norm");
}

}  // namespace

// (ba grouped, v-heads tiled, head size, prompt length)
class CudaGdn : public ::testing::TestWithParam<std::tuple<bool, bool, int64_t, int64_t>> {};

TEST_P(CudaGdn, RecurrentAndChunkedMatchTheCpu) {
    const auto [grouped, tiled, d, P] = GetParam();
    GdnModel g;
    make_gdn_model(g, grouped, tiled, d);
    auto gpu = cuda_backend();
    auto cpu = make_cpu_backend(2);
    const auto gs = place(*gpu, g.m), cs = place(*cpu, g.m);
    const int64_t conv_dim = 8 * d, vd = 4 * d, nv = 4;
    // A long prefill (chunked: a short last chunk; past 1024 tokens more than one group of chunks) with a short one
    // (recurrent, shorter than the conv kernel), then decode steps; every output compared.
    std::vector<BatchInfo> steps;
    BatchInfo p;
    p.segs = {{0, 0, P, 0}, {1, 0, 2, P}};
    p.n_tokens = P + 2;
    steps.push_back(p);
    for (int s = 0; s < 4; s++) {
        BatchInfo dec;
        dec.segs = {{0, P + s, 1, 0}, {1, 2 + s, 1, 1}};
        dec.n_tokens = 2;
        steps.push_back(dec);
    }
    uint64_t seed = 500;
    for (const BatchInfo &bi : steps) {
        const int64_t T = bi.n_tokens;
        std::vector<float> qkv = randn(size_t(T * conv_dim), seed++), z = randn(size_t(T * vd), seed++),
                           b = randn(size_t(T * 2 * nv), seed++), a = randn(size_t(T * nv), seed++);
        auto run = [&](Backend &be, bool dev) {
            be.reset_scratch();
            Act qa = be.alloc(T, conv_dim), za = be.alloc(T, vd), o = be.alloc(T, vd);
            Act ba = be.alloc(T, grouped ? 2 * nv : nv), aa;
            put(qa, qkv, dev);
            put(za, z, dev);
            put(ba, std::vector<float>(b.begin(), b.begin() + T * ba.cols), dev);
            if (!grouped) {
                aa = be.alloc(T, nv);
                put(aa, a, dev);
            }
            be.gdn(0, gdn_weights(g.m.layers[0]), qa, za, ba, aa, g.p, bi, o);
            return get(be, o);
        };
        const auto want = run(*cpu, false), got = run(*gpu, true);
        EXPECT_LE(max_abs_diff(want, got), 1e-4f * std::max(1.0f, max_abs(want))) << T << " rows";
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaGdn,
                         ::testing::Values(std::make_tuple(true, false, int64_t(64), int64_t(150)),
                                           std::make_tuple(false, true, int64_t(64), int64_t(150)),
                                           std::make_tuple(true, false, int64_t(128), int64_t(1100)),
                                           std::make_tuple(false, true, int64_t(96), int64_t(150))));

// The chunked and the recurrent kernels compute the same recurrence: a prompt read in one pass equals it read one
// token at a time, on the GPU alone, with either recurrent kernel (STRATA_CUDA_GDN_COLUMNS=0: one block a head).
TEST(CudaGdnForms, ChunkedEqualsRecurrent) {
    for (const char *columns : {"1", "0"}) {
        ::setenv("STRATA_CUDA_GDN_COLUMNS", columns, 1);
        GdnModel g;
        make_gdn_model(g, true, false);
        auto gpu = cuda_backend();
        const auto gs = place(*gpu, g.m);
        const int64_t n = 100, conv_dim = 512, vd = 256;
        std::vector<float> qkv = randn(size_t(n * conv_dim), 1), z = randn(size_t(n * vd), 2),
                           b = randn(size_t(n * 8), 3);
        gpu->reset_scratch();
        Act qa = gpu->alloc(n, conv_dim), za = gpu->alloc(n, vd), ba = gpu->alloc(n, 8), o = gpu->alloc(n, vd);
        put(qa, qkv, true);
        put(za, z, true);
        put(ba, b, true);
        BatchInfo all;
        all.segs = {{0, 0, n, 0}};
        all.n_tokens = n;
        gpu->gdn(0, gdn_weights(g.m.layers[0]), qa, za, ba, Act{}, g.p, all, o);
        const std::vector<float> chunked = get(*gpu, o);
        std::vector<float> stepped;
        for (int64_t t = 0; t < n; t++) {
            BatchInfo one;
            one.segs = {{1, t, 1, 0}};
            one.n_tokens = 1;
            Act o1 = gpu->alloc(1, vd);
            gpu->gdn(0, gdn_weights(g.m.layers[0]), qa.rows_view(t, 1), za.rows_view(t, 1), ba.rows_view(t, 1), Act{},
                     g.p, one, o1);
            const std::vector<float> r = get(*gpu, o1);
            stepped.insert(stepped.end(), r.begin(), r.end());
        }
        EXPECT_LE(max_abs_diff(chunked, stepped), 1e-4f * std::max(1.0f, max_abs(chunked)))
            << "columns " << columns;
        ::unsetenv("STRATA_CUDA_GDN_COLUMNS");
    }
}

// ---- MoE ----------------------------------------------------------------------------------------------------------

namespace {

struct MoeModel {
    Model m;
    HostWeight router, gate, up, down, sh_gate, sh_up, sh_down;
    std::vector<float> sh_inp;
    MoeParams p;
};

void make_moe_model(MoeModel &mm, DType et, bool shared, int64_t k_used) {
    const int64_t E = 256, F = 256, NE = 8;
    mm.p = MoeParams{NE, k_used, true, 0.0f};
    HParams &hp = mm.m.hp;
    hp.n_layer = 1;
    hp.n_embd = E;
    hp.n_expert = NE;
    hp.n_expert_used = k_used;
    hp.n_ff_exp = F;
    hp.n_ff_shexp = shared ? F : 0;
    mm.m.layers.resize(1);
    LayerWeights &L = mm.m.layers[0];
    make_weight(mm.router, DType::F32, E, NE, 1, 1, 0.2f, false);
    make_weight(mm.gate, et, E, F, NE, 2, 0.05f, false);
    make_weight(mm.up, et, E, F, NE, 3, 0.05f, false);
    make_weight(mm.down, et, F, E, NE, 4, 0.05f, false);
    L.gate_inp = mm.router.w;
    L.gate_inp.name = "ffn_gate_inp";
    L.gate_exps = mm.gate.w;
    L.gate_exps.name = "ffn_gate_exps";
    L.up_exps = mm.up.w;
    L.up_exps.name = "ffn_up_exps";
    L.down_exps = mm.down.w;
    L.down_exps.name = "ffn_down_exps";
    if (shared) {
        make_weight(mm.sh_gate, DType::Q8_0, E, F, 1, 5, 0.05f, false);
        make_weight(mm.sh_up, DType::Q8_0, E, F, 1, 6, 0.05f, false);
        make_weight(mm.sh_down, DType::Q8_0, F, E, 1, 7, 0.05f, false);
        mm.sh_inp = randn(size_t(E), 8, 0.1f);
        L.gate_shexp = mm.sh_gate.w;
        L.up_shexp = mm.sh_up.w;
        L.down_shexp = mm.sh_down.w;
        L.gate_inp_shexp.name = "ffn_gate_inp_shexp";
        L.gate_inp_shexp.type = DType::F32;
        L.gate_inp_shexp.ne[0] = E;
        L.gate_inp_shexp.ne[1] = 1;
        L.gate_inp_shexp.ne[2] = 1;
        L.gate_inp_shexp.host = reinterpret_cast<const uint8_t *>(mm.sh_inp.data());
        L.gate_inp_shexp.row_bytes = size_t(E) * 4;
    }
}

std::vector<float> run_moe(Backend &be, MemoryStrata &st, const MoeModel &mm, const std::vector<float> &x, int64_t T,
                           bool dev) {
    be.reset_scratch();
    Act xa = be.alloc(T, mm.m.hp.n_embd), o = be.alloc(T, mm.m.hp.n_embd);
    put(xa, x, dev);
    st.moe().run(0, mm.m.layers[0], xa, mm.p, o, nullptr);
    return get(be, o);
}

}  // namespace

class CudaMoe : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(CudaMoe, MatchesTheCpuAndIgnoresPlacement) {
    const auto [et, shared] = GetParam();
    MoeModel mm;
    make_moe_model(mm, et, shared, shared ? 3 : 2);
    auto cpu = make_cpu_backend(2);
    const auto cs = place(*cpu, mm.m);
    // All experts resident, three slots (a layer's experts in several sets), one slot.
    std::vector<std::unique_ptr<Backend>> gpus;
    std::vector<std::unique_ptr<MemoryStrata>> placed;
    for (int64_t slots : {0, 3, 1}) {
        gpus.push_back(cuda_backend());
        placed.push_back(place(*gpus.back(), mm.m, slots));
    }
    EXPECT_EQ(placed[0]->stats().n_slots, 8);
    EXPECT_EQ(placed[1]->stats().n_slots, 3);
    uint64_t seed = 900;
    for (int64_t T : {1, 2, 9, 40, 1}) {
        const std::vector<float> x = randn(size_t(T * 256), seed++);
        const std::vector<float> want = run_moe(*cpu, *cs, mm, x, T, false);
        const std::vector<float> got = run_moe(*gpus[0], *placed[0], mm, x, T, true);
        // The same function as the CPU, but the experts' inputs are quantized again from intermediates that differ
        // in float rounding, so now and then an element lands one quantization step away: small, rare differences.
        EXPECT_LE(nmse(want, got), 1e-5) << dtype_name(et) << " T=" << T;
        EXPECT_LE(max_abs_diff(want, got), 3e-3f * std::max(1.0f, max_abs(want))) << dtype_name(et) << " T=" << T;
        for (size_t g = 1; g < gpus.size(); g++) {
            const std::vector<float> other = run_moe(*gpus[g], *placed[g], mm, x, T, true);
            EXPECT_EQ(std::memcmp(other.data(), got.data(), got.size() * 4), 0)
                << "placement changed the result: " << dtype_name(et) << " T=" << T << " backend " << g;
        }
    }
    EXPECT_GT(placed[1]->stats().expert_cache_misses, 0u);
    EXPECT_GT(placed[2]->stats().bytes_streamed, 0u);
    EXPECT_EQ(placed[0]->stats().expert_cache_misses, 0u);
}

// Benchmark routing drawn on the device (Backend::route_draws) draws the host's experts (backend/route_draws.h, the
// CPU backend's default) for every row, layer and pass, uniform and Zipf, in the router's rank order, weighted as the
// host weights them (the softmax's float rounding apart); the pass count goes up at each new pass, also across
// calls, and starts again at reset_draws(). A pass of more rows than one grid takes (70,000) draws every row's own.
TEST(CudaRouter, DrawsOnTheDeviceAreTheHostDraws) {
    auto be = cuda_backend();
    auto cpu = make_cpu_backend(1);
    uint64_t seed = 9100;
    for (const RouteDraws::Kind kind : {RouteDraws::Uniform, RouteDraws::Zipf})
        for (const int64_t ne : {64, 512}) {
            RouteDraws d;
            d.kind = kind;
            d.skew = 1.1;
            d.seed = 3;
            const MoeParams p = ne == 64 ? MoeParams{ne, 8, true, 0.0f} : MoeParams{ne, 10, false, 2.5f};
            const int64_t k = p.n_expert_used;
            for (int round = 0; round < 2; round++) {  // the same passes again after reset_draws()
                be->reset_draws();
                cpu->reset_draws();
                for (int pass = 0; pass < 3; pass++)
                    for (const int64_t il : {0, 5}) {
                        const int64_t T = pass == 1 && ne == 64 && il == 5 ? 70000 : 7;
                        be->reset_scratch();
                        cpu->reset_scratch();
                        // logits in steps of 1/8: the ranks never hang on the softmax's last bits (equal logits
                        // tie on both, to the lower id)
                        std::vector<float> x = randn(size_t(T * ne), seed++);
                        for (float &v : x) v = std::round(v * 8.0f) / 8.0f;
                        Act lg = be->alloc(T, ne), w = be->alloc(T, k), lc = cpu->alloc(T, ne), wc = cpu->alloc(T, k);
                        put(lg, x, true);
                        put(lc, x, false);
                        int32_t *ids = be->alloc_i32(T * k), *idc = cpu->alloc_i32(T * k);
                        be->route_draws(lg, p, d, il, il == 0, ids, w);
                        cpu->route_draws(lc, p, d, il, il == 0, idc, wc);
                        std::vector<int32_t> got(size_t(T * k)), want(size_t(T * k));
                        be->download_i32(ids, T * k, got.data());
                        cpu->download_i32(idc, T * k, want.data());
                        const std::string what = strfmt("%s, %lld experts, round %d, pass %d, layer %lld",
                                                        kind == RouteDraws::Zipf ? "zipf" : "uniform", (long long)ne,
                                                        round, pass, (long long)il);
                        ASSERT_EQ(got, want) << what;
                        // the host's draw for this pass and row, sorted into the router's order by the host
                        std::vector<int32_t> row(static_cast<size_t>(k));
                        for (const int64_t t : {int64_t(0), T - 1}) {
                            draw_experts(d, il, pass, t, ne, k, row.data());
                            std::vector<float> wh(static_cast<size_t>(k));
                            router_weights(x.data() + t * ne, p, row.data(), wh.data());
                            EXPECT_EQ(std::vector<int32_t>(got.begin() + t * k, got.begin() + (t + 1) * k), row)
                                << what << ", row " << t;
                        }
                        const std::vector<float> wg = get(*be, w), ww = get(*cpu, wc);
                        EXPECT_LE(max_abs_diff(wg, ww), 1e-6f * std::max(1.0f, max_abs(ww))) << what;
                    }
            }
        }
}

// The router's mat-vec and top-k in one launch (Backend::route at decode sizes) against the two launches (matmul,
// route_topk): logits, ids and weights bit for bit, for 128 and 512 experts, top-8 and top-10, renormalised or not,
// scaled or not, 1..8 tokens, f32, f16 and bf16 routers, one launch after another on one backend (each must leave its
// block counter at zero for the next). Two experts with the same router row tie (the lower id wins on both), and a
// token with a NaN routes alike.
// The routing's top-k in its register form against the shared-memory form, bit for bit: 64, 100, 128 and 512 experts,
// top-1, 8, 10 and 32, renormalised or not, scaled or not; logits with ties (equal values, so equal probabilities:
// the lower id first), a NaN, an -inf, and all equal.
TEST(CudaRouter, RegisterFormIsTheSharedMemoryForm) {
    uint64_t seed = 7100;
    for (int64_t ne : {64, 100, 128, 512})
        for (int64_t k : {1, 8, 10, 32})
            for (int form = 0; form < 4; form++) {
                const bool norm = form & 1;
                const float scale = form & 2 ? 2.5f : 0.0f;
                const int64_t T = 6;
                std::vector<float> l = randn(size_t(T * ne), seed++);
                for (int64_t e = 0; e < ne; e += 3) l[size_t(ne + e)] = l[size_t(ne + (e * 7) % ne)];  // ties
                l[size_t(2 * ne + 5)] = std::nanf("");
                l[size_t(3 * ne + 1)] = -INFINITY;
                for (int64_t e = 0; e < ne; e++) l[size_t(4 * ne + e)] = 0.25f;  // every probability equal
                for (int64_t e = 0; e < ne; e += 2) l[size_t(5 * ne + e)] = float(e % 5);  // many equal
                DevBuf ld(l.size() * 4), i1(size_t(T * k) * 4), i2(size_t(T * k) * 4), w1(size_t(T * k) * 4),
                    w2(size_t(T * k) * 4);
                CUDA_OK(cudaMemcpy(ld.p, l.data(), l.size() * 4, cudaMemcpyHostToDevice));
                const cuda::Rows lr{ld.as<float>(), T, ne, ne};
                cuda::launch_router_topk(lr, k, norm, scale, i1.as<int32_t>(), w1.as<float>(), nullptr, 0);
                cuda::launch_router_topk(lr, k, norm, scale, i2.as<int32_t>(), w2.as<float>(), nullptr, 1);
                CUDA_OK(cudaDeviceSynchronize());
                std::vector<int32_t> a(size_t(T * k)), b(a.size());
                std::vector<float> wa(a.size()), wb(a.size());
                CUDA_OK(cudaMemcpy(a.data(), i1.p, a.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(b.data(), i2.p, b.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(wa.data(), w1.p, wa.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(wb.data(), w2.p, wb.size() * 4, cudaMemcpyDeviceToHost));
                const std::string what = std::to_string(ne) + " experts, top-" + std::to_string(k) +
                                         (norm ? " normed" : "") + (scale != 0.0f ? " scaled" : "");
                ASSERT_EQ(a, b) << what;
                ASSERT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 4), 0) << what;
                for (int64_t j = 0; j < k; j++) EXPECT_EQ(a[size_t(4 * k + j)], j) << what << ": equal, lower id first";
            }
}

// The residual step done by the router's launch (launch_router_norm, STRATA_CUDA_ROUTER_NORM=1): the residual, the
// normed row, its Q8_K form, the logits, ids and weights bit for bit those of launch_add_rms_norm and then
// launch_router_fused; rows of 1024, 2048 and 4096 (one, two and four float4s a thread), one and three tokens.
TEST(CudaRouter, ResidualStepInTheLaunchIsTheTwoLaunches) {
    uint64_t seed = 9100;
    for (int64_t E : {1024, 2048, 4096})
        for (int64_t T : {1, 3}) {
            const int64_t ne = 128, k = 8;
            const float eps = 1e-6f;
            const std::vector<float> wr = randn(size_t(ne * E), seed++, 0.05f), x = randn(size_t(T * E), seed++),
                                     y = randn(size_t(T * E), seed++), nw = randn(size_t(E), seed++);
            DevBuf wd(wr.size() * 4), yd(y.size() * 4), nwd(nw.size() * 4), done(4);
            CUDA_OK(cudaMemcpy(wd.p, wr.data(), wr.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(yd.p, y.data(), y.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(nwd.p, nw.data(), nw.size() * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(done.p, 0, 4));
            struct Out {
                std::vector<float> x, normed, logits, wts;
                std::vector<int8_t> q;
                std::vector<float2> ds;
                std::vector<int32_t> ids;
            };
            auto run = [&](bool fused, Out &o) {
                DevBuf xd(x.size() * 4), nd(x.size() * 4), qd(x.size()), dd(x.size() / 32 * 8), ld(size_t(T * ne) * 4),
                    id(size_t(T * k) * 4), wtd(size_t(T * k) * 4);
                CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                const cuda::Rows xr{xd.as<float>(), T, E, E}, yr{yd.as<float>(), T, E, E}, nr{nd.as<float>(), T, E, E};
                const cuda::NormQ8 q8{qd.as<int8_t>(), dd.as<float2>(), 2};
                cuda::MatmulArgs a = f32_args(wd.p, E, ne, nd.as<float>(), ld.as<float>());
                a.single.n_rows = int32_t(T);
                if (fused) {
                    const cuda::RouterNorm rn{xr, yr, nr, nwd.as<float>(), eps, q8};
                    ASSERT_TRUE(cuda::router_norm_supported(a, rn));
                    cuda::launch_router_norm(a, k, true, 0.0f, id.as<int32_t>(), wtd.as<float>(), done.as<unsigned>(),
                                             nullptr, {}, rn);
                } else {
                    cuda::launch_add_rms_norm(xr, yr, nwd.as<float>(), E, eps, nr, nullptr, q8);
                    cuda::launch_router_fused(a, k, true, 0.0f, id.as<int32_t>(), wtd.as<float>(), done.as<unsigned>(),
                                              nullptr);
                }
                CUDA_OK(cudaDeviceSynchronize());
                o.x.resize(x.size()), o.normed.resize(x.size()), o.logits.resize(size_t(T * ne));
                o.wts.resize(size_t(T * k)), o.ids.resize(size_t(T * k)), o.q.resize(x.size()),
                    o.ds.resize(x.size() / 32);
                CUDA_OK(cudaMemcpy(o.x.data(), xd.p, x.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.normed.data(), nd.p, x.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.logits.data(), ld.p, o.logits.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.wts.data(), wtd.p, o.wts.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.ids.data(), id.p, o.ids.size() * 4, cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.q.data(), qd.p, o.q.size(), cudaMemcpyDeviceToHost));
                CUDA_OK(cudaMemcpy(o.ds.data(), dd.p, o.ds.size() * 8, cudaMemcpyDeviceToHost));
            };
            Out two, one;
            run(false, two);
            run(true, one);
            ASSERT_FALSE(HasFatalFailure());
            const std::string what = std::to_string(E) + " columns, " + std::to_string(T) + " tokens";
            EXPECT_EQ(std::memcmp(two.x.data(), one.x.data(), x.size() * 4), 0) << what << ": residual";
            EXPECT_EQ(std::memcmp(two.normed.data(), one.normed.data(), x.size() * 4), 0) << what << ": normed";
            EXPECT_EQ(two.q, one.q) << what << ": Q8_K levels";
            EXPECT_EQ(std::memcmp(two.ds.data(), one.ds.data(), two.ds.size() * 8), 0) << what << ": Q8_K scales";
            EXPECT_EQ(std::memcmp(two.logits.data(), one.logits.data(), two.logits.size() * 4), 0)
                << what << ": logits";
            EXPECT_EQ(two.ids, one.ids) << what << ": ids";
            EXPECT_EQ(std::memcmp(two.wts.data(), one.wts.data(), two.wts.size() * 4), 0) << what << ": weights";
            unsigned left = 1;
            CUDA_OK(cudaMemcpy(&left, done.p, 4, cudaMemcpyDeviceToHost));
            EXPECT_EQ(left, 0u) << what << ": the counter is back at zero";
        }
}

TEST(CudaRouter, OneLaunchIsTheTwoLaunches) {
    auto be = cuda_backend();
    ThreadPool pool(2);
    const int64_t E = 2048;
    uint64_t seed = 5000;
    for (DType rt : {DType::F32, DType::F16, DType::BF16}) {
        for (int64_t ne : {128, 512}) {
            HostWeight hw;
            make_weight(hw, rt, E, ne, 1, seed++, 0.05f, false);
            std::memcpy(hw.bytes.data() + 7 * hw.w.row_bytes, hw.bytes.data() + 3 * hw.w.row_bytes, hw.w.row_bytes);
            hw.dev = new DevBuf(hw.bytes.size());
            CUDA_OK(cudaMemcpy(hw.dev->p, hw.bytes.data(), hw.bytes.size(), cudaMemcpyHostToDevice));
            hw.w.backend = hw.dev->p;
            struct Pick {
                int64_t k;
                bool norm;
                float scale;
            };
            for (const Pick pk :
                 {Pick{8, true, 0.0f}, Pick{10, false, 0.0f}, Pick{8, false, 2.5f}, Pick{10, true, 1.5f}}) {
                const MoeParams p{ne, pk.k, pk.norm, pk.scale};
                for (int64_t T = 1; T <= 8; T++) {
                    be->reset_scratch();
                    std::vector<float> x = randn(size_t(T * E), seed++);
                    if (T == 5) x[size_t(2 * E + 17)] = std::nanf("");
                    Act xd = be->alloc(T, E);
                    put(xd, x, true);
                    Act l1 = be->alloc(T, ne), l2 = be->alloc(T, ne), w1 = be->alloc(T, pk.k), w2 = be->alloc(T, pk.k);
                    int32_t *i1 = be->alloc_i32(T * pk.k), *i2 = be->alloc_i32(T * pk.k);
                    be->route(hw.w, xd, p, l1, i1, w1.data);
                    be->matmul(hw.w, xd, l2);
                    be->route_topk(l2, p, i2, w2.data);
                    const std::string what = std::string(dtype_name(rt)) + " " + std::to_string(ne) + " experts, top-" +
                                             std::to_string(pk.k) + (pk.norm ? " normed" : "") + " scale " +
                                             std::to_string(pk.scale) + ", T=" + std::to_string(T);
                    const std::vector<float> lg1 = get(*be, l1), lg2 = get(*be, l2), wt1 = get(*be, w1),
                                             wt2 = get(*be, w2);
                    std::vector<int32_t> id1(size_t(T * pk.k)), id2(size_t(T * pk.k));
                    be->download_i32(i1, T * pk.k, id1.data());
                    be->download_i32(i2, T * pk.k, id2.data());
                    ASSERT_EQ(std::memcmp(lg1.data(), lg2.data(), lg1.size() * 4), 0) << what << ": logits";
                    ASSERT_EQ(id1, id2) << what << ": ids";
                    ASSERT_EQ(std::memcmp(wt1.data(), wt2.data(), wt1.size() * 4), 0) << what << ": weights";
                    for (int64_t t = 0; t < T; t++) {
                        std::vector<int32_t> row(id1.begin() + t * pk.k, id1.begin() + (t + 1) * pk.k);
                        for (int32_t id : row) ASSERT_TRUE(id >= 0 && id < ne) << what;
                        std::sort(row.begin(), row.end());
                        ASSERT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << what << ": repeats";
                    }
                    if (T != 5) {  // the logits are the reference's, float rounding apart
                        std::vector<float> want(size_t(T * ne));
                        Act xh{x.data(), T, E, E}, yh{want.data(), T, ne, ne};
                        cpu_matmul_reference(pool, hw.w, xh, yh);
                        EXPECT_LE(max_abs_diff(want, lg1), 2e-5f * std::max(1.0f, max_abs(want))) << what;
                    }
                }
            }
        }
    }
}

// The one-launch router's one-token form (launch_router_fused's `one`, STRATA_CUDA_ROUTER_ONE) against its general
// form for a token: logits, ids and weights bit for bit, the counter back at zero after each. F32, F16 and BF16
// routers of 128 and 512 experts, rows of 2048 (weights loaded before the wait) and 5120 (read after it), top-8 and
// top-10; an F32 router whose rows sit 2 bytes off a word (loaded byte by byte) beside the aligned one.
TEST(CudaRouter, OneTokenFormIsTheGeneralForm) {
    uint64_t seed = 9300;
    for (DType rt : {DType::F32, DType::F16, DType::BF16})
        for (int64_t ne : {128, 512})
            for (int64_t E : {2048, 5120})
                for (int64_t k : {8, 10})
                    for (size_t off : {size_t(0), size_t(2)}) {
                        if (off && rt != DType::F32) continue;
                        HostWeight hw;
                        make_weight(hw, rt, E, ne, 1, seed++, 0.05f, false);
                        DevBuf wd(hw.bytes.size() + 16), xd(size_t(E) * 4), done(4);
                        uint8_t *w = static_cast<uint8_t *>(wd.p) + off;
                        CUDA_OK(cudaMemcpy(w, hw.bytes.data(), hw.bytes.size(), cudaMemcpyHostToDevice));
                        const std::vector<float> x = randn(size_t(E), seed++);
                        CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                        CUDA_OK(cudaMemset(done.p, 0, 4));
                        struct Out {
                            std::vector<float> logits, wts;
                            std::vector<int32_t> ids;
                        };
                        auto run = [&](int one, Out &o) {
                            DevBuf ld(size_t(ne) * 4), id(size_t(k) * 4), wtd(size_t(k) * 4);
                            cuda::MatmulArgs a = f32_args(w, E, ne, xd.as<float>(), ld.as<float>());
                            a.type = rt, a.row_bytes = hw.w.row_bytes, a.single.n_rows = 1;
                            cuda::launch_router_fused(a, k, true, 0.0f, id.as<int32_t>(), wtd.as<float>(),
                                                      done.as<unsigned>(), nullptr, {}, one);
                            CUDA_OK(cudaDeviceSynchronize());
                            o.logits.resize(size_t(ne)), o.wts.resize(size_t(k)), o.ids.resize(size_t(k));
                            CUDA_OK(cudaMemcpy(o.logits.data(), ld.p, o.logits.size() * 4, cudaMemcpyDeviceToHost));
                            CUDA_OK(cudaMemcpy(o.wts.data(), wtd.p, o.wts.size() * 4, cudaMemcpyDeviceToHost));
                            CUDA_OK(cudaMemcpy(o.ids.data(), id.p, o.ids.size() * 4, cudaMemcpyDeviceToHost));
                            unsigned left = 1;
                            CUDA_OK(cudaMemcpy(&left, done.p, 4, cudaMemcpyDeviceToHost));
                            EXPECT_EQ(left, 0u) << "one " << one;
                        };
                        Out general, one;
                        run(0, general);
                        run(1, one);
                        ASSERT_FALSE(HasFatalFailure());
                        const std::string what = std::string(dtype_name(rt)) + " " + std::to_string(ne) +
                                                 " experts, rows of " + std::to_string(E) + ", top-" +
                                                 std::to_string(k) + ", offset " + std::to_string(off);
                        EXPECT_EQ(std::memcmp(general.logits.data(), one.logits.data(), general.logits.size() * 4), 0)
                            << what << ": logits";
                        EXPECT_EQ(general.ids, one.ids) << what << ": ids";
                        EXPECT_EQ(std::memcmp(general.wts.data(), one.wts.data(), general.wts.size() * 4), 0)
                            << what << ": weights";
                    }
}

// The one-launch router replayed from a CUDA graph: the counter it leaves at zero is what the next replay starts
// from, so three replays over new inputs give what the two launches give for each.
TEST(CudaRouter, OneLaunchReplaysFromAGraph) {
    const int64_t E = 2048, ne = 128, k = 8, T = 2;
    HostWeight hw;
    make_weight(hw, DType::F32, E, ne, 1, 77, 0.05f, true);
    DevBuf xd(size_t(T * E) * 4), l1(size_t(T * ne) * 4), l2(size_t(T * ne) * 4), w1(size_t(T * k) * 4),
        w2(size_t(T * k) * 4), i1(size_t(T * k) * 4), i2(size_t(T * k) * 4), done(4);
    CUDA_OK(cudaMemset(done.p, 0, 4));
    cuda::MatmulArgs a;
    a.type = DType::F32;
    a.k = E;
    a.n = ne;
    a.row_bytes = hw.w.row_bytes;
    a.x = xd.as<float>();
    a.x_stride = E;
    a.y = l1.as<float>();
    a.y_stride = ne;
    a.single = {hw.dev->p, 0, int32_t(T), 0};
    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    cuda::launch_router_fused(a, k, true, 0.0f, i1.as<int32_t>(), w1.as<float>(), done.as<unsigned>(), st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; rep++) {
        const std::vector<float> x = randn(size_t(T * E), 78 + uint64_t(rep));
        CUDA_OK(cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaGraphLaunch(exec, st));
        cuda::MatmulArgs b = a;
        b.y = l2.as<float>();
        cuda::launch_mmv_generic(b, st);
        cuda::launch_router_topk({l2.as<float>(), T, ne, ne}, k, true, 0.0f, i2.as<int32_t>(), w2.as<float>(), st);
        CUDA_OK(cudaStreamSynchronize(st));
        std::vector<float> lg1(size_t(T * ne)), lg2(lg1.size()), wt1(size_t(T * k)), wt2(wt1.size());
        std::vector<int32_t> id1(size_t(T * k)), id2(id1.size());
        CUDA_OK(cudaMemcpy(lg1.data(), l1.p, lg1.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lg2.data(), l2.p, lg2.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(wt1.data(), w1.p, wt1.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(wt2.data(), w2.p, wt2.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(id1.data(), i1.p, id1.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(id2.data(), i2.p, id2.size() * 4, cudaMemcpyDeviceToHost));
        unsigned left = 1;
        CUDA_OK(cudaMemcpy(&left, done.p, 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(left, 0u) << "replay " << rep;
        EXPECT_EQ(std::memcmp(lg1.data(), lg2.data(), lg1.size() * 4), 0) << "replay " << rep;
        EXPECT_EQ(id1, id2) << "replay " << rep;
        EXPECT_EQ(std::memcmp(wt1.data(), wt2.data(), wt1.size() * 4), 0) << "replay " << rep;
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(st));
}

// A token whose hidden state holds a NaN routes to k distinct experts of the layer (no expert id out of range, so no
// stray read or write) on every path: the device-routed decode path (all resident, one token), host grouping, slots.
// The other tokens of the pass keep their finite results.
TEST(CudaMoeNan, NanTokensRouteInRange) {
    MoeModel mm;
    make_moe_model(mm, DType::Q4_K, true, 3);
    for (int64_t slots : {0, 3}) {
        auto be = cuda_backend();
        auto st = place(*be, mm.m, slots);
        for (int64_t T : {1, 9}) {
            std::vector<float> x = randn(size_t(T * 256), 77);
            x[size_t((T - 1) * 256 + 5)] = std::nanf("");
            std::vector<float> out;
            ASSERT_NO_THROW(out = run_moe(*be, *st, mm, x, T, true)) << slots << " slots, T=" << T;
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << slots << " slots, T=" << T;
            for (int64_t t = 0; t + 1 < T; t++)
                for (int64_t c = 0; c < 256; c++)
                    ASSERT_TRUE(std::isfinite(out[size_t(t * 256 + c)])) << "token " << t << ", " << slots << " slots";
        }
        // and the backend goes on: a finite pass afterwards
        const std::vector<float> y = randn(size_t(4 * 256), 78);
        const std::vector<float> after = run_moe(*be, *st, mm, y, 4, true);
        for (float v : after) ASSERT_TRUE(std::isfinite(v));
    }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMoe,
                         ::testing::Values(std::make_tuple(DType::Q4_K, true), std::make_tuple(DType::Q8_0, false),
                                           std::make_tuple(DType::F16, true), std::make_tuple(DType::IQ2_XXS, false),
                                           std::make_tuple(DType::Q3_K, true)));
