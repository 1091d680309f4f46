// The weight types with an x86 kernel, as a table for vec_dot_avx2.cpp / vec_dot_avx512.cpp (included inside their
// anonymous namespace after the kernels): every weight type has one.
#pragma once

template <class Kernel, int max_rows = 4>
constexpr DotEntry entry(DType t) {
    return {t, dot_one<Kernel>, dot_rows<Kernel, max_rows>, max_rows};
}

constexpr DotEntry k_x86_dots[] = {
    entry<KernelF32, k_float_rows>(DType::F32),
    entry<KernelF16, k_float_rows>(DType::F16),
    entry<KernelBF16, k_float_rows>(DType::BF16),
    entry<KernelQ8_0>(DType::Q8_0),
    entry<KernelQ4_0>(DType::Q4_0),
    entry<KernelQ5_0>(DType::Q5_0),
    entry<KernelQ4_1>(DType::Q4_1),
    entry<KernelQ5_1>(DType::Q5_1),
    entry<KernelIQ4_NL>(DType::IQ4_NL),
    entry<KernelMXFP4>(DType::MXFP4),
    entry<KernelQ2_K>(DType::Q2_K),
    entry<KernelQ3_K>(DType::Q3_K),
    entry<KernelQ4_K>(DType::Q4_K),
    entry<KernelQ5_K>(DType::Q5_K),
    entry<KernelQ6_K>(DType::Q6_K),
    entry<KernelIQ4_XS>(DType::IQ4_XS),
    entry<KernelIQ2_XXS>(DType::IQ2_XXS),
    entry<KernelIQ2_XS>(DType::IQ2_XS),
    entry<KernelIQ2_S>(DType::IQ2_S),
    entry<KernelIQ3_XXS>(DType::IQ3_XXS),
    entry<KernelIQ3_S>(DType::IQ3_S),
    entry<KernelIQ1_S>(DType::IQ1_S),
    entry<KernelIQ1_M>(DType::IQ1_M),
    entry<KernelTQ1_0>(DType::TQ1_0),
    entry<KernelTQ2_0>(DType::TQ2_0),
};
