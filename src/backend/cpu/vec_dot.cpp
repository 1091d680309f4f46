// vec_dot.h's dispatch: which instruction-set level the CPU runs, the STRATA_CPU_ISA override, and the per-type
// choice of kernel (falling back level by level). No arithmetic here.
#include "backend/cpu/vec_dot.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

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

CpuIsa cpu_isa_supported() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static const CpuIsa level = [] {
        __builtin_cpu_init();
        const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
        const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                            __builtin_cpu_supports("avx512vnni");
        if (avx512 && avx512_kernels().n_dots > 0) return CpuIsa::avx512;
        if (avx2 && avx2_kernels().n_dots > 0) return CpuIsa::avx2;
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

DType cpu_vec_dot_type(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16: return DType::F32;
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q8_0:
        case DType::IQ4_NL:
        case DType::MXFP4: return DType::Q8_0;
        case DType::Q4_1:
        case DType::Q5_1: return DType::Q8_1;
        default: return DType::Q8_K;
    }
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
