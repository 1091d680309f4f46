// Matmuls and the MoE block of the CUDA backend: kernel choice per group, activation preparation, and routed
// experts run grouped by expert through the slot table (expert_cache.h).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

// STRATA_CUDA_MMVQ=0 sends the small groups and STRATA_CUDA_MMQ=0 the large ones to the generic kernels (A/B checks
// of the quantized kernels).
bool mmvq_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMVQ", true);
    return on;
}
bool mmq_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MMQ", true);
    return on;
}
// STRATA_CUDA_DEVICE_ROUTING=0 sends decoding through the host-grouped MoE path as well.
bool device_routing_enabled() {
    static const bool on = env_switch("STRATA_CUDA_DEVICE_ROUTING", true);
    return on;
}
// STRATA_CUDA_SCAN_EVICT=0 keeps least-recently-used eviction for chunks that sweep most experts (expert_cache.h).
bool scan_evict_enabled() {
    static const bool on = env_switch("STRATA_CUDA_SCAN_EVICT", true);
    return on;
}

}  // namespace

bool CudaBackend::fusion_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FUSE", true);
    return on;
}

void CudaBackend::grouped_matmul(const WeightShape &w, const std::vector<MatmulGroup> &groups, PreparedAct &x, Rows y) {
    STRATA_ASSERT(x.k == w.k && y.cols == w.n);
    const DType vt = cpu_vec_dot_type(w.type);
    if (vt != DType::F32 && w.k % dtype_info(vt).block_size != 0)
        fail("matmul with '%s': row length %lld is not a multiple of %s blocks", w.name, (long long)w.k,
             dtype_name(vt));
    std::vector<MatmulGroup> small, big;
    for (const MatmulGroup &g : groups) {
        if (g.n_rows == 0) continue;
        STRATA_ASSERT(g.x_row0 >= 0 && g.x_row0 + g.n_rows <= x.rows);
        (g.n_rows <= k_mmv_max_rows ? small : big).push_back(g);
    }

    MatmulArgs base;
    base.type = w.type;
    base.k = w.k;
    base.n = w.n;
    base.row_bytes = w.row_bytes;
    base.y = y.data;
    base.y_stride = y.stride;

    auto round_trip = [&](MatmulArgs &a) {
        if (vt == DType::F32) {
            a.x = x.src;
            a.x_stride = x.stride;
            return;
        }
        if (!x.round_trip || x.round_trip_type != vt) {
            float *rt = scratch_array<float>(x.rows * x.k);
            launch_act_round_trip(vt, x.src, x.stride, x.rows, x.k, rt, stream_);
            x.round_trip = rt;
            x.round_trip_type = vt;
        }
        a.x = x.round_trip;
        a.x_stride = x.k;
    };
    auto quantized = [&](MatmulArgs &a) {
        if (!x.q8 || x.q8_type != vt) {
            int8_t *q = scratch_array<int8_t>(x.rows * x.k);
            float2 *ds = scratch_array<float2>(x.rows * (x.k / 32));
            launch_quantize_act(vt, x.src, x.stride, x.rows, x.k, q, ds, stream_);
            x.q8 = q;
            x.q8_ds = ds;
            x.q8_type = vt;
        }
        a.xq = x.q8;
        a.xds = x.q8_ds;
    };
    const bool int8_ok = vt != DType::F32 && w.k % 32 == 0;
    auto set_groups = [&](MatmulArgs &a, const std::vector<MatmulGroup> &gs) {
        if (gs.size() == 1) {
            a.single = gs[0];
            a.groups = nullptr;
            a.n_groups = 1;
        } else {
            a.groups = upload_vec(gs);
            a.n_groups = int32_t(gs.size());
        }
    };

    if (!small.empty()) {
        MatmulArgs a = base;
        set_groups(a, small);
        if (mmvq_enabled() && mmvq_supported(w.type) && int8_ok) {
            quantized(a);
            launch_mmvq(a, stream_);
        } else {
            round_trip(a);
            launch_mmv_generic(a, stream_);
        }
    }
    if (!big.empty()) {
        MatmulArgs a = base;
        const bool mmq = mmq_enabled() && mmq_supported(w.type) && int8_ok;
        if (mmq)
            quantized(a);
        else
            round_trip(a);
        if (big.size() == 1 && big[0].x_row0 == 0 && big[0].y_row0 == 0) {
            a.single = big[0];
        } else {
            std::vector<int2> tiles;
            for (size_t gi = 0; gi < big.size(); gi++)
                for (int32_t r = 0; r < big[gi].n_rows; r += k_mm_tile_rows) tiles.push_back(int2{int(gi), r});
            set_groups(a, big);
            a.tiles = upload_vec(tiles);
            a.n_tiles = int32_t(tiles.size());
        }
        if (mmq)
            launch_mmq(a, stream_);
        else
            launch_mm_generic(a, stream_);
    }
}

void CudaBackend::matmul(const Weight &w, Act x, Act out) {
    matmuls(x, {{&w, out}});
}

// The input is quantized (or rounded) once per activation format and shared by every product that reads it.
void CudaBackend::matmuls(Act x, const std::vector<MatmulOut> &outs) {
    STRATA_CUDA_OP("matmul");
    if (x.rows == 0) return;
    const Mark m = mark();
    PreparedAct pa;
    pa.src = x.data;
    pa.rows = x.rows;
    pa.k = x.cols;
    pa.stride = x.stride;
    for (const MatmulOut &o : outs) {
        if (!fusion_enabled()) pa = PreparedAct{x.data, x.rows, x.cols, x.stride};  // each product its own
        const Weight &w = *o.w;
        STRATA_ASSERT(x.cols == w.ne[0] && o.out.cols == w.ne[1] && o.out.rows == x.rows);
        const std::string name(w.name);
        const WeightShape ws{w.type, w.ne[0], w.ne[1], w.row_bytes, name.c_str()};
        grouped_matmul(ws, {MatmulGroup{dev_matrix(w), 0, int32_t(x.rows), 0}}, pa, rows_of(o.out));
    }
    release(m);
}

// The host-grouped path below runs an expert's rows as one group, through the mat-vec kernel when it has at most
// k_mmv_max_rows of them. With at most that many tokens every expert has, so there every pair (token, expert) can be
// its own one-row group of the same kernel: the same function of the same rows, hence the same bits, with the
// groups made on the device from the routing and no synchronisation with the host.
bool CudaBackend::device_routing_applies(const LayerWeights &L, int64_t il, int64_t n_tokens) const {
    if (!device_routing_enabled() || !mmvq_enabled() || n_tokens > k_mmv_max_rows) return false;
    if (size_t(il) >= expert_tables_.size() || !expert_tables_[size_t(il)]) return false;
    for (const Weight *w : {&L.gate_exps, &L.up_exps, &L.down_exps})
        if (!mmvq_supported(w->type) || w->ne[0] % 32 != 0 || cpu_vec_dot_type(w->type) == DType::F32 ||
            w->ne[0] % dtype_info(cpu_vec_dot_type(w->type)).block_size != 0)
            return false;
    return true;
}

void CudaBackend::moe_device_routed(const LayerWeights &L, int64_t il, Act x, int64_t k, const int32_t *ids_dev,
                                    const float *wts_dev, Act out) {
    STRATA_CUDA_OP("experts_device_routed");
    const int64_t T = x.rows, E = x.cols, n_ff = L.gate_exps.ne[1], M = T * k;
    MatmulGroup *groups = scratch_array<MatmulGroup>(3 * M);
    int32_t *yrow = scratch_array<int32_t>(M), *widx = scratch_array<int32_t>(M);
    launch_moe_pair_groups(ids_dev, T, k, expert_tables_[size_t(il)], groups, groups + M, groups + 2 * M, yrow, widx,
                           stream_);
    // gate rows 0..M-1 and up rows M..2M-1 of one buffer: the pair groups address both from its start, so where gate
    // and up share a type one launch computes both.
    Act gu = alloc(2 * M, n_ff), ys = alloc(M, E);
    Act g = gu.rows_view(0, M), u = gu.rows_view(M, M);
    // Activations quantized once per activation format (gate and up usually share it).
    auto run = [&](const Weight &w, const MatmulGroup *gs, int64_t n_groups, const Act &src, Act y, const int8_t *&q,
                   const float2 *&ds, DType &qt, const Act *silu_mul_by = nullptr) {
        const DType vt = cpu_vec_dot_type(w.type);
        if (!q || qt != vt) {
            int8_t *qq = scratch_array<int8_t>(src.rows * src.cols);
            float2 *dd = scratch_array<float2>(src.rows * (src.cols / 32));
            launch_quantize_act(vt, src.data, src.stride, src.rows, src.cols, qq, dd, stream_,
                                silu_mul_by ? silu_mul_by->data : nullptr, silu_mul_by ? silu_mul_by->stride : 0);
            q = qq, ds = dd, qt = vt;
        }
        MatmulArgs a;
        a.type = w.type;
        a.k = w.ne[0];
        a.n = w.ne[1];
        a.row_bytes = w.row_bytes;
        a.xq = q;
        a.xds = ds;
        a.y = y.data;
        a.y_stride = y.stride;
        a.groups = gs;
        a.n_groups = int32_t(n_groups);
        launch_mmvq(a, stream_);
    };
    const int8_t *xq = nullptr, *gq = nullptr;
    const float2 *xds = nullptr, *gds = nullptr;
    DType xt = DType::F32, gt = DType::F32;
    if (fusion_enabled() && L.gate_exps.type == L.up_exps.type && L.gate_exps.row_bytes == L.up_exps.row_bytes) {
        run(L.gate_exps, groups, 2 * M, x, gu, xq, xds, xt);
    } else {
        run(L.gate_exps, groups, M, x, gu, xq, xds, xt);
        run(L.up_exps, groups + M, M, x, gu, xq, xds, xt);
    }
    // silu(gate) * up made while quantizing for the down matrices (no launch of its own)
    if (fusion_enabled()) {
        run(L.down_exps, groups + 2 * M, M, g, ys, gq, gds, gt, &u);
    } else {
        launch_silu_mul(rows_of(g), rows_of(u), stream_);
        run(L.down_exps, groups + 2 * M, M, g, ys, gq, gds, gt);
    }
    launch_moe_combine(rows_of(ys), yrow, widx, wts_dev, k, rows_of(out), stream_);
}

// Routing read back: (token, expert) pairs grouped by expert on the host, each expert's gate/up/down over its rows
// (several experts per launch, pointers from the slot table, which copies in the experts that are not resident),
// and each token's expert outputs summed in expert-id order.
void CudaBackend::moe_host_grouped(const LayerWeights &L, int64_t il, Act x, int64_t k, int64_t n_exp,
                                   const std::vector<int32_t> &ids, const float *wts_dev, Act out) {
    const int64_t T = x.rows, E = x.cols, n_ff = L.gate_exps.ne[1];
    // Rows sorted by expert (tokens in order within an expert).
    std::vector<int32_t> count(size_t(n_exp), 0), first(size_t(n_exp), 0), fill(size_t(n_exp), 0);
    for (int32_t e : ids) {
        STRATA_ASSERT(e >= 0 && e < n_exp);
        count[size_t(e)]++;
    }
    std::vector<int32_t> used;
    for (int32_t e = 0, off = 0; e < n_exp; e++) {
        first[size_t(e)] = off;
        off += count[size_t(e)];
        if (count[size_t(e)]) used.push_back(e);
    }
    const int64_t M = T * k;
    std::vector<int32_t> src_row(static_cast<size_t>(M)), row_of(static_cast<size_t>(M));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            const int32_t e = ids[size_t(t * k + j)];
            const int32_t r = first[size_t(e)] + fill[size_t(e)]++;
            src_row[size_t(r)] = int32_t(t);
            row_of[size_t(t * k + j)] = r;
        }
    // Each token's entries in expert-id order: the order the reference adds them in.
    std::vector<int32_t> yrow(static_cast<size_t>(M)), widx(static_cast<size_t>(M));
    for (int64_t t = 0; t < T; t++) {
        int32_t order[64];
        std::vector<int32_t> big_order;
        int32_t *ord = k <= 64 ? order : (big_order.resize(size_t(k)), big_order.data());
        for (int64_t j = 0; j < k; j++) ord[j] = int32_t(j);
        std::sort(ord, ord + k, [&](int32_t a, int32_t b) { return ids[size_t(t * k + a)] < ids[size_t(t * k + b)]; });
        for (int64_t j = 0; j < k; j++) {
            yrow[size_t(t * k + j)] = row_of[size_t(t * k + ord[j])];
            widx[size_t(t * k + j)] = int32_t(t * k + ord[j]);
        }
    }

    Act xs = alloc(M, E), g = alloc(M, n_ff), u = alloc(M, n_ff), ys = alloc(M, E);
    launch_gather_rows(rows_of(x), upload_vec(src_row), rows_of(xs), stream_);
    PreparedAct px;
    px.src = xs.data;
    px.rows = M;
    px.k = E;
    px.stride = xs.stride;
    const std::string gname(L.gate_exps.name), uname(L.up_exps.name), dname(L.down_exps.name);
    const WeightShape gw{L.gate_exps.type, E, n_ff, L.gate_exps.row_bytes, gname.c_str()};
    const WeightShape uw{L.up_exps.type, E, n_ff, L.up_exps.row_bytes, uname.c_str()};
    const WeightShape dw{L.down_exps.type, n_ff, E, L.down_exps.row_bytes, dname.c_str()};

    // As many experts at a time as there are slots: with a small cache a layer's experts come in several sets.
    const int64_t per_set = std::max<int64_t>(1, experts_.n_slots());
    std::vector<ExpertPtrs> ptrs;
    for (size_t s0 = 0; s0 < used.size(); s0 += size_t(per_set)) {
        const size_t s1 = std::min(used.size(), s0 + size_t(per_set));
        ptrs.resize(s1 - s0);
        {
            STRATA_CUDA_OP("acquire");
            const bool scan = scan_evict_enabled() && 2 * int64_t(used.size()) >= n_exp;
            experts_.acquire(il, used.data() + s0, int64_t(s1 - s0), ptrs.data(), stream_, scan);
        }
        STRATA_CUDA_OP("experts");
        std::vector<MatmulGroup> gg, ug, dg;
        const int32_t r0 = first[size_t(used[s0])];
        const int32_t r1 = first[size_t(used[s1 - 1])] + count[size_t(used[s1 - 1])];
        for (size_t i = s0; i < s1; i++) {
            const int32_t e = used[i], f = first[size_t(e)], c = count[size_t(e)];
            gg.push_back({ptrs[i - s0].gate, f, c, f});
            ug.push_back({ptrs[i - s0].up, f, c, f});
            dg.push_back({ptrs[i - s0].down, f - r0, c, f});
        }
        grouped_matmul(gw, gg, px, rows_of(g));
        grouped_matmul(uw, ug, px, rows_of(u));
        const Act gs = g.rows_view(r0, r1 - r0), us = u.rows_view(r0, r1 - r0);
        launch_silu_mul(rows_of(gs), rows_of(us), stream_);
        PreparedAct pg;
        pg.src = gs.data;
        pg.rows = gs.rows;
        pg.k = n_ff;
        pg.stride = gs.stride;
        grouped_matmul(dw, dg, pg, rows_of(ys));
    }
    launch_moe_combine(rows_of(ys), upload_vec(yrow), upload_vec(widx), wts_dev, k, rows_of(out), stream_);
}

// Routed experts: route on the device; then the experts either through the routing read back and grouped on the
// host (any batch, any cache) or, for decoding with every expert resident, grouped on the device; then the shared
// expert.
void CudaBackend::moe(const LayerWeights &L, Act x, const MoeParams &p, Act out) {
    const int64_t il = layer_index(L);
    const int64_t T = x.rows, E = x.cols, k = p.n_expert_used, n_exp = p.n_expert;
    STRATA_ASSERT(out.rows == T && out.cols == E && L.down_exps.ne[1] == E && k >= 1 && k <= n_exp);
    if (T == 0) return;
    STRATA_CUDA_OP("moe");
    const Mark mk = mark();

    Act logits = alloc(T, n_exp);
    int32_t *ids_dev = scratch_array<int32_t>(T * k);
    float *wts_dev = scratch_array<float>(T * k);
    std::vector<int32_t> ids(size_t(T * k));
    const bool on_device = device_routing_applies(L, il, T);
    {
        STRATA_CUDA_OP("route");
        matmul(L.gate_inp, x, logits);
        launch_router_topk(rows_of(logits), k, p.norm_weights, p.weights_scale, ids_dev, wts_dev, stream_);
        if (!on_device) {
            STRATA_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_dev, ids.size() * 4, cudaMemcpyDeviceToHost, stream_));
            STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
    }
    if (on_device) {
        moe_device_routed(L, il, x, k, ids_dev, wts_dev, out);
    } else {
        moe_host_grouped(L, il, x, k, n_exp, ids, wts_dev, out);
    }

    if (L.gate_shexp.present()) {
        STRATA_CUDA_OP("shared_expert");
        const int64_t n_sh = L.gate_shexp.ne[1];
        Act sg = alloc(T, n_sh), su = alloc(T, n_sh), sy = alloc(T, E);
        matmuls(x, {{&L.gate_shexp, sg}, {&L.up_shexp, su}});
        launch_silu_mul(rows_of(sg), rows_of(su), stream_);
        matmul(L.down_shexp, sg, sy);
        launch_shared_expert_add(rows_of(x), dev_vector(L.gate_inp_shexp), rows_of(sy), rows_of(out), stream_);
    }
    release(mk);
}

}  // namespace strata::cuda
