// Per-op timing of the CUDA backend, for finding where a forward pass spends its time. Off unless
// STRATA_CUDA_PROFILE=1; then every op scope records CUDA events around its work on the stream (GPU span) and the
// wall time of the call (host), summed per op path ("moe", "moe/matmul", ...) and printed to stderr when the backend
// is destroyed. The GPU span of a scope includes any time the GPU waited for the host inside it.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace strata::cuda {

class OpProfiler {
  public:
    OpProfiler();
    ~OpProfiler();
    bool on() const { return on_; }
    void begin(const char *name, cudaStream_t s);
    void end(cudaStream_t s);
    void step();    // one forward pass ended (the stream is synchronised): fold finished events into the totals
    void report();  // print the totals to stderr

  private:
    using Clock = std::chrono::steady_clock;
    struct Open {
        std::string path;
        cudaEvent_t e0;
        Clock::time_point t0;
    };
    struct Pending {
        std::string path;
        cudaEvent_t e0, e1;
        double host_ms;
    };
    struct Total {
        int64_t calls = 0;
        double gpu_ms = 0, host_ms = 0;
    };
    cudaEvent_t event();

    bool on_ = false;
    std::vector<Open> stack_;
    std::vector<Pending> pending_;
    std::vector<cudaEvent_t> free_;
    std::map<std::string, Total> totals_;
    Clock::time_point step_t0_;
    bool step_open_ = false;
};

class OpScope {
  public:
    OpScope(OpProfiler &p, const char *name, cudaStream_t s) : p_(p), s_(s) {
        if (p_.on()) p_.begin(name, s_);
    }
    ~OpScope() {
        if (p_.on()) p_.end(s_);
    }
    OpScope(const OpScope &) = delete;
    OpScope &operator=(const OpScope &) = delete;

  private:
    OpProfiler &p_;
    cudaStream_t s_;
};

}  // namespace strata::cuda
