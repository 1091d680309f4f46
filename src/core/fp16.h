// IEEE half and bfloat16 conversions, bit-exact with numpy's astype (round to nearest even, subnormals kept,
// NaN stays NaN). Scalar and portable; SIMD paths may use F16C but must agree with these.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata {

inline float bits_to_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint32_t f32_to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / nan
    if (exp == 0) {
        if (mant == 0) return bits_to_f32(sign);
        // subnormal: value = mant * 2^-24, exact in f32
        float v = float(mant) * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_to_bits(f);
    uint16_t sign = uint16_t((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or nan
        if (abs == 0x7f800000u) return sign | 0x7c00;
        return uint16_t(sign | 0x7e00 | ((abs >> 13) & 0x3ff));
    }
    if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: overflow to inf
    if (abs < 0x38800000u) {                        // below the smallest normal half (2^-14): subnormal or zero
        // value in units of 2^-24, rounded to nearest even
        uint32_t exp = abs >> 23;
        if (exp < 102) return sign;  // < 2^-25: rounds to zero
        uint32_t mant = (abs & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exp;  // value = mant * 2^(exp-150); in 2^-24 units: mant >> (126-exp)
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return uint16_t(sign | q);
    }
    uint32_t r = abs + 0xfff + ((abs >> 13) & 1);  // round to nearest even at bit 13
    return uint16_t(sign | (((r >> 13) - (112u << 10)) & 0x7fff));
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet nan
    return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

}  // namespace strata
