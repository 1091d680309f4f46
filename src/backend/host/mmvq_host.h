// The CUDA backend's decode mat-vec (cuda/mmvq.cu, k_mmvq) and its activation quantization (k_quantize_act_q8_0,
// k_quantize_act_q8_k) computed on the host in the same arithmetic and the same order: the same packed-weight
// unpacking into 32-element sub-blocks of four 8-element integer dot products, the same correctly rounded float
// steps, each warp lane's sub-blocks summed in turn and the lanes added in the warp's butterfly order. An expert
// computed this way on the CPU has the GPU's bits, which is what lets decoding compute some misses on the host
// without the result depending on where an expert ran (issue: decode under a budget). The GPU side of the contract
// is tested in tests/cuda (MmvqHost); here, against the reference dot products within their bound.
#pragma once

#include <cstdint>

#include "backend/cpu_isa.h"
#include "format/dtype.h"

namespace strata {

// Per 32 activation values: the scale d and d * sum(q), as the GPU's float2.
struct ActScale {
    float d = 0.0f, s = 0.0f;
};

// The types k_mmvq takes (cuda/mmvq.cu mmvq_supported): Q8_0, Q4_0, MXFP4, IQ4_XS, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ1_M.
bool mmvq_host_supported(DType t);

// k floats to the GPU's 8-bit layout for activation type vt (Q8_0 or Q8_1: k % 32 == 0; Q8_K: k % 256 == 0): q
// gets k int8 values, ds k / 32 scales. silu_mul_by, where given, quantizes silu(x) * m instead, as the GPU's form
// for an expert's down matrix does (exact_math.h's silu, the same bits on both).
void quantize_act_gpu(DType vt, const float *x, int64_t k, int8_t *q, ActScale *ds, const float *silu_mul_by = nullptr);

// A packed matrix in host memory: n rows of k values of `type`, row_bytes apart.
struct HostMatrix {
    DType type = DType::F32;
    const uint8_t *data = nullptr;
    size_t row_bytes = 0;
    int64_t k = 0, n = 0;
};

// One token through one expert as the GPU's decode kernels compute it (cuda_matmul.cpp experts_device_routed and
// the host-grouped path alike): x (gate.k floats) quantized for the gate and for the up matrix, their n_ff rows,
// silu(gate) * up quantized for the down matrix, its rows into y (down.n floats). Every type mmvq_host_supported.
void expert_ffn_host(const HostMatrix &gate, const HostMatrix &up, const HostMatrix &down, const float *x, float *y);

// exact_math.h's e^x and silu(v) * m, compiled as the host copies use them (for tests).
float host_exp(float x);
float host_silu_mul(float v, float m);

// One weight row of type t (k values) against activations (q, ds) in that layout: the GPU kernel's result.
float mmvq_host_dot(DType t, const uint8_t *row, int64_t k, const int8_t *q, const ActScale *ds);

// The form mmvq_host_rows takes by default: the faster of AVX2 and AVX-512 on this CPU, timed once on first use
// (about a millisecond on a Q4_K matrix in cache: 512-bit vectors are not faster everywhere, e.g. where the core
// splits them in two), capped by STRATA_CPU_ISA=scalar|avx2|avx512 (cpu_isa_requested). The forms give the same
// bits, so the choice changes only the speed.
CpuIsa mmvq_host_form();
// The two timings behind mmvq_host_form's choice, in microseconds (0 where the CPU runs no such form).
struct MmvqHostTiming {
    double avx2_us = 0, avx512_us = 0;
};
MmvqHostTiming mmvq_host_timing();

// Rows [r0, r1) of m against (q, ds): out[r - r0] = mmvq_host_dot of row r, the same bits in every form: row by
// row (CpuIsa::scalar), eight rows at a time with AVX2, or sixteen with AVX-512 and VNNI. `isa`: the highest form to
// take (one the CPU does not run falls back to the best it does); by default mmvq_host_form().
// The vector forms read their eight or sixteen rows side by side, 32 bytes of each in turn, which hardware
// prefetchers follow badly: on the development machine (an AMD EPYC VM) sixteen rows of 1152 bytes read that way
// came at 6-11 GB/s where one row after the other came at 27. So the rows are first copied, in order, into a
// per-thread buffer (at most k_host_stage_bytes at a time) and read from there: bench_host_experts, one 30B Q4_K
// expert a call on two threads, 226-308 us a call against 286-410 over fourteen alternated pairs
// (STRATA_HOST_STAGE=0: read in place). The same bytes, so the same bits.
constexpr size_t k_host_stage_bytes = size_t(64) << 10;
void mmvq_host_rows(const HostMatrix &m, int64_t r0, int64_t r1, const int8_t *q, const ActScale *ds, float *out,
                    CpuIsa isa = mmvq_host_form());

}  // namespace strata
