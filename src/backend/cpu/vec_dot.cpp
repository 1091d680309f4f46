// vec_dot.h's dispatch: which instruction-set level the CPU runs, the STRATA_CPU_ISA override, and the per-type
// choice of kernel (falling back level by level). No arithmetic here.
#include "backend/cpu/vec_dot.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "backend/cpu/vec_dot_impl.h"
#include "core/error.h"

namespace strata {

using namespace vec_dot_detail;

const char *cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::scalar: return "scalar";
        case CpuIsa::avx2: return "avx2";
        case CpuIsa::avx512: return "avx512";
    }
    return "?";
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {

// What the CPU has and the OS saves across context switches (XCR0), read with cpuid / xgetbv (compilers differ in
// which feature names __builtin_cpu_supports knows).
struct X86Features {
    bool avx2 = false, avx512 = false;
};

X86Features x86_features() {
    X86Features f;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
    if (!osxsave || !avx) return f;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool os_avx = (xcr0_lo & 0x6) == 0x6;        // SSE and AVX state
    const bool os_avx512 = (xcr0_lo & 0xe6) == 0xe6;   // and opmask, upper ZMM halves, ZMM16-31
    if (__get_cpuid_max(0, nullptr) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = os_avx && fma && f16c && (b & (1u << 5));
    const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));  // F DQ BW VL
    const bool vnni = c & (1u << 11);
    f.avx512 = f.avx2 && os_avx512 && avx512 && vnni;
    return f;
}

}  // namespace
#endif

CpuIsa cpu_isa_supported() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static const CpuIsa level = [] {
        const X86Features f = x86_features();
        if (f.avx512 && avx512_kernels().n_dots > 0) return CpuIsa::avx512;
        if (f.avx2 && avx2_kernels().n_dots > 0) return CpuIsa::avx2;
        return CpuIsa::scalar;
    }();
    return level;
#else
    return CpuIsa::scalar;
#endif
}

CpuIsa cpu_isa_active() {
    static const CpuIsa level = [] {
        const CpuIsa supported = cpu_isa_supported();
        const char *env = std::getenv("STRATA_CPU_ISA");
        if (!env || !*env) return supported;
        CpuIsa want;
        if (!std::strcmp(env, "scalar"))
            want = CpuIsa::scalar;
        else if (!std::strcmp(env, "avx2"))
            want = CpuIsa::avx2;
        else if (!std::strcmp(env, "avx512"))
            want = CpuIsa::avx512;
        else
            fail("STRATA_CPU_ISA='%s': expected scalar, avx2 or avx512", env);
        if (int(want) > int(supported)) {
            std::fprintf(stderr, "strata: STRATA_CPU_ISA=%s, but this CPU runs at most %s: using %s\n", env,
                         cpu_isa_name(supported), cpu_isa_name(supported));
            return supported;
        }
        return want;
    }();
    return level;
}

namespace {

const KernelTable &table_of(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::avx512: return avx512_kernels();
        case CpuIsa::avx2: return avx2_kernels();
        case CpuIsa::scalar: break;
    }
    return scalar_kernels();
}

const DotEntry *find_dot(const KernelTable &t, DType type) {
    for (int i = 0; i < t.n_dots; i++)
        if (t.dots[i].type == type) return &t.dots[i];
    return nullptr;
}

QuantizeActFn find_quantizer(const KernelTable &t, DType act) {
    switch (act) {
        case DType::Q8_0: return t.quantize_q8_0;
        case DType::Q8_1: return t.quantize_q8_1;
        case DType::Q8_K: return t.quantize_q8_k;
        default: return nullptr;
    }
}

}  // namespace

VecDotKernel vec_dot_kernel(DType type, CpuIsa isa) {
    STRATA_ASSERT(int(isa) <= int(cpu_isa_supported()));
    for (int level = int(isa); level >= 0; level--)
        if (const DotEntry *e = find_dot(table_of(CpuIsa(level)), type))
            return {e->dot, e->dot_rows, e->dot_rows ? e->max_rows : 1};
    return {};
}

VecDotFn vec_dot_fn(DType type, CpuIsa isa) { return vec_dot_kernel(type, isa).dot; }

bool vec_dot_has_kernel(DType type, CpuIsa isa) { return find_dot(table_of(isa), type) != nullptr; }

QuantizeActFn quantize_act_fn(DType act, CpuIsa isa) {
    STRATA_ASSERT(int(isa) <= int(cpu_isa_supported()));
    for (int level = int(isa); level >= 0; level--)
        if (QuantizeActFn f = find_quantizer(table_of(CpuIsa(level)), act)) return f;
    return nullptr;
}

}  // namespace strata
