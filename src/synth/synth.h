// Synthetic models: GGUF files with the real shapes and metadata of released MoE models (or tiny ones) and
// seeded random weights at trained-like scales. For tests, benchmarks and the embedded default model; the
// weights mean nothing, the shapes, types and byte counts are real.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/dtype.h"
#include "model/hparams.h"

namespace strata {

struct SynthOptions {
    std::string preset = "tiny-qwen3moe";
    DType expert_type = DType::Q4_K;  // routed experts
    DType dense_type = DType::Q8_0;   // attention / GDN projections, shared experts, embeddings, output
    // Where set, the routed experts' down matrices of some layers take this type instead, as llama.cpp's Q4_K_M
    // recipe gives Q6_K to the first and last eighth of the layers and every third layer between (mixed_down_layer):
    // layers whose experts differ in size, as in most released quantized files.
    std::optional<DType> mixed_down_type;
    uint64_t seed = 1;
    // 0: routing as random routers give it (nearly uniform); S > 0: the expert of popularity rank r is chosen about
    // in proportion to 1/r^S (synth/route_skew.h), which experts are popular shuffled per layer by the seed.
    float route_skew = 0.0f;
    std::string vocab_file;           // copy tokenizer.* metadata from this GGUF (its vocab size wins)
    int n_threads = 0;
};

// Whether layer il of n takes SynthOptions::mixed_down_type.
bool mixed_down_layer(int64_t il, int64_t n);

// Names of the presets, for help and errors.
std::vector<std::string> synth_presets();
// The hyperparameters of a preset (throws naming the preset when unknown).
HParams synth_hparams(const std::string &preset);

// One tensor of a synthetic file, as the file lists it: what `strata inspect` reports, without writing the file.
struct SynthTensor {
    std::string name;
    std::vector<int64_t> ne;  // ggml order
    DType type;               // F32 where the requested type cannot hold the tensor (1-D, or rows not whole blocks)
    uint64_t bytes = 0;
};
// The tensors write_synthetic_model writes for these hyperparameters and options, in file order.
std::vector<SynthTensor> synth_tensors(const HParams &hp, const SynthOptions &opt);

struct SynthReport {
    uint64_t bytes = 0;
    size_t n_tensors = 0;
};
SynthReport write_synthetic_model(const SynthOptions &opt, const std::string &path);

}  // namespace strata
