// Byte layouts of the quantized blocks as C structs (sizes checked against the dtype table), and the small format
// constants that go with them. Layout only: no (de)quantization here. Fields are little-endian; fp16 fields are raw
// IEEE half bits. See ../shared/REFERENCE.md §2 for what each field means.
#pragma once

#include <bit>
#include <cstdint>

namespace strata {

static_assert(std::endian::native == std::endian::little, "block layouts are read in place: little-endian hosts only");

constexpr int QK4_0 = 32;  // elements per block of every 32-element format (Q4_0 ... Q8_1, IQ4_NL, MXFP4)
constexpr int QK_K_BLOCK = 256;
constexpr int K_SCALE_SIZE = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K

// clang-format off
// ---- 32-element blocks -------------------------------------------------------------------------------------------
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };  // qh: little-endian u32, bit e = 5th bit of e
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ8_1 { uint16_t d, s; int8_t qs[32]; };  // s = d * sum(qs), as fp16
struct BlockIQ4NL { uint16_t d; uint8_t qs[16]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[16]; };  // e: E8M0 shared exponent

// ---- K-quants (256 elements) -------------------------------------------------------------------------------------
struct BlockQ2K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };  // scales: low nibble scale, high min
struct BlockQ3K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[128]; };
struct BlockQ5K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockQ8K { float d; int8_t qs[256]; int16_t bsums[16]; };  // bsums[j] = sum of qs[16j .. 16j+15]

// ---- i-quants (256 elements) -------------------------------------------------------------------------------------
struct BlockIQ2XXS { uint16_t d; uint16_t qs[32]; };
struct BlockIQ2XS { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };
struct BlockIQ2S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; };  // qs[32..63]: sign masks
struct BlockIQ3XXS { uint16_t d; uint8_t qs[96]; };  // qs[64..95]: 8 x u32 of signs and scales
struct BlockIQ3S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };
struct BlockIQ1S { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; };
struct BlockIQ1M { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; };  // fp16 d is spread over scales' top nibbles
struct BlockIQ4XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };

// ---- ternary (256 elements) --------------------------------------------------------------------------------------
struct BlockTQ1_0 { uint8_t qs[48]; uint8_t qh[4]; uint16_t d; };  // base-3 digits, 5 per byte (4 in qh)
struct BlockTQ2_0 { uint8_t qs[64]; uint16_t d; };                 // 2 bits per value, as Q2_K's qs

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockIQ4NL) == 18 && sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2K) == 84 && sizeof(BlockQ3K) == 110 && sizeof(BlockQ4K) == 144);
static_assert(sizeof(BlockQ5K) == 176 && sizeof(BlockQ6K) == 210 && sizeof(BlockQ8K) == 292);
static_assert(sizeof(BlockIQ2XXS) == 66 && sizeof(BlockIQ2XS) == 74 && sizeof(BlockIQ2S) == 82);
static_assert(sizeof(BlockIQ3XXS) == 98 && sizeof(BlockIQ3S) == 110 && sizeof(BlockIQ1S) == 50);
static_assert(sizeof(BlockIQ1M) == 56 && sizeof(BlockIQ4XS) == 136);
static_assert(sizeof(BlockTQ1_0) == 54 && sizeof(BlockTQ2_0) == 66);

// clang-format on

// Non-linear 4-bit levels of IQ4_NL and IQ4_XS.
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// E2M1 (FP4) values doubled; MXFP4's scale is therefore 2^(e-128) rather than 2^(e-127).
inline constexpr int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

constexpr float IQ1_DELTA = 0.125f;  // IQ1_S / IQ1_M grid offset

}  // namespace strata
