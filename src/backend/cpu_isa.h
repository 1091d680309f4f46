// The x86 instruction-set levels the hand-vectorized host kernels target (backend/cpu's dot products, backend/host's
// mat-vec in the GPU's order): what this CPU and its OS run, and the STRATA_CPU_ISA cap. Each kernel family adds what
// its build has (backend/cpu/vec_dot.h: cpu_isa_supported, cpu_isa_active; backend/host/mmvq_host.h).
#pragma once

#include <optional>

namespace strata {

// Instruction-set levels, in increasing order. avx2 means AVX2 + FMA + F16C; avx512 means AVX-512 F/BW/VL/DQ + VNNI.
enum class CpuIsa : int { scalar = 0, avx2 = 1, avx512 = 2 };

const char *cpu_isa_name(CpuIsa isa);

// The best level this CPU runs with its OS saving the registers' state (cpuid and xgetbv), whatever was built.
CpuIsa cpu_isa_hardware();

// The level named by the environment variable STRATA_CPU_ISA=scalar|avx2|avx512 (read once), nullopt where it is
// unset or empty. Throws strata::Error for any other value.
std::optional<CpuIsa> cpu_isa_requested();

}  // namespace strata
