// Expert slots of the CUDA backend: the plan's slot memory, fills from the host stratum on a copy stream, and the
// events that order the fills against the compute that reads the slots. Which expert goes to which slot is not
// decided here (strata/expert_slots.h).
//
// Protocol (two streams: compute `stream_`, copies `copy_stream_`). Fills made ahead of the compute that reads them
// (start-up; later prefetch and staging rings) run on the copy stream; a fill the next expert_ffn reads at once runs
// on the compute stream, in order with it: there is nothing to overlap it with, and the event hops between two
// streams cost about 3% of decode speed under a 12 GiB budget (30B-A3B, H200).
//   - A fill may overwrite slot s only once every expert_ffn that read s before has finished. Each expert_ffn
//     that reads slots, and each fill on the compute stream, is numbered n (ffn_seq_), records read_done_[n % 64]
//     on the compute stream after its work, and marks its slots last touched by n. Before a fill on the copy stream,
//     the copy stream waits for read_done_ of the slot's last toucher (once per newer one: copy_waited_). Events
//     are recorded again every 64 calls: an event recorded again stands for a later call, and on the in-order
//     compute stream waiting for a later call waits for the earlier one too, so reuse can make a wait longer, never
//     too short. A fill on the compute stream first makes compute wait for the copy stream's fills.
//   - An expert_ffn (or a device-routed pass) may read a slot only once its fill has finished: after each call of
//     fills on the copy stream, fill_events_[n % 64] (call n) and fill_done_ are recorded there. An expert_ffn makes
//     the compute stream wait for the newest fill call that wrote one of its slots (so fills issued ahead for later
//     experts do not hold it up: the streamed MoE schedule; only where a schedule fills ahead during passes,
//     slot_waits_, else it waits for fill_done_ as before); a device-routed pass, and a fill on the compute stream,
//     wait for fill_done_ (every fill so far).
//   - Sources: the pinned host copy (one DMA per expert: laid out as a slot), the mapped file through the pinned
//     stager (its buffers carry their own events: host_stager.h), the mapped file as it is, or the pinned mapping.
//   - Fills at start (every expert resident) have finished when set_resident_experts returns.
//   - Mapped misses (STRATA_DECODE_MAPPED, on; the pinned host copy as the host stratum): each layer's device table
//     names every expert's matrices, in its slot or in the host copy, which decode's kernels then read in place over
//     the bus. The table follows the fills and loans (cuda_backend_impl.h, MappedTable): an expert leaves the table
//     before its slot is overwritten and enters it once its fill is issued; a table goes up, on the compute stream
//     after it has waited for every fill, before the next device-routed pass reads it. A fill on the copy stream
//     waits for the last device-routed pass issued before it, which may have read any slot.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/host_register.h"
#include "core/env.h"
#include "core/error.h"
#include "core/threads.h"
#include "core/units.h"

namespace strata::cuda {

void CudaBackend::make_slots(const Placement &plan) {
    graph_gen_++;
    layouts_ = plan.layouts;
    // The slots' pools as the plan lays them out (placement.h: slot_pools; the lendable slots one pool, so that a
    // loan is one range of memory).
    const SlotPools pools = slot_pools(plan);
    std::vector<uint8_t *> base;
    for (size_t i = 0; i < pools.pool_bytes.size(); i++)
        base.push_back(static_cast<uint8_t *>(dev_alloc(
            size_t(pools.pool_bytes[i]), int32_t(i) == pools.loan_pool ? "expert slots (lendable)" : "expert slots")));
    slots_.assign(pools.slots.size(), nullptr);
    slot_size_.assign(pools.slots.size(), 0);
    loan_end_ =
        pools.loan_pool >= 0 ? base[size_t(pools.loan_pool)] + pools.pool_bytes[size_t(pools.loan_pool)] : nullptr;
    for (size_t s = 0; s < pools.slots.size(); s++) {
        STRATA_ASSERT(pools.slots[s].pool >= 0 && size_t(pools.slots[s].pool) < base.size());
        slots_[s] = base[size_t(pools.slots[s].pool)] + pools.slots[s].offset;
        slot_size_[s] = size_t(pools.slots[s].bytes);
    }
    slot_last_read_.assign(slots_.size(), 0);
    slot_fill_seq_.assign(slots_.size(), 0);
    moe_layers_ = 0;
    for (const ExpertSlotLayout &L : layouts_) moe_layers_ += L.bytes > 0;
    expert_tables_.assign(layouts_.size(), nullptr);
    mapped_.assign(layouts_.size(), {});
    slot_owner_.assign(slots_.size(), {-1, -1});
}

// Every layer whose decode kernels take its types gets a table of its experts' matrices in the host copy (no
// expert is in a slot yet). The copy is pinned memory the device addresses directly.
void CudaBackend::map_host_copy(const WeightSet &ws) {
    const bool first = mapped_counts_ == nullptr;
    if (first) {
        mapped_counts_ = static_cast<unsigned long long *>(
            dev_alloc(2 * layouts_.size() * sizeof(unsigned long long), "mapped read counts"));
        STRATA_CUDA_CHECK(
            cudaMemsetAsync(mapped_counts_, 0, 2 * layouts_.size() * sizeof(unsigned long long), stream_));
    }
    int64_t mapped = 0;
    for (const ExpertWeights &w : ws.experts) {
        if (!w.present() || !device_routing_kernels(w)) continue;
        const size_t il = size_t(w.il);
        STRATA_ASSERT(il < host_copy_.size() && host_copy_[il].base && !expert_tables_[il]);
        void *base = nullptr;
        STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&base, const_cast<uint8_t *>(host_copy_[il].base), 0));
        const ExpertSlotLayout &L = layouts_[il];
        const int64_t n = w.gate->ne[2];
        MappedTable &t = mapped_[il];
        t.home.resize(size_t(3 * n));
        for (int64_t e = 0; e < n; e++) {
            const uint8_t *b = static_cast<const uint8_t *>(base) + size_t(e) * host_copy_[il].stride;
            t.home[size_t(3 * e)] = b + L.gate_off;
            t.home[size_t(3 * e + 1)] = b + L.up_off;
            t.home[size_t(3 * e + 2)] = b + L.down_off;
        }
        t.ptrs = t.home;
        t.from_host.assign(size_t(n), 1);
        t.expert_bytes = w.expert_bytes();
        t.dev = static_cast<const uint8_t **>(dev_alloc(size_t(3 * n) * sizeof(void *) + size_t(n), "expert tables"));
        t.dirty = true;
        expert_tables_[il] = t.dev;
        tables_set_++;
        resident_layers_++;
        mapped++;
    }
    graph_eligible_ = resident_layers_ == moe_layers_;
    graph_gen_++;
    if (mapped > 0)
        prepare_note_ += strfmt(" (decoding reads misses from it in place, %lld layers)", (long long)mapped);
}

void CudaBackend::map_expert(int64_t il, int32_t e, int32_t slot) {
    MappedTable &t = mapped_[size_t(il)];
    if (!t.dev) return;
    if (slot >= 0) {
        const ExpertSlotLayout &L = layouts_[size_t(il)];
        const uint8_t *s = slots_[size_t(slot)];
        t.ptrs[size_t(3 * e)] = s + L.gate_off;
        t.ptrs[size_t(3 * e + 1)] = s + L.up_off;
        t.ptrs[size_t(3 * e + 2)] = s + L.down_off;
    } else {
        for (int j = 0; j < 3; j++) t.ptrs[size_t(3 * e + j)] = t.home[size_t(3 * e + j)];
    }
    t.from_host[size_t(e)] = slot < 0;
    t.dirty = true;
}

void CudaBackend::unmap_slot(int32_t slot) {
    if (slot_owner_.empty()) return;
    auto &[il, e] = slot_owner_[size_t(slot)];
    if (il >= 0) map_expert(il, e, -1);
    il = e = -1;
}

void CudaBackend::flush_mapped(int64_t il) {
    const size_t a = il < 0 ? 0 : size_t(il), b = il < 0 ? mapped_.size() : size_t(il) + 1;
    for (size_t i = a; i < b && i < mapped_.size(); i++) {
        MappedTable &t = mapped_[i];
        if (!t.dirty) continue;
        STRATA_ASSERT(!capturing_);
        wait_for_fills();  // every expert the table names in a slot is there
        const size_t n = t.from_host.size();
        STRATA_CUDA_CHECK(
            cudaMemcpyAsync(t.dev, t.ptrs.data(), 3 * n * sizeof(void *), cudaMemcpyHostToDevice, stream_));
        STRATA_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<uint8_t *>(t.dev + 3 * n), t.from_host.data(), n,
                                          cudaMemcpyHostToDevice, stream_));
        t.dirty = false;
    }
}

Backend::MappedReads CudaBackend::mapped_reads() const {
    use_device();
    MappedReads r;
    if (!mapped_counts_) return r;
    std::vector<unsigned long long> c(2 * mapped_.size());
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(c.data(), mapped_counts_, c.size() * sizeof(c[0]), cudaMemcpyDeviceToHost, stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t il = 0; il < mapped_.size(); il++) {
        r.from_slots += c[2 * il];
        r.from_host += c[2 * il + 1];
        r.host_bytes += c[2 * il + 1] * mapped_[il].expert_bytes;
    }
    return r;
}

// The "pinned where it fits" host stratum: every routed expert copied once into pinned host memory, so that misses
// are DMA copies at the bus's speed with no CPU work (on the H200 machine, Qwen3-30B-A3B under a 12 GiB budget:
// pp512 3386 against 2487 t/s through the stager, tg64 105 against 78). Costs start-up time (allocating pinned
// memory took ~0.5 s per GiB there: 9.5 s for 15.2 GiB of experts) and host RAM, which the plan checked. Each
// expert is laid out as a slot is (make_slots' layouts), so its fill is one copy of the layout's bytes
// (STRATA_CUDA_FILL_WHOLE=0: one copy per matrix, as before).
std::string CudaBackend::pin_host_copy(const WeightSet &ws) {
    const auto t0 = std::chrono::steady_clock::now();
    ThreadPool pool(std::min(8, hardware_threads()));
    host_copy_.assign(ws.experts.size(), {});
    fill_whole_ = env_switch("STRATA_CUDA_FILL_WHOLE", true);
    uint64_t bytes = 0;
    for (const ExpertWeights &e : ws.experts) {
        if (!e.present()) continue;
        STRATA_ASSERT(size_t(e.il) < layouts_.size() && layouts_[size_t(e.il)].bytes > 0);
        const ExpertSlotLayout &L = layouts_[size_t(e.il)];
        const size_t n = size_t(e.gate->ne[2]) * L.bytes;
        uint8_t *copy = nullptr;
        const cudaError_t err = cudaMallocHost(reinterpret_cast<void **>(&copy), n);
        if (err != cudaSuccess) {
            cudaGetLastError();
            fail("CUDA%d: pinning %s of host memory for expert copies failed: %s", device_, format_bytes(n).c_str(),
                 cudaGetErrorString(err));
        }
        host_allocs_.push_back(copy);
        const Weight *mats[3] = {e.gate, e.up, e.down};
        const size_t offs[3] = {L.gate_off, L.up_off, L.down_off};
        pool.parallel_for(e.gate->ne[2], 1, [&](int64_t x0, int64_t x1) {
            for (int64_t x = x0; x < x1; x++) {
                uint8_t *dst = copy + size_t(x) * L.bytes;
                std::memset(dst, 0, L.bytes);  // the alignment gaps: defined bytes in every copy
                for (int j = 0; j < 3; j++)
                    std::memcpy(dst + offs[j], mats[j]->expert_host(x), mats[j]->matrix_bytes());
            }
        });
        bytes += n;
        host_copy_[size_t(e.il)] = {copy, L.bytes};
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return strfmt(" (%s pinned in %.1f s)", format_bytes(bytes).c_str(), secs);
}

void CudaBackend::make_host_tier(WeightSet &ws, const Placement &plan) {
    // STRATA_CUDA_STAGER_THREADS=N: the threads that copy the file's pages into the stager's buffers (default the
    // physical cores less one: on an H100 machine's 16 cores the 30B-A3B's mapped pp4096 at 12 GiB took 10236 tok/s
    // with 15 against 9654 with 8, bench/RESULTS.md, eighteenth round)
    const int stager_threads =
        int(std::clamp<long>(env_count("STRATA_CUDA_STAGER_THREADS", std::max(1, physical_cores() - 1)), 1, 64));
    // STRATA_CUDA_STAGER_NT=1: the threads copy with stores that bypass the caches instead of memcpy (opt-in: on an
    // H100 machine the 30B-A3B's mapped pp4096 gained 1.05x with it at 8 threads, Next-80B's lost 0.91x at 15)
    const bool stager_nt = env_switch("STRATA_CUDA_STAGER_NT", false);
    auto make_stager = [&] {
        stager_ = std::make_unique<HostStager>(plan.stager_buffer_bytes, plan.stager_buffers,
                                               std::min(stager_threads, hardware_threads()), stager_nt);
    };
    switch (plan.host) {
        case HostTier::none:  // the stager only fills every slot at start (set_resident_experts drops it)
            if (plan.stager_buffers > 0) make_stager();
            break;
        case HostTier::pageable: break;
        case HostTier::pinned_copy:
            prepare_note_ = pin_host_copy(ws);
            // STRATA_DECODE_MAPPED=0: decode's misses are copied into slots (or computed on the host) instead
            if (env_switch("STRATA_DECODE_MAPPED", true)) map_host_copy(ws);
            break;
        case HostTier::stager: make_stager(); break;
        case HostTier::pinned_mapping: {
            // Copies as DMA straight from the mapping. On the Firecracker H200 machines registering the 16.75 GiB
            // mapping of Qwen3-30B-A3B did not finish within 150 s: opt-in, and the stager where it fails.
            const long page = sysconf(_SC_PAGESIZE);
            const size_t len = (ws.file_size + size_t(page) - 1) / size_t(page) * size_t(page);
            const auto t0 = std::chrono::steady_clock::now();
            // (a split's other parts share the mapping: one registration, counted)
            const cudaError_t err = host_register_shared(ws.file_bytes, len, /*read_only=*/true);
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (err == cudaSuccess) {
                pinned_base_ = ws.file_bytes;
                prepare_note_ = strfmt(" (pinned in %.2f s)", secs);
            } else {
                make_stager();
                prepare_note_ = strfmt(" (pinning failed: %s; through a pinned stager %d x %s instead)",
                                       cudaGetErrorName(err), plan.stager_buffers,
                                       format_bytes(plan.stager_buffer_bytes).c_str());
            }
            break;
        }
    }
}

void CudaBackend::free_slots() {
    graph_gen_++;
    if (pinned_base_) host_unregister_shared(pinned_base_);
    pinned_base_ = nullptr;
    for (void *p : host_allocs_) cudaFreeHost(p);
    host_allocs_.clear();
    stager_.reset();
}

ExpertSrc CudaBackend::expert_slot(const ExpertWeights &w, int32_t slot) const {
    STRATA_ASSERT(slot >= 0 && size_t(slot) < slots_.size() && size_t(w.il) < layouts_.size());
    const ExpertSlotLayout &L = layouts_[size_t(w.il)];
    STRATA_ASSERT(L.bytes <= slot_size_[size_t(slot)]);  // a slot of the layer's class (or larger: one class)
    const uint8_t *s = slots_[size_t(slot)];
    return {s + L.gate_off, s + L.up_off, s + L.down_off};
}

ExpertSrc CudaBackend::expert_host_bytes(const ExpertWeights &w, int32_t e) const {
    if (size_t(w.il) < host_copy_.size() && host_copy_[size_t(w.il)].base) {
        const HostCopy &hc = host_copy_[size_t(w.il)];
        const ExpertSlotLayout &L = layouts_[size_t(w.il)];
        const uint8_t *b = hc.base + size_t(e) * hc.stride;
        return {b + L.gate_off, b + L.up_off, b + L.down_off};
    }
    return {w.gate->expert_host(e), w.up->expert_host(e), w.down->expert_host(e)};
}

void CudaBackend::fill_slots(const ExpertWeights &w, const std::vector<SlotFill> &fills, bool ahead) {
    use_device();
    STRATA_ASSERT(size_t(w.il) < layouts_.size() && layouts_[size_t(w.il)].bytes > 0);
    if (fills.empty()) return;
    for (const SlotFill &f : fills)  // a slot of the layer's class (placement.h): its size holds the layer's expert
        STRATA_ASSERT(f.slot >= 0 && size_t(f.slot) < slots_.size() &&
                      layouts_[size_t(w.il)].bytes <= slot_size_[size_t(f.slot)]);
    cudaStream_t s = ahead ? copy_stream_ : stream_;
    // Mapped layers read what these slots held from its copy from here on, and the new experts once issued.
    for (const SlotFill &f : fills) unmap_slot(f.slot);
    if (ahead) {
        // Wait for the last compute that read any of these slots (protocol above).
        uint64_t last = device_read_seq_;
        for (const SlotFill &f : fills) last = std::max(last, slot_last_read_[size_t(f.slot)]);
        if (last > copy_waited_) {
            STRATA_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, read_done_[last % k_read_events], 0));
            copy_waited_ = last;
        }
    } else {
        wait_for_fills();  // a fill on the copy stream into one of these slots lands first
    }
    const ExpertSlotLayout &L = layouts_[size_t(w.il)];
    const Weight *mats[3] = {w.gate, w.up, w.down};
    const size_t offs[3] = {L.gate_off, L.up_off, L.down_off};
    const HostCopy *hc = size_t(w.il) < host_copy_.size() && host_copy_[size_t(w.il)].base
                             ? &host_copy_[size_t(w.il)]
                             : nullptr;
    std::vector<HostStager::Item> staged;
    for (const SlotFill &f : fills) {
        uint8_t *slot = slots_[size_t(f.slot)];
        if (hc && fill_whole_) {  // the expert as its slot holds it: one copy
            STRATA_CUDA_CHECK(cudaMemcpyAsync(slot, hc->base + size_t(f.expert) * hc->stride, hc->stride,
                                              cudaMemcpyHostToDevice, s));
            continue;
        }
        const ExpertSrc hs = expert_host_bytes(w, f.expert);  // the pinned copy, or the file
        const void *srcs[3] = {hs.gate, hs.up, hs.down};
        for (int j = 0; j < 3; j++) {
            const size_t n = mats[j]->matrix_bytes();
            const uint8_t *src = static_cast<const uint8_t *>(srcs[j]);
            if (!hc && stager_)
                staged.push_back({slot + offs[j], src, n});
            else
                STRATA_CUDA_CHECK(cudaMemcpyAsync(slot + offs[j], src, n, cudaMemcpyHostToDevice, s));
        }
    }
    if (!staged.empty()) stager_->copy(staged, s);
    if (!slot_owner_.empty() && size_t(w.il) < mapped_.size() && mapped_[size_t(w.il)].dev)
        for (const SlotFill &f : fills) {
            slot_owner_[size_t(f.slot)] = {int32_t(w.il), f.expert};
            map_expert(w.il, f.expert, f.slot);
        }
    if (ahead) {
        STRATA_CUDA_CHECK(cudaEventRecord(fill_done_, copy_stream_));
        fills_pending_ = true;
        const uint64_t n = ++fill_seq_;
        STRATA_CUDA_CHECK(cudaEventRecord(fill_events_[n % k_fill_events], copy_stream_));
        for (const SlotFill &f : fills) slot_fill_seq_[size_t(f.slot)] = n;
    } else {
        // The slots' newest toucher is this fill, for a later fill on the copy stream to wait for.
        const uint64_t n = ++ffn_seq_;
        STRATA_CUDA_CHECK(cudaEventRecord(read_done_[n % k_read_events], stream_));
        for (const SlotFill &f : fills) slot_last_read_[size_t(f.slot)] = n;
    }
}

// Where a schedule fills ahead during passes (slot_waits_), only the fills of these slots; else every fill so far.
void CudaBackend::wait_slot_fills(const std::vector<ExpertGroup> &groups) {
    if (groups.empty()) return;
    if (slot_waits_)
        wait_for_slot_fills(groups);
    else
        wait_for_fills();
}

void CudaBackend::wait_for_fills() {
    if (!fills_pending_) return;
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, fill_done_, 0));
    fills_pending_ = false;
    fill_waited_ = fill_seq_;
}

// An event recorded again stands for a later fill call (the copy stream is in order): waiting for it then waits
// longer, never too short, as with read_done_.
void CudaBackend::wait_for_slot_fills(const std::vector<ExpertGroup> &groups) {
    if (!fills_pending_) return;
    uint64_t need = 0;
    for (const ExpertGroup &g : groups)
        if (g.slot >= 0) need = std::max(need, slot_fill_seq_[size_t(g.slot)]);
    if (need <= fill_waited_) return;
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, fill_events_[need % k_fill_events], 0));
    fill_waited_ = need;
    if (need == fill_seq_) fills_pending_ = false;
}

void CudaBackend::note_slots_read(const std::vector<ExpertGroup> &groups) {
    if (slots_.empty()) return;
    bool any = false;
    for (const ExpertGroup &g : groups) any = any || g.slot >= 0;
    if (!any) return;
    const uint64_t n = ++ffn_seq_;
    STRATA_CUDA_CHECK(cudaEventRecord(read_done_[n % k_read_events], stream_));
    for (const ExpertGroup &g : groups)
        if (g.slot >= 0) {
            STRATA_ASSERT(size_t(g.slot) < slots_.size());
            slot_last_read_[size_t(g.slot)] = n;
        }
}

void CudaBackend::set_resident_experts(const ExpertWeights &w, const std::vector<int32_t> &slot_of) {
    use_device();
    STRATA_ASSERT(size_t(w.il) < expert_tables_.size() && int64_t(slot_of.size()) == w.gate->ne[2]);
    // The start-up fills are done before anything reads these slots without waiting.
    STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    fills_pending_ = false;
    // The device table of the layer's experts' matrices, for routing without the host (experts_device_routed).
    std::vector<const uint8_t *> tab(3 * slot_of.size());
    for (size_t e = 0; e < slot_of.size(); e++) {
        const ExpertSrc s = expert_slot(w, slot_of[e]);
        tab[3 * e] = static_cast<const uint8_t *>(s.gate);
        tab[3 * e + 1] = static_cast<const uint8_t *>(s.up);
        tab[3 * e + 2] = static_cast<const uint8_t *>(s.down);
    }
    auto *dev = static_cast<const uint8_t **>(dev_alloc(tab.size() * sizeof(void *), "expert tables"));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dev, tab.data(), tab.size() * sizeof(void *), cudaMemcpyHostToDevice, stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (!expert_tables_[size_t(w.il)]) {
        resident_layers_ += device_routing_kernels(w) ? 1 : 0;
        tables_set_++;
    }
    expert_tables_[size_t(w.il)] = dev;
    graph_gen_++;
    // Every layer filled for good: no fill comes after start, and the stager's pinned buffers and threads go.
    if (tables_set_ == moe_layers_) stager_.reset();
    // Decoding passes can run as graphs once no layer needs the host for its experts.
    graph_eligible_ = resident_layers_ == moe_layers_;
}

}  // namespace strata::cuda
