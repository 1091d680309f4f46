#include "backend/cuda/op_profiler.h"

#include <algorithm>
#include <cstdio>

#include "core/env.h"

namespace strata::cuda {

OpProfiler::OpProfiler() {
    on_ = env_switch("STRATA_CUDA_PROFILE", false);
}

OpProfiler::~OpProfiler() {
    for (const Pending &p : pending_) cudaEventDestroy(p.e0), cudaEventDestroy(p.e1);
    for (const Open &o : stack_) cudaEventDestroy(o.e0);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::event() {
    if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
    }
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    return e;
}

void OpProfiler::begin(const char *name, cudaStream_t s) {
    if (!step_open_) step_t0_ = Clock::now(), step_open_ = true;
    Open o;
    o.path = stack_.empty() ? std::string(name) : stack_.back().path + "/" + name;
    o.e0 = event();
    cudaEventRecord(o.e0, s);
    o.t0 = Clock::now();
    stack_.push_back(std::move(o));
}

void OpProfiler::end(cudaStream_t s) {
    Open o = std::move(stack_.back());
    stack_.pop_back();
    cudaEvent_t e1 = event();
    cudaEventRecord(e1, s);
    const double host = std::chrono::duration<double, std::milli>(Clock::now() - o.t0).count();
    pending_.push_back({std::move(o.path), o.e0, e1, host});
}

void OpProfiler::step() {
    for (const Pending &p : pending_) {
        float ms = 0.0f;
        if (cudaEventSynchronize(p.e1) == cudaSuccess) cudaEventElapsedTime(&ms, p.e0, p.e1);
        Total &t = totals_[p.path];
        t.calls++;
        t.gpu_ms += ms;
        t.host_ms += p.host_ms;
        free_.push_back(p.e0);
        free_.push_back(p.e1);
    }
    pending_.clear();
    cudaGetLastError();
    if (step_open_) {
        Total &t = totals_["(forward pass, host wall time)"];
        t.calls++;
        t.host_ms += std::chrono::duration<double, std::milli>(Clock::now() - step_t0_).count();
        step_open_ = false;
    }
}

void OpProfiler::report() {
    if (!on_ || totals_.empty()) return;
    std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
    std::fprintf(stderr, "strata: CUDA op profile (STRATA_CUDA_PROFILE=1)\n%-44s %9s %12s %12s %10s\n", "op", "calls",
                 "GPU ms", "host ms", "GPU us/call");
    for (const auto &[path, t] : rows)
        std::fprintf(stderr, "%-44s %9lld %12.2f %12.2f %10.1f\n", path.c_str(), (long long)t.calls, t.gpu_ms,
                     t.host_ms, t.calls ? 1000.0 * t.gpu_ms / double(t.calls) : 0.0);
}

}  // namespace strata::cuda
