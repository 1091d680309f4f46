// The weight types with an x86 kernel, as a table for vec_dot_avx2.cpp / vec_dot_avx512.cpp (included inside their
// anonymous namespace after the kernels). Types missing here fall back to the scalar kernels.
#pragma once

const DotEntry k_x86_dots[] = {
    {DType::F32, dot_f32},       {DType::F16, dot_f16},         {DType::BF16, dot_bf16},
    {DType::Q8_0, dot_q8_0},     {DType::Q4_0, dot_q4_0},       {DType::Q5_0, dot_q5_0},
    {DType::Q4_1, dot_q4_1},     {DType::Q5_1, dot_q5_1},       {DType::IQ4_NL, dot_iq4_nl},
    {DType::MXFP4, dot_mxfp4},   {DType::Q2_K, dot_q2_k},       {DType::Q3_K, dot_q3_k},
    {DType::Q4_K, dot_q4_k},     {DType::Q5_K, dot_q5_k},       {DType::Q6_K, dot_q6_k},
    {DType::IQ4_XS, dot_iq4_xs}, {DType::IQ2_XXS, dot_iq2_xxs}, {DType::IQ2_XS, dot_iq2_xs},
    {DType::IQ2_S, dot_iq2_s},   {DType::IQ3_XXS, dot_iq3_xxs}, {DType::IQ3_S, dot_iq3_s},
    {DType::IQ1_S, dot_iq1_s},   {DType::IQ1_M, dot_iq1_m},
};
