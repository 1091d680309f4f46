// What a backend is handed at start: the tensors it computes with (WeightSet), the caches it holds (CacheShape) and
// the memory plan it executes (Placement), plus what a plan needs to know of the backend (DeviceFacts). The plan is
// computed above this layer, by a pure function (strata/placement_plan.h); a backend only carries it out.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/weight.h"

namespace strata {

// ---- tensors ----

// A layer's routed experts: three 3-D tensors {row length, rows, n_expert}, one matrix per expert.
struct ExpertWeights {
    int64_t il = -1;  // layer index
    const Weight *gate = nullptr, *up = nullptr, *down = nullptr;
    bool present() const { return gate != nullptr; }
    size_t expert_bytes() const { return gate->matrix_bytes() + up->matrix_bytes() + down->matrix_bytes(); }
};

// The tensors of a model, by how a backend treats them: matrices kept as packed bytes, small 1-D or 2-D weights used
// as f32 (norms, biases, gates, conv taps), and per layer index the routed experts (absent where a layer has none).
// A weight may appear in several lists' entries (tied embeddings); backends copy each byte range once.
struct WeightSet {
    std::vector<Weight *> matrices;
    std::vector<Weight *> vectors;
    std::vector<ExpertWeights> experts;  // one per layer index
    const uint8_t *file_bytes = nullptr;  // the mapping the host views point into (nullptr: none)
    size_t file_size = 0;
};

// ---- caches ----

enum class KvType { F32, F16, Q8_0 };
const char *kv_type_name(KvType t);
size_t kv_row_bytes(KvType t, int64_t cols);  // one cache row of `cols` values

// The caches a backend holds for n_seqs sequences of n_ctx positions: per layer either attention K and V rows or a
// Gated DeltaNet layer's conv state ([kernel - 1][conv_dim] f32) and delta-rule state (f32).
struct CacheShape {
    int32_t n_seqs = 1;
    int64_t n_ctx = 4096;
    KvType kv_type = KvType::F16;
    struct Layer {
        bool attention = false;
        int64_t kv_cols = 0;   // attention: n_head_kv * head_dim
        int64_t head_dim = 0;  // attention (q8_0 rows need a multiple of 32)
        int64_t conv_rows = 0, conv_cols = 0, state_floats = 0;  // GDN, per sequence
    };
    std::vector<Layer> layers;

    // Bytes of layer il's two buffers (K and V, or conv and state) for all sequences.
    size_t first_bytes(size_t il) const;
    size_t second_bytes(size_t il) const;
};

// ---- the device and the plan ----

struct DeviceFacts {
    bool has_device_memory = false;  // false: the CPU, which reads every weight where it lies
    int device = 0;
    std::string name;                // for messages: "CUDA0"
    uint64_t free_bytes = 0, total_bytes = 0;
    uint64_t runtime_bytes = 0;      // what the device runtime's context holds (measured, or estimated)
    bool runtime_estimated = false;  // the driver's count could not be read: runtime_bytes is an assumption
    uint64_t host_available_bytes = 0;  // host RAM available now (0: unknown)
    size_t align = 256;                 // allocations are rounded up to this
    // Expert types (gate and up alike) whose input rows the backend gathers only in an int8 form, no float rows
    // (Backend::gather_expert_input): the plan's scratch for a pass counts them so.
    std::vector<DType> int8_expert_input_types;
};

// Where the experts that are not resident come from when a slot is filled.
enum class HostTier {
    none,           // every expert resident: nothing is copied after start
    pinned_copy,    // a copy of every routed expert in pinned host memory (DMA at the bus's speed)
    stager,         // the mapped file, through a ring of pinned staging buffers
    pageable,       // the mapped file, copied as it is (STRATA_CUDA_STAGER=0)
    pinned_mapping  // the mapped file registered as pinned memory (STRATA_CUDA_PIN=1)
};
const char *host_tier_name(HostTier t);

// One layer's experts within an expert slot: gate, up and down at these byte offsets (bytes: what they take).
struct ExpertSlotLayout {
    size_t gate_off = 0, up_off = 0, down_off = 0, bytes = 0;
    int32_t cls = -1;  // the layer's slot class (Placement::slot_classes)
};

// Expert slots come in size classes, one per distinct ExpertSlotLayout::bytes: in a file whose layers' experts differ
// in size (a Q4_K_M file's Q6_K down matrices in some layers) each layer's experts take slots of their own size, not
// every slot the largest. Classes in increasing size, slots numbered class after class (class c: [first, first + n));
// a prompt loan takes the top slots of each class (Placement::loan_class_slots, loan_take).
struct SlotClass {
    size_t bytes = 0;
    int64_t first = 0, n = 0;
    int64_t n_experts = 0;  // the routed experts of the class's layers
};

struct Placement {
    bool device = false;  // false: nothing to place (the CPU reads weights in place)
    // Bytes the backend's allocations may hold in all, and the budget of the whole process on the device (the
    // runtime's share included); the runtime's share as measured or estimated.
    uint64_t budget_bytes = 0, budget_total_bytes = 0, runtime_bytes = 0;
    // The resident stratum, allocation by allocation.
    uint64_t weight_bytes = 0;      // non-expert weights, one arena (each matrix rounded up to the alignment)
    uint64_t cache_bytes = 0;       // KV cache and GDN states, one arena
    uint64_t scratch_bytes = 0;     // activations and kernel temporaries of one pass of chunk_tokens tokens
    uint64_t pass_table_bytes = 0;  // per-pass tables (rows' sequences and positions, attention tiles)
    uint64_t misc_bytes = 0;        // small tables (rope, i-quant grids, expert pointer tables), rounding
    int64_t chunk_tokens = 0;       // the most tokens in one forward pass
    // Prompt loans (with a partial expert cache): passes of at most resident_chunk_tokens run on the resident
    // scratch; a bigger one (up to chunk_tokens) runs on the memory of expert slots lent to it for the call and
    // refilled after (loan_slots 0: no loans, scratch_bytes is for chunk_tokens). The slots a loan may take are the
    // top loan_class_slots[c] of each class c, one allocation laid out class after class; a loan of B bytes takes
    // the last class's first (loan_take), so that its slots are always one range of memory, the allocation's tail.
    int64_t resident_chunk_tokens = 0;
    int64_t loan_slots = 0;  // the most slots a loan takes, all classes
    std::vector<int64_t> loan_class_slots;
    // What a pass of fewer tokens borrows: the scratch a pass of up to (i + 1) * 256 tokens needs, loan_step_bytes[i],
    // so that a shorter prompt leaves more of the cache in place.
    std::vector<uint64_t> loan_step_bytes;
    // Slots of each class a loan of `bytes` takes (at most loan_class_slots), and what a call whose largest pass has
    // `tokens` tokens takes (empty: none; loan_slots_for: how many in all).
    std::vector<int64_t> loan_take(uint64_t bytes) const;
    std::vector<int64_t> loan_split_for(int64_t tokens) const;
    int64_t loan_slots_for(int64_t tokens) const;
    uint64_t loan_bytes() const;    // the loan allocation's bytes
    int64_t download_cols = 0;      // the widest rows a pass downloads per token (logits, or a split part's residuals)
    // Pinned host memory for one pass's small uploads (routing groups and rows, tiles, positions), so that a prompt
    // chunk never waits for its own earlier copies or grows the buffer mid-pass.
    uint64_t stage_bytes = 0;
    // The expert cache: n_slots slots in slot_classes (slot_bytes: the largest class's size), one layout per layer
    // index (bytes 0: no routed experts).
    int64_t n_slots = 0, n_experts_total = 0;
    size_t slot_bytes = 0;
    std::vector<SlotClass> slot_classes;
    std::vector<ExpertSlotLayout> layouts;
    uint64_t slots_total_bytes() const {
        uint64_t b = 0;
        for (const SlotClass &c : slot_classes) b += uint64_t(c.n) * c.bytes;
        return b;
    }
    bool all_resident() const { return n_experts_total > 0 && n_slots >= n_experts_total; }
    // The host stratum.
    HostTier host = HostTier::none;
    uint64_t host_expert_bytes = 0;  // routed experts in host memory (all of them, by the file)
    uint64_t host_copy_bytes = 0;    // the same laid out as slots are (the pinned host copy)
    size_t stager_buffer_bytes = 0;  // the stager's buffers and how many (0: none; with HostTier::none, for start-up)
    int stager_buffers = 0;
    CacheShape caches;
    std::string check_line;  // the plan in one line, printed at start
};

// Where a plan's expert slots live: allocations (pools) and each slot's pool and offset. Each class's slots in pools
// of at most max_pool_bytes (at least a slot each), so no single allocation is huge, except the slots a prompt loan
// may borrow (the top loan_class_slots[c] of each class): one pool laid out class after class, so that any loan's
// slots (Placement::loan_take: the tail of it) are one range of memory.
struct SlotPools {
    struct At {
        int32_t pool = -1;
        uint64_t offset = 0, bytes = 0;
    };
    std::vector<uint64_t> pool_bytes;
    std::vector<At> slots;  // per slot
    int32_t loan_pool = -1;
};
SlotPools slot_pools(const Placement &p, uint64_t max_pool_bytes = uint64_t(1) << 30);

}  // namespace strata
