// Quantizers for the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): for each group of 8, the
// exactly nearest grid point under the format's sign rules, with scales fitted by a few Lloyd iterations (choose
// points, refit the scale by least squares). Simple and deterministic; no importance weights, modest quality.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "format/iq_grids.h"
#include "format/quant_blocks.h"
#include "format/quant_impl.h"

namespace strata::quant_detail {

namespace {

constexpr float k_inf = std::numeric_limits<float>::infinity();

// ---- codebooks -----------------------------------------------------------------------------------------------------

// A grid with an exact nearest-entry search that avoids scoring every entry. Each entry is split into two halves; a
// half is a short pattern over the grid's few coordinate values (3 values: 81 patterns of 4; 8 values: 64 of 2). The
// squared distance to a target is A[first half] + B[second half], both tables cheap to fill per target. Entries are
// bucketed by first half; a bucket is skipped when A + min(B) already exceeds the best distance found, which after
// starting from the bucket of smallest A leaves only a few buckets to scan.
struct Codebook {
    int n = 0, dim = 0, half = 0, n_values = 0, n_patterns = 0;
    float max_value = 0.0f;
    float values[8] = {};      // the distinct coordinate values, ascending
    std::vector<float> coord;  // coord[j * dim + k] = value k of entry j
    // Buckets: entries grouped by first-half pattern, in increasing entry order inside each bucket.
    std::vector<int> bucket_pattern, bucket_begin;  // bucket_begin has one extra element at the end
    std::vector<uint16_t> entry_second, entry_index;

    template <class Entry>
    Codebook(const Entry *grid, int n_entries, int dims, bool signed_bytes) : n(n_entries), dim(dims), half(dims / 2) {
        coord.resize(size_t(n) * size_t(dim));
        for (int j = 0; j < n; j++)
            for (int k = 0; k < dim; k++) {
                const uint8_t byte = uint8_t(uint64_t(grid[j]) >> (8 * k));
                coord[size_t(j * dim + k)] = signed_bytes ? float(int8_t(byte)) : float(byte);
            }
        std::vector<float> distinct(coord);
        std::sort(distinct.begin(), distinct.end());
        distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
        STRATA_ASSERT(distinct.size() <= 8);
        n_values = int(distinct.size());
        for (int v = 0; v < n_values; v++) values[v] = distinct[size_t(v)];
        max_value = values[n_values - 1];
        n_patterns = 1;
        for (int k = 0; k < half; k++) n_patterns *= n_values;
        STRATA_ASSERT((half == 4 && n_patterns <= 81) || (half == 2 && n_patterns <= 64));

        auto pattern_of = [&](int j, int first_k) {
            int p = 0;
            for (int k = half - 1; k >= 0; k--) {
                const float v = coord[size_t(j * dim + first_k + k)];
                p = p * n_values + int(std::lower_bound(values, values + n_values, v) - values);
            }
            return p;
        };
        for (int p = 0; p < n_patterns; p++) {
            const size_t begin = entry_index.size();
            for (int j = 0; j < n; j++) {
                if (pattern_of(j, 0) != p) continue;
                entry_second.push_back(uint16_t(pattern_of(j, half)));
                entry_index.push_back(uint16_t(j));
            }
            if (entry_index.size() > begin) bucket_pattern.push_back(p), bucket_begin.push_back(int(begin));
        }
        bucket_begin.push_back(int(entry_index.size()));
    }

    float value(int j, int k) const { return coord[size_t(j * dim + k)]; }

    // Squared distance of every half pattern to t[first_k .. first_k + half), and the least of them. Pattern digits
    // are built up in pairs of coordinates, (c0 + c1) + (c2 + c3); the minimum is the same sum of per-coordinate
    // minima, which float rounding (monotonic) keeps a lower bound of every entry of out.
    float half_distances(const float *t, int first_k, float *out) const {
        float cost[4][8], cmin[4];
        for (int k = 0; k < half; k++) {
            cmin[k] = k_inf;
            for (int v = 0; v < n_values; v++) {
                const float diff = values[v] - t[first_k + k];
                cost[k][v] = diff * diff;
                cmin[k] = std::min(cmin[k], cost[k][v]);
            }
        }
        const int nv = n_values, nv2 = nv * nv;
        float lo[64], hi[64];
        for (int v1 = 0; v1 < nv; v1++)
            for (int v0 = 0; v0 < nv; v0++) lo[v0 + nv * v1] = cost[0][v0] + cost[1][v1];
        if (half == 2) {
            for (int p = 0; p < nv2; p++) out[p] = lo[p];
            return cmin[0] + cmin[1];
        }
        for (int v3 = 0; v3 < nv; v3++)
            for (int v2 = 0; v2 < nv; v2++) hi[v2 + nv * v3] = cost[2][v2] + cost[3][v3];
        for (int q = 0; q < nv2; q++)
            for (int p = 0; p < nv2; p++) out[p + nv2 * q] = lo[p] + hi[q];
        return (cmin[0] + cmin[1]) + (cmin[2] + cmin[3]);
    }

    // The entry nearest to t[0..dim) in squared distance (the lowest index on ties).
    int nearest(const float *t) const {
        float a[81], b[81];
        half_distances(t, 0, a);
        const float b_min = half_distances(t, half, b);
        const int n_buckets = int(bucket_pattern.size());
        int first = 0;
        for (int i = 1; i < n_buckets; i++)
            if (a[bucket_pattern[size_t(i)]] < a[bucket_pattern[size_t(first)]]) first = i;
        float best = k_inf;
        int best_j = n;
        auto scan = [&](int i) {
            const float ai = a[bucket_pattern[size_t(i)]];
            if (ai + b_min > best) return;
            for (int e = bucket_begin[size_t(i)]; e < bucket_begin[size_t(i) + 1]; e++) {
                const float d = ai + b[entry_second[size_t(e)]];
                const int j = entry_index[size_t(e)];
                if (d < best || (d == best && j < best_j)) best = d, best_j = j;
            }
        };
        scan(first);
        for (int i = 0; i < n_buckets; i++)
            if (i != first) scan(i);
        return best_j < n ? best_j : 0;  // (only a NaN target finds nothing)
    }
};

const Codebook &cb_iq2xxs() {
    static const Codebook cb(iq::iq2xxs_grid, 256, 8, false);
    return cb;
}
const Codebook &cb_iq2xs() {
    static const Codebook cb(iq::iq2xs_grid, 512, 8, false);
    return cb;
}
const Codebook &cb_iq2s() {
    static const Codebook cb(iq::iq2s_grid, 1024, 8, false);
    return cb;
}
const Codebook &cb_iq3xxs() {
    static const Codebook cb(iq::iq3xxs_grid, 256, 4, false);
    return cb;
}
const Codebook &cb_iq3s() {
    static const Codebook cb(iq::iq3s_grid, 512, 4, false);
    return cb;
}
const Codebook &cb_iq1s() {
    static const Codebook cb(iq::iq1s_grid, 2048, 8, true);
    return cb;
}

// ---- IQ2 / IQ3: magnitudes from a grid, signs stored apart -------------------------------------------------------

// A group of 8 split into a sign mask and the magnitudes to match. With even_parity (formats whose signs go through
// ksigns_iq2xs), an odd number of negatives is fixed by flipping the smallest element's sign; that element's target
// becomes -|x|, which the grid (all positive) can only approach with its smallest value.
struct SignedGroup {
    uint8_t mask = 0;
    float a[8];
};

SignedGroup make_group(const float *x, bool even_parity) {
    SignedGroup g;
    for (int j = 0; j < 8; j++) {
        if (x[j] < 0.0f) g.mask |= uint8_t(1u << j);
        g.a[j] = std::fabs(x[j]);
    }
    if (even_parity && (std::popcount(unsigned(g.mask)) & 1)) {
        int k = 0;
        for (int j = 1; j < 8; j++)
            if (g.a[j] < g.a[k]) k = j;
        g.mask ^= uint8_t(1u << k);
        g.a[k] = -g.a[k];
    }
    return g;
}

struct GroupChoice {
    int idx[2] = {0, 0};  // one entry of 8, or two entries of 4
};

// Grid entries for magnitudes a at scale s > 0 (the value is s * entry), and sum(entry*a), sum(entry^2).
GroupChoice choose_group(const Codebook &cb, const float *a, float s, float *sag, float *sgg) {
    GroupChoice c;
    const float is = 1.0f / s;
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = a[j] * is;
    const int parts = 8 / cb.dim;
    for (int p = 0; p < parts; p++) {
        const int j = cb.nearest(t + p * cb.dim);
        c.idx[p] = j;
        for (int k = 0; k < cb.dim; k++) {
            const float g = cb.value(j, k);
            *sag += g * a[p * cb.dim + k];
            *sgg += g * g;
        }
    }
    return c;
}

// Squared error of group choices at the reader's scale db.
float group_error(const Codebook &cb, const SignedGroup &g, const GroupChoice &c, float db) {
    float err = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float v = db * cb.value(c.idx[j / cb.dim], j % cb.dim);
        const float diff = v - g.a[j];
        err += diff * diff;
    }
    return err;
}

// Least-squares scale for n_groups groups sharing one scale: Lloyd iterations (choose points, refit the scale) from a
// few starting scales, keeping the best. Returns 0 for an all-zero scale group.
float fit_signed_scale(const Codebook &cb, const SignedGroup *groups, int n_groups) {
    float amax = 0.0f;
    for (int i = 0; i < n_groups; i++)
        for (int j = 0; j < 8; j++) amax = std::max(amax, groups[i].a[j]);
    if (!(amax > 0.0f)) return 0.0f;
    float best_err = k_inf, best_s = amax / cb.max_value;
    for (float start : {1.0f, 0.8f}) {  // more starts or iterations gain < 0.5% RMSE on Gaussian data
        float s = start * amax / cb.max_value;
        for (int iter = 0; iter < 2; iter++) {
            float sag = 0.0f, sgg = 0.0f, saa = 0.0f;
            for (int i = 0; i < n_groups; i++) {
                choose_group(cb, groups[i].a, s, &sag, &sgg);
                for (int j = 0; j < 8; j++) saa += groups[i].a[j] * groups[i].a[j];
            }
            if (!(sgg > 0.0f) || !(sag > 0.0f)) break;
            const float s_new = sag / sgg;
            const float err = saa - sag * s_new;
            if (err < best_err) best_err = err, best_s = s_new;
            if (s_new == s) break;
            s = s_new;
        }
    }
    return best_s;
}

// The block-level plan shared by IQ2_* and IQ3_*: groups of 8 with sign masks, scale groups of `per_scale` groups,
// 4-bit integer scales k with the reader's scale db(d, k).
struct SignedPlan {
    float d = 0.0f;
    int k[16] = {};
    SignedGroup groups[32];
    GroupChoice choice[32];
};

// Integer scales and grid points for the super-block scale in p.d, the scale groups' fitted scales as targets:
// each k is the best of its rounding's neighbours by the error it gives.
template <class DbOf>
void assign_signed(const Codebook &cb, const float *s_sub, int per_scale, DbOf db_of, SignedPlan &p) {
    const float unit = db_of(p.d, 1) - db_of(p.d, 0);  // scales are affine in k
    for (int i = 0; i < 32 / per_scale; i++) {
        const int k0 = unit > 0.0f ? round_clamp((s_sub[i] - db_of(p.d, 0)) / unit, 0, 15) : 0;
        float best = k_inf;
        for (int k = std::max(k0 - 1, 0); k <= std::min(k0 + 1, 15); k++) {
            const float db = db_of(p.d, k);
            float err = 0.0f;
            GroupChoice c[4];
            for (int q = 0; q < per_scale; q++) {
                const SignedGroup &grp = p.groups[i * per_scale + q];
                float sag = 0.0f, sgg = 0.0f;
                if (db > 0.0f) c[q] = choose_group(cb, grp.a, db, &sag, &sgg);
                err += group_error(cb, grp, c[q], db);
            }
            if (err < best) {
                best = err, p.k[i] = k;
                for (int q = 0; q < per_scale; q++) p.choice[i * per_scale + q] = c[q];
            }
        }
    }
}

template <class DbOf>
SignedPlan plan_signed(const Codebook &cb, const float *x, int per_scale, bool even_parity, DbOf db_of) {
    SignedPlan p;
    const int n_scale = 32 / per_scale;
    for (int g = 0; g < 32; g++) p.groups[g] = make_group(x + 8 * g, even_parity);
    float s_sub[16], s_max = 0.0f;
    for (int i = 0; i < n_scale; i++) {
        s_sub[i] = fit_signed_scale(cb, p.groups + i * per_scale, per_scale);
        s_max = std::max(s_max, s_sub[i]);
    }
    // d so that the largest scale group gets k = 15. (A least-squares refit of d afterwards, as the K-quants do,
    // gains under 0.1% RMSE here and costs a third more time.)
    p.d = f16_round(s_max / db_of(1.0f, 15));
    assign_signed(cb, s_sub, per_scale, db_of, p);
    return p;
}

float db_iq2(float d, int k) {
    return d * (0.5f + float(k)) * 0.25f;
}
float db_iq3xxs(float d, int k) {
    return d * (0.5f + float(k)) * 0.5f;
}
float db_iq3s(float d, int k) {
    return d * float(1 + 2 * k);
}

// ---- IQ1: ternary grid plus a shifted offset (+-1/8), no signs ---------------------------------------------------

struct Iq1Choice {
    int idx = 0;
    bool neg_delta = false;
};

// Best entry for a group at scale dl > 0 under each delta (index 0: +1/8, 1: -1/8), with the squared error at the
// reader's values dl * (entry + delta).
void iq1_choose_group(const Codebook &cb, const float *x, float dl, int idx[2], float err[2]) {
    const float idl = 1.0f / dl;
    for (int neg = 0; neg < 2; neg++) {
        const float delta = neg ? -IQ1_DELTA : IQ1_DELTA;
        float t[8];
        for (int j = 0; j < 8; j++) t[j] = x[j] * idl - delta;
        idx[neg] = cb.nearest(t);
        err[neg] = 0.0f;
        for (int j = 0; j < 8; j++) {
            const float diff = dl * (cb.value(idx[neg], j) + delta) - x[j];
            err[neg] += diff * diff;
        }
    }
}

// Choices for the n_groups groups of one scale group; shared_delta: one delta for all of them (IQ1_S).
float iq1_choose(const Codebook &cb, const float *x, int n_groups, float dl, bool shared_delta, Iq1Choice *out) {
    if (!(dl > 0.0f)) {
        float err = 0.0f;
        for (int j = 0; j < 8 * n_groups; j++) err += x[j] * x[j];
        for (int g = 0; g < n_groups; g++) out[g] = Iq1Choice{};
        return err;
    }
    int idx[4][2];
    float err[4][2], total[2] = {0.0f, 0.0f}, best_total = 0.0f;
    for (int g = 0; g < n_groups; g++) {
        iq1_choose_group(cb, x + 8 * g, dl, idx[g], err[g]);
        total[0] += err[g][0], total[1] += err[g][1];
        const int neg = err[g][1] < err[g][0] ? 1 : 0;
        out[g] = Iq1Choice{idx[g][neg], neg != 0};
        best_total += err[g][neg];
    }
    if (!shared_delta) return best_total;
    const int neg = total[1] < total[0] ? 1 : 0;
    for (int g = 0; g < n_groups; g++) out[g] = Iq1Choice{idx[g][neg], neg != 0};
    return total[neg];
}

float iq1_fit_scale(const Codebook &cb, const float *x, int n_groups, bool shared_delta) {
    const int n = 8 * n_groups;
    float sxx = 0.0f, amax = 0.0f;
    for (int j = 0; j < n; j++) sxx += x[j] * x[j], amax = std::max(amax, std::fabs(x[j]));
    if (!(amax > 0.0f)) return 0.0f;
    const float rms = std::sqrt(sxx / float(n));
    float best_err = k_inf, best_dl = rms;
    for (float start : {1.0f, 1.5f}) {  // as for IQ2/IQ3: more starts or iterations barely help
        float dl = start * rms;
        for (int iter = 0; iter < 2; iter++) {
            Iq1Choice c[4];
            iq1_choose(cb, x, n_groups, dl, shared_delta, c);
            float sxv = 0.0f, svv = 0.0f;
            for (int j = 0; j < n; j++) {
                const Iq1Choice &cj = c[j / 8];
                const float v = cb.value(cj.idx, j % 8) + (cj.neg_delta ? -IQ1_DELTA : IQ1_DELTA);
                sxv += x[j] * v, svv += v * v;
            }
            if (!(sxv > 0.0f)) break;
            const float dl_new = sxv / svv;
            const float err = sxx - sxv * dl_new;
            if (err < best_err) best_err = err, best_dl = dl_new;
            if (dl_new == dl) break;
            dl = dl_new;
        }
    }
    return best_dl;
}

// IQ1 block plan: n_scale scale groups of per_scale groups, 3-bit k with dl = d * (2k + 1).
struct Iq1Plan {
    float d = 0.0f;
    int k[16] = {};
    Iq1Choice choice[32];
};

Iq1Plan plan_iq1(const float *x, int per_scale, bool shared_delta) {
    const Codebook &cb = cb_iq1s();
    const int n_scale = 32 / per_scale;
    Iq1Plan p;
    float dl[16], dl_max = 0.0f;
    for (int i = 0; i < n_scale; i++) {
        dl[i] = iq1_fit_scale(cb, x + 8 * per_scale * i, per_scale, shared_delta);
        dl_max = std::max(dl_max, dl[i]);
    }
    p.d = f16_round(dl_max / 15.0f);
    for (int i = 0; i < n_scale; i++) {
        const float *xs = x + 8 * per_scale * i;
        const int k0 = p.d > 0.0f ? round_clamp((dl[i] / p.d - 1.0f) * 0.5f, 0, 7) : 0;
        float best = k_inf;
        for (int k = std::max(k0 - 1, 0); k <= std::min(k0 + 1, 7); k++) {
            Iq1Choice c[4];
            const float err = iq1_choose(cb, xs, per_scale, p.d * float(2 * k + 1), shared_delta, c);
            if (err < best) {
                best = err, p.k[i] = k;
                for (int g = 0; g < per_scale; g++) p.choice[i * per_scale + g] = c[g];
            }
        }
    }
    return p;
}

}  // namespace

// ---- packing -----------------------------------------------------------------------------------------------------

void quant_iq2_xxs(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SignedPlan p = plan_signed(cb_iq2xxs(), src, 4, true, db_iq2);
        BlockIQ2XXS b = {};
        b.d = f32_to_f16(p.d);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a0 = 0, a1 = uint32_t(p.k[ib]) << 28;
            for (int l = 0; l < 4; l++) {
                const int g = 4 * ib + l;
                a0 |= uint32_t(p.choice[g].idx[0]) << (8 * l);
                a1 |= uint32_t(p.groups[g].mask & 127) << (7 * l);
            }
            b.qs[4 * ib + 0] = uint16_t(a0), b.qs[4 * ib + 1] = uint16_t(a0 >> 16);
            b.qs[4 * ib + 2] = uint16_t(a1), b.qs[4 * ib + 3] = uint16_t(a1 >> 16);
        }
        store_block(dst, i, b);
    }
}

void quant_iq2_xs(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SignedPlan p = plan_signed(cb_iq2xs(), src, 2, true, db_iq2);
        BlockIQ2XS b = {};
        b.d = f32_to_f16(p.d);
        for (int ib = 0; ib < 8; ib++) {
            b.scales[ib] = uint8_t(p.k[2 * ib] | (p.k[2 * ib + 1] << 4));
            for (int l = 0; l < 4; l++) {
                const int g = 4 * ib + l;
                b.qs[g] = uint16_t(p.choice[g].idx[0] | ((p.groups[g].mask & 127) << 9));
            }
        }
        store_block(dst, i, b);
    }
}

void quant_iq2_s(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SignedPlan p = plan_signed(cb_iq2s(), src, 2, false, db_iq2);
        BlockIQ2S b = {};
        b.d = f32_to_f16(p.d);
        for (int ib = 0; ib < 8; ib++) {
            b.scales[ib] = uint8_t(p.k[2 * ib] | (p.k[2 * ib + 1] << 4));
            for (int l = 0; l < 4; l++) {
                const int g = 4 * ib + l, idx = p.choice[g].idx[0];
                b.qs[g] = uint8_t(idx & 255);
                b.qh[ib] |= uint8_t((idx >> 8) << (2 * l));
                b.qs[32 + g] = p.groups[g].mask;
            }
        }
        store_block(dst, i, b);
    }
}

void quant_iq3_xxs(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SignedPlan p = plan_signed(cb_iq3xxs(), src, 4, true, db_iq3xxs);
        BlockIQ3XXS b = {};
        b.d = f32_to_f16(p.d);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a = uint32_t(p.k[ib]) << 28;
            for (int l = 0; l < 4; l++) {
                const int g = 4 * ib + l;
                b.qs[8 * ib + 2 * l] = uint8_t(p.choice[g].idx[0]);
                b.qs[8 * ib + 2 * l + 1] = uint8_t(p.choice[g].idx[1]);
                a |= uint32_t(p.groups[g].mask & 127) << (7 * l);
            }
            std::memcpy(b.qs + 64 + 4 * ib, &a, 4);
        }
        store_block(dst, i, b);
    }
}

void quant_iq3_s(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const SignedPlan p = plan_signed(cb_iq3s(), src, 4, false, db_iq3s);
        BlockIQ3S b = {};
        b.d = f32_to_f16(p.d);
        for (int ib = 0; ib < 8; ib++) {
            b.scales[ib / 2] |= uint8_t(p.k[ib] << (4 * (ib % 2)));
            for (int l = 0; l < 4; l++) {
                const int g = 4 * ib + l;
                for (int h = 0; h < 2; h++) {
                    const int idx = p.choice[g].idx[h];
                    b.qs[8 * ib + 2 * l + h] = uint8_t(idx & 255);
                    b.qh[ib] |= uint8_t((idx >> 8) << (2 * l + h));
                }
                b.signs[g] = p.groups[g].mask;
            }
        }
        store_block(dst, i, b);
    }
}

void quant_iq1_s(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const Iq1Plan p = plan_iq1(src, 4, true);
        BlockIQ1S b = {};
        b.d = f32_to_f16(p.d);
        for (int ib = 0; ib < 8; ib++) {
            uint16_t w = uint16_t(p.k[ib] << 12);
            if (p.choice[4 * ib].neg_delta) w |= 0x8000;
            for (int l = 0; l < 4; l++) {
                const int idx = p.choice[4 * ib + l].idx;
                b.qs[4 * ib + l] = uint8_t(idx & 255);
                w |= uint16_t((idx >> 8) << (3 * l));
            }
            b.qh[ib] = w;
        }
        store_block(dst, i, b);
    }
}

void quant_iq1_m(const float *src, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, src += QK_K_BLOCK) {
        const Iq1Plan p = plan_iq1(src, 2, false);
        BlockIQ1M b = {};
        uint16_t sc[4] = {};
        for (int ib = 0; ib < 8; ib++) {
            sc[ib / 2] |= uint16_t(p.k[2 * ib] << (6 * (ib % 2)));
            sc[ib / 2] |= uint16_t(p.k[2 * ib + 1] << (6 * (ib % 2) + 3));
            for (int l = 0; l < 4; l++) {
                const Iq1Choice &c = p.choice[4 * ib + l];
                b.qs[4 * ib + l] = uint8_t(c.idx & 255);
                const int nib = (c.idx >> 8) | (c.neg_delta ? 8 : 0);
                b.qh[2 * ib + l / 2] |= uint8_t(nib << (4 * (l % 2)));
            }
        }
        // The fp16 super-block scale is spread over the top nibbles of the four scale words.
        const uint16_t h = f32_to_f16(p.d);
        for (int w = 0; w < 4; w++) sc[w] |= uint16_t(((h >> (4 * w)) & 15) << 12);
        std::memcpy(b.scales, sc, 8);
        store_block(dst, i, b);
    }
}

}  // namespace strata::quant_detail
