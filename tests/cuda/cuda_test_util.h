// Helpers for the GPU tests: device buffers, seeded data, weights quantized on the host and uploaded, and the
// comparisons the tests share.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "format/quant.h"
#include "strata/memory_strata.h"

namespace strata::test {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = d(rng);
    return v;
}

// Device memory freed on scope exit.
struct DevBuf {
    void *p = nullptr;
    explicit DevBuf(size_t bytes) {
        if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) p = nullptr;
    }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    template <class T>
    T *as() const {
        return static_cast<T *>(p);
    }
};

// Host rows (packed) into a backend activation; synchronous w.r.t. every stream.
inline void put(const Act &a, const std::vector<float> &host, bool device) {
    if (device) {
        cudaMemcpy2D(a.data, size_t(a.stride) * 4, host.data(), size_t(a.cols) * 4, size_t(a.cols) * 4, size_t(a.rows),
                     cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
    } else {
        for (int64_t r = 0; r < a.rows; r++) std::memcpy(a.row(r), host.data() + r * a.cols, size_t(a.cols) * 4);
    }
}

inline std::vector<float> get(Backend &be, const Act &a) {
    std::vector<float> h(size_t(a.rows * a.cols));
    be.download(a, h.data());
    return h;
}

// A weight of `type` with n rows of k (times n_exp experts), from seeded normals; host bytes kept in `store`.
struct HostWeight {
    std::vector<uint8_t> bytes;
    Weight w;
    DevBuf *dev = nullptr;
    ~HostWeight() { delete dev; }
};

inline void make_weight(HostWeight &hw, DType type, int64_t k, int64_t n, int64_t n_exp, uint64_t seed, float scale,
                        bool upload) {
    const size_t rb = row_bytes(type, k);
    hw.bytes.resize(rb * size_t(n * n_exp));
    std::vector<float> f = randn(size_t(k * n * n_exp), seed, scale);
    for (int64_t r = 0; r < n * n_exp; r++) quantize_row(type, f.data() + r * k, hw.bytes.data() + size_t(r) * rb, k);
    hw.w = Weight{};
    hw.w.type = type;
    hw.w.ne[0] = k;
    hw.w.ne[1] = n;
    hw.w.ne[2] = n_exp;
    hw.w.host = hw.bytes.data();
    hw.w.row_bytes = rb;
    hw.w.expert_stride = rb * size_t(n);
    if (upload) {
        hw.dev = new DevBuf(hw.bytes.size());
        cudaMemcpy(hw.dev->p, hw.bytes.data(), hw.bytes.size(), cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
        hw.w.backend = hw.dev->p;
    }
}

// Normalised mean squared error of b against a.
inline double nmse(const std::vector<float> &a, const std::vector<float> &b) {
    double e = 0, r = 0;
    for (size_t i = 0; i < a.size(); i++) {
        e += double(a[i] - b[i]) * double(a[i] - b[i]);
        r += double(a[i]) * double(a[i]);
    }
    return r > 0 ? e / r : e;
}

inline float max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
    float m = 0;
    for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

inline float max_abs(const std::vector<float> &a) {
    float m = 0;
    for (float x : a) m = std::max(m, std::fabs(x));
    return m;
}

// A (toy) model placed on a backend as the engine places it: plan, weights, caches for n_seqs sequences of n_ctx
// positions, expert slots (at most expert_slots; 0: all experts), and the MoE schedule to run its experts through.
inline std::unique_ptr<MemoryStrata> place(Backend &be, Model &m, int64_t expert_slots = 0, int32_t n_seqs = 2,
                                           int64_t n_ctx = 160, KvType kv = KvType::F16, int64_t chunk = 64) {
    StrataOptions o;
    o.plan.expert_slots = expert_slots;
    o.plan.chunk_tokens = chunk;
    o.n_seqs = n_seqs;
    o.n_ctx = n_ctx;
    o.kv_type = kv;
    return std::make_unique<MemoryStrata>(be, m, o);
}

inline bool gpu_present() {
    return cuda_device_count() > 0;
}

}  // namespace strata::test
