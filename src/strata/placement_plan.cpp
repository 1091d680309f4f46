// The placement plan (placement_plan.h): sizes of every stratum under a budget, the expert-slot count, the host
// tier, and the check line.
#include "strata/placement_plan.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"
#include "core/units.h"
#include "model/forward.h"

namespace strata {

namespace {

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

uint64_t scratch_estimate(const HParams &hp, int64_t chunk_tokens) {
    const uint64_t align = 256;
    const uint64_t T = uint64_t(std::max<int64_t>(chunk_tokens, 1)), E = uint64_t(hp.n_embd);
    const uint64_t q_cols = uint64_t(hp.n_head * hp.head_dim_k), kv = uint64_t(hp.n_head_kv * hp.head_dim_k);
    const uint64_t attn = T * (q_cols * (hp.attn_output_gate ? 4 : 2) + 2 * kv + E);
    const uint64_t conv = uint64_t(hp.gdn_conv_dim()), d_inner = uint64_t(hp.ssm_d_inner),
                   n_v = uint64_t(hp.ssm_dt_rank);
    const uint64_t gdn = T * (conv + 2 * d_inner + 2 * n_v + E);
    // A pass keeps one layer's temporaries at a time (the forward pass releases them per layer).
    uint64_t layers = 0;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const uint64_t mix = hp.is_recurrent(il) ? gdn : attn;
        layers = std::max(layers, (mix + 2 * T * E) * 4 + 16 * align);
    }
    const uint64_t M = T * uint64_t(hp.n_expert_used), F = uint64_t(std::max(hp.n_ff_exp, hp.n_ff_shexp));
    const uint64_t K = std::max({E, F, q_cols, d_inner});
    const uint64_t moe_tmp =
        4 * (T * uint64_t(hp.n_expert) + 2 * M + M * (3 * E + 4 * F) + T * (3 * F + E)) + M * (E + F) * 2 + 5 * M * K;
    // the delta rule's workspace: 16 chunks of 64 tokens of prepared matrices per v-head (gdn_parallel.cu)
    const uint64_t d_v = n_v ? d_inner / n_v : 0;
    const uint64_t gdn_tmp = 4 * (T * (conv + 2 * n_v) + conv * uint64_t(hp.ssm_conv_kernel) +
                                  n_v * 16 * (64 * (3 * uint64_t(hp.ssm_d_state) + 2 * d_v) + 1));
    const uint64_t mm_tmp = 5 * T * K;
    const uint64_t out_rows = std::min<uint64_t>(T, uint64_t(k_logit_slice_rows));
    const uint64_t out = 4 * out_rows * (2 * E + uint64_t(hp.n_vocab)) + 5 * out_rows * E;
    const uint64_t total = 4 * T * E + layers + std::max({moe_tmp, gdn_tmp, mm_tmp}) + out;
    return total + total / 8 + (uint64_t(32) << 20);
}

// A pass's uploads through the pinned staging buffer: per MoE layer, for M = chunk x k token-expert pairs, the rows
// gathered, the combine's rows and weight indices (4 bytes a pair each) and the expert groups and tiles of the three
// matrices (counted as 4 more bytes a pair, and 64 bytes per expert and matrix); the pass tables; each upload rounded
// to 256 bytes. Between 4 MiB (what decoding and small chunks need) and 256 MiB.
uint64_t stage_estimate(const HParams &hp, int64_t chunk_tokens) {
    const uint64_t T = uint64_t(std::max<int64_t>(chunk_tokens, 1));
    const uint64_t M = T * uint64_t(std::max<int64_t>(hp.n_expert_used, 0));
    const uint64_t moe_layers = hp.n_expert_used > 0 ? uint64_t(hp.n_layer) : 0;
    const uint64_t per_layer = 16 * M + 3 * 64 * uint64_t(hp.n_expert) + 64 * 256;
    const uint64_t total = moe_layers * per_layer + T * (8 + 2 * 16) + (uint64_t(1) << 20);
    return std::clamp<uint64_t>(total, uint64_t(4) << 20, uint64_t(256) << 20);
}

Placement plan_placement(const WeightSet &ws, const HParams &hp, const CacheShape &caches, const DeviceFacts &dev,
                         const PlanOptions &opt) {
    Placement p;
    p.caches = caches;
    p.chunk_tokens = opt.chunk_tokens;
    p.download_cols = hp.n_vocab;
    if (!dev.has_device_memory) return p;
    p.device = true;
    const size_t a = std::max<size_t>(dev.align, 1);
    // The kernels over token-expert pairs launch in row slices; a pass's tokens still index one grid dimension.
    if (opt.chunk_tokens > 65535)
        fail("%s: a batch of %lld tokens is more than a pass takes (at most 65535); use a smaller batch",
             dev.name.c_str(), (long long)opt.chunk_tokens);

    // Resident weights: one arena, each byte range once (tied embeddings), each rounded up to the alignment.
    {
        std::unordered_set<const uint8_t *> seen;
        for (const Weight *w : ws.matrices)
            if (seen.insert(w->host).second) p.weight_bytes += align_up(w->matrix_bytes(), a);
        for (const Weight *w : ws.vectors)
            if (seen.insert(w->host).second) p.weight_bytes += align_up(size_t(w->ne[0] * w->ne[1]) * 4, a);
    }

    // Expert slots: one expert's gate, up and down, each matrix aligned; the largest layer sets the slot size.
    p.layouts.assign(ws.experts.size(), {});
    int64_t n_moe_layers = 0;
    for (size_t il = 0; il < ws.experts.size(); il++) {
        const ExpertWeights &e = ws.experts[il];
        if (!e.present()) continue;
        ExpertSlotLayout &L = p.layouts[il];
        L.gate_off = 0;
        L.up_off = align_up(e.gate->matrix_bytes(), a);
        L.down_off = L.up_off + align_up(e.up->matrix_bytes(), a);
        L.bytes = L.down_off + align_up(e.down->matrix_bytes(), a);
        p.slot_bytes = std::max(p.slot_bytes, L.bytes);
        p.host_expert_bytes += uint64_t(e.expert_bytes()) * uint64_t(e.gate->ne[2]);
        p.host_copy_bytes += uint64_t(L.bytes) * uint64_t(e.gate->ne[2]);
        n_moe_layers++;
    }
    p.n_experts_total = n_moe_layers * hp.n_expert;

    // The budget bounds what the process holds on the device, the runtime's context included, plus a margin for
    // what the runtime may still add. Without a budget: what is free less a reserve.
    const uint64_t runtime_total = dev.runtime_bytes + k_plan_runtime_margin;
    p.runtime_bytes = dev.runtime_bytes;
    const uint64_t reserve = std::max<uint64_t>(uint64_t(512) << 20, dev.total_bytes / 32);
    const uint64_t usable = dev.free_bytes > reserve ? dev.free_bytes - reserve : 0;
    const uint64_t given = opt.vram_budget;
    const uint64_t budget = given ? (given > runtime_total ? given - runtime_total : 0) : usable;
    if (given && budget > dev.free_bytes)
        fail("--vram-budget %s is more than %s can give (%s free besides the runtime's %s)", format_bytes(given).c_str(),
             dev.name.c_str(), format_bytes(dev.free_bytes).c_str(), format_bytes(runtime_total).c_str());

    for (size_t il = 0; il < caches.layers.size(); il++)
        p.cache_bytes += align_up(caches.first_bytes(il), a) + align_up(caches.second_bytes(il), a);
    p.scratch_bytes = align_up(opt.scratch_bytes ? opt.scratch_bytes : scratch_estimate(hp, opt.chunk_tokens), a);
    // The pass tables (rows' sequences and positions, attention tiles) and the small rest: i-quant and rope tables,
    // expert tables, rounding.
    p.pass_table_bytes = align_up(size_t(16) << 10, a) + align_up(size_t(opt.chunk_tokens) * (8 + 2 * 16), a);
    p.misc_bytes = p.pass_table_bytes + (uint64_t(4) << 20);
    p.stage_bytes = stage_estimate(hp, opt.chunk_tokens);
    const uint64_t resident = p.weight_bytes + p.cache_bytes + p.scratch_bytes + p.misc_bytes;
    const int64_t min_slots =
        p.n_experts_total ? std::min<int64_t>(p.n_experts_total, std::max<int64_t>(hp.n_expert_used, 1)) : 0;
    const uint64_t minimum = resident + uint64_t(min_slots) * p.slot_bytes;
    const std::string what = given ? std::string("--vram-budget") : "the free memory of " + dev.name;
    if (minimum > budget)
        fail(
            "%s %s is too small for this model: the resident part needs %s (weights %s, KV cache and states %s, "
            "scratch for %lld-token passes %s), the expert cache at least %lld slots of %s and the CUDA runtime %s; "
            "give at least %s",
            what.c_str(), format_bytes(given ? given : budget).c_str(),
            format_bytes(resident).c_str(), format_bytes(p.weight_bytes).c_str(), format_bytes(p.cache_bytes).c_str(),
            (long long)opt.chunk_tokens, format_bytes(p.scratch_bytes).c_str(), (long long)min_slots,
            format_bytes(p.slot_bytes).c_str(), format_bytes(runtime_total).c_str(),
            format_bytes(minimum + (given ? runtime_total : 0)).c_str());
    p.n_slots = p.slot_bytes ? int64_t(std::min<uint64_t>(uint64_t(p.n_experts_total), (budget - resident) / p.slot_bytes))
                             : 0;
    if (opt.expert_slots > 0) p.n_slots = std::min(p.n_slots, opt.expert_slots);
    p.budget_bytes = budget;
    p.budget_total_bytes = given ? given : budget + runtime_total;

    // The host stratum for the experts without a slot of their own.
    std::string host = "host 0 GiB";
    const std::string stager_note =
        strfmt(" via pinned stager %d x %s", opt.stager_buffers, format_bytes(opt.stager_buffer_bytes).c_str());
    if (p.all_resident() || p.n_experts_total == 0) {
        p.host = HostTier::none;
    } else if (opt.pin_mapping && ws.file_bytes) {
        p.host = HostTier::pinned_mapping;
        host = strfmt("host %s pinned mapping", format_bytes(p.host_expert_bytes).c_str());
    } else {
        const uint64_t need = p.host_copy_bytes + k_plan_host_headroom, avail = dev.host_available_bytes;
        if (opt.host_pinned_copy && (!avail || need <= avail)) {
            p.host = HostTier::pinned_copy;
            host = strfmt("host %s pinned copy", format_bytes(p.host_copy_bytes).c_str());
        } else {
            if (opt.require_pinned_copy)
                fail("%s: a pinned host copy of the %s of experts without a slot needs %s of host RAM (headroom "
                     "included); %s is available. Use --host-mem mmap (the mapped file) or auto",
                     dev.name.c_str(), format_bytes(p.host_expert_bytes).c_str(), format_bytes(need).c_str(),
                     format_bytes(avail).c_str());
            p.host = opt.stager ? HostTier::stager : HostTier::pageable;
            host = strfmt("host %s pageable", format_bytes(p.host_expert_bytes).c_str());
            if (opt.host_pinned_copy)
                host += strfmt(" (a pinned copy needs %s, %s available)", format_bytes(need).c_str(),
                               format_bytes(avail).c_str());
            if (opt.stager) host += stager_note;
        }
    }
    if (p.host == HostTier::stager || p.host == HostTier::pinned_mapping ||
        (p.host == HostTier::none && p.n_experts_total > 0 && opt.stager)) {
        // The mapping through the stager: for misses, where pinning the mapping fails at run time, and for filling
        // every slot at start when all experts are resident.
        p.stager_buffer_bytes = opt.stager_buffer_bytes;
        p.stager_buffers = opt.stager_buffers;
    }

    const double pct = p.n_experts_total ? 100.0 * double(p.n_slots) / double(p.n_experts_total) : 100.0;
    const std::string runtime_note = strfmt("CUDA runtime %s%s", format_bytes(dev.runtime_bytes).c_str(),
                                            dev.runtime_estimated ? " (estimated: the driver's count is not readable)"
                                                                  : "");
    p.check_line = strfmt(
        "strata: %s plan: resident %s, expert cache %lld slots (%s, %.0f%% of experts), %s, KV %s %d x %lld (%s "
        "with states), scratch %s for %lld-token chunks, %s, budget %s",
        dev.name.c_str(), format_bytes(p.weight_bytes + p.cache_bytes + p.scratch_bytes).c_str(), (long long)p.n_slots,
        format_bytes(uint64_t(p.n_slots) * p.slot_bytes).c_str(), pct, host.c_str(), kv_type_name(caches.kv_type),
        caches.n_seqs, (long long)caches.n_ctx, format_bytes(p.cache_bytes).c_str(),
        format_bytes(p.scratch_bytes).c_str(), (long long)opt.chunk_tokens, runtime_note.c_str(),
        format_bytes(p.budget_total_bytes).c_str());
    return p;
}

}  // namespace strata
