// The AVX-512 level (AVX-512 F/BW/VL/DQ + VNNI) of vec_dot.h: this file is compiled with those instruction sets
// enabled whatever the build's target, and is only called when the running CPU has them. It compiles the kernels of
// x86/*.h again with VNNI int8 steps (256-bit vectors, which keep their shuffles in-lane) and 512-bit float types;
// everything has internal linkage so no AVX-512 code can leak into other files.
#include "backend/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
// GCC 12's AVX-512 intrinsics fill unused lanes from self-initialised "undefined" vectors, which its own
// -Wuninitialized then reports inside the intrinsic headers; silence that for the header's lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cstring>
#include <type_traits>

#include "format/iq_grids.h"
#include "format/quant_blocks.h"

#define STRATA_X86_AVX512 1

namespace strata::vec_dot_detail {
namespace {
// The order matters: each file uses the ones before it.
// clang-format off
#include "backend/cpu/x86/simd_common.h"
#include "backend/cpu/x86/dot_legacy.h"
#include "backend/cpu/x86/dot_kquants.h"
#include "backend/cpu/x86/dot_iquants.h"
#include "backend/cpu/x86/kernel_list.h"
// clang-format on
}  // namespace

// Constant-initialised (no code runs to build it), so asking for the table is safe on any CPU.
const KernelTable &avx512_kernels() {
    static constexpr KernelTable table = {k_x86_dots, int(sizeof(k_x86_dots) / sizeof(k_x86_dots[0])),
                                          quantize_q8_0, quantize_q8_1, quantize_q8_k};
    return table;
}

}  // namespace strata::vec_dot_detail

#else

namespace strata::vec_dot_detail {
const KernelTable &avx512_kernels() {
    static const KernelTable table = {nullptr, 0, nullptr, nullptr, nullptr};
    return table;
}
}  // namespace strata::vec_dot_detail

#endif
