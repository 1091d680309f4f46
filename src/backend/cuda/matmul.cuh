// Matrix products of packed weights with f32 activations on the device: y[t, n] = sum_k W[n, k] x[t, k].
// Work comes as groups: rows [x_row0, x_row0 + n_rows) of x times one weight matrix (device pointer) into rows
// [y_row0, ...) of y. A plain matmul is one group; the MoE passes one group per routed expert, its pointer taken from
// the layer's expert slot table. Every output element is computed by one thread or one warp in a fixed order, so a
// row's result depends only on its inputs and the kernel chosen for its group, never on the other groups.
//
// Kernels: generic ones for every weight type (elements dequantized exactly, fp32 products, activations first taken
// through the CPU reference's activation format so both compute the same function): mmv for groups of <= 8 rows,
// tiled mm for larger ones. Quantized mat-vec kernels (mmvq) for the common weight types, for groups of <= 8 rows:
// integer dot products of the packed weights with 8-bit activations held Q8_1-style (int8 values, and per 32 of
// them the scale d and d * sum(q)). The activation values are exactly those of the reference's format for the weight
// type (Q8_0 levels and fp16 scale per 32, or Q8_K levels and scale per 256), not llama.cpp's per-32 Q8_1: then the
// quantized kernels, the generic ones and the CPU compute one function, differing only in float rounding, and the
// choice of kernel (which follows the batch size) never moves a result by a quantization step. The same types have
// quantized matrix-matrix kernels (mmq) on the int8 tensor cores for larger groups.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

#include "format/dtype.h"

namespace strata::cuda {

struct MatmulGroup {
    const void *w;  // device pointer to the weight matrix (n rows of row_bytes)
    int32_t x_row0, n_rows, y_row0;
};

constexpr int k_mmv_max_rows = 8;   // groups up to this many rows go to the mat-vec kernels
constexpr int k_mm_tile_rows = 64;  // activation rows per tile of the mm kernel

struct MatmulArgs {
    DType type = DType::F32;
    int64_t k = 0, n = 0;      // row length, rows of the weight
    size_t row_bytes = 0;      // bytes of one weight row
    const float *x = nullptr;  // f32 activations for the generic kernels (already in the reference act. format)
    int64_t x_stride = 0;
    const int8_t *xq = nullptr;   // 8-bit activations for mmvq: k int8 per row, then
    const float2 *xds = nullptr;  // per 32 elements {d, d * sum(q)}
    float *y = nullptr;
    int64_t y_stride = 0;
    MatmulGroup single{};                 // used when groups == nullptr
    const MatmulGroup *groups = nullptr;  // device array
    int32_t n_groups = 1;
    const int2 *tiles = nullptr;  // mm: device array of (group, first row) per row tile; nullptr: tiles of `single`
    int32_t n_tiles = 0;
    // mmvq: the group table may be read before the kernel's wait for the one before it (pdl.cuh): the kernel that
    // wrote it is two launches or more back in the stream, so it finished before the kernel before this one began
    // its work. The mat-vec then stages its weight rows as a matrix named by the parameters (launch_mmvq).
    bool groups_early = false;
    // mmvq, set by launch_mmvq: bytes of the first stage_sub sub-blocks of a row that a warp copies into shared memory
    // before the wait, in pieces of stage_piece bytes (16 or 4), at stage_stride bytes a warp (16 past them: a
    // sub-block's word loads may read a few bytes beyond it); 0: none.
    int32_t stage_bytes = 0, stage_sub = 0, stage_piece = 0, stage_stride = 0;
    // mmvq, one activation row a group: whether a lane with several sub-blocks of a row issues the loads of 2 or 4 of
    // them before using the first (-1: as STRATA_CUDA_MMVQ_AHEAD says, mmvq.cu; 0 no; 1 yes). The same bits either way.
    int32_t loads_ahead = -1;
};

// Generic kernels (every type cuda_can_dequantize accepts).
void launch_mmv_generic(const MatmulArgs &a, cudaStream_t stream);  // every group <= k_mmv_max_rows rows
void launch_mm_generic(const MatmulArgs &a, cudaStream_t stream);
// f32 weights, a single group of more than k_mmv_max_rows rows, k a multiple of 32 and 16-byte aligned rows (a
// prompt's router): a pipelined kernel of launch_mm_generic's bits, which launch_mm_generic takes where it applies
// (STRATA_CUDA_MM_F32=0 turns it off).
bool mm_f32_applies(const MatmulArgs &a);
void launch_mm_f32(const MatmulArgs &a, cudaStream_t stream);
// Few rows and long ones (routers): the generic mat-vec splits each row's k over a block (mmv_split.cuh). The choice
// follows the matrix's shape only.
inline bool mmv_split_applies(int64_t n, int64_t k) {
    return n <= 1024 && k >= 1024;
}

// Quantized mat-vec kernels (k a multiple of 32); activations from launch_quantize_act.
bool mmvq_supported(DType t);
// every group <= k_mmv_max_rows rows; one_row: every group has exactly one (a kernel form with fewer registers, the
// same bits)
void launch_mmvq(const MatmulArgs &a, cudaStream_t stream, bool one_row = false);

// Several matrices of one type and row length times the same activation rows in one launch (q, k and v): a's type,
// k, row_bytes, activations and single group (x rows 0.., y rows 0..) hold for all of them, a's w, n and y are
// unused. Each output is computed by the code a launch of its matrix alone runs, so the same bits.
constexpr int k_matmul_max_parts = 4;
struct MatmulPart {
    const void *w;  // device pointer to the weight matrix (n rows of the shared row_bytes)
    int64_t n;
    float *y;
    int64_t y_stride;
};
// The parts of a launch, passed to the kernel by value (a recorded graph holds them, nothing is uploaded): part p
// owns the blocks along the weight rows' grid dimension from block0[p] to the next part's. n_parts 0: a's own
// matrix.
struct MatmulParts {
    int32_t n_parts = 0;
    uint32_t block0[k_matmul_max_parts] = {};
    MatmulPart part[k_matmul_max_parts] = {};
    uint32_t blocks = 0;  // all the parts' blocks
    // Parts of rows_per_block weight rows a block, each matrix's rows starting a block (its blocks as alone).
    MatmulParts(const MatmulPart *parts, int n, int64_t rows_per_block) : n_parts(n) {
        for (int p = 0; p < n; p++) {
            block0[p] = blocks;
            part[p] = parts[p];
            blocks += uint32_t((parts[p].n + rows_per_block - 1) / rows_per_block);
        }
    }
    MatmulParts() = default;
};
// Decode sizes (every row count <= k_mmv_max_rows): the mat-vec kernel.
void launch_mmvq_parts(const MatmulArgs &a, const MatmulPart *parts, int n_parts, cudaStream_t stream);

// Quantized matrix-matrix kernels on the tensor cores (sm_80 and later; k a multiple of 32), same activations and
// the tile list of launch_mm_generic.
// Forms (mmq.cu), all of the same bits: Plain loads a k step and then computes it, 64 activation rows a block;
// Narrow and Wide load the next step while computing this one, 64 and 128 rows a block (Wide: a single group only).
// Staged (Q4_K; other types take Plain): 64 rows a block, each k step's bytes copied into shared memory by cp.async
// two steps ahead and unpacked from there; Q4Direct likewise (Q4_K only), four stages three steps ahead and only the
// scales unpacked, the MMAs reading the copied quants. Q8Staged (Q8_0 single groups, k a multiple of 128; others take
// Wide): Wide's tiles, each k step's bytes copied into shared memory by cp.async up to three steps ahead and read by
// the MMAs as they are. Auto: Wide for a single group, Q8Staged where it applies (Plain with STRATA_CUDA_MMQ_WIDE=0,
// and with STRATA_CUDA_MMQ_SMALL_GRID=1 where Wide's blocks would be fewer than the device's SMs;
// STRATA_CUDA_MMQ_Q8_STAGED=0 keeps Wide), Plain for a tile list (Narrow with STRATA_CUDA_MMQ_PIPE=1); Plain becomes
// Staged (STRATA_CUDA_MMQ_STAGED=0 keeps Plain; STRATA_CUDA_MMQ_Q4_DIRECT=1, opt-in until measured, makes it Q4Direct).
enum class MmqForm { Auto, Plain, Narrow, Wide, Staged, Q8Staged, Q4Direct };
bool mmq_supported(DType t);
void launch_mmq(const MatmulArgs &a, cudaStream_t stream, MmqForm form = MmqForm::Auto);
// Several matrices of a prompt (more than k_mmv_max_rows rows) in one tensor-core launch, in the form launch_mmq's
// Auto gives a single group: a prompt's k and v (16 blocks each on 512 tokens of the 30B-A3B) no longer each take a
// whole block's time with most SMs idle. On unless STRATA_CUDA_MMQ_PARTS=0.
bool mmq_parts_enabled();
void launch_mmq_parts(const MatmulArgs &a, const MatmulPart *parts, int n_parts, cudaStream_t stream,
                      MmqForm form = MmqForm::Auto);

// x rows through the activation format `vt` (F32: a plain copy; Q8_0, Q8_1, Q8_K: quantized and dequantized exactly
// as format/quant.h does), packed into out (rows x k).
void launch_act_round_trip(DType vt, const float *x, int64_t x_stride, int64_t rows, int64_t k, float *out,
                           cudaStream_t stream);

// x rows quantized to the reference activation format vt (Q8_0, Q8_1 or Q8_K: the levels and scales format/quant.h
// gives), stored for mmvq: qs[r * k + i] int8, ds[r * (k / 32) + b] = {d, d * sum(qs of b)} with d the scale the
// reference dequantizes block b with. silu_mul_by: quantize silu(x) * m instead (m rows with mul_stride), the
// values launch_silu_mul would have stored.
void launch_quantize_act(DType vt, const float *x, int64_t x_stride, int64_t rows, int64_t k, int8_t *qs, float2 *ds,
                         cudaStream_t stream, const float *silu_mul_by = nullptr, int64_t mul_stride = 0);

}  // namespace strata::cuda
