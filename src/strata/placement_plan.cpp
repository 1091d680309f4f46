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

uint64_t scratch_estimate(const HParams &hp, int64_t chunk_tokens, bool int8_rows, bool logits) {
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
    // The MoE step (strata/moe_schedule.h) holds the router's logits, ids and weights, the gathered input rows (int8
    // rows with their scales for the pass's T rows and the M gathered ones, or M float rows) and the experts'
    // output rows to the end; in between, either one expert set's temporaries (gate and up outputs of its rows, the
    // down input's int8 form or float round trip, and the gathered rows' where they are floats) or the shared
    // expert's (its gate and up outputs, output, the input's int8 form). An int8 form takes 1.25 bytes a value
    // (scales included), a form and a round trip 5.
    const uint64_t rows_in = int8_rows ? 5 * (M + T) * E / 4 + 4 * M : 4 * M * E;
    const uint64_t set_tmp = 8 * M * F + 5 * M * F + (int8_rows ? 0 : 5 * M * E);
    const uint64_t shared_tmp = 4 * T * (2 * F + E) + 5 * T * E;
    // A prompt's shared expert runs first (STRATA_PREFILL_SHARED_FIRST): its output rows live through the sets.
    const uint64_t shared_out = hp.n_ff_shexp > 0 ? 4 * T * E : 0;
    const uint64_t moe_tmp = 4 * T * uint64_t(hp.n_expert) + 8 * M + rows_in + 4 * M * E + shared_out +
                             std::max(set_tmp, shared_tmp) + 64 * align;
    // the delta rule's workspace: 16 chunks of 64 tokens of prepared matrices per v-head (gdn_parallel.cu)
    const uint64_t d_v = n_v ? d_inner / n_v : 0;
    const uint64_t gdn_tmp = 4 * (T * (conv + 2 * n_v) + conv * uint64_t(hp.ssm_conv_kernel) +
                                  n_v * 16 * (64 * (3 * uint64_t(hp.ssm_d_state) + 2 * d_v) + 1));
    const uint64_t mm_tmp = 5 * T * K;
    const uint64_t out_rows = std::min<uint64_t>(T, uint64_t(k_logit_slice_rows));
    const uint64_t out = logits ? 4 * out_rows * (2 * E + uint64_t(hp.n_vocab)) + 5 * out_rows * E : 0;
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

namespace {

Placement plan_with(const WeightSet &ws, const HParams &hp, const CacheShape &caches, const DeviceFacts &dev,
                    const PlanOptions &opt) {
    Placement p;
    p.caches = caches;
    p.chunk_tokens = opt.chunk_tokens;
    p.download_cols = std::max(hp.n_vocab, 2 * hp.n_embd);  // a split part's residual stream: x and cur
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

    // Expert slots: one expert's gate, up and down, each matrix aligned; the layers of one size share a slot class
    // (with opt.slot_classes off, one class of the largest size).
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
    std::vector<SlotClass> &cls = p.slot_classes;
    for (ExpertSlotLayout &L : p.layouts) {
        if (!L.bytes) continue;
        const size_t b = opt.slot_classes ? L.bytes : p.slot_bytes;
        auto at = std::lower_bound(cls.begin(), cls.end(), b, [](const SlotClass &c, size_t v) { return c.bytes < v; });
        if (at == cls.end() || at->bytes != b) at = cls.insert(at, SlotClass{b, 0, 0, 0});
    }
    for (ExpertSlotLayout &L : p.layouts) {
        if (!L.bytes) continue;
        const size_t b = opt.slot_classes ? L.bytes : p.slot_bytes;
        for (size_t c = 0; c < cls.size(); c++)
            if (cls[c].bytes == b) L.cls = int32_t(c), cls[c].n_experts += hp.n_expert;
    }
    const int64_t min_slots =
        p.n_experts_total ? std::min<int64_t>(p.n_experts_total, std::max<int64_t>(hp.n_expert_used, 1)) : 0;
    // Slots per class for `bytes` of cache (and at most opt.expert_slots in all): every class min(its experts,
    // min_slots), then the same share f of every class's experts, f as large as fits, then what is left a slot at a
    // time to the class with the smallest share (below the minimum, all of them so). One class: min(experts,
    // bytes / size, expert_slots), as many as fit.
    struct Split {
        std::vector<int64_t> n;
        int64_t total = 0;
        bool minimum_fits = false;
    };
    auto split = [&](uint64_t bytes) {
        Split s;
        s.n.assign(cls.size(), 0);
        const int64_t cap = opt.expert_slots > 0 ? opt.expert_slots : INT64_MAX;
        auto at_least = [&](size_t c) { return std::min(cls[c].n_experts, min_slots); };
        auto fill = [&](double f, std::vector<int64_t> &n) {
            uint64_t b = 0;
            int64_t k = 0;
            for (size_t c = 0; c < cls.size(); c++) {
                n[c] = std::max(at_least(c), std::min(cls[c].n_experts, int64_t(f * double(cls[c].n_experts))));
                b += uint64_t(n[c]) * cls[c].bytes, k += n[c];
            }
            return b <= bytes && k <= cap;
        };
        s.minimum_fits = fill(0.0, s.n);
        if (!s.minimum_fits) {
            s.n.assign(cls.size(), 0);
        } else if (fill(1.0, s.n)) {
            for (const int64_t v : s.n) s.total += v;
            return s;
        } else {
            double lo = 0.0, hi = 1.0;
            for (int i = 0; i < 64; i++) {
                const double mid = (lo + hi) / 2;
                (fill(mid, s.n) ? lo : hi) = mid;
            }
            fill(lo, s.n);
        }
        uint64_t used = 0;
        for (size_t c = 0; c < cls.size(); c++) used += uint64_t(s.n[c]) * cls[c].bytes, s.total += s.n[c];
        for (bool more = true; more && s.total < cap;) {
            more = false;
            size_t best = cls.size();
            for (size_t c = 0; c < cls.size(); c++)
                if (s.n[c] < cls[c].n_experts && used + cls[c].bytes <= bytes &&
                    (best == cls.size() ||
                     double(s.n[c]) * double(cls[best].n_experts) < double(s.n[best]) * double(cls[c].n_experts)))
                    best = c;
            if (best < cls.size()) s.n[best]++, s.total++, used += cls[best].bytes, more = true;
        }
        return s;
    };

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
    // The experts' input rows int8 only where every layer's gate and up have one type the backend gathers so.
    bool int8_rows = hp.n_embd % 256 == 0;
    for (const ExpertWeights &e : ws.experts)
        if (e.present())
            int8_rows = int8_rows && e.gate->type == e.up->type &&
                        std::find(dev.int8_expert_input_types.begin(), dev.int8_expert_input_types.end(),
                                  e.gate->type) != dev.int8_expert_input_types.end();
    auto scratch_for = [&](int64_t chunk) {
        return uint64_t(align_up(opt.scratch_bytes ? opt.scratch_bytes : scratch_estimate(hp, chunk, int8_rows, opt.logits), a));
    };
    p.resident_chunk_tokens = opt.chunk_tokens;
    p.scratch_bytes = scratch_for(opt.chunk_tokens);
    // The pass tables (rows' sequences and positions, attention tiles) and the small rest: i-quant and rope tables,
    // expert tables, rounding.
    p.pass_table_bytes = align_up(size_t(16) << 10, a) + align_up(size_t(opt.chunk_tokens) * (8 + 2 * 16), a);
    p.misc_bytes = p.pass_table_bytes + (uint64_t(4) << 20);
    p.stage_bytes = stage_estimate(hp, opt.chunk_tokens);
    uint64_t resident = p.weight_bytes + p.cache_bytes + p.scratch_bytes + p.misc_bytes;
    // A prompt loan, where the whole chunk's scratch kept resident would leave the cache partial: scratch for
    // k_loan_resident_chunk tokens resident, the cache the rest, and bigger passes on borrowed slots, as big as a
    // loan can be while the floor of slots (each class its share of it) stays in the cache.
    auto slots_with = [&](uint64_t res) { return split(res > budget ? 0 : budget - res); };
    if (opt.prompt_loan && p.n_experts_total > 0 && opt.chunk_tokens > k_loan_resident_chunk) {
        const uint64_t small = scratch_for(k_loan_resident_chunk), res_small = resident - p.scratch_bytes + small;
        const Split n_full = slots_with(resident), n_small = slots_with(res_small);
        if (n_full.total < p.n_experts_total && n_small.minimum_fits && n_small.total < p.n_experts_total) {
            const int64_t floor_all = std::max<int64_t>(
                min_slots, opt.loan_floor_slots >= 0 ? opt.loan_floor_slots : k_loan_floor_layers * hp.n_expert);
            std::vector<int64_t> can_lend(cls.size(), 0);
            uint64_t lendable = 0;
            for (size_t c = 0; c < cls.size(); c++) {
                const int64_t floor =
                    cls.size() == 1
                        ? floor_all
                        : std::max(std::min(cls[c].n_experts, min_slots),
                                   (floor_all * cls[c].n_experts + p.n_experts_total - 1) / p.n_experts_total);
                can_lend[c] = std::max<int64_t>(0, n_small.n[c] - floor);
                lendable += uint64_t(can_lend[c]) * cls[c].bytes;
            }
            auto fits = [&](int64_t c) { return scratch_for(c) <= lendable; };
            int64_t chunk = 0;
            if (fits(opt.chunk_tokens)) {
                chunk = opt.chunk_tokens;
            } else {  // the largest multiple of 256 tokens that fits (the estimate grows with the chunk)
                int64_t lo = k_loan_resident_chunk / 256, hi = opt.chunk_tokens / 256 + 1;  // fits(lo) unknown
                while (hi - lo > 1) {
                    const int64_t mid = (lo + hi) / 2;
                    (fits(mid * 256) ? lo : hi) = mid;
                }
                if (lo * 256 > k_loan_resident_chunk && fits(lo * 256)) chunk = lo * 256;
            }
            if (chunk > 0 || !n_full.minimum_fits) {
                p.scratch_bytes = small;
                p.resident_chunk_tokens = p.chunk_tokens = k_loan_resident_chunk;
                resident = res_small;
                if (chunk > 0) {
                    p.chunk_tokens = chunk;
                    // the loan allocation: what the chunk's scratch takes of what each class can lend
                    p.loan_class_slots = can_lend;
                    p.loan_class_slots = p.loan_take(scratch_for(chunk));
                    for (const int64_t x : p.loan_class_slots) p.loan_slots += x;
                    for (int64_t t = 256; t < chunk; t += 256) p.loan_step_bytes.push_back(scratch_for(t));
                    p.loan_step_bytes.push_back(scratch_for(chunk));
                }
            }
        } else if (!n_full.minimum_fits) {  // the whole chunk's scratch does not fit at all: smaller chunks, no loan
            p.scratch_bytes = small;
            p.resident_chunk_tokens = p.chunk_tokens = k_loan_resident_chunk;
            resident = res_small;
        }
    }
    uint64_t min_cache = 0;
    for (const SlotClass &c : cls) min_cache += uint64_t(std::min(c.n_experts, min_slots)) * c.bytes;
    const uint64_t minimum = resident + min_cache;
    const std::string what = given ? std::string("--vram-budget") : "the free memory of " + dev.name;
    if (minimum > budget)
        fail(
            "%s %s is too small for this model: the resident part needs %s (weights %s, KV cache and states %s, "
            "scratch for %lld-token passes %s), the expert cache at least %lld slots of %s%s and the CUDA runtime "
            "%s; give at least %s",
            what.c_str(), format_bytes(given ? given : budget).c_str(), format_bytes(resident).c_str(),
            format_bytes(p.weight_bytes).c_str(), format_bytes(p.cache_bytes).c_str(),
            (long long)p.resident_chunk_tokens, format_bytes(p.scratch_bytes).c_str(), (long long)min_slots,
            format_bytes(p.slot_bytes).c_str(),
            cls.size() > 1
                ? strfmt(" in each of %zu slot sizes (%s in all)", cls.size(), format_bytes(min_cache).c_str()).c_str()
                : "",
            format_bytes(runtime_total).c_str(), format_bytes(minimum + (given ? runtime_total : 0)).c_str());
    if (!cls.empty()) {
        const Split s = slots_with(resident);
        for (size_t c = 0; c < cls.size(); c++) cls[c].first = p.n_slots, cls[c].n = s.n[c], p.n_slots += s.n[c];
    }
    for (size_t c = 0; c < p.loan_class_slots.size(); c++)
        STRATA_ASSERT(p.loan_class_slots[c] == 0 || p.loan_class_slots[c] < cls[c].n);
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
    std::string sizes_note;  // several classes: their slots and sizes, e.g. "; 1536 x 2.65 MiB + 960 x 3.06 MiB"
    if (cls.size() > 1)
        for (const SlotClass &c : cls)
            sizes_note +=
                strfmt("%s%lld x %s", sizes_note.empty() ? "; " : " + ", (long long)c.n, format_bytes(c.bytes).c_str());
    p.check_line = strfmt(
        "strata: %s plan: resident %s, expert cache %lld slots (%s, %.0f%% of experts), %s, KV %s %d x %lld (%s "
        "with states), scratch %s for %lld-token chunks, %s, budget %s",
        dev.name.c_str(), format_bytes(p.weight_bytes + p.cache_bytes + p.scratch_bytes).c_str(), (long long)p.n_slots,
        (format_bytes(p.slots_total_bytes()) + sizes_note).c_str(), pct, host.c_str(), kv_type_name(caches.kv_type),
        caches.n_seqs, (long long)caches.n_ctx, format_bytes(p.cache_bytes).c_str(),
        format_bytes(p.scratch_bytes).c_str(), (long long)p.resident_chunk_tokens, runtime_note.c_str(),
        format_bytes(p.budget_total_bytes).c_str());
    if (p.loan_slots > 0)
        p.check_line += strfmt("; prompt loan: passes of %lld-%lld tokens borrow up to %lld slots (%s)",
                               (long long)p.resident_chunk_tokens + 1, (long long)p.chunk_tokens,
                               (long long)p.loan_slots, format_bytes(p.loan_bytes()).c_str());
    if (p.chunk_tokens < opt.chunk_tokens)
        p.check_line += strfmt("; chunks of %lld tokens, not the %lld asked: no loan holds more under this budget",
                               (long long)p.chunk_tokens, (long long)opt.chunk_tokens);
    return p;
}

}  // namespace

// Size classes where each class gets a slot, the budget holds every class's minimum and a prompt loan holds the chunk
// one class of the largest size would; otherwise (a budget near the smallest, fewer slots asked for than there are
// sizes, a chunk the classes' floors leave too little to lend for) that one class.
Placement plan_placement(const WeightSet &ws, const HParams &hp, const CacheShape &caches, const DeviceFacts &dev,
                         const PlanOptions &opt) {
    PlanOptions one = opt;
    one.slot_classes = false;
    if (!opt.slot_classes) return plan_with(ws, hp, caches, dev, one);
    Placement p;
    try {
        p = plan_with(ws, hp, caches, dev, opt);
    } catch (const Error &) {
        // the single class's plan fails too where the budget is short of even its minimum, with its message
        return plan_with(ws, hp, caches, dev, one);
    }
    if (p.slot_classes.size() <= 1) return p;
    Placement q = plan_with(ws, hp, caches, dev, one);
    bool each = true;
    for (const SlotClass &c : p.slot_classes) each = each && c.n > 0;
    return each && p.chunk_tokens >= q.chunk_tokens && p.n_slots >= q.n_slots ? p : q;
}

}  // namespace strata
