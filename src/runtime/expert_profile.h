// An expert-popularity profile (`--expert-profile FILE`): the prompts' favourite scores (strata/expert_slots.h:
// rows routed to each expert of each MoE layer, halving every k_favourite_half_tokens prompt tokens) kept in a small
// GGUF file between runs, so that a new process turns its expert cache toward what earlier runs routed most rows
// to as soon as it decodes, short prompts included (their passes score nothing); the scores then go on halving and
// adding as prompts run, and the file is written again at the end. Keyed to the model's routing shape (architecture,
// layers, experts per layer), not to its quantization: the same model in another quant type routes alike.
//
// The file: general.type "expert_profile"; strata.profile.architecture, .block_count, .expert_count,
// .half_life_tokens; one F32 tensor "favourite_scores" of [expert_count, block_count] (a layer without experts or
// without a score yet: zeros). `strata inspect FILE` reads it as any GGUF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct ExpertProfile {
    std::string arch;
    int64_t n_layer = 0, n_expert = 0;
    std::vector<std::vector<double>> scores;  // [layer][expert]; empty: no score for that layer
    bool empty() const;                       // no layer scored
};

// Throws strata::Error naming the file and what is wrong (not a profile, malformed, truncated).
ExpertProfile read_expert_profile(const std::string &path);
// Writes (replaces) path; throws strata::Error naming the file on a failure, leaving no partial file.
void write_expert_profile(const std::string &path, const ExpertProfile &p);

class Engine;
// `--expert-profile path` at the start and at the end of a run (run, serve), where eng keeps part of the experts in
// slots: start reads the file where it exists and gives it to eng (Engine::seed_expert_profile; a profile of another
// model's shape is refused), or checks that its folder can take it at the end; end writes eng's scores there (not
// where nothing has been scored). Each returns what to tell the user ("" where path is empty; otherwise a line
// saying what it did, or that there is no partial expert cache and nothing to keep) and throws strata::Error naming
// the file where it cannot.
std::string start_expert_profile(const std::string &path, Engine &eng);
std::string end_expert_profile(const std::string &path, const Engine &eng);

}  // namespace strata
