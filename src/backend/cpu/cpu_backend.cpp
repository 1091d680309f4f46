// CPU backend set-up: weights as they lie in the mapped file (vectors converted to f32), the scratch blocks, and the
// elementwise ops.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_caches.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "format/quant.h"

namespace strata {

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads, k_pool_spin_us) {}
CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const { return strfmt("CPU (%d threads)", pool_.size()); }

// ---- weights ------------------------------------------------------------------------------------------------

void CpuBackend::prepare(WeightSet &ws, const Placement &plan) {
    STRATA_ASSERT(!plan.device);  // nothing to place: every weight is read where it lies
    // Small weights read whole for every token (norms, biases, gates, conv taps): f32 copies, made once.
    for (const Weight *w : ws.vectors) {
        if (std::any_of(vectors_.begin(), vectors_.end(), [&](const auto &v) { return v.first == w->host; }))
            continue;
        std::vector<float> f(static_cast<size_t>(w->ne[0] * w->ne[1]));
        for (int64_t r = 0; r < w->ne[1]; r++)
            dequantize_row(w->type, w->host + size_t(r) * w->row_bytes, f.data() + r * w->ne[0], w->ne[0]);
        vectors_.emplace_back(w->host, std::move(f));
    }
}

const float *CpuBackend::vec_f32(const Weight &w) {
    for (auto &v : vectors_)
        if (v.first == w.host) return v.second.data();
    fail("internal: weight '%.*s' was not prepared as a vector", int(w.name.size()), w.name.data());
}

// ---- scratch --------------------------------------------------------------------------------------------------

Act CpuBackend::alloc(int64_t rows, int64_t cols) {
    STRATA_ASSERT(rows >= 0 && cols > 0);
    size_t n = size_t(rows * cols);
    scratch_.emplace_back(new std::byte[(n > 0 ? n : 1) * sizeof(float)]);
    return {reinterpret_cast<float *>(scratch_.back().get()), rows, cols, cols};
}

int32_t *CpuBackend::alloc_i32(int64_t n) {
    scratch_.emplace_back(new std::byte[size_t(std::max<int64_t>(n, 1)) * sizeof(int32_t)]);
    return reinterpret_cast<int32_t *>(scratch_.back().get());
}

void CpuBackend::reset_scratch() { scratch_.clear(); }

void CpuBackend::download(const Act &src, float *host) {
    for (int64_t r = 0; r < src.rows; r++) std::memcpy(host + r * src.cols, src.row(r), size_t(src.cols) * 4);
}

void CpuBackend::download_i32(const int32_t *src, int64_t n, int32_t *host) {
    std::memcpy(host, src, size_t(n) * sizeof(int32_t));
}

void CpuBackend::upload(const float *host, Act dst) {
    for (int64_t r = 0; r < dst.rows; r++) std::memcpy(dst.row(r), host + r * dst.cols, size_t(dst.cols) * 4);
}

void CpuBackend::upload_i32(const int32_t *host, int64_t n, int32_t *dst) {
    std::memcpy(dst, host, size_t(n) * sizeof(int32_t));
}

// ---- elementwise ops ------------------------------------------------------------------------------------------

void cpu_rms_norm(ThreadPool &pool, const Act &x, const float *w, int64_t group, float eps, const Act &out) {
    STRATA_ASSERT(x.cols % group == 0 && out.cols == x.cols && out.rows == x.rows);
    pool.parallel_for(x.rows, 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x.row(r);
            float *yr = out.row(r);
            for (int64_t g0 = 0; g0 < x.cols; g0 += group) {
                double ss = 0;
                for (int64_t i = 0; i < group; i++) ss += double(xr[g0 + i]) * xr[g0 + i];
                float scale = 1.0f / std::sqrt(float(ss / double(group)) + eps);
                for (int64_t i = 0; i < group; i++) yr[g0 + i] = xr[g0 + i] * scale * w[i];
            }
        }
    });
}

void CpuBackend::rms_norm(Act x, const Weight &w, float eps, Act out) {
    cpu_rms_norm(pool_, x, vec_f32(w), w.ne[0], eps, out);
}

void CpuBackend::embed(const Weight &tok_embd, const int32_t *ids, Act out) {
    STRATA_ASSERT(out.cols == tok_embd.ne[0]);
    for (int64_t t = 0; t < out.rows; t++) {
        if (ids[t] < 0 || ids[t] >= tok_embd.ne[1])
            fail("token id %d is outside the vocabulary (0..%lld)", ids[t], (long long)tok_embd.ne[1] - 1);
        dequantize_row(tok_embd.type, tok_embd.host + size_t(ids[t]) * tok_embd.row_bytes, out.row(t), out.cols);
    }
}

void CpuBackend::add(Act a, Act b, Act out) {
    STRATA_ASSERT(a.rows == b.rows && a.cols == b.cols && out.rows == a.rows && out.cols == a.cols);
    for (int64_t r = 0; r < a.rows; r++) {
        const float *ar = a.row(r), *br = b.row(r);
        float *o = out.row(r);
        for (int64_t c = 0; c < a.cols; c++) o[c] = ar[c] + br[c];
    }
}

void CpuBackend::mul_sigmoid(Act x, Act gate) {
    STRATA_ASSERT(x.rows == gate.rows && x.cols == gate.cols);
    for (int64_t r = 0; r < x.rows; r++) {
        float *xr = x.row(r);
        const float *gr = gate.row(r);
        for (int64_t c = 0; c < x.cols; c++) xr[c] *= 1.0f / (1.0f + std::exp(-gr[c]));
    }
}

void CpuBackend::gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) {
    STRATA_ASSERT(dst.rows == int64_t(rows.size()) && dst.cols == src.cols);
    for (size_t i = 0; i < rows.size(); i++) {
        STRATA_ASSERT(rows[i] >= 0 && rows[i] < src.rows);
        std::memcpy(dst.row(int64_t(i)), src.row(rows[i]), size_t(src.cols) * 4);
    }
}

void CpuBackend::deinterleave(Act src, int64_t width, Act a, Act b) {
    const int64_t n_pairs = src.cols / (2 * width);
    STRATA_ASSERT(src.cols == 2 * width * n_pairs && a.cols == width * n_pairs && b.cols == a.cols);
    for (int64_t r = 0; r < src.rows; r++) {
        const float *s = src.row(r);
        for (int64_t i = 0; i < n_pairs; i++) {
            std::memcpy(a.row(r) + i * width, s + 2 * i * width, size_t(width) * 4);
            std::memcpy(b.row(r) + i * width, s + (2 * i + 1) * width, size_t(width) * 4);
        }
    }
}

void cpu_rope_neox(ThreadPool &pool, const Act &x, const RopeParams &rp, const BatchInfo &b) {
    const int64_t half = rp.n_rot / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; i++)
        inv_freq[size_t(i)] = float(1.0 / std::pow(double(rp.theta), double(2 * i) / double(rp.n_rot)));
    const int64_t n_head = x.cols / rp.head_dim;
    for (const BatchSeg &s : b.segs) {
        pool.parallel_for(s.n, 8, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; t++) {
                float pos = float(s.pos0 + t);
                float *xr = x.row(s.row0 + t);
                for (int64_t i = 0; i < half; i++) {
                    float angle = pos * inv_freq[size_t(i)];
                    float c = std::cos(angle), sn = std::sin(angle);
                    for (int64_t h = 0; h < n_head; h++) {
                        float *hd = xr + h * rp.head_dim;
                        float a = hd[i], bb = hd[i + half];
                        hd[i] = a * c - bb * sn;
                        hd[i + half] = bb * c + a * sn;
                    }
                }
            }
        });
    }
}

void CpuBackend::rope(Act x, const RopeParams &rp, const BatchInfo &b) { cpu_rope_neox(pool_, x, rp, b); }

}  // namespace strata
