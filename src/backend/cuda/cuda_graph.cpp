// Decoding passes as CUDA graphs. A decode step launches over a thousand small kernels, each with its own launch
// cost on the host and gap on the GPU. Where a pass needs nothing from the host until its logits (every expert
// resident, so routing stays on the device), the pass's ops are recorded by stream capture and launched as one graph:
// the same kernels with the same arguments in the same order, so the results are bit-identical to launching them one by
// one. Each pass size keeps an executable graph, updated in place from each new recording (cheap while the shape of
// the pass holds: kernel arguments differ from step to step, the nodes do not) and rebuilt when the driver refuses.
//
// Rules that keep a recorded pass valid: nothing in it synchronises with the host or reads device results on the
// host (the eligibility below, and upload() refusing to wrap its staging buffer while recording); host data it
// uploads sits in the pinned staging buffer until the graph has run (end_pass synchronises before the next pass);
// downloads go to pinned memory and reach the caller's buffer in end_pass. A pass size runs once without a graph
// first, so tables and allocations that a first pass makes are made outside any recording.
//
// Off by default: measured on the H200 (Qwen3-30B-A3B, tg128), recording and updating every pass cost more than the
// launches it saves (122 t/s with graphs, 134 without), because the host records a pass while the GPU waits, where
// launches one by one overlap the host's work with the GPU's; and the graph itself ran 5.9 ms of the 7.3 a pass took
// op by op, so the kernels, more than their launches, set the pace. STRATA_CUDA_GRAPHS=1 (or CudaOptions::graphs)
// turns them on; profiling (STRATA_CUDA_PROFILE=1) keeps them off. Replaying a graph without recording it again
// (kernel arguments that do not change from step to step) would take the recording off the critical path.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/matmul.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

bool graphs_forced() {
    static const bool on = env_switch("STRATA_CUDA_GRAPHS", false);
    return on;
}

}  // namespace

void CudaBackend::begin_pass(const BatchInfo &b, bool traced) {
    STRATA_ASSERT(!capturing_);
    pass_t0_ = Clock::now();
    pass_small_ = b.n_tokens <= k_mmv_max_rows;
    if (!(opt_.graphs || graphs_forced()) || traced || prof_.on() || !graph_eligible_ || download_cols_ <= 0) return;
    if (b.n_tokens < 1 || b.n_tokens > k_mmv_max_rows) return;
    if (std::find(graph_warm_.begin(), graph_warm_.end(), b.n_tokens) == graph_warm_.end()) {
        graph_warm_.push_back(b.n_tokens);
        return;
    }
    // The pass downloads at most one row of logits per token.
    const size_t need = size_t(b.n_tokens) * size_t(download_cols_);
    if (dl_floats_ < need) {
        if (dl_pinned_) STRATA_CUDA_CHECK(cudaFreeHost(dl_pinned_));
        dl_pinned_ = nullptr;
        dl_floats_ = 0;
        STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void **>(&dl_pinned_), need * sizeof(float)));
        dl_floats_ = need;
    }
    dl_used_ = 0;
    deferred_.clear();
    pass_rows_ = b.n_tokens;
    STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    graph_t0_ = Clock::now();
}

void CudaBackend::note_direct_pass(Clock::time_point issued, Clock::time_point done) {
    if (!pass_small_) return;
    direct_passes_++;
    direct_ms_[0] += std::chrono::duration<double, std::milli>(issued - pass_t0_).count();
    direct_ms_[1] += std::chrono::duration<double, std::milli>(done - pass_t0_).count();
}

void CudaBackend::report_graphs() const {
    static const bool times = env_switch("STRATA_CUDA_PASS_TIMES", false);
    if (times && direct_passes_)
        std::fprintf(stderr,
                     "strata: CUDA%d decoding passes launched op by op: %llu; per pass: host issues its work in %.3f "
                     "ms, done after %.3f ms\n",
                     device_, (unsigned long long)direct_passes_, direct_ms_[0] / double(direct_passes_),
                     direct_ms_[1] / double(direct_passes_));
    if (!graph_launches_) return;
    const double n = double(graph_launches_);
    std::fprintf(stderr,
                 "strata: CUDA%d graphs: %llu passes (%llu graphs built); per pass: recording %.3f ms, update or "
                 "build %.3f ms, launch to done %.3f ms\n",
                 device_, (unsigned long long)graph_launches_, (unsigned long long)graph_instantiations_,
                 graph_ms_[0] / n, graph_ms_[1] / n, graph_ms_[2] / n);
}

void CudaBackend::drop_capture() {
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    deferred_.clear();
}

void CudaBackend::abort_pass() {
    if (capturing_) drop_capture();
}

void CudaBackend::end_pass() {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream_, &g);
    const Clock::time_point t1 = Clock::now();
    if (err != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        fail(
            "CUDA%d: recording a decoding pass as a graph failed: %s (graphs are opt-in: leave STRATA_CUDA_GRAPHS "
            "unset)",
            device_, cudaGetErrorString(err));
    }
    // One executable graph per pass size (a server's batches come in a few sizes): updated from the new recording
    // where the driver accepts it, else built anew.
    cudaGraphExec_t *exec = nullptr;
    for (auto &e : graph_execs_)
        if (e.first == pass_rows_) exec = &e.second;
    if (!exec) exec = &graph_execs_.emplace_back(pass_rows_, nullptr).second;
    bool ready = false;
    if (*exec) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(*exec, g, &info) == cudaSuccess) {
            ready = true;
        } else {
            cudaGetLastError();
            cudaGraphExecDestroy(*exec);
            *exec = nullptr;
        }
    }
    if (!ready) {
        err = cudaGraphInstantiate(exec, g, 0);
        if (err != cudaSuccess) {
            *exec = nullptr;
            cudaGraphDestroy(g);
            cudaGetLastError();
            fail("CUDA%d: building a graph of a decoding pass failed: %s", device_, cudaGetErrorString(err));
        }
        graph_instantiations_++;
    }
    cudaGraphDestroy(g);
    const Clock::time_point t2 = Clock::now();
    STRATA_CUDA_CHECK(cudaGraphLaunch(*exec, stream_));
    graph_launches_++;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const Clock::time_point t3 = Clock::now();
    auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    graph_ms_[0] += ms(graph_t0_, t1);
    graph_ms_[1] += ms(t1, t2);
    graph_ms_[2] += ms(t2, t3);
    for (const Deferred &d : deferred_) std::memcpy(d.host, d.pinned, d.bytes);
    deferred_.clear();
}

}  // namespace strata::cuda
