// Gated DeltaNet on the CPU: causal conv with carried state, per-head L2 norms, the gated delta rule (recurrent
// for short runs, chunked for prefill; both exact), and the gated RMSNorm.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_caches.h"
#include "core/error.h"

namespace strata {

namespace {

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void delta_rule_recurrent(const DeltaRuleIo &io, int64_t n, int64_t d_k, int64_t d_v, float *S) {
    std::vector<float> kv(static_cast<size_t>(d_v));
    for (int64_t t = 0; t < n; t++) {
        const float *q = io.q + t * io.q_stride, *k = io.k + t * io.k_stride, *v = io.v + t * io.v_stride;
        const float decay = std::exp(io.g[t * io.gb_stride]), beta = io.beta[t * io.gb_stride];
        for (int64_t i = 0; i < d_k * d_v; i++) S[i] *= decay;
        // kv = S^T k: what the state currently recalls for key k
        std::fill(kv.begin(), kv.end(), 0.0f);
        for (int64_t i = 0; i < d_k; i++) {
            const float *Si = S + i * d_v;
            for (int64_t j = 0; j < d_v; j++) kv[size_t(j)] += Si[j] * k[i];
        }
        for (int64_t j = 0; j < d_v; j++) kv[size_t(j)] = (v[j] - kv[size_t(j)]) * beta;  // delta
        float *o = io.o + t * io.o_stride;
        std::fill_n(o, d_v, 0.0f);
        for (int64_t i = 0; i < d_k; i++) {
            float *Si = S + i * d_v;
            for (int64_t j = 0; j < d_v; j++) {
                Si[j] += k[i] * kv[size_t(j)];
                o[j] += Si[j] * q[i];
            }
        }
    }
}

// REFERENCE.md §5, per chunk of up to C tokens: with gamma the running sum of g inside the chunk,
//   (I + A) W = diag(beta e^gamma) K,  (I + A) U = diag(beta) V,  A_rs = beta_r (k_r.k_s) e^(gamma_r - gamma_s), r > s
//   V' = U - W S;  O = diag(e^gamma) Q S + ((Q K^T) . D . M) V';  S <- e^gamma_C S + sum_r e^(gamma_C - gamma_r) k_r v'_r^T
// solved by forward substitution instead of forming (I + A)^-1.
void delta_rule_chunked(const DeltaRuleIo &io, int64_t n, int64_t d_k, int64_t d_v, float *S, int64_t C) {
    std::vector<float> gam(static_cast<size_t>(C)), W(static_cast<size_t>(C * d_k)), U(static_cast<size_t>(C * d_v)), KK(static_cast<size_t>(C * C)), QK(static_cast<size_t>(C * C));
    std::vector<float> Snew(static_cast<size_t>(d_k * d_v));
    for (int64_t c0 = 0; c0 < n; c0 += C) {
        const int64_t L = std::min(C, n - c0);
        auto q = [&](int64_t r) { return io.q + (c0 + r) * io.q_stride; };
        auto k = [&](int64_t r) { return io.k + (c0 + r) * io.k_stride; };
        auto v = [&](int64_t r) { return io.v + (c0 + r) * io.v_stride; };
        auto beta = [&](int64_t r) { return io.beta[(c0 + r) * io.gb_stride]; };
        float acc = 0;
        for (int64_t r = 0; r < L; r++) {
            acc += io.g[(c0 + r) * io.gb_stride];
            gam[size_t(r)] = acc;
        }
        for (int64_t r = 0; r < L; r++)
            for (int64_t s = 0; s <= r; s++) {
                float kk = 0, qk = 0;
                for (int64_t i = 0; i < d_k; i++) {
                    kk += k(r)[i] * k(s)[i];
                    qk += q(r)[i] * k(s)[i];
                }
                const float dec = std::exp(gam[size_t(r)] - gam[size_t(s)]);
                KK[size_t(r * C + s)] = beta(r) * kk * dec;  // A_rs (used for s < r)
                QK[size_t(r * C + s)] = qk * dec;            // (Q K^T . D) with the causal mask
            }
        // Forward substitution: W_r = beta_r e^gamma_r k_r - sum_{s<r} A_rs W_s; U likewise with beta_r v_r.
        for (int64_t r = 0; r < L; r++) {
            float *Wr = W.data() + r * d_k, *Ur = U.data() + r * d_v;
            const float bw = beta(r) * std::exp(gam[size_t(r)]);
            for (int64_t i = 0; i < d_k; i++) Wr[i] = bw * k(r)[i];
            for (int64_t j = 0; j < d_v; j++) Ur[j] = beta(r) * v(r)[j];
            for (int64_t s = 0; s < r; s++) {
                const float a = KK[size_t(r * C + s)];
                const float *Ws = W.data() + s * d_k, *Us = U.data() + s * d_v;
                for (int64_t i = 0; i < d_k; i++) Wr[i] -= a * Ws[i];
                for (int64_t j = 0; j < d_v; j++) Ur[j] -= a * Us[j];
            }
        }
        // V' = U - W S (stored over U)
        for (int64_t r = 0; r < L; r++) {
            float *Ur = U.data() + r * d_v;
            const float *Wr = W.data() + r * d_k;
            for (int64_t i = 0; i < d_k; i++) {
                const float *Si = S + i * d_v;
                for (int64_t j = 0; j < d_v; j++) Ur[j] -= Wr[i] * Si[j];
            }
        }
        // O = e^gamma Q S + (QK . D . M) V'
        for (int64_t r = 0; r < L; r++) {
            float *o = io.o + (c0 + r) * io.o_stride;
            std::fill_n(o, d_v, 0.0f);
            const float eg = std::exp(gam[size_t(r)]);
            for (int64_t i = 0; i < d_k; i++) {
                const float qi = q(r)[i] * eg;
                const float *Si = S + i * d_v;
                for (int64_t j = 0; j < d_v; j++) o[j] += qi * Si[j];
            }
            for (int64_t s = 0; s <= r; s++) {
                const float a = QK[size_t(r * C + s)];
                const float *Us = U.data() + s * d_v;
                for (int64_t j = 0; j < d_v; j++) o[j] += a * Us[j];
            }
        }
        // S <- e^gamma_L S + sum_r e^(gamma_L - gamma_r) k_r v'_r^T
        const float gL = gam[size_t(L - 1)];
        const float eL = std::exp(gL);
        for (int64_t i = 0; i < d_k * d_v; i++) S[i] *= eL;
        for (int64_t r = 0; r < L; r++) {
            const float w = std::exp(gL - gam[size_t(r)]);
            const float *Ur = U.data() + r * d_v;
            for (int64_t i = 0; i < d_k; i++) {
                const float ki = k(r)[i] * w;
                float *Si = S + i * d_v;
                for (int64_t j = 0; j < d_v; j++) Si[j] += ki * Ur[j];
            }
        }
    }
}

void CpuBackend::gdn(int64_t il, const GdnWeights &Lw, Act qkv, Act z, Act beta_in, Act alpha_in,
                     const GdnParams &p, const BatchInfo &b, Act out) {
    STRATA_ASSERT(caches_ && il < int64_t(caches_->layers.size()));
    Caches::Layer &L = caches_->layers[size_t(il)];
    const int64_t n_k = p.n_k_heads, n_v = p.n_v_heads, d_k = p.head_k_dim, d_v = p.head_v_dim;
    const int64_t key_dim = n_k * d_k, conv_dim = 2 * key_dim + n_v * d_v, K = p.conv_kernel, r = n_v / n_k;
    STRATA_ASSERT(!L.attn && qkv.cols == conv_dim && L.conv_cols == conv_dim && L.conv_rows == K - 1);
    STRATA_ASSERT(z.cols == n_v * d_v && out.cols == n_v * d_v);
    const float *w_conv = vec_f32(*Lw.conv1d);  // [conv_dim][K]
    const float *dt_bias = vec_f32(*Lw.dt_bias), *a_neg = vec_f32(*Lw.a), *norm_w = vec_f32(*Lw.norm);
    const float q_scale = 1.0f / std::sqrt(float(d_k));

    for (const BatchSeg &s : b.segs) {
        const int64_t n = s.n;
        // 1. causal depthwise conv over [conv state; new inputs], then SiLU.
        float *cstate = caches_->conv(L, s.seq);
        std::vector<float> xin(static_cast<size_t>((K - 1 + n) * conv_dim));
        std::memcpy(xin.data(), cstate, size_t((K - 1) * conv_dim) * 4);
        for (int64_t t = 0; t < n; t++)
            std::memcpy(xin.data() + (K - 1 + t) * conv_dim, qkv.row(s.row0 + t), size_t(conv_dim) * 4);
        std::vector<float> xc(static_cast<size_t>(n * conv_dim));
        pool_.parallel_for(conv_dim, 64, [&](int64_t c0, int64_t c1) {
            for (int64_t c = c0; c < c1; c++) {
                const float *w = w_conv + c * K;
                for (int64_t t = 0; t < n; t++) {
                    float acc = 0;
                    for (int64_t j = 0; j < K; j++) acc += w[j] * xin[size_t((t + j) * conv_dim + c)];
                    xc[size_t(t * conv_dim + c)] = siluf(acc);
                }
            }
        });
        std::memcpy(cstate, xin.data() + n * conv_dim, size_t((K - 1) * conv_dim) * 4);

        // 2. L2-normalised q (scaled by 1/sqrt(d_k)) and k per k-head, in place in xc.
        for (int64_t t = 0; t < n; t++) {
            float *row = xc.data() + t * conv_dim;
            for (int64_t h = 0; h < 2 * n_k; h++) {
                float *x = row + h * d_k;
                float ss = 0;
                for (int64_t i = 0; i < d_k; i++) ss += x[i] * x[i];
                float sc = 1.0f / std::sqrt(ss + 1e-6f);
                if (h < n_k) sc *= q_scale;
                for (int64_t i = 0; i < d_k; i++) x[i] *= sc;
            }
        }

        // 3. beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per token and v-head.
        std::vector<float> g(static_cast<size_t>(n * n_v)), beta(static_cast<size_t>(n * n_v));
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < n_v; j++) {
                float bj, aj;
                if (p.ba_grouped) {
                    const int64_t grp = j / r, i = j % r;
                    bj = beta_in.row(s.row0 + t)[grp * 2 * r + i];
                    aj = beta_in.row(s.row0 + t)[grp * 2 * r + r + i];
                } else {
                    bj = beta_in.row(s.row0 + t)[j];
                    aj = alpha_in.row(s.row0 + t)[j];
                }
                beta[size_t(t * n_v + j)] = sigmoidf(bj);
                g[size_t(t * n_v + j)] = a_neg[j] * softplusf(aj + dt_bias[j]);
            }

        // 4. the delta rule per v-head with the seq's state, 5. gated RMSNorm with z.
        float *states = caches_->state(L, s.seq);
        pool_.parallel_for(n_v, 1, [&](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; j++) {
                const int64_t kh = p.vhead_tiled ? j % n_k : j / r;
                DeltaRuleIo io;
                io.q = xc.data() + kh * d_k;
                io.k = xc.data() + key_dim + kh * d_k;
                io.v = xc.data() + 2 * key_dim + j * d_v;
                io.q_stride = io.k_stride = io.v_stride = conv_dim;
                io.g = g.data() + j;
                io.beta = beta.data() + j;
                io.gb_stride = n_v;
                io.o = out.row(s.row0) + j * d_v;
                io.o_stride = out.stride;
                float *S = states + j * d_k * d_v;
                if (n >= 16) delta_rule_chunked(io, n, d_k, d_v, S, 64);
                else delta_rule_recurrent(io, n, d_k, d_v, S);
                for (int64_t t = 0; t < n; t++) {
                    float *o = out.row(s.row0 + t) + j * d_v;
                    const float *zz = z.row(s.row0 + t) + j * d_v;
                    float ss = 0;
                    for (int64_t i = 0; i < d_v; i++) ss += o[i] * o[i];
                    const float sc = 1.0f / std::sqrt(ss / float(d_v) + p.eps);
                    for (int64_t i = 0; i < d_v; i++) o[i] = o[i] * sc * norm_w[i] * siluf(zz[i]);
                }
            }
        });
    }
}

}  // namespace strata
