// Float functions that give the same bits on the host and on the GPU: each is a fixed sequence of correctly
// rounded steps (+, *, /, fused multiply-add, exact scaling by powers of two), so the CUDA kernels and their host
// copies (backend/host/mmvq_host.cpp) agree wherever they use them. Host files that include this must be compiled
// with -ffp-contract=off (the steps are written as separate operations, which a contracting compiler may fuse).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define STRATA_HD inline
#endif

namespace strata::exact {

STRATA_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

// Single correctly rounded steps the device compiler may not fuse with their neighbours.
STRATA_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

STRATA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

STRATA_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

STRATA_HD float from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

// Round to the nearest integer, ties to even.
STRATA_HD int round_even(float x) {
#if defined(__CUDA_ARCH__)
    return __float2int_rn(x);
#else
    return int(std::nearbyint(x));
#endif
}

// e^x within about 1 ulp: Cody-Waite reduction to r in [-ln2/2, ln2/2], a degree-6 polynomial for e^r by Horner's
// rule in fused multiply-adds, and exact scaling by 2^n in two halves. Results below 2^-126 come out subnormal or
// zero, above the float range infinity; NaN stays NaN.
STRATA_HD float exp(float x) {
    if (!(x == x)) return x;
    if (x > 89.0f) return from_bits(0x7f800000u);
    if (x < -104.0f) return 0.0f;
    const int n = round_even(mul_rn(x, 1.44269504088896341f));
    const float fn = float(n);
    float r = fma_rn(-fn, 0.693145751953125f, x);
    r = fma_rn(-fn, 1.42860682030941723212e-6f, r);
    float p = 1.9875691500e-4f;
    p = fma_rn(p, r, 1.3981999507e-3f);
    p = fma_rn(p, r, 8.3334519073e-3f);
    p = fma_rn(p, r, 4.1665795894e-2f);
    p = fma_rn(p, r, 1.6666665459e-1f);
    p = fma_rn(p, r, 5.0000001201e-1f);
    const float e = add_rn(fma_rn(p, mul_rn(r, r), r), 1.0f);
    const int h = n / 2;
    return mul_rn(mul_rn(e, from_bits(uint32_t(h + 127) << 23)), from_bits(uint32_t(n - h + 127) << 23));
}

// silu(v) * m, as the decode kernels compute it: v / (1 + e^-v), then the product.
STRATA_HD float silu_mul(float v, float m) {
    return mul_rn(div_rn(v, add_rn(1.0f, exact::exp(-v))), m);
}

}  // namespace strata::exact
