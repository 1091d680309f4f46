// The AVX2 level (AVX2 + FMA + F16C) of vec_dot.h: this file is compiled with those instruction sets enabled whatever
// the build's target, and is only called when the running CPU has them. The kernels live in x86/*.h, shared with
// the AVX-512 level; everything here has internal linkage so no code compiled for AVX2 can leak into other files.
#include "backend/cpu/vec_dot_impl.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "format/iq_grids.h"
#include "format/quant_blocks.h"

#define STRATA_X86_AVX512 0

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
const KernelTable &avx2_kernels() {
    static constexpr KernelTable table = {k_x86_dots, int(sizeof(k_x86_dots) / sizeof(k_x86_dots[0])),
                                          quantize_q8_0, quantize_q8_1, quantize_q8_k};
    return table;
}

}  // namespace strata::vec_dot_detail

#else

namespace strata::vec_dot_detail {
const KernelTable &avx2_kernels() {
    static const KernelTable table = {nullptr, 0, nullptr, nullptr, nullptr};
    return table;
}
}  // namespace strata::vec_dot_detail

#endif
