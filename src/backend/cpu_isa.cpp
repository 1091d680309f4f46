// cpu_isa.h: the CPU's level and the STRATA_CPU_ISA cap.
#include "backend/cpu_isa.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "core/error.h"

namespace strata {

const char *cpu_isa_name(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::scalar:
            return "scalar";
        case CpuIsa::avx2:
            return "avx2";
        case CpuIsa::avx512:
            return "avx512";
    }
    return "?";
}

CpuIsa cpu_isa_hardware() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // What the CPU has and the OS saves across context switches (XCR0), read with cpuid / xgetbv (compilers differ
    // in which feature names __builtin_cpu_supports knows).
    static const CpuIsa level = [] {
        unsigned a, b, c, d;
        if (!__get_cpuid(1, &a, &b, &c, &d)) return CpuIsa::scalar;
        const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
        if (!osxsave || !avx) return CpuIsa::scalar;
        unsigned xcr0_lo, xcr0_hi;
        __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
        const bool os_avx = (xcr0_lo & 0x6) == 0x6;       // SSE and AVX state
        const bool os_avx512 = (xcr0_lo & 0xe6) == 0xe6;  // and opmask, upper ZMM halves, ZMM16-31
        if (__get_cpuid_max(0, nullptr) < 7) return CpuIsa::scalar;
        __cpuid_count(7, 0, a, b, c, d);
        const bool avx2 = os_avx && fma && f16c && (b & (1u << 5));
        const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));  // F DQ BW VL
        const bool vnni = c & (1u << 11);
        if (avx2 && os_avx512 && avx512 && vnni) return CpuIsa::avx512;
        return avx2 ? CpuIsa::avx2 : CpuIsa::scalar;
    }();
    return level;
#else
    return CpuIsa::scalar;
#endif
}

std::optional<CpuIsa> cpu_isa_requested() {
    static const std::optional<CpuIsa> want = []() -> std::optional<CpuIsa> {
        const char *env = std::getenv("STRATA_CPU_ISA");
        if (!env || !*env) return std::nullopt;
        if (!std::strcmp(env, "scalar")) return CpuIsa::scalar;
        if (!std::strcmp(env, "avx2")) return CpuIsa::avx2;
        if (!std::strcmp(env, "avx512")) return CpuIsa::avx512;
        fail("STRATA_CPU_ISA='%s': expected scalar, avx2 or avx512", env);
    }();
    return want;
}

}  // namespace strata
