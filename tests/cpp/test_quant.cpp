// Reference quantizers: round-trip error bounds, values that must survive exactly, the activation formats' side
// fields (Q8_1 s, Q8_K bsums), argument checking, determinism. Bit-exactness against gguf-py is checked from Python
// (tests/python/test_quant_vs_gguf.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "format/quant.h"
#include "format/quant_blocks.h"

using namespace strata;

namespace {

// Gaussian values from a fixed seed (Box-Muller over mt19937, whose output the standard fixes).
std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    auto uniform = [&] { return (float(rng() >> 8) + 0.5f) * 0x1p-24f; };
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i += 2) {
        const float r = std::sqrt(-2.0f * std::log(uniform())), a = 6.2831853f * uniform();
        x[i] = r * std::cos(a);
        if (i + 1 < n) x[i + 1] = r * std::sin(a);
    }
    return x;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float> &x) {
    std::vector<uint8_t> q(row_bytes(t, int64_t(x.size())));
    quantize_row(t, x.data(), q.data(), int64_t(x.size()));
    return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t> &q, size_t n) {
    std::vector<float> y(n);
    dequantize_row(t, q.data(), y.data(), int64_t(n));
    return y;
}

std::vector<float> round_trip(DType t, const std::vector<float> &x) {
    return dequantize(t, quantize(t, x), x.size());
}

double relative_rmse(const std::vector<float> &x, const std::vector<float> &y) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); i++) num += double(x[i] - y[i]) * double(x[i] - y[i]), den += double(x[i]) * x[i];
    return std::sqrt(num / den);
}

const DType k_quantizable[] = {
    DType::F32,     DType::F16,   DType::BF16,  DType::Q8_0,   DType::Q8_1,    DType::Q8_K,   DType::Q4_0,
    DType::Q4_1,    DType::Q5_0,  DType::Q5_1,  DType::MXFP4,  DType::IQ4_NL,  DType::Q2_K,   DType::Q3_K,
    DType::Q4_K,    DType::Q5_K,  DType::Q6_K,  DType::IQ4_XS, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,
    DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M,  DType::TQ1_0,   DType::TQ2_0,
};

}  // namespace

// Relative RMSE ||x - deq(q(x))|| / ||x|| on 16 rows x 4096 of N(0,1) (seed 1). "measured" is what the current
// quantizers give (one number, they are deterministic); the bound leaves a small margin for harmless changes of
// rounding, and a quantizer that gets worse by more than that fails here.
struct RmseBound {
    DType type;
    double measured, bound;
};

const RmseBound k_rmse_bounds[] = {
    // type, measured, bound (measured + ~2%, rounded up)
    {DType::F16, 0.000207, 0.000212},
    {DType::BF16, 0.001667, 0.00171},
    {DType::Q8_0, 0.005334, 0.00545},
    {DType::Q8_1, 0.005334, 0.00545},
    {DType::Q8_K, 0.006938, 0.00708},
    {DType::Q6_K, 0.017163, 0.0176},
    {DType::Q5_K, 0.034455, 0.0352},
    {DType::Q5_1, 0.037787, 0.0386},
    {DType::Q5_0, 0.042571, 0.0435},
    {DType::Q4_K, 0.069945, 0.0714},
    {DType::IQ4_NL, 0.073250, 0.0748},
    {DType::IQ4_XS, 0.073822, 0.0753},
    {DType::Q4_1, 0.078106, 0.0797},
    {DType::Q4_0, 0.085705, 0.0875},
    {DType::MXFP4, 0.114769, 0.118},
    {DType::IQ3_S, 0.130187, 0.133},
    {DType::Q3_K, 0.143926, 0.147},
    {DType::IQ3_XXS, 0.178487, 0.183},
    {DType::IQ2_S, 0.239121, 0.244},
    {DType::Q2_K, 0.261954, 0.268},
    {DType::IQ2_XS, 0.285683, 0.292},
    {DType::IQ2_XXS, 0.328646, 0.336},
    {DType::IQ1_M, 0.412129, 0.421},
    {DType::IQ1_S, 0.444762, 0.454},
    // ternary formats are for weights trained ternary; with d = max|x| a Gaussian row loses most of its values
    {DType::TQ2_0, 0.802540, 0.819},
    {DType::TQ1_0, 0.802540, 0.819},
};

TEST(Quant, RoundTripErrorWithinBounds) {
    const std::vector<float> x = gaussian(16 * 4096, 1);
    for (const RmseBound &b : k_rmse_bounds) {
        const double rmse = relative_rmse(x, round_trip(b.type, x));
        std::printf("  %-8s relative RMSE %.6f (bound %.6f)\n", dtype_name(b.type), rmse, b.bound);
        EXPECT_LE(rmse, b.bound) << dtype_name(b.type);
        // A much better result than recorded means the table is stale (or the data changed): update it honestly.
        EXPECT_GE(rmse, b.measured * 0.97) << dtype_name(b.type) << ": better than recorded, update the table";
    }
}

TEST(Quant, EveryQuantizerHasABound) {
    for (DType t : k_quantizable) {
        if (t == DType::F32) continue;
        bool found = false;
        for (const RmseBound &b : k_rmse_bounds) found |= b.type == t;
        EXPECT_TRUE(found) << dtype_name(t);
    }
}

TEST(Quant, ZerosSurvive) {
    const std::vector<float> x(1024, 0.0f);
    for (DType t : k_quantizable) {
        const std::vector<float> y = round_trip(t, x);
        for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
    }
}

TEST(Quant, PlainFloatsAreExact) {
    std::mt19937 rng(5);
    std::vector<float> x(4096);
    for (float &v : x) {
        do v = bits_to_f32(rng());
        while (std::isnan(v));
    }
    const std::vector<float> y = round_trip(DType::F32, x);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);

    // every finite half and bfloat16 value survives the trip through f32
    std::vector<float> h, bf;
    for (uint32_t b = 0; b < 0x10000; b++) {
        if (!std::isnan(f16_to_f32(uint16_t(b)))) h.push_back(f16_to_f32(uint16_t(b)));
        if (!std::isnan(bf16_to_f32(uint16_t(b)))) bf.push_back(bf16_to_f32(uint16_t(b)));
    }
    const std::vector<float> h2 = round_trip(DType::F16, h), bf2 = round_trip(DType::BF16, bf);
    EXPECT_EQ(std::memcmp(h.data(), h2.data(), h.size() * 4), 0);
    EXPECT_EQ(std::memcmp(bf.data(), bf2.data(), bf.size() * 4), 0);
}

// Values on a format's own lattice, with the block's largest magnitude where the quantizer puts it, come back exactly.
TEST(Quant, RepresentableValuesSurvive) {
    std::mt19937 rng(9);
    auto pick = [&](int lo, int hi) { return lo + int(rng() % uint32_t(hi - lo + 1)); };
    struct Case {
        DType type;
        int block;
        std::function<float(int)> value;  // element e of a block
    };
    const float d = 0x1p-5f;  // a power of two: its reciprocal and every product below are exact
    const std::vector<Case> cases = {
        {DType::Q8_0, 32, [&](int e) { return e == 7 ? -127 * d : float(pick(-126, 126)) * d; }},
        {DType::Q8_1, 32, [&](int e) { return e == 7 ? 127 * d : float(pick(-126, 126)) * d; }},
        {DType::Q8_K, 256, [&](int e) { return e == 9 ? 127 * d : float(pick(-126, 126)) * d; }},
        {DType::Q4_0, 32, [&](int e) { return e == 3 ? -8 * d : float(pick(-7, 7)) * d; }},
        {DType::Q5_0, 32, [&](int e) { return e == 3 ? 16 * d : float(pick(-15, 15)) * d; }},
        // the block's min (level 0) and max (level 15 / 31) are in it: elements 0 and 1
        {DType::Q4_1, 32, [&](int e) { return 0.5f + d * float(e < 2 ? 15 * e : pick(0, 15)); }},
        {DType::Q5_1, 32, [&](int e) { return -1.25f + d * float(e < 2 ? 31 * e : pick(0, 31)); }},
        {DType::MXFP4, 32, [&](int e) { return d * float(e == 5 ? -12 : kvalues_mxfp4[pick(0, 15)]); }},
        {DType::IQ4_NL, 32, [&](int e) { return d * float(kvalues_iq4nl[e == 2 ? 0 : pick(1, 15)]); }},
        // sub-block scales d*(ls-32) with ls = 0 everywhere, the largest level -127 in every sub-block
        {DType::IQ4_XS, 256, [&](int e) { return -32 * d * float(kvalues_iq4nl[e % 32 == 2 ? 0 : pick(1, 15)]); }},
        // integer levels with the most negative one in every sub-block of 16: scale 1 exactly
        {DType::Q6_K, 256, [&](int e) { return float(e % 16 == 4 ? -32 : pick(-31, 31)); }},
        {DType::Q3_K, 256, [&](int e) { return float(e % 16 == 4 ? -4 : pick(-3, 3)); }},
        {DType::TQ1_0, 256, [&](int e) { return d * float(e == 100 ? 1 : pick(-1, 1)); }},
        {DType::TQ2_0, 256, [&](int e) { return d * float(e == 100 ? -1 : pick(-1, 1)); }},
    };
    for (const Case &c : cases) {
        std::vector<float> x(size_t(c.block) * 8);
        for (size_t i = 0; i < x.size(); i++) x[i] = c.value(int(i % size_t(c.block)));
        const std::vector<float> y = round_trip(c.type, x);
        for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(y[i], x[i]) << dtype_name(c.type) << " element " << i;
    }
}

TEST(Quant, Q8_1SumField) {
    const std::vector<float> x = gaussian(32 * 64, 3);
    const std::vector<uint8_t> q = quantize(DType::Q8_1, x);
    for (size_t ib = 0; ib < 64; ib++) {
        BlockQ8_1 b;
        std::memcpy(&b, q.data() + ib * sizeof b, sizeof b);
        int sum = 0;
        float amax = 0.0f, xsum = 0.0f;
        for (int j = 0; j < 32; j++) {
            sum += b.qs[j];
            amax = std::fmax(amax, std::fabs(x[ib * 32 + j]));
            xsum += x[ib * 32 + j];
        }
        // s = d * sum(qs) with d = amax / 127 before its own fp16 rounding, rounded once to fp16
        EXPECT_EQ(b.s, f32_to_f16(amax / 127.0f * float(sum))) << "block " << ib;
        // and it is the sum of the block's dequantized values, to fp16 precision
        EXPECT_NEAR(f16_to_f32(b.s), f16_to_f32(b.d) * float(sum), 2e-3f * (1.0f + std::fabs(f16_to_f32(b.s))));
        EXPECT_NEAR(f16_to_f32(b.s), xsum, 32 * f16_to_f32(b.d) / 2 + 1e-2f);
    }
}

TEST(Quant, Q8_KLevelsAndBlockSums) {
    std::vector<float> x = gaussian(256 * 8, 4);
    x[10] = 9.0f;         // block 0: largest magnitude positive -> d < 0, that element on -127
    x[256 + 20] = -9.0f;  // block 1: largest magnitude negative -> d > 0, that element on -127
    const std::vector<uint8_t> q = quantize(DType::Q8_K, x);
    const std::vector<float> y = dequantize(DType::Q8_K, q, x.size());
    for (size_t ib = 0; ib < 8; ib++) {
        BlockQ8K b;
        std::memcpy(&b, q.data() + ib * sizeof b, sizeof b);
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int e = 0; e < 16; e++) sum += b.qs[16 * j + e];
            EXPECT_EQ(b.bsums[j], sum) << "block " << ib << " group " << j;
        }
        for (int e = 0; e < 256; e++) EXPECT_LE(std::fabs(y[ib * 256 + e] - x[ib * 256 + e]), std::fabs(b.d) * 0.5001f);
    }
    BlockQ8K b0, b1;
    std::memcpy(&b0, q.data(), sizeof b0);
    std::memcpy(&b1, q.data() + sizeof b0, sizeof b1);
    EXPECT_EQ(b0.d, 1.0f / (-127.0f / 9.0f));
    EXPECT_EQ(b0.qs[10], -127);
    EXPECT_EQ(b1.d, 1.0f / (-127.0f / -9.0f));
    EXPECT_EQ(b1.qs[20], -127);
}

// A count that is not a whole number of blocks is bad input (e.g. a tensor row of the wrong length): strata::Error
// naming the type, from both directions and for every type, before anything is read or written.
TEST(Quant, RejectsPartialBlocks) {
    std::vector<float> x(512, 1.0f);
    std::vector<uint8_t> q(4096, 0);
    for (DType t : k_quantizable) {
        const int64_t bs = dtype_info(t).block_size;
        if (bs == 1) {
            EXPECT_THROW(quantize_row(t, x.data(), q.data(), -1), Error) << dtype_name(t);
            EXPECT_THROW(dequantize_row(t, q.data(), x.data(), -1), Error) << dtype_name(t);
            continue;
        }
        for (int64_t n : {int64_t(1), bs - 1, bs + 1, int64_t(-bs)}) {
            EXPECT_THROW(quantize_row(t, x.data(), q.data(), n), Error) << dtype_name(t) << " n=" << n;
            EXPECT_THROW(dequantize_row(t, q.data(), x.data(), n), Error) << dtype_name(t) << " n=" << n;
        }
        EXPECT_NO_THROW(quantize_row(t, x.data(), q.data(), 0));
    }
    try {
        quantize_row(DType::Q4_K, x.data(), q.data(), 100);
        FAIL();
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("Q4_K"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("100"), std::string::npos) << e.what();
    }
}

TEST(Quant, CapabilitiesAndUnsupportedTypes) {
    for (DType t : k_quantizable) {
        EXPECT_TRUE(can_quantize(t)) << dtype_name(t);
        EXPECT_TRUE(can_dequantize(t)) << dtype_name(t);
    }
    float x[256] = {};
    uint8_t q[1024] = {};
    for (DType t : {DType::I8, DType::I32, DType::F64}) {
        EXPECT_FALSE(can_dequantize(t)) << dtype_name(t);
        EXPECT_FALSE(can_quantize(t)) << dtype_name(t);
        EXPECT_THROW(quantize_row(t, x, q, 256), Error) << dtype_name(t);
        EXPECT_THROW(dequantize_row(t, q, x, 256), Error) << dtype_name(t);
    }
}

// Blocks are independent and nothing persists between calls: a row quantizes to the concatenation of its halves,
// and the same input always gives the same bytes.
TEST(Quant, DeterministicAndBlockLocal) {
    const std::vector<float> x = gaussian(2 * 512, 6);
    const std::vector<float> a(x.begin(), x.begin() + 512), b(x.begin() + 512, x.end());
    for (DType t : k_quantizable) {
        const std::vector<uint8_t> whole = quantize(t, x), again = quantize(t, x);
        std::vector<uint8_t> halves = quantize(t, a);
        const std::vector<uint8_t> qb = quantize(t, b);
        halves.insert(halves.end(), qb.begin(), qb.end());
        EXPECT_EQ(whole, again) << dtype_name(t);
        EXPECT_EQ(whole, halves) << dtype_name(t);
    }
}

// Rows need not be aligned: an odd address decodes like an aligned one.
TEST(Quant, UnalignedRows) {
    const std::vector<float> x = gaussian(512, 7);
    for (DType t : k_quantizable) {
        const std::vector<uint8_t> q = quantize(t, x);
        std::vector<uint8_t> shifted(q.size() + 1);
        std::memcpy(shifted.data() + 1, q.data(), q.size());
        std::vector<float> y1(x.size()), y2(x.size());
        dequantize_row(t, q.data(), y1.data(), int64_t(x.size()));
        dequantize_row(t, shifted.data() + 1, y2.data(), int64_t(x.size()));
        EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << dtype_name(t);
    }
}

// Garbage in (NaN, infinities, values beyond fp16 range, subnormals) must still give well-formed blocks: no crash,
// no undefined float-to-int conversion (run under -fsanitize=undefined,float-cast-overflow to see that), and the
// finite blocks of such a row are unaffected by their neighbours.
TEST(Quant, NonFiniteAndExtremeInput) {
    std::vector<float> x = gaussian(256 * 6, 8);
    const std::vector<float> clean(x.begin() + 256 * 5, x.end());
    for (int e = 0; e < 256; e++) {
        x[e] = e % 3 == 0 ? NAN : x[e];                                         // block 0: NaNs
        x[256 + e] = e % 5 == 0 ? (e % 2 ? INFINITY : -INFINITY) : x[256 + e];  // block 1: infinities
        x[512 + e] *= 1e30f;                                                    // block 2: beyond fp16 scales
        x[768 + e] *= 1e-41f;                                                   // block 3: f32 subnormals
        x[1024 + e] = e == 17 ? 3.0e38f : 0.0f;                                 // block 4: one huge value
    }
    for (DType t : k_quantizable) {
        const std::vector<uint8_t> q = quantize(t, x);
        const std::vector<float> y = dequantize(t, q, x.size());
        const std::vector<float> y_clean = round_trip(t, clean);
        EXPECT_EQ(std::memcmp(y.data() + 256 * 5, y_clean.data(), 256 * 4), 0) << dtype_name(t);
    }
}
