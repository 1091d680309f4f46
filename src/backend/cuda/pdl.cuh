// Programmatic dependent launch (sm_90 and later): a decoding pass is a chain of hundreds of small kernels, each of
// which used to wait for the one before to finish and drain before its own blocks were even scheduled (a gap of about
// 1.3 us between kernels inside a replayed graph, plus each kernel's ramp). Launched with pdl_launch, a kernel's
// blocks may be scheduled while the kernel before it in the stream still runs; they hold at pdl_wait() until that
// kernel has finished and its writes are visible, so the results are the same bits.
//
// Protocol for a kernel launched with pdl_launch:
//   - pdl_wait() comes before its first access to any global memory that another kernel or copy writes or reads (the
//     activations, tables, caches, scratch it writes: a write before it could land while the kernel before still
//     reads the old contents).
//   - pdl_release() after pdl_wait(): from then on the next kernel's blocks may be scheduled beside this one's. So
//     at most two kernels of a chain overlap, and every kernel's pdl_wait() returns only after all before it are done
//     (each finished only after its own wait returned).
//   - Before pdl_wait() a kernel may read memory nothing writes during the pass (weights), and memory a kernel two
//     launches or more back wrote: its blocks are scheduled only once the kernel just before has passed its own wait,
//     that is, once every kernel before that one is done and its writes are visible (the decode mat-vec stages its
//     weight rows there, and the down matrices' group table the router wrote: mmvq.cu).
//   - A kernel launched without pdl_launch (<<<>>>) is ordered after everything before it as usual; the kernel after
//     it then starts when it is done.
// On devices before sm_90, or with STRATA_CUDA_PDL=0, pdl_launch is a plain launch, and pdl_wait/pdl_release compile
// to nothing below sm_90.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace strata::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether kernels on the current device launch programmatically (compute capability 9.0 or later, and
// STRATA_CUDA_PDL not 0). Read once per device.
bool pdl_enabled();

// Whether the decoding kernels that can (the MoE tail, q/k norm and rotation, tiled attention) issue their reads of
// what the kernel just before them does not write before their pdl_wait() (on by default: 1.028x the 30B's resident
// tg128 on an H100; STRATA_CUDA_EARLY_READS=0 reads after the wait): the MoE tail's pair weights and rows, residual
// row and norm weights; the rotation's angles; the attention's tile and the keys and values of positions before the pass's. The same values are read either way (the
// same bits); the reads overlap the kernel before instead of following it. The caller passes early only where its
// op uploaded none of what the kernel reads early (CudaBackend::uploads_): an upload by kernel just before, read
// early, would be overtaken (the first layer of a pass uploads the positions and the attention's tiles).
bool early_reads_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), programmatic where pdl_enabled(). The caller checks the launch
// (STRATA_CUDA_LAUNCH_CHECK) as after <<<>>>.
template <typename... P, typename... A>
void pdl_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    // A failed launch leaves its error for cudaGetLastError, as <<<>>> does.
    (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

}  // namespace strata::cuda
