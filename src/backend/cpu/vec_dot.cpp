// vec_dot.h's dispatch: which instruction-set level the CPU runs, the STRATA_CPU_ISA override, and the per-type
// choice of kernel (falling back level by level). No arithmetic here.
#include "backend/cpu/vec_dot.h"

#include <cstdio>
#include <optional>

#include "backend/cpu/vec_dot_impl.h"
#include "core/error.h"

namespace strata {

using namespace vec_dot_detail;

CpuIsa cpu_isa_supported() {
    static const CpuIsa level = [] {
        const CpuIsa hw = cpu_isa_hardware();
        if (hw >= CpuIsa::avx512 && avx512_kernels().n_dots > 0) return CpuIsa::avx512;
        if (hw >= CpuIsa::avx2 && avx2_kernels().n_dots > 0) return CpuIsa::avx2;
        return CpuIsa::scalar;
    }();
    return level;
}

CpuIsa cpu_isa_active() {
    static const CpuIsa level = [] {
        const CpuIsa supported = cpu_isa_supported();
        const std::optional<CpuIsa> want = cpu_isa_requested();
        if (!want) return supported;
        if (int(*want) > int(supported)) {
            std::fprintf(stderr, "strata: STRATA_CPU_ISA=%s, but this CPU runs at most %s: using %s\n",
                         cpu_isa_name(*want), cpu_isa_name(supported), cpu_isa_name(supported));
            return supported;
        }
        return *want;
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
