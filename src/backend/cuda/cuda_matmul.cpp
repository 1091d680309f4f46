// Matmuls and the MoE steps of the CUDA backend: kernel choice per group, activation preparation, routing on the
// device, and routed experts run grouped by expert from the slots the strata layer names (strata/moe_schedule.h).
#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/host/mmvq_host.h"
#include "core/env.h"
#include "core/error.h"
#include "format/quant.h"

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
// STRATA_CUDA_MOE_TAIL=0 keeps a decoding MoE layer's combination, shared expert and residual step in separate
// launches (A/B of k_moe_tail; the same bits).
bool moe_tail_enabled() {
    static const bool on = env_switch("STRATA_CUDA_MOE_TAIL", true);
    return on;
}
// STRATA_CUDA_TAIL_AHEAD=0: the decoding MoE tail loads each pair's row after adding the one before instead of all of
// them first (launch_moe_tail's ahead; the same bits; on: 1.02-1.04x the 30B's resident tg128, bench/RESULTS.md).
bool tail_ahead_enabled() {
    static const bool on = env_switch("STRATA_CUDA_TAIL_AHEAD", true);
    return on;
}
// STRATA_CUDA_DEVICE_ROUTING=0 sends decoding through the host-grouped MoE path as well.
bool device_routing_enabled() {
    static const bool on = env_switch("STRATA_CUDA_DEVICE_ROUTING", true);
    return on;
}
}  // namespace

bool CudaBackend::fusion_enabled() {
    static const bool on = env_switch("STRATA_CUDA_FUSE", true);
    return on;
}

// ---- norms that quantize for the next mat-vec ----

namespace {
bool norm_q8_enabled() {
    static const bool on = env_switch("STRATA_CUDA_NORM_Q8", true);
    return on;
}
bool same_q8_bytes(DType a, DType b) {  // Q8_0 and Q8_1 activations are made alike (launch_quantize_act)
    auto cls = [](DType t) { return t == DType::Q8_1 ? DType::Q8_0 : t; };
    return cls(a) == cls(b);
}
}  // namespace

NormQ8 CudaBackend::norm_quant_begin(const float *w_dev, const Act &x, const Act &out, bool wide) {
    norm_quant_.src = nullptr;
    last_norm_w_ = w_dev, last_norm_out_ = out.data, norm_want_open_ = true;
    if (!wide || !norm_q_ || !fusion_enabled() || !norm_q8_enabled() || out.rows > k_mmv_max_rows ||
        out.rows * out.cols > k_norm_quant_values)
        return {};
    const auto it = norm_wants_.find(w_dev);
    if (it == norm_wants_.end()) return {};
    const int form = same_q8_bytes(it->second, DType::Q8_0) ? 1 : it->second == DType::Q8_K ? 2 : 0;
    if (!form || !norm_quantizes(rows_of(x), rows_of(out), out.cols, w_dev, form)) return {};
    return NormQ8{norm_q_, norm_ds_, form};
}

// The decoding attention writes the Q8_0 form of its output for the o matrix, whose input then takes no quantize
// launch of its own (the same bytes; 1.026-1.028x the 30B's resident tg128 on an H100). STRATA_CUDA_ATTN_Q8=0
// quantizes it in its own launch.
static bool attn_q8_enabled() {
    static const bool on = env_switch("STRATA_CUDA_ATTN_Q8", true);
    return on;
}

NormQ8 CudaBackend::act_quant_begin(const void *key, const Act &out, bool can) {
    norm_quant_.src = nullptr;
    last_norm_w_ = key, last_norm_out_ = out.data, norm_want_open_ = true;
    if (!can || !norm_q_ || !fusion_enabled() || !norm_q8_enabled() || !attn_q8_enabled() ||
        out.rows > k_mmv_max_rows || out.rows * out.cols > k_norm_quant_values || out.cols % 32 != 0)
        return {};
    const auto it = norm_wants_.find(key);
    if (it == norm_wants_.end() || !same_q8_bytes(it->second, DType::Q8_0)) return {};
    return NormQ8{norm_q_, norm_ds_, 1};
}

void CudaBackend::norm_quant_made(const NormQ8 &q, const Act &out) {
    if (!q.form) return;
    NormQuant n{out.data, out.rows, out.cols, out.stride, q.form == 2 ? DType::Q8_K : DType::Q8_0};
    const auto *p = reinterpret_cast<const uint8_t *>(out.data);
    for (size_t c = 0; c < chunks_.size(); c++)
        if (p >= chunks_[c].ptr && p < chunks_[c].ptr + chunks_[c].size) n.chunk = c, n.off = size_t(p - chunks_[c].ptr);
    norm_quant_ = n;
}

bool CudaBackend::norm_quant_take(const float *src, int64_t rows, int64_t k, int64_t stride, DType vt,
                                  const int8_t *&q, const float2 *&ds) {
    if (src == last_norm_out_ && norm_want_open_) {
        norm_wants_[last_norm_w_] = vt;  // what the next norm with this weight should make
        norm_want_open_ = false;
    }
    const NormQuant &n = norm_quant_;
    if (!n.src || n.src != src || n.rows != rows || n.k != k || n.stride != stride || !same_q8_bytes(n.vt, vt))
        return false;
    q = norm_q_, ds = norm_ds_;
    return true;
}

void CudaBackend::wrote(const Act &a) {
    if (a.rows == 0) return;
    // the spans from a view's first float to its last (as wide as the rows between are, conservatively)
    auto overlaps = [&](const float *p, int64_t rows, int64_t cols, int64_t stride) {
        const float *a_end = a.data + (a.rows - 1) * a.stride + a.cols, *p_end = p + (rows - 1) * stride + cols;
        return a.data < p_end && p < a_end;
    };
    const KvStored &st = kv_stored_;
    if (st.il >= 0 && (overlaps(st.k.data, st.k.rows, st.k.cols, st.k.stride) ||
                       overlaps(st.v.data, st.v.rows, st.v.cols, st.v.stride)))
        kv_stored_ = {};
    const NormQuant &n = norm_quant_;
    if (n.src && overlaps(n.src, n.rows, n.k, n.stride)) norm_quant_.src = nullptr;
    // the latest producer's output changed before a matmul quantized it (a gate on the attention's output): what
    // that matmul quantizes is not what the producer wrote, so it learns no form from it
    if (a.data == last_norm_out_) norm_want_open_ = false;
}

void CudaBackend::quantize(PreparedAct &x, DType vt) {
    if (x.q8 && x.q8_type == vt) return;
    if (norm_quant_take(x.src, x.rows, x.k, x.stride, vt, x.q8, x.q8_ds)) {
        x.q8_type = vt;
        return;
    }
    int8_t *q = scratch_array<int8_t>(x.rows * x.k);
    float2 *ds = scratch_array<float2>(x.rows * (x.k / 32));
    launch_quantize_act(vt, x.src, x.stride, x.rows, x.k, q, ds, stream_);
    x.q8 = q;
    x.q8_ds = ds;
    x.q8_type = vt;
}

void CudaBackend::grouped_matmul(const WeightShape &w, const std::vector<MatmulGroup> &groups, PreparedAct &x, Rows y) {
    STRATA_ASSERT(x.k == w.k && y.cols == w.n);
    const DType vt = dot_act_type(w.type);
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
        quantize(x, vt);
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
            // a decoding token's rows (the attention output, the LM head) take the one-row form
            const bool one_row =
                std::all_of(small.begin(), small.end(), [](const MatmulGroup &g) { return g.n_rows == 1; });
            launch_mmvq(a, stream_, one_row);
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

// Products whose matrices share a quantized type (and so the bytes of a row) go out as one launch of up to
// k_matmul_max_parts matrices, in the order given: at decode sizes the mat-vec kernel's, for a prompt (more rows;
// STRATA_CUDA_MMQ_PARTS=0: separate launches) the tensor-core kernel's. done[i] is set for every product launched here; a product with
// no partner is left to the plain path.
void CudaBackend::matmul_parts(const std::vector<MatmulOut> &outs, PreparedAct &x, std::vector<bool> &done) {
    const bool prompt = x.rows > k_mmv_max_rows;
    auto takes = [&](const Weight &w) {
        const DType vt = dot_act_type(w.type);
        return (prompt ? mmq_enabled() && mmq_supported(w.type) : mmvq_supported(w.type)) && vt != DType::F32 &&
               w.ne[0] % 32 == 0 && w.ne[0] % dtype_info(vt).block_size == 0;
    };
    for (size_t i = 0; i < outs.size(); i++) {
        if (done[i] || !takes(*outs[i].w)) continue;
        const Weight &w0 = *outs[i].w;
        std::vector<size_t> same{i};
        for (size_t j = i + 1; j < outs.size() && same.size() < size_t(k_matmul_max_parts); j++)
            if (!done[j] && outs[j].w->type == w0.type && outs[j].w->row_bytes == w0.row_bytes) same.push_back(j);
        if (same.size() < 2) continue;
        MatmulPart parts[k_matmul_max_parts];
        for (size_t p = 0; p < same.size(); p++) {
            const MatmulOut &o = outs[same[p]];
            STRATA_ASSERT(o.w->ne[0] == x.k && o.out.cols == o.w->ne[1] && o.out.rows == x.rows);
            parts[p] = MatmulPart{dev_matrix(*o.w), o.w->ne[1], o.out.data, o.out.stride};
            done[same[p]] = true;
        }
        quantize(x, dot_act_type(w0.type));
        MatmulArgs a;
        a.type = w0.type;
        a.k = w0.ne[0];
        a.row_bytes = w0.row_bytes;
        a.xq = x.q8;
        a.xds = x.q8_ds;
        a.single = MatmulGroup{nullptr, 0, int32_t(x.rows), 0};
        if (prompt)
            launch_mmq_parts(a, parts, int(same.size()), stream_);
        else
            launch_mmvq_parts(a, parts, int(same.size()), stream_);
    }
}

// The input is quantized (or rounded) once per activation format and shared by every product that reads it; at
// decode sizes products of one mat-vec type share a launch as well.
void CudaBackend::matmuls(Act x, const std::vector<MatmulOut> &outs) {
    for (const MatmulOut &o : outs) wrote(o.out);
    STRATA_CUDA_OP("matmul");
    if (x.rows == 0) return;
    const Mark m = mark();
    PreparedAct pa;
    pa.src = x.data;
    pa.rows = x.rows;
    pa.k = x.cols;
    pa.stride = x.stride;
    std::vector<bool> done(outs.size(), false);
    const bool parts = x.rows <= k_mmv_max_rows ? mmvq_enabled() : mmq_parts_enabled();
    if (fusion_enabled() && parts && outs.size() > 1) matmul_parts(outs, pa, done);
    for (size_t i = 0; i < outs.size(); i++) {
        if (done[i]) continue;
        const MatmulOut &o = outs[i];
        if (!fusion_enabled()) pa = PreparedAct{x.data, x.rows, x.cols, x.stride};  // each product its own
        const Weight &w = *o.w;
        STRATA_ASSERT(x.cols == w.ne[0] && o.out.cols == w.ne[1] && o.out.rows == x.rows);
        const std::string name(w.name);
        const WeightShape ws{w.type, w.ne[0], w.ne[1], w.row_bytes, name.c_str()};
        grouped_matmul(ws, {MatmulGroup{dev_matrix(w), 0, int32_t(x.rows), 0}}, pa, rows_of(o.out));
    }
    release(m);
}

// ---- MoE steps ----

void CudaBackend::route_topk(Act logits, const MoeParams &p, int32_t *ids, float *weights) {
    routed_pairs_.il = -1;
    launch_router_topk(rows_of(logits), p.n_expert_used, p.norm_weights, p.weights_scale, ids, weights, stream_);
}

// Benchmark routing drawn on the device (moe.cu), its pass count in device memory.
void CudaBackend::route_draws(Act logits, const MoeParams &p, const RouteDraws &d, int64_t il, bool new_pass,
                              int32_t *ids, Act weights) {
    STRATA_CUDA_OP("route_draws");
    routed_pairs_.il = -1;  // ids rewritten: tables made from the router's choice no longer hold
    wrote(weights);
    STRATA_ASSERT(draw_pass_dev_ && logits.cols == p.n_expert &&
                  weights.rows * weights.cols == logits.rows * p.n_expert_used);
    const double *cdf = nullptr;
    const int32_t *perm = nullptr;
    if (d.kind == RouteDraws::Zipf) {
        const auto key = std::make_tuple(p.n_expert, d.skew, d.seed, il);
        auto it = zipf_dev_.find(key);
        if (it == zipf_dev_.end()) {  // made by a pass that is not recorded (reset_draws: every size runs once first)
            STRATA_ASSERT(!capturing_);
            const ZipfTable &z = zipf_table(p.n_expert, d.skew, d.seed, il);
            auto *c = static_cast<double *>(dev_alloc(z.cdf.size() * sizeof(double), "routing draws"));
            auto *r = static_cast<int32_t *>(dev_alloc(z.expert_of_rank.size() * sizeof(int32_t), "routing draws"));
            STRATA_CUDA_CHECK(
                cudaMemcpyAsync(c, z.cdf.data(), z.cdf.size() * sizeof(double), cudaMemcpyHostToDevice, stream_));
            STRATA_CUDA_CHECK(cudaMemcpyAsync(r, z.expert_of_rank.data(), z.expert_of_rank.size() * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream_));
            it = zipf_dev_.emplace(key, std::make_pair(c, r)).first;
        }
        cdf = it->second.first;
        perm = it->second.second;
    }
    launch_route_draws(rows_of(logits), p.n_expert_used, p.norm_weights, p.weights_scale, d.seed, il, draw_pass_dev_,
                       new_pass, cdf, perm, ids, weights.data, stream_);
}

// Passes count from here, and every pass size runs once without a recording first (a recording made before would
// route as the router does; a Zipf table is made outside any recording).
void CudaBackend::reset_draws() {
    use_device();
    STRATA_ASSERT(!capturing_);
    if (!draw_pass_dev_) draw_pass_dev_ = static_cast<int64_t *>(dev_alloc(sizeof(int64_t), "routing draws"));
    STRATA_CUDA_CHECK(cudaMemsetAsync(draw_pass_dev_, 0xff, sizeof(int64_t), stream_));  // -1
    graph_gen_++;
    graph_warm_.clear();
}

// At decode sizes the router's mat-vec and the top-k are one launch (moe.cu), each logit and each pick computed as
// the two launches compute them.
void CudaBackend::route(const Weight &router, Act x, const MoeParams &p, Act logits, int32_t *ids, float *weights) {
    routed_pairs_.il = -1;
    route_launch(router, x, p, logits, ids, weights, RouterPairs{});
}

bool CudaBackend::route_launch(const Weight &router, Act x, const MoeParams &p, Act logits, int32_t *ids,
                               float *weights, const RouterPairs &pairs, const RouterNorm *rn) {
    STRATA_ASSERT(x.cols == router.ne[0] && logits.cols == router.ne[1] && logits.rows == x.rows);
    STRATA_ASSERT(!rn || (fusion_enabled() && router_fused_supported(router.type, router.ne[1], router.ne[0], x.rows)));
    wrote(logits);
    if (!fusion_enabled() || !router_fused_supported(router.type, router.ne[1], router.ne[0], x.rows)) {
        Backend::route(router, x, p, logits, ids, weights);
        return false;
    }
    STRATA_CUDA_OP("router");
    STRATA_ASSERT(route_done_);  // made with the plan's memory
    MatmulArgs a;
    a.type = router.type;
    a.k = router.ne[0];
    a.n = router.ne[1];
    a.row_bytes = router.row_bytes;
    a.x = x.data;
    a.x_stride = x.stride;
    a.y = logits.data;
    a.y_stride = logits.stride;
    a.single = MatmulGroup{dev_matrix(router), 0, int32_t(x.rows), 0};
    if (rn)
        launch_router_norm(a, p.n_expert_used, p.norm_weights, p.weights_scale, ids, weights, route_done_, stream_,
                           pairs, *rn);
    else
        launch_router_fused(a, p.n_expert_used, p.norm_weights, p.weights_scale, ids, weights, route_done_, stream_,
                            pairs);
    return true;
}

namespace {
// STRATA_CUDA_ROUTER_NORM=1: a decoding MoE layer's residual step (the add and the norm before the router) done by
// the router's launch (opt-in; the same bits, 0.99x the 30B's resident tg128 on an H100).
bool router_norm_enabled() {
    static const bool on = env_switch("STRATA_CUDA_ROUTER_NORM", false);
    return on;
}
}  // namespace

void CudaBackend::add_rms_norm_route(Act resid, Act y, const Weight &norm_w, float eps, Act normed,
                                     const Weight &router, const ExpertWeights &w, const MoeParams &p, Act logits,
                                     int32_t *ids, float *weights) {
    const float *wd = dev_vector(norm_w);
    MatmulArgs a;
    a.type = router.type;
    a.k = router.ne[0];
    a.n = router.ne[1];
    a.single = MatmulGroup{nullptr, 0, int32_t(normed.rows), 0};
    RouterNorm rn{rows_of(resid), rows_of(y), rows_of(normed), wd, eps, {}};
    static const bool pairs_on = env_switch("STRATA_CUDA_ROUTER_PAIRS", true);
    const bool pairs = pairs_on && !maps_host_experts(w) && device_routing_applies(w, normed.rows);
    if (!router_norm_enabled() || !fusion_enabled() || !pairs || norm_w.ne[0] != resid.cols || y.rows != resid.rows ||
        normed.rows != resid.rows || !router_norm_supported(a, rn)) {
        add_rms_norm(resid, y, norm_w, eps, normed);
        route_for_device(router, w, normed, p, logits, ids, weights);
        return;
    }
    wrote(resid), wrote(normed);
    rn.q8 = norm_quant_begin(wd, resid, normed, norm_quantizes(rows_of(y), rows_of(y), norm_w.ne[0], wd, 1));
    routed_pairs_.il = -1;
    const int64_t M = normed.rows * p.n_expert_used;
    RoutedPairs rp{w.il,
                   normed.rows,
                   p.n_expert_used,
                   ids,
                   scratch_array<MatmulGroup>(3 * M),
                   scratch_array<int32_t>(M),
                   scratch_array<int32_t>(M)};
    if (route_launch(router, normed, p, logits, ids, weights,
                     RouterPairs{expert_tables_[size_t(w.il)], rp.groups, rp.yrow, rp.widx}, &rn))
        routed_pairs_ = rp;
    norm_quant_made(rn.q8, normed);
}

// The one-launch router also makes the layer's pair groups where experts_device_routed will read every expert from
// a fixed table (all resident, not mapped: a mapped table is brought up to date by that call first).
// STRATA_CUDA_ROUTER_PAIRS=0: the groups by their own launch (A/B; the same tables).
void CudaBackend::route_for_device(const Weight &router, const ExpertWeights &w, Act x, const MoeParams &p, Act logits,
                                   int32_t *ids, float *weights) {
    static const bool on = env_switch("STRATA_CUDA_ROUTER_PAIRS", true);
    routed_pairs_.il = -1;
    if (!on || maps_host_experts(w) || !device_routing_applies(w, x.rows)) {
        route_launch(router, x, p, logits, ids, weights, RouterPairs{});
        return;
    }
    const int64_t M = x.rows * p.n_expert_used;
    RoutedPairs rp{w.il, x.rows, p.n_expert_used, ids, scratch_array<MatmulGroup>(3 * M), scratch_array<int32_t>(M),
                   scratch_array<int32_t>(M)};
    if (route_launch(router, x, p, logits, ids, weights,
                     RouterPairs{expert_tables_[size_t(w.il)], rp.groups, rp.yrow, rp.widx}))
        routed_pairs_ = rp;
}

void CudaBackend::download_i32(const int32_t *src, int64_t n, int32_t *host) {
    use_device();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host, src, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

const int32_t *CudaBackend::ids_after_pass(int64_t key, const int32_t *src, int64_t n) {
    use_device();
    if (key < 0 || n <= 0) return nullptr;
    if (!ids_pinned_) {
        if (ids_keys_ < 0 || capturing_ || expert_tables_.empty()) return nullptr;  // < 0: pinning failed once
        // every MoE layer's ids of a pass the size the device routes (k_mmv_max_rows tokens, up to 16 experts each)
        ids_keys_ = int64_t(expert_tables_.size());
        ids_cap_ = int64_t(k_mmv_max_rows) * 16;
        const cudaError_t err =
            cudaMallocHost(reinterpret_cast<void **>(&ids_pinned_), size_t(ids_keys_ * ids_cap_) * sizeof(int32_t));
        if (err != cudaSuccess) {  // the admission it serves is an optimisation: go on without it
            cudaGetLastError();
            ids_pinned_ = nullptr;
            ids_keys_ = ids_cap_ = -1;
            return nullptr;
        }
    }
    if (key >= ids_keys_ || n > ids_cap_) return nullptr;
    int32_t *dst = ids_pinned_ + key * ids_cap_;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    ids_pending_ = true;
    return dst;
}

void CudaBackend::ids_ready() {
    use_device();
    if (!ids_pending_ || capturing_) return;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // most passes ended with a download that waited already
    ids_pending_ = false;
}

void CudaBackend::download_many(std::initializer_list<ActDownload> acts, const int32_t *ids, int64_t n,
                                int32_t *ids_host) {
    use_device();
    if (capturing_) {  // a recorded pass defers its downloads (download()); ids it cannot read at all
        Backend::download_many(acts, ids, n, ids_host);
        return;
    }
    for (const ActDownload &a : acts)
        if (a.src.rows)
            STRATA_CUDA_CHECK(cudaMemcpy2DAsync(a.host, size_t(a.src.cols) * 4, a.src.data, size_t(a.src.stride) * 4,
                                                size_t(a.src.cols) * 4, size_t(a.src.rows), cudaMemcpyDeviceToHost,
                                                stream_));
    if (ids && n)
        STRATA_CUDA_CHECK(
            cudaMemcpyAsync(ids_host, ids, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Uploads go through the pinned staging buffer, so the host may reuse its bytes at once and nobody waits for the
// device (a synchronous copy from pageable memory cost a round trip of ~13 us on the H200 machine, three a layer
// when a benchmark's routing override sends ids and weights up).
void CudaBackend::upload(const float *host, Act dst) {
    use_device();
    wrote(dst);
    upload_rows(host, dst);
}

void CudaBackend::upload_i32(const int32_t *host, int64_t n, int32_t *dst) {
    use_device();
    if (n == 0) return;
    if (capturing_) fail("internal: an upload inside a recorded pass");
    const uint8_t *h = stage(host, size_t(n) * sizeof(int32_t));
    copy_up(dst, size_t(n) * sizeof(int32_t), h, size_t(n) * sizeof(int32_t), 1);
}

// Where gate and up read one int8 activation form through the quantized kernels at every group size, the pass's
// rows are quantized once (launch_quantize_act: row by row, so a gathered row gets the bits its token's row gets)
// and the int8 rows gathered, instead of gathering k float rows per token and quantizing them again in each
// expert_ffn. xs is left unwritten: every kernel expert_ffn runs on it reads the int8 form.
bool CudaBackend::expert_input_int8(DType t) const {
    return q8_gather_ && mmvq_enabled() && mmq_enabled() && mmvq_supported(t) && mmq_supported(t) &&
           dot_act_type(t) != DType::F32;
}

Act CudaBackend::gather_expert_input(const ExpertWeights &w, Act x, const std::vector<int64_t> &rows) {
    expert_input_ = {};
    const int64_t E = x.cols, M = int64_t(rows.size());
    const DType vt = dot_act_type(w.gate->type);
    const bool q8 = vt != DType::F32 && E % 32 == 0 && E % dtype_info(vt).block_size == 0 &&
                    expert_input_int8(w.gate->type) && expert_input_int8(w.up->type) &&
                    dot_act_type(w.up->type) == vt && M > 0;
    if (!q8) {
        Act xs = alloc(M, E);
        gather_rows(x, rows, xs);
        return xs;
    }
    STRATA_CUDA_OP("gather_rows");
    std::vector<int32_t> r32(rows.size());
    for (size_t i = 0; i < rows.size(); i++) {
        STRATA_ASSERT(rows[i] >= 0 && rows[i] < x.rows);
        r32[i] = int32_t(rows[i]);
    }
    int8_t *xq = scratch_array<int8_t>(x.rows * E);
    float2 *xds = scratch_array<float2>(x.rows * (E / 32));
    launch_quantize_act(vt, x.data, x.stride, x.rows, E, xq, xds, stream_);
    int8_t *q = scratch_array<int8_t>(M * E);
    float2 *ds = scratch_array<float2>(M * (E / 32));
    launch_gather_q8(xq, xds, E, static_cast<const int32_t *>(upload(r32.data(), r32.size() * 4)), M, q, ds, stream_);
    // No float rows: the Act names the int8 rows (its data their start; E bytes a row are E / 4 floats), and
    // expert_ffn reads only those.
    const Act xs{reinterpret_cast<float *>(q), M, E, E / 4};
    expert_input_ = {xs.data, w.il, M, E, vt, q, ds};
    return xs;
}

// Each expert's rows as one group, through the mat-vec kernel when it has at most k_mmv_max_rows of them: gate and
// up over the groups' rows (the input quantized once for both), silu(gate) * up, down into the groups' rows of ys.
// Only the rows the groups cover are prepared, and activations are quantized row by row, so a call over a set of the
// groups computes each row exactly as a call over all of them.
void CudaBackend::expert_ffn(const ExpertWeights &w, Act xs, const std::vector<ExpertGroup> &groups, Act ys) {
    wrote(ys);
    if (groups.empty()) return;
    wait_slot_fills(groups);
    const int64_t E = xs.cols, n_ff = w.gate->ne[1];
    STRATA_ASSERT(E == w.gate->ne[0] && ys.cols == w.down->ne[1] && xs.rows == ys.rows);
    int32_t r0 = groups.front().row0, r1 = r0;
    for (const ExpertGroup &g : groups) {
        STRATA_ASSERT(g.row0 >= 0 && g.row0 + g.n_rows <= xs.rows);
        r0 = std::min(r0, g.row0);
        r1 = std::max(r1, g.row0 + g.n_rows);
    }
    const Mark m = mark();
    const int64_t R = r1 - r0;
    // gate rows 0..R-1 and up rows R..2R-1 of one buffer: where gate and up share a type, one grouped launch
    // computes both (each row by the kernel two launches would give it, so the same bits; expert_fuse_ off: two).
    Act gu = alloc(2 * R, n_ff);
    Act g = gu.rows_view(0, R), u = gu.rows_view(R, R);
    PreparedAct px;
    px.rows = r1 - r0;
    px.k = E;
    const ExpertInput &in = expert_input_;
    if (in.xs && in.xs == xs.data && in.il == w.il && in.rows == xs.rows && in.k == E) {
        // the rows gather_expert_input kept quantized (its conditions make every gate and up kernel read them;
        // there are no float rows)
        px.q8_type = in.type;
        px.q8 = in.q8 + r0 * E;
        px.q8_ds = in.ds + r0 * (E / 32);
    } else {
        const Act xv = xs.rows_view(r0, r1 - r0);
        px.src = xv.data;
        px.stride = xv.stride;
    }
    const std::string gname(w.gate->name), uname(w.up->name), dname(w.down->name);
    const WeightShape gw{w.gate->type, E, n_ff, w.gate->row_bytes, gname.c_str()};
    const WeightShape uw{w.up->type, E, n_ff, w.up->row_bytes, uname.c_str()};
    const WeightShape dw{w.down->type, n_ff, E, w.down->row_bytes, dname.c_str()};
    const bool fuse = expert_fuse_ && fusion_enabled();
    // (one group alone keeps its two launches: a single group's matmul takes the wide single-group form)
    const bool gate_up_one =
        fuse && groups.size() > 1 && w.gate->type == w.up->type && w.gate->row_bytes == w.up->row_bytes;
    std::vector<MatmulGroup> gg, ug, dg;
    for (const ExpertGroup &e : groups) {
        const int32_t f = e.row0 - r0, c = e.n_rows;
        gg.push_back({e.src.gate, f, c, f});
        ug.push_back({e.src.up, f, c, gate_up_one ? f + int32_t(R) : f});
        dg.push_back({e.src.down, f, c, e.row0});
    }
    if (gate_up_one) {
        gg.insert(gg.end(), ug.begin(), ug.end());
        grouped_matmul(gw, gg, px, rows_of(gu));
    } else {
        grouped_matmul(gw, gg, px, rows_of(g));
        grouped_matmul(uw, ug, px, rows_of(u));
    }
    PreparedAct pg;
    pg.src = g.data;
    pg.rows = g.rows;
    pg.k = n_ff;
    pg.stride = g.stride;
    // silu(gate) * up made while quantizing for the down matrices, where every kernel of the down product reads the
    // 8-bit rows (none the floats, which keep the gate's values); otherwise its own launch.
    const DType dvt = dot_act_type(w.down->type);
    if (fuse && dvt != DType::F32 && n_ff % 32 == 0 && n_ff % dtype_info(dvt).block_size == 0 && mmvq_enabled() &&
        mmq_enabled() && mmvq_supported(w.down->type) && mmq_supported(w.down->type)) {
        int8_t *q = scratch_array<int8_t>(R * n_ff);
        float2 *ds = scratch_array<float2>(R * (n_ff / 32));
        launch_quantize_act(dvt, g.data, g.stride, R, n_ff, q, ds, stream_, u.data, u.stride);
        pg.q8 = q, pg.q8_ds = ds, pg.q8_type = dvt;
    } else {
        launch_silu_mul(rows_of(g), rows_of(u), stream_);
    }
    grouped_matmul(dw, dg, pg, rows_of(ys));
    note_slots_read(groups);
    release(m);
}

// expert_ffn runs an expert's rows as one group, through the mat-vec kernel when it has at most k_mmv_max_rows of
// them. With at most that many tokens every expert has, so there every pair (token, expert) can be its own one-row
// group of the same kernel: the same function of the same rows, hence the same bits, with the groups made on the
// device from the routing and no synchronisation with the host.
bool CudaBackend::device_routing_kernels(const ExpertWeights &w) const {
    return device_routing_enabled() && mat_vec_takes(w);
}

// Every matrix of the expert goes through k_mmvq at decode sizes (an int8 activation form its rows divide into).
bool CudaBackend::mat_vec_takes(const ExpertWeights &w) const {
    if (!mmvq_enabled()) return false;
    for (const Weight *m : {w.gate, w.up, w.down})
        if (!mmvq_supported(m->type) || m->ne[0] % 32 != 0 || dot_act_type(m->type) == DType::F32 ||
            m->ne[0] % dtype_info(dot_act_type(m->type)).block_size != 0)
            return false;
    return true;
}

// The host-grouped expert_ffn runs a group of at most k_mmv_max_rows rows through k_mmvq (activations quantized
// by launch_quantize_act, silu(gate) * up by launch_silu_mul and quantized again for down): each row the function
// mmvq_host.h reproduces, where every matrix has a type it knows.
bool CudaBackend::host_computes_like(const ExpertWeights &w, int64_t n_rows) const {
    if (n_rows < 1 || n_rows > k_mmv_max_rows || !mat_vec_takes(w)) return false;
    for (const Weight *m : {w.gate, w.up, w.down})
        if (!mmvq_host_supported(m->type)) return false;
    return true;
}

bool CudaBackend::device_routing_applies(const ExpertWeights &w, int64_t n_tokens) const {
    if (n_tokens > k_mmv_max_rows) return false;
    if (size_t(w.il) >= expert_tables_.size() || !expert_tables_[size_t(w.il)]) return false;
    return device_routing_kernels(w);
}

void CudaBackend::experts_device_routed(const ExpertWeights &w, Act x, int64_t k, const int32_t *ids_dev,
                                        const float *wts_dev, Act out, const MoeTail &tail) {
    STRATA_CUDA_OP("experts_device_routed");
    wrote(out);
    STRATA_ASSERT(device_routing_applies(w, x.rows));
    const bool mapped = maps_host_experts(w);
    if (mapped) flush_mapped(w.il);
    wait_for_fills();
    const int64_t T = x.rows, E = x.cols, n_ff = w.gate->ne[1], M = T * k;
    const RoutedPairs rp = routed_pairs_;
    routed_pairs_.il = -1;
    MatmulGroup *groups;
    int32_t *yrow, *widx;
    if (rp.il == w.il && rp.ids == ids_dev && rp.n_tokens == T && rp.k == k && !mapped) {
        groups = rp.groups, yrow = rp.yrow, widx = rp.widx;  // made by the router's launch
    } else {
        groups = scratch_array<MatmulGroup>(3 * M);
        yrow = scratch_array<int32_t>(M), widx = scratch_array<int32_t>(M);
        const uint8_t *const *table = expert_tables_[size_t(w.il)];
        // a mapped table's byte per expert (1: from the host copy) follows its pointers; each pair is counted
        const uint8_t *from_host = mapped ? reinterpret_cast<const uint8_t *>(table + 3 * w.gate->ne[2]) : nullptr;
        launch_moe_pair_groups(ids_dev, T, k, table, groups, groups + M, groups + 2 * M, yrow, widx, from_host,
                               mapped ? mapped_counts_ + 2 * w.il : nullptr, stream_);
    }
    // gate rows 0..M-1 and up rows M..2M-1 of one buffer: the pair groups address both from its start, so where gate
    // and up share a type one launch computes both.
    Act gu = alloc(2 * M, n_ff), ys = alloc(M, E);
    Act g = gu.rows_view(0, M), u = gu.rows_view(M, M);
    // Activations quantized once per activation format (gate and up usually share it).
    // early: the groups were made two launches or more before this one (MatmulArgs::groups_early): the down
    // matrices', after gate and up and the quantization between.
    auto run = [&](const Weight &mw, const MatmulGroup *gs, int64_t n_groups, const Act &src, Act y, const int8_t *&q,
                   const float2 *&ds, DType &qt, const Act *silu_mul_by = nullptr, bool early = false) {
        const DType vt = dot_act_type(mw.type);
        if ((!q || qt != vt) && !silu_mul_by &&
            norm_quant_take(src.data, src.rows, src.cols, src.stride, vt, q, ds)) {
            qt = vt;
        } else if (!q || qt != vt) {
            int8_t *qq = scratch_array<int8_t>(src.rows * src.cols);
            float2 *dd = scratch_array<float2>(src.rows * (src.cols / 32));
            launch_quantize_act(vt, src.data, src.stride, src.rows, src.cols, qq, dd, stream_,
                                silu_mul_by ? silu_mul_by->data : nullptr, silu_mul_by ? silu_mul_by->stride : 0);
            q = qq, ds = dd, qt = vt;
        }
        MatmulArgs a;
        a.type = mw.type;
        a.k = mw.ne[0];
        a.n = mw.ne[1];
        a.row_bytes = mw.row_bytes;
        a.xq = q;
        a.xds = ds;
        a.y = y.data;
        a.y_stride = y.stride;
        a.groups = gs;
        a.n_groups = int32_t(n_groups);
        a.groups_early = early;
        launch_mmvq(a, stream_, true);  // a group per pair: one row each
    };
    const int8_t *xq = nullptr, *gq = nullptr;
    const float2 *xds = nullptr, *gds = nullptr;
    DType xt = DType::F32, gt = DType::F32;
    if (fusion_enabled() && w.gate->type == w.up->type && w.gate->row_bytes == w.up->row_bytes) {
        run(*w.gate, groups, 2 * M, x, gu, xq, xds, xt);
    } else {
        run(*w.gate, groups, M, x, gu, xq, xds, xt);
        run(*w.up, groups + M, M, x, gu, xq, xds, xt);
    }
    // silu(gate) * up made while quantizing for the down matrices (no launch of its own)
    if (fusion_enabled()) {
        run(*w.down, groups + 2 * M, M, g, ys, gq, gds, gt, &u, true);
    } else {
        launch_silu_mul(rows_of(g), rows_of(u), stream_);
        run(*w.down, groups + 2 * M, M, g, ys, gq, gds, gt, nullptr, true);
    }
    // The combination and the tail (the shared expert's rows, the residual step) in one launch where the shapes
    // allow (STRATA_CUDA_MOE_TAIL=0: separate launches; the same bits).
    const bool norm = tail.then.w != nullptr;
    const float *norm_w = norm ? dev_vector(*tail.then.w) : nullptr;
    const bool fused = fusion_enabled() && moe_tail_enabled() && T <= 65535 && k <= k_moe_tail_max_k &&
                       moe_tail_fuses(rows_of(out), out.cols) && moe_tail_fuses(rows_of(ys), out.cols) &&
                       (!tail.shared_gate || moe_tail_fuses(rows_of(tail.shared_y), out.cols)) &&
                       (!norm || (tail.then.w->ne[0] == out.cols && (reinterpret_cast<uintptr_t>(norm_w) & 15) == 0 &&
                                  moe_tail_fuses(rows_of(tail.then.resid), out.cols) &&
                                  moe_tail_fuses(rows_of(tail.then.normed), out.cols)));
    if (fused) {
        wrote(out);
        if (norm) wrote(tail.then.resid);
        const NormQ8 q8 = norm ? norm_quant_begin(norm_w, tail.then.resid, tail.then.normed, true) : NormQ8{};
        // early: the launch just before is the down matrices' mat-vec, which writes ys only; the pairs' tables and
        // weights were made before gate and up, the residual row before the routing
        launch_moe_tail(rows_of(ys), yrow, widx, wts_dev, k, rows_of(x),
                        tail.shared_gate ? dev_vector(*tail.shared_gate) : nullptr, rows_of(tail.shared_y),
                        rows_of(out), rows_of(tail.then.resid), norm_w, tail.then.eps, rows_of(tail.then.normed),
                        stream_, q8, early_reads_enabled(), tail_ahead_enabled() && T <= k_mmv_max_rows);
        norm_quant_made(q8, tail.then.normed);
    } else {
        launch_moe_combine(rows_of(ys), yrow, widx, wts_dev, k, rows_of(out), stream_);
        moe_tail(x, out, tail);
    }
    if (mapped && !capturing_) {
        // a later fill into any slot waits for this pass's reads (a recorded pass is waited for when it runs)
        const uint64_t n = ++ffn_seq_;
        STRATA_CUDA_CHECK(cudaEventRecord(read_done_[n % k_read_events], stream_));
        device_read_seq_ = n;
    }
}

void CudaBackend::moe_combine(Act ys, const std::vector<int32_t> &yrow, const std::vector<int32_t> &widx,
                              const float *weights, int64_t k, Act out) {
    STRATA_ASSERT(int64_t(yrow.size()) == out.rows * k && widx.size() == yrow.size() && ys.cols == out.cols);
    wrote(out);
    launch_moe_combine(rows_of(ys), upload_vec(yrow), upload_vec(widx), weights, k, rows_of(out), stream_);
}

void CudaBackend::silu_mul(Act g, Act u) {
    wrote(g);
    STRATA_ASSERT(g.rows == u.rows && g.cols == u.cols);
    launch_silu_mul(rows_of(g), rows_of(u), stream_);
}

void CudaBackend::shared_expert_add(Act x, const Weight &gate, Act y, Act out) {
    wrote(out);
    STRATA_ASSERT(y.rows == x.rows && out.rows == x.rows && y.cols == out.cols && gate.ne[0] == x.cols);
    launch_shared_expert_add(rows_of(x), dev_vector(gate), rows_of(y), rows_of(out), stream_);
}

}  // namespace strata::cuda
