// CPU dot-product kernels and the matmul built on them: every instruction-set level this machine runs equals the
// scalar kernel; the scalar kernel equals dequantize-then-multiply; the SIMD activation quantizers write
// quantize_row's bytes; cpu_matmul equals cpu_matmul_reference, and equals its own kernel bit for bit whatever the
// threads and tiling. Benchmarks are elsewhere (tests/tools/bench_matmul.cpp).
//
// Tolerances. Let u = 2^-24 (fp32 unit roundoff) and M = sum_k |W_k| |X_k| over the dequantized values, where for
// types that store a minimum (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) or an offset level (Q3_K, Q6_K, TQ1_0, TQ2_0) |W_k|
// counts the stored level's part and the minimum / offset part separately, since kernels sum those apart. A kernel
// sums exact integers per block, then adds depth = (number of blocks) scaled block sums in fp32 (float types: n
// products in 8 or more lanes, depth n/8 + 1); every block term carries a few roundings. So each result is within
// (depth + c) u M of the exact value of the same integers, c covering the handful of per-block roundings and the
// final lane reductions (c = 16 here, generous for <= 6 roundings). Two levels therefore agree within
// (2 depth + 2c) u M. The dequantize-then-multiply reference is summed in double from fp32 elements that carry <= 5
// roundings each, so scalar vs reference also fits (depth + 2c) u M. Q4_1 / Q5_1 add one known, intended
// difference: the activation's s = d*sum(q) is an fp16 made from the unrounded d, off from the dequantized
// d * sum(q) by at most 2^-10 (1 + 2^-10) |s|; its m * s term gets that much more.
// These bounds shrink with M; a wrong level, scale, sign or block offset moves a result by a sizeable part of one
// block's share of M, tens to thousands of times the tolerance at the sizes tested (checked by breaking kernels).
// Each type's log line prints the largest |difference| / tolerance seen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_dot.h"
#include "core/error.h"
#include "core/fp16.h"
#include "format/quant.h"

using namespace strata;

namespace {

constexpr double k_u = 0x1p-24;
constexpr double k_c = 16;

const DType k_weight_types[] = {
    DType::F32,    DType::F16,    DType::BF16,    DType::Q8_0,   DType::Q4_0,    DType::Q4_1,   DType::Q5_0,
    DType::Q5_1,   DType::IQ4_NL, DType::MXFP4,   DType::Q2_K,   DType::Q3_K,    DType::Q4_K,   DType::Q5_K,
    DType::Q6_K,   DType::IQ4_XS, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,   DType::IQ3_XXS, DType::IQ3_S,
    DType::IQ1_S,  DType::IQ1_M,  DType::TQ1_0,   DType::TQ2_0,
};

std::vector<CpuIsa> levels_here() {
    std::vector<CpuIsa> v;
    for (int l = 0; l <= int(cpu_isa_supported()); l++) v.push_back(CpuIsa(l));
    return v;
}

// Gaussian values with a few outliers (every 97th element x8): the kind of row real weights and activations are.
std::vector<float> gaussian_outliers(size_t n, uint64_t seed, float scale) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = d(rng) * (i % 97 == 13 ? 8.0f : 1.0f);
    return v;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Byte ranges of the level fields of types that store a minimum or an offset level: zeroed, the dequantized value
// is the block's minimum part (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) or its offset part (Q3_K: -4, Q6_K: -32, TQ: -1 times
// the scale) alone, which is what the kernels add apart from the stored levels.
struct LevelBytes {
    int begin, end;
};
bool level_bytes(DType t, LevelBytes *r) {
    switch (t) {
        case DType::Q4_1: *r = {4, 20}; return true;
        case DType::Q5_1: *r = {4, 24}; return true;
        case DType::Q2_K: *r = {16, 80}; return true;
        case DType::Q3_K: *r = {0, 96}; return true;  // hmask and qs
        case DType::Q4_K: *r = {16, 144}; return true;
        case DType::Q5_K: *r = {16, 176}; return true;
        case DType::Q6_K: *r = {0, 192}; return true;  // ql and qh
        case DType::TQ1_0: *r = {0, 52}; return true;  // qs and qh
        case DType::TQ2_0: *r = {0, 64}; return true;
        default: return false;
    }
}

// Offsets of fp16 scale fields in a block (random-byte rows get sane values there).
std::vector<int> scale_offsets(DType t) {
    switch (t) {
        case DType::Q4_1:
        case DType::Q5_1:
        case DType::Q4_K:
        case DType::Q5_K: return {0, 2};
        case DType::Q2_K: return {80, 82};
        case DType::Q3_K: return {108};
        case DType::Q6_K: return {208};
        case DType::TQ1_0: return {52};
        case DType::TQ2_0: return {64};
        case DType::MXFP4:
        case DType::IQ1_M: return {};
        default: return {0};
    }
}

// Random bytes in every field, then sane scales: fp16 magnitudes in [2^-9, 2^-6], positive where the format
// subtracts a minimum; MXFP4 exponents 2^-10 .. 2^-4; IQ1_M's scattered fp16 nibbles likewise.
std::vector<uint8_t> random_weight_row(DType t, int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const DTypeInfo &info = dtype_info(t);
    std::vector<uint8_t> row(row_bytes(t, n));
    if (is_float(t)) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> f(static_cast<size_t>(n));
        for (float &v : f) v = u(rng) * 0.1f;
        quantize_row(t, f.data(), row.data(), n);
        return row;
    }
    for (uint8_t &b : row) b = uint8_t(rng());
    std::uniform_real_distribution<float> mag(0x1p-9f, 0x1p-6f);
    for (int64_t blk = 0; blk < n / info.block_size; blk++) {
        uint8_t *b = row.data() + blk * info.block_bytes;
        const std::vector<int> offs = scale_offsets(t);
        for (size_t k = 0; k < offs.size(); k++) {
            const bool is_min = k == 1;  // Q4_1/Q5_1 m may be negative (y = d q + m); K-quant dmin is used as -dmin m
            float v = mag(rng);
            if (k == 0 || (is_min && (t == DType::Q4_1 || t == DType::Q5_1))) v = (rng() & 1) ? v : -v;
            if (k == 0 && (t == DType::Q2_K || t == DType::Q4_K || t == DType::Q5_K)) v = std::fabs(v);
            const uint16_t h = f32_to_f16(v);
            std::memcpy(b + offs[k], &h, 2);
        }
        if (t == DType::MXFP4) b[0] = uint8_t(118 + rng() % 7);
        if (t == DType::IQ1_M) {
            const uint16_t h = f32_to_f16(mag(rng));
            for (int k = 0; k < 4; k++) {
                uint16_t sc;
                std::memcpy(&sc, b + 48 + 2 * k, 2);
                sc = uint16_t((sc & 0x0fff) | (((h >> (4 * k)) & 15) << 12));
                std::memcpy(b + 48 + 2 * k, &sc, 2);
            }
        }
    }
    return row;
}

std::vector<uint8_t> quantized_weight_row(DType t, int64_t n, uint64_t seed) {
    const std::vector<float> w = gaussian_outliers(size_t(n), seed, 0.05f);
    std::vector<uint8_t> row(row_bytes(t, n));
    quantize_row(t, w.data(), row.data(), n);
    return row;
}

struct ActRow {
    std::vector<uint8_t> bytes;  // the activation format (for F32: the floats)
    std::vector<float> values;   // what they mean (dequantized)
};

ActRow activation_row(DType weight_type, int64_t n, uint64_t seed) {
    const DType vt = dot_act_type(weight_type);
    const std::vector<float> x = gaussian_outliers(size_t(n), seed, 1.0f);
    ActRow a;
    a.bytes.resize(row_bytes(vt, n));
    quantize_row(vt, x.data(), a.bytes.data(), n);
    a.values.resize(size_t(n));
    dequantize_row(vt, a.bytes.data(), a.values.data(), n);
    return a;
}

// The reference value (double sum of dequantized products) and the tolerances above, for one row pair.
struct Expect {
    double ref = 0;       // dequantize-then-multiply
    double m_abs = 0;     // M
    double s_term = 0;    // Q4_1 / Q5_1: the fp16 s allowance
    double depth = 0;
};

Expect expect(DType t, int64_t n, const std::vector<uint8_t> &w, const ActRow &x) {
    Expect e;
    std::vector<float> wd(static_cast<size_t>(n)), w0(static_cast<size_t>(n), 0.0f);
    dequantize_row(t, w.data(), wd.data(), n);
    LevelBytes lb;
    const DTypeInfo &info = dtype_info(t);
    if (level_bytes(t, &lb)) {
        std::vector<uint8_t> zeroed = w;
        for (int64_t blk = 0; blk < n / info.block_size; blk++)
            std::memset(zeroed.data() + blk * info.block_bytes + lb.begin, 0, size_t(lb.end - lb.begin));
        dequantize_row(t, zeroed.data(), w0.data(), n);
    }
    for (int64_t k = 0; k < n; k++) {
        const double wk = wd[size_t(k)], mk = w0[size_t(k)], xk = x.values[size_t(k)];
        e.ref += wk * xk;
        e.m_abs += (std::fabs(wk - mk) + std::fabs(mk)) * std::fabs(xk);
    }
    if (t == DType::Q4_1 || t == DType::Q5_1) {
        for (int64_t blk = 0; blk < n / 32; blk++) {
            uint16_t s;
            std::memcpy(&s, x.bytes.data() + blk * 36 + 2, 2);
            e.s_term += std::fabs(double(w0[size_t(blk * 32)])) * std::fabs(double(f16_to_f32(s)));
        }
        e.s_term *= 0x1p-10 * (1 + 0x1p-10);
    }
    e.depth = is_float(t) ? double(n) / 8 + 1 : double(n / info.block_size);
    return e;
}

std::vector<int64_t> sizes_for(DType t) {
    if (is_float(t)) return {1, 13, 64, 256, 2304, 7168};
    if (dtype_info(t).block_size == 32) return {32, 96, 256, 2304, 7168};
    return {256, 512, 2304, 7168};
}

}  // namespace

class VecDot : public ::testing::TestWithParam<DType> {};

// Each level equals the scalar kernel, and the scalar kernel equals dequantize-then-multiply, on quantizer output
// (Gaussian rows with outliers) and on random bytes with sane scales.
TEST_P(VecDot, LevelsAgreeWithScalarAndScalarWithReference) {
    const DType t = GetParam();
    const VecDotFn scalar = vec_dot_fn(t, CpuIsa::scalar);
    ASSERT_NE(scalar, nullptr) << dtype_name(t);
    uint64_t seed = 1000 * uint64_t(t);
    int checked = 0;
    double worst_ref = 0, worst_level = 0;  // largest |difference| / tolerance seen, for the log
    for (int64_t n : sizes_for(t)) {
        for (int source = 0; source < 2; source++) {
            if (source == 0 && !can_quantize(t)) continue;
            for (int rep = 0; rep < 2; rep++) {
                seed++;
                const std::vector<uint8_t> w =
                    source == 0 ? quantized_weight_row(t, n, seed) : random_weight_row(t, n, seed);
                const ActRow x = activation_row(t, n, seed + 7);
                const Expect e = expect(t, n, w, x);
                const float ys = scalar(n, w.data(), x.bytes.data());
                const double tol_ref = (e.depth + 2 * k_c) * k_u * e.m_abs + e.s_term;
                ASSERT_NEAR(ys, e.ref, tol_ref) << dtype_name(t) << " n=" << n << " source=" << source;
                worst_ref = std::max(worst_ref, std::fabs(ys - e.ref) / tol_ref);
                float y_avx2 = NAN;
                for (CpuIsa isa : levels_here()) {
                    if (isa == CpuIsa::scalar) continue;
                    const float yl = vec_dot_fn(t, isa)(n, w.data(), x.bytes.data());
                    // The AVX-512 level's integer kernels are the AVX2 ones with VNNI steps: same integers, same
                    // float operations, so the same bits (the float types use wider vectors and only agree within
                    // the tolerance).
                    if (isa == CpuIsa::avx2) y_avx2 = yl;
                    if (isa == CpuIsa::avx512 && !is_float(t) && vec_dot_has_kernel(t, CpuIsa::avx512)) {
                        ASSERT_EQ(std::memcmp(&yl, &y_avx2, 4), 0) << dtype_name(t) << " n=" << n;
                    }
                    const double tol = (2 * e.depth + 2 * k_c) * k_u * e.m_abs;
                    ASSERT_NEAR(yl, ys, tol) << dtype_name(t) << " " << cpu_isa_name(isa) << " n=" << n
                                             << " source=" << source;
                    worst_level = std::max(worst_level, std::fabs(double(yl) - ys) / tol);
                }
                checked++;
            }
        }
    }
    EXPECT_GT(checked, 0);
    std::printf("%-8s %d row pairs; worst |diff| / tolerance: scalar vs reference %.3f, levels up to %s vs "
                "scalar %.3f\n",
                dtype_name(t), checked, worst_ref, cpu_isa_name(cpu_isa_supported()), worst_level);
}

// The multi-row form gives each row bit for bit what the one-row form gives, for every row count it accepts.
TEST_P(VecDot, RowsEqualOneAtATime) {
    const DType t = GetParam();
    const DType vt = dot_act_type(t);
    const int64_t n = is_float(t) ? 2304 + 7 : 2304;
    const std::vector<uint8_t> w = random_weight_row(t, n, 99);
    std::vector<uint8_t> xs;
    const size_t stride = (vt == DType::F32 ? size_t(n) * 4 : row_bytes(vt, n)) + 64;  // padded rows
    for (int r = 0; r < 4; r++) {
        ActRow a = activation_row(t, n, 500 + uint64_t(r));
        a.bytes.resize(stride, 0xee);
        xs.insert(xs.end(), a.bytes.begin(), a.bytes.end());
    }
    for (CpuIsa isa : levels_here()) {
        const VecDotKernel k = vec_dot_kernel(t, isa);
        ASSERT_NE(k.dot, nullptr);
        if (!k.dot_rows) continue;
        ASSERT_GE(k.max_rows, 2);
        ASSERT_LE(k.max_rows, 8);
        for (int nx = 1; nx <= k.max_rows; nx++) {
            float out[8];
            std::fill(out, out + 8, NAN);
            k.dot_rows(n, w.data(), xs.data(), stride, out, nx);
            for (int j = 0; j < nx; j++) {
                const float one = k.dot(n, w.data(), xs.data() + size_t(j) * stride);
                ASSERT_EQ(std::memcmp(&out[j], &one, 4), 0)
                    << dtype_name(t) << " " << cpu_isa_name(isa) << " nx=" << nx << " row " << j;
            }
            for (int j = nx; j < 8; j++) ASSERT_TRUE(std::isnan(out[j]));
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, VecDot, ::testing::ValuesIn(k_weight_types),
                         [](const ::testing::TestParamInfo<DType> &p) { return std::string(dtype_name(p.param)); });

// The SIMD activation quantizers write exactly quantize_row's bytes, including ties, zeros, NaN, infinities,
// subnormals, and blocks whose largest magnitude appears with both signs.
TEST(ActivationQuantizers, SameBytesAsQuantizeRow) {
    const int64_t n = 256 * 12;
    std::vector<std::vector<float>> inputs;
    inputs.push_back(gaussian_outliers(size_t(n), 1, 1.0f));
    inputs.push_back(gaussian_outliers(size_t(n), 2, 1e-3f));
    {
        std::vector<float> x(static_cast<size_t>(n));
        std::mt19937_64 rng(3);
        for (int64_t i = 0; i < n; i++) {
            const int64_t blk = i / 256;  // one kind of block per 256 elements (and per 32 within)
            switch (blk) {
                case 0: x[size_t(i)] = 0.0f; break;
                case 1: x[size_t(i)] = float(int64_t(rng() % 255) - 127) + 0.5f * float(rng() & 1); break;  // ties
                case 2: x[size_t(i)] = (i % 32 == 5) ? NAN : float(int64_t(rng() % 200) - 100) * 0.01f; break;
                case 3: x[size_t(i)] = (i % 64 == 9) ? INFINITY : 1.0f; break;
                case 4: x[size_t(i)] = (i % 32 == 3) ? -2.0f : (i % 32 == 7 ? 2.0f : 0.5f); break;
                case 5: x[size_t(i)] = float(int64_t(rng() % 2001) - 1000) * 1e-42f; break;  // subnormals
                case 6: x[size_t(i)] = (i % 2) ? -0.0f : 0.0f; break;
                case 7: x[size_t(i)] = NAN; break;
                case 8: x[size_t(i)] = (i % 32 == 0) ? -INFINITY : float(i % 7); break;
                case 9: x[size_t(i)] = float(i % 255) * (127.0f / 254.0f) - 63.5f; break;
                default: x[size_t(i)] = float(int64_t(rng() % 2000001) - 1000000) * 1e3f; break;
            }
        }
        inputs.push_back(x);
    }
    for (DType vt : {DType::Q8_0, DType::Q8_1, DType::Q8_K}) {
        for (const std::vector<float> &x : inputs) {
            std::vector<uint8_t> want(row_bytes(vt, n)), got(row_bytes(vt, n));
            quantize_row(vt, x.data(), want.data(), n);
            for (CpuIsa isa : levels_here()) {
                std::fill(got.begin(), got.end(), 0xa5);
                quantize_act_fn(vt, isa)(x.data(), got.data(), n);
                for (size_t i = 0; i < want.size(); i++)
                    ASSERT_EQ(got[i], want[i]) << dtype_name(vt) << " " << cpu_isa_name(isa) << " byte " << i;
            }
        }
    }
}

// Activation levels stay within [-127, 127] (the SIMD kernels' sign tricks rely on it), also at the extremes.
TEST(ActivationQuantizers, LevelsNeverReachMinus128) {
    const int64_t n = 256 * 64;
    std::vector<float> x = gaussian_outliers(size_t(n), 9, 1.0f);
    for (int64_t i = 0; i < n; i += 37) x[size_t(i)] *= 1000.0f;
    for (int64_t i = 5; i < n; i += 256) x[size_t(i)] = -std::fabs(x[size_t(i)]) * 1e4f;  // negative maxima
    for (DType vt : {DType::Q8_0, DType::Q8_1, DType::Q8_K}) {
        std::vector<uint8_t> q(row_bytes(vt, n));
        quantize_row(vt, x.data(), q.data(), n);
        const int bs = dtype_info(vt).block_size, bb = dtype_info(vt).block_bytes;
        const int qs_off = vt == DType::Q8_0 ? 2 : 4;
        for (int64_t blk = 0; blk < n / bs; blk++)
            for (int j = 0; j < bs; j++) ASSERT_NE(int8_t(q[size_t(blk * bb + qs_off + j)]), -128) << dtype_name(vt);
    }
}

TEST(CpuIsa, LevelsAndKernelsPresent) {
    EXPECT_LE(int(cpu_isa_active()), int(cpu_isa_supported()));
    for (DType t : k_weight_types) {
        EXPECT_TRUE(vec_dot_has_kernel(t, CpuIsa::scalar)) << dtype_name(t);
        for (CpuIsa isa : levels_here()) EXPECT_NE(vec_dot_fn(t, isa), nullptr) << dtype_name(t);
    }
#if defined(__x86_64__)
    // x86-64 builds carry both SIMD levels, with a kernel for every type, whatever the build machine runs (the CPU
    // decides at run time).
    for (DType t : k_weight_types) {
        for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) EXPECT_TRUE(vec_dot_has_kernel(t, isa)) << dtype_name(t);
    }
#endif
}

// The STRATA_CPU_ISA switch (tests/CMakeLists.txt runs this with it set; skipped otherwise): the named level, capped
// at what the CPU runs, is the one cpu_matmul uses; any other value is refused.
TEST(CpuIsa, EnvironmentSwitch) {
    const char *env = std::getenv("STRATA_CPU_ISA");
    if (!env) GTEST_SKIP() << "STRATA_CPU_ISA is not set";
    const std::string name = env;
    if (name != "scalar" && name != "avx2" && name != "avx512") {
        EXPECT_THROW(cpu_isa_active(), Error);
        return;
    }
    const CpuIsa want = name == "scalar" ? CpuIsa::scalar : name == "avx2" ? CpuIsa::avx2 : CpuIsa::avx512;
    const CpuIsa expect = int(want) <= int(cpu_isa_supported()) ? want : cpu_isa_supported();
    EXPECT_EQ(cpu_isa_active(), expect);

    // cpu_matmul computes at that level: its outputs are the level's own dot products, bit for bit.
    const int64_t K = 512, N = 5, T = 2;
    std::vector<uint8_t> storage(row_bytes(DType::Q4_K, K) * N);
    for (int64_t n = 0; n < N; n++) {
        const std::vector<float> wf = gaussian_outliers(size_t(K), 40 + uint64_t(n), 0.05f);
        quantize_row(DType::Q4_K, wf.data(), storage.data() + size_t(n) * row_bytes(DType::Q4_K, K), K);
    }
    Weight w;
    w.type = DType::Q4_K;
    w.ne[0] = K, w.ne[1] = N, w.ne[2] = 1;
    w.host = storage.data();
    w.row_bytes = row_bytes(DType::Q4_K, K);
    std::vector<float> x = gaussian_outliers(size_t(T * K), 41, 1.0f), y(size_t(T * N));
    ThreadPool pool(2);
    cpu_matmul(pool, w, Act{x.data(), T, K, K}, Act{y.data(), T, N, N});
    const VecDotFn dot = vec_dot_fn(DType::Q4_K, expect);
    std::vector<uint8_t> xq(row_bytes(DType::Q8_K, K));
    for (int64_t t = 0; t < T; t++) {
        quantize_row(DType::Q8_K, x.data() + t * K, xq.data(), K);
        for (int64_t n = 0; n < N; n++) {
            const float want_y = dot(K, storage.data() + size_t(n) * w.row_bytes, xq.data());
            EXPECT_EQ(std::memcmp(&y[size_t(t * N + n)], &want_y, 4), 0) << cpu_isa_name(expect);
        }
    }
}

// ---- cpu_matmul ---------------------------------------------------------------------------------------------------

namespace {

struct MatmulCase {
    DType type;
    int64_t K, N, T;
};

Weight make_weight(DType t, int64_t K, int64_t N, std::vector<uint8_t> &storage, uint64_t seed) {
    storage.resize(row_bytes(t, K) * size_t(N));
    for (int64_t n = 0; n < N; n++) {
        const std::vector<uint8_t> r = n % 3 == 2 || !can_quantize(t) ? random_weight_row(t, K, seed + uint64_t(n))
                                                                      : quantized_weight_row(t, K, seed + uint64_t(n));
        std::memcpy(storage.data() + size_t(n) * r.size(), r.data(), r.size());
    }
    Weight w;
    w.name = "test.weight";
    w.type = t;
    w.ne[0] = K;
    w.ne[1] = N;
    w.ne[2] = 1;
    w.host = storage.data();
    w.row_bytes = row_bytes(t, K);
    w.expert_stride = w.row_bytes * size_t(N);
    return w;
}

}  // namespace

class Matmul : public ::testing::TestWithParam<DType> {};

// Decode (one token) and prefill (several tokens, up to three token tiles) shapes, 1..4 threads, every level:
// each output equals its own vec_dot bit for bit (tiling and threads change nothing), and cpu_matmul equals
// cpu_matmul_reference within the tolerance above (reference: fp32 sums of depth K/8 + 1).
TEST_P(Matmul, EqualsKernelExactlyAndReferenceWithinBound) {
    const DType t = GetParam();
    const int64_t block = dtype_info(dot_act_type(t)).block_size;
    const int64_t K = is_float(t) ? 300 : (block == 256 ? 1024 : 320);
    // token counts: 1 (decode), 3 and 6 (partial groups of the multi-row kernels), 133 (three token tiles)
    for (const MatmulCase mc : {MatmulCase{t, K, 67, 1}, MatmulCase{t, K, 9, 3}, MatmulCase{t, K, 21, 6},
                                MatmulCase{t, K, 35, 133}}) {
        std::vector<uint8_t> storage;
        const Weight w = make_weight(t, mc.K, mc.N, storage, 77);
        std::vector<float> x = gaussian_outliers(size_t(mc.T * (mc.K + 5)), 78, 1.0f);
        const Act xa{x.data(), mc.T, mc.K, mc.K + 5};  // strided rows: a column view of a wider activation
        std::vector<float> y_ref(size_t(mc.T * mc.N));
        {
            ThreadPool pool(2);
            cpu_matmul_reference(pool, w, xa, Act{y_ref.data(), mc.T, mc.N, mc.N});
        }
        // expected bounds per output, from the dequantized operands
        const DType vt = dot_act_type(t);
        std::vector<ActRow> acts;
        for (int64_t r = 0; r < mc.T; r++) {
            ActRow a;
            a.bytes.resize(row_bytes(vt, mc.K));
            quantize_row(vt, xa.row(r), a.bytes.data(), mc.K);
            a.values.resize(size_t(mc.K));
            dequantize_row(vt, a.bytes.data(), a.values.data(), mc.K);
            acts.push_back(std::move(a));
        }
        for (CpuIsa isa : levels_here()) {
            const VecDotFn dot = vec_dot_fn(t, isa);
            for (int threads = 1; threads <= 4; threads++) {
                ThreadPool pool(threads);
                std::vector<float> y(size_t(mc.T * (mc.N + 3)), NAN);
                cpu_matmul_isa(pool, w, xa, Act{y.data(), mc.T, mc.N, mc.N + 3}, isa);
                for (int64_t r = 0; r < mc.T; r++) {
                    for (int64_t n = 0; n < mc.N; n++) {
                        const uint8_t *wr = storage.data() + size_t(n) * w.row_bytes;
                        const float got = y[size_t(r * (mc.N + 3) + n)];
                        const float own = dot(mc.K, wr, acts[size_t(r)].bytes.data());
                        ASSERT_EQ(std::memcmp(&got, &own, 4), 0)
                            << dtype_name(t) << " " << cpu_isa_name(isa) << " threads=" << threads << " t=" << r
                            << " n=" << n << ": " << got << " vs " << own;
                        if (threads > 1) continue;  // the bound check is the same for every thread count
                        const std::vector<uint8_t> wrow(wr, wr + w.row_bytes);
                        const Expect e = expect(t, mc.K, wrow, acts[size_t(r)]);
                        const double depth_ref = double(mc.K) / 8 + 1;
                        const double tol = (e.depth + depth_ref + 2 * k_c) * k_u * e.m_abs + e.s_term;
                        ASSERT_NEAR(got, y_ref[size_t(r * mc.N + n)], tol)
                            << dtype_name(t) << " " << cpu_isa_name(isa) << " t=" << r << " n=" << n;
                    }
                    for (int64_t n = mc.N; n < mc.N + 3; n++) ASSERT_TRUE(std::isnan(y[size_t(r * (mc.N + 3) + n)]));
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, Matmul, ::testing::ValuesIn(k_weight_types),
                         [](const ::testing::TestParamInfo<DType> &p) { return std::string(dtype_name(p.param)); });
