// The placement plan: how a device's memory is divided among the strata (resident weights, caches, scratch, the
// expert cache) and where the experts that do not fit come from, as a pure function of the model's tensors, the
// device's facts and the options. No device is touched here: the backend executes the plan (Backend::prepare), and
// the plan can be tested on any machine. One plan per participating device.
#pragma once

#include <cstdint>
#include <string>

#include "backend/placement.h"
#include "model/hparams.h"

namespace strata {

struct PlanOptions {
    uint64_t vram_budget = 0;    // all the process may hold on the device, its runtime included (0: what is free)
    int64_t expert_slots = 0;    // at most this many expert slots (0: as many as the budget allows)
    uint64_t scratch_bytes = 0;  // scratch to plan (0: the estimate for chunk_tokens; tests plan less)
    int64_t chunk_tokens = 512;  // the most tokens in one forward pass
    bool logits = true;          // its passes compute logits (false: a split model's part before the last)
    // Prompt loans (STRATA_PROMPT_LOAN=0: off): with a partial expert cache, scratch for passes of up to
    // k_loan_resident_chunk tokens stays resident and bigger passes borrow expert slots (placement.h); where no loan
    // holds chunk_tokens, the chunk shrinks to the largest one that fits.
    bool prompt_loan = true;
    int64_t loan_floor_slots = -1;  // slots a loan leaves in the cache (-1: k_loan_floor_layers layers' worth; tests)
    // Slots in size classes (placement.h; STRATA_SLOT_CLASSES=0: every slot of the largest layer's size). Slots of a
    // class go to its layers' experts in proportion to their number, each class at least a layer's routed experts
    // where it has that many; a loan borrows from the largest class only. Where the budget cannot hold every class's
    // minimum, or expert_slots is fewer than the classes, the plan is one class of the largest size.
    bool slot_classes = true;
    // The host stratum: a pinned copy of the experts where host RAM allows (else the mapped file), copied through
    // a pinned stager (else as it is), or the mapping itself pinned instead (opt-in).
    bool host_pinned_copy = true;
    bool require_pinned_copy = false;  // --host-mem pinned: refuse the plan rather than fall back to the mapping
    bool stager = true;
    bool pin_mapping = false;
    size_t stager_buffer_bytes = size_t(32) << 20;
    int stager_buffers = 4;
};

// Margins the plan keeps: what the device runtime may add after the plan (kernels loaded at first launch, local
// memory grown for a kernel that needs more), and host RAM left free beside a pinned copy of the experts.
constexpr uint64_t k_plan_runtime_margin = uint64_t(64) << 20;
constexpr uint64_t k_plan_host_headroom = uint64_t(4) << 30;
// Prompt loans: passes of at most this many tokens run on resident scratch (decoding, parallel sequences, short
// prompts), and a loan leaves the cache at least k_loan_floor_layers layers' worth of experts (the streamed
// schedule's lookahead and the full schedule's ring work in what is left).
constexpr int64_t k_loan_resident_chunk = 512;
constexpr int64_t k_loan_floor_layers = 2;

// The plan for a model's weights and caches on a device. For a backend without device memory (the CPU) a plan with
// device = false that places nothing. Throws strata::Error when the budget cannot hold the resident stratum and the
// fewest expert slots a layer needs; the message names the parts and the smallest budget that works.
Placement plan_placement(const WeightSet &ws, const HParams &hp, const CacheShape &caches, const DeviceFacts &dev,
                         const PlanOptions &opt);

// The scratch one forward pass of `chunk_tokens` tokens takes (activations of a layer, the largest op's
// temporaries, the logits of one slice where `logits`), with a margin.
// int8_rows: the experts' gathered input rows are int8 only (DeviceFacts::int8_expert_input_types).
uint64_t scratch_estimate(const HParams &hp, int64_t chunk_tokens, bool int8_rows = false, bool logits = true);
// The pinned host staging a pass of `chunk_tokens` tokens uploads through (routing tables, rows, positions).
uint64_t stage_estimate(const HParams &hp, int64_t chunk_tokens);

}  // namespace strata
