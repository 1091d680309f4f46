// The expert slot table and its least-recently-used refill (protocol in expert_cache.h).
#include "backend/cuda/expert_cache.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace strata::cuda {

void ExpertCache::init(std::vector<ExpertLayout> layers, int64_t n_expert, size_t slot_bytes,
                       std::vector<uint8_t *> slots) {
    layers_ = std::move(layers);
    n_expert_ = n_expert;
    slot_bytes_ = slot_bytes;
    n_total_ = 0;
    table_.assign(layers_.size(), {});
    for (size_t il = 0; il < layers_.size(); il++) {
        if (!layers_[il].gate) continue;
        STRATA_ASSERT(layers_[il].bytes <= slot_bytes);
        table_[il].assign(size_t(n_expert), -1);
        n_total_ += n_expert;
    }
    host_copy_.assign(layers_.size(), {});
    slots_.clear();
    all_resident_ = false;
    lru_head_ = lru_tail_ = -1;
    for (uint8_t *p : slots) {
        slots_.push_back(Slot{p, -1, -1, -1, -1});
        push_back(int32_t(slots_.size() - 1));
    }
}

void ExpertCache::unlink(int32_t s) {
    Slot &x = slots_[size_t(s)];
    if (x.prev >= 0)
        slots_[size_t(x.prev)].next = x.next;
    else
        lru_head_ = x.next;
    if (x.next >= 0)
        slots_[size_t(x.next)].prev = x.prev;
    else
        lru_tail_ = x.prev;
    x.prev = x.next = -1;
}

void ExpertCache::push_back(int32_t s) {
    Slot &x = slots_[size_t(s)];
    x.prev = lru_tail_;
    x.next = -1;
    if (lru_tail_ >= 0)
        slots_[size_t(lru_tail_)].next = s;
    else
        lru_head_ = s;
    lru_tail_ = s;
}

ExpertPtrs ExpertCache::ptrs(const Slot &s, int64_t il) const {
    const ExpertLayout &L = layers_[size_t(il)];
    return {s.dev + L.gate_off, s.dev + L.up_off, s.dev + L.down_off};
}

void ExpertCache::set_host_copy(int64_t il, const uint8_t *gate, const uint8_t *up, const uint8_t *down) {
    STRATA_ASSERT(il >= 0 && size_t(il) < layers_.size() && layers_[size_t(il)].gate);
    host_copy_[size_t(il)] = {gate, up, down};
}

void ExpertCache::fill(int32_t slot, int64_t il, int32_t e, cudaStream_t stream) {
    Slot &s = slots_[size_t(slot)];
    if (s.layer >= 0) table_[size_t(s.layer)][size_t(s.expert)] = -1;
    const ExpertLayout &L = layers_[size_t(il)];
    const size_t g = L.gate->matrix_bytes(), u = L.up->matrix_bytes(), d = L.down->matrix_bytes();
    const HostCopy &hc = host_copy_[size_t(il)];
    if (hc.gate) {
        // From pinned memory: straight to the stream.
        STRATA_CUDA_CHECK(
            cudaMemcpyAsync(s.dev + L.gate_off, hc.gate + size_t(e) * g, g, cudaMemcpyHostToDevice, stream));
        STRATA_CUDA_CHECK(cudaMemcpyAsync(s.dev + L.up_off, hc.up + size_t(e) * u, u, cudaMemcpyHostToDevice, stream));
        STRATA_CUDA_CHECK(
            cudaMemcpyAsync(s.dev + L.down_off, hc.down + size_t(e) * d, d, cudaMemcpyHostToDevice, stream));
    } else {
        pending_.push_back({s.dev + L.gate_off, L.gate->expert_host(e), g});
        pending_.push_back({s.dev + L.up_off, L.up->expert_host(e), u});
        pending_.push_back({s.dev + L.down_off, L.down->expert_host(e), d});
    }
    s.layer = int32_t(il);
    s.expert = e;
    table_[size_t(il)][size_t(e)] = slot;
    stats_.bytes_uploaded += g + u + d;
}

void ExpertCache::flush(cudaStream_t stream) {
    if (pending_.empty()) return;
    if (stager_) {
        stager_->copy(pending_, stream);
    } else {
        for (const HostStager::Item &it : pending_)
            STRATA_CUDA_CHECK(cudaMemcpyAsync(it.dst, it.src, it.bytes, cudaMemcpyHostToDevice, stream));
    }
    pending_.clear();
}

void ExpertCache::load_all(cudaStream_t stream) {
    STRATA_ASSERT(n_slots() >= n_total_);
    int32_t next = 0;
    for (size_t il = 0; il < layers_.size(); il++) {
        if (!layers_[il].gate) continue;
        for (int32_t e = 0; e < n_expert_; e++) fill(next++, int64_t(il), e, stream);
        flush(stream);
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    stats_.bytes_uploaded = 0;  // start-up loading is not streaming
    all_resident_ = true;
}

ExpertPtrs ExpertCache::resident(int64_t il, int32_t e) const {
    STRATA_ASSERT(all_resident_ && table_[size_t(il)][size_t(e)] >= 0);
    return ptrs(slots_[size_t(table_[size_t(il)][size_t(e)])], il);
}

void ExpertCache::acquire(int64_t il, const int32_t *experts, int64_t n, ExpertPtrs *out, cudaStream_t stream,
                          bool scan) {
    STRATA_ASSERT(il >= 0 && size_t(il) < layers_.size() && layers_[size_t(il)].gate);
    STRATA_ASSERT(n <= n_slots());
    std::vector<int32_t> &tab = table_[size_t(il)];
    const uint64_t call = ++calls_;
    // First move every requested expert that is resident to the recent end, so that refilling the others cannot
    // evict it: after that, the n - 1 or fewer slots this call has touched are all behind at least one untouched one.
    for (int64_t i = 0; i < n; i++) {
        const int32_t s = tab[size_t(experts[i])];
        if (s >= 0) {
            unlink(s);
            push_back(s);
            slots_[size_t(s)].call = call;
            stats_.hits++;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t s = tab[size_t(experts[i])];
        if (s < 0) {
            s = lru_head_;
            if (scan && slots_[size_t(s)].layer >= 0) {  // empty slots first, in any case
                // The slots this call touched are at the recent end: the first one before them.
                int32_t v = lru_tail_;
                while (v >= 0 && slots_[size_t(v)].call == call) v = slots_[size_t(v)].prev;
                if (v >= 0) s = v;
            }
            STRATA_ASSERT(s >= 0 && slots_[size_t(s)].call != call);
            slots_[size_t(s)].call = call;
            fill(s, il, experts[i], stream);
            unlink(s);
            push_back(s);
            stats_.misses++;
        }
        out[i] = ptrs(slots_[size_t(s)], il);
    }
    flush(stream);
}

}  // namespace strata::cuda
