// Routed experts in device memory: a pool of equal slots, each holding one expert's gate, up and down matrices, and
// per MoE layer a table expert id -> slot. Kernels reach an expert only through this table, so where an expert's
// bytes live (a slot filled at start, or one refilled on demand) never changes what they compute: same kernels,
// same bytes, identical results.
//
// Protocol (everything on the backend's one stream, in issue order):
//   - acquire() makes a set of experts resident, copying each missing one from host memory (the mapped model file;
//     pinned with STRATA_CUDA_PIN=1) into the least recently used slot that is not in the set. The copy is queued on
//     the stream, so it starts after every kernel queued before it (the ones reading the slot's previous expert) and
//     before every kernel queued after it (the ones reading the new expert). No events are needed while copies and
//     compute share the stream; a separate copy stream would need an event per slot ("compute that read it is done").
//   - The pointers acquire() returns stay valid until the next acquire() on any layer: callers run all work on a set
//     before acquiring the next one.
//   - With as many slots as experts, every expert is copied once at start and acquire() never copies.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>
#include <vector>

#include "backend/cuda/host_stager.h"
#include "model/weights.h"

namespace strata::cuda {

struct ExpertPtrs {
    const uint8_t *gate, *up, *down;  // device
};

struct ExpertLayout {  // one MoE layer's expert tensors (host views) and the byte offsets within a slot
    const Weight *gate = nullptr, *up = nullptr, *down = nullptr;
    size_t gate_off = 0, up_off = 0, down_off = 0, bytes = 0;  // bytes: the slot space this layer's experts use
};

class ExpertCache {
  public:
    struct Stats {
        uint64_t hits = 0, misses = 0, bytes_uploaded = 0;
    };

    // layers: one entry per layer index (entries without gate are layers with no routed experts to run).
    // slots: n_slots device pointers of slot_bytes each.
    void init(std::vector<ExpertLayout> layers, int64_t n_expert, size_t slot_bytes, std::vector<uint8_t *> slots);

    // Copies from host memory go through this stager (pageable sources), or straight to the stream (nullptr).
    void set_stager(HostStager *s) { stager_ = s; }
    // Pinned host copies of layer il's gate, up and down tensors (every expert, in expert order): copies then come
    // from there by DMA at the bus's speed, not through the stager.
    void set_host_copy(int64_t il, const uint8_t *gate, const uint8_t *up, const uint8_t *down);

    // Copies every expert of every layer into its own slot (needs n_slots >= all experts); synchronous.
    void load_all(cudaStream_t stream);

    // Makes experts[0..n) of layer il resident (n <= n_slots(), distinct ids) and writes their pointers to out.
    // Victims are the least recently used slots; with `scan` (a chunk that needs most of a layer's experts, so
    // passes sweep the layers in order) the most recently used ones outside this call instead: under LRU a sweep
    // larger than the cache evicts each expert just before it is needed again and nothing ever hits, while evicting
    // what was just used keeps the rest of the cache for the next pass.
    void acquire(int64_t il, const int32_t *experts, int64_t n, ExpertPtrs *out, cudaStream_t stream,
                 bool scan = false);

    int64_t n_slots() const { return int64_t(slots_.size()); }
    int64_t n_experts_total() const { return n_total_; }
    size_t slot_bytes() const { return slot_bytes_; }
    const Stats &stats() const { return stats_; }
    // Every expert of every layer in its slot for good (load_all): callers may then keep pointers.
    bool all_resident() const { return all_resident_; }
    // Device pointers of a resident expert (all_resident()).
    ExpertPtrs resident(int64_t il, int32_t e) const;
    // Slot of an expert, -1 when not in device memory (tests).
    int32_t slot_of(int64_t il, int32_t e) const { return table_[size_t(il)][size_t(e)]; }

  private:
    struct Slot {
        uint8_t *dev = nullptr;
        int32_t layer = -1, expert = -1;
        int32_t prev = -1, next = -1;  // recency list: head = least recently used
        uint64_t call = 0;             // the acquire() that last touched it
    };
    // Copies expert e of layer il into a slot: from a pinned host copy at once, else queued in pending_.
    void fill(int32_t slot, int64_t il, int32_t e, cudaStream_t stream);
    void flush(cudaStream_t stream);  // issues pending_
    ExpertPtrs ptrs(const Slot &s, int64_t il) const;
    void unlink(int32_t s);
    void push_back(int32_t s);  // most recently used

    struct HostCopy {
        const uint8_t *gate = nullptr, *up = nullptr, *down = nullptr;
    };
    std::vector<ExpertLayout> layers_;
    std::vector<HostCopy> host_copy_;          // per layer; empty pointers: the tensors in the mapped file
    std::vector<std::vector<int32_t>> table_;  // [layer][expert] -> slot, -1: not resident
    std::vector<Slot> slots_;
    size_t slot_bytes_ = 0;
    int64_t n_expert_ = 0, n_total_ = 0;
    int32_t lru_head_ = -1, lru_tail_ = -1;
    bool all_resident_ = false;
    uint64_t calls_ = 0;
    HostStager *stager_ = nullptr;
    std::vector<HostStager::Item> pending_;
    Stats stats_;
};

}  // namespace strata::cuda
