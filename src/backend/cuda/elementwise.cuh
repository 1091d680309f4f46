// Row-wise and elementwise ops on f32 activations (device pointers, row strides in floats).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace strata::cuda {

struct Rows {  // a rows x cols view of device floats
    float *data;
    int64_t rows, cols, stride;
};

void launch_add(Rows a, Rows b, Rows out, cudaStream_t stream);                             // out = a + b
void launch_mul_sigmoid(Rows x, Rows gate, cudaStream_t stream);                            // x *= sigmoid(gate)
void launch_silu_mul(Rows g, Rows u, cudaStream_t stream);                                  // g = silu(g) * u
void launch_gather_rows(Rows src, const int32_t *rows_dev, Rows dst, cudaStream_t stream);  // dst[i] = src[rows[i]]
// src columns in pairs of width-wide blocks [a0 b0 a1 b1 ...] -> a, b
void launch_deinterleave(Rows src, int64_t width, Rows a, Rows b, cudaStream_t stream);
// The 8-bit activation form of a norm's output rows, made by the norm's kernel as it writes them (norm_row.cuh), for
// the next mat-vec, which then quantizes nothing: form 1 Q8_0 / Q8_1 (k_quantize_act_q8_0's levels and scales), 2 Q8_K
// (k_quantize_act_q8_k's), 0 none; q: rows x cols int8, ds: rows x cols / 32 {d, d * sum}. The same bytes as
// launch_quantize_act of the output.
struct NormQ8 {
    int8_t *q = nullptr;
    float2 *ds = nullptr;
    int form = 0;
};
// Whether the norm of x into out with w makes form `form` too (whole rows as one group, of 1024..8192 columns, a
// multiple of the form's block, 16-byte aligned).
bool norm_quantizes(const Rows &x, const Rows &out, int64_t group, const float *w, int form);
// out = x / rms(x) * w over groups of `group` columns (w: `group` floats on the device); out may be x.
void launch_rms_norm(Rows x, const float *w, int64_t group, float eps, Rows out, cudaStream_t stream,
                     const NormQ8 &q8 = {});
// x += y, then out = rms_norm(x) as launch_rms_norm computes it (the same bits as launch_add and launch_rms_norm).
void launch_add_rms_norm(Rows x, Rows y, const float *w, int64_t group, float eps, Rows out, cudaStream_t stream,
                         const NormQ8 &q8 = {});
// NeoX rotation of the first n_rot dims of every head of x at each row's position (seq_pos_dev: {sequence, position}
// per row). inv_freq_dev: n_rot / 2 floats, theta^(-2i / n_rot) as the CPU computes them.
void launch_rope_neox(Rows x, int64_t head_dim, int64_t n_rot, const float *inv_freq_dev, const int2 *seq_pos_dev,
                      cudaStream_t stream);

// rows x row_bytes bytes from host memory the device reads in place (pinned and mapped: src_dev is its device
// address) into dst, dst_pitch bytes apart. Loads by the SMs, not the copy engine, so the copy does not queue behind
// the expert fills another stream has on that engine.
void launch_copy_from_host(void *dst, size_t dst_pitch, const void *src_dev, size_t row_bytes, size_t rows,
                           cudaStream_t stream);
// The same copy started only once the host has stored a value at least `ticket` (as a wrapping count) in the word at
// signal_dev (pinned, mapped): each block waits for it (an acquire load at system scope) before reading src, whose
// bytes the host writes after the launch; rows of 4-byte multiples at 4-byte aligned addresses.
void launch_copy_from_host_after(void *dst, size_t dst_pitch, const void *src_dev, size_t row_bytes, size_t rows,
                                 const uint32_t *signal_dev, uint32_t ticket, cudaStream_t stream);

}  // namespace strata::cuda
