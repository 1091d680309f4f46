// The engine: a model on a backend with its caches, serving sequences. Callers create sequences, feed them tokens
// (prompt chunks or one token per decode step, several sequences per call) and get logits back. The engine packs
// the work into forward passes of at most n_batch tokens; results do not depend on how the work was packed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/forward.h"
#include "model/weights.h"
#include "runtime/expert_profile.h"
#include "strata/memory_strata.h"

namespace strata {

// Where the experts without a device slot live in host memory: a pinned copy where RAM allows, else the mapped
// file (auto); a pinned copy or nothing (pinned: the plan refuses when RAM is short); the mapped file read through
// the pinned stager (mmap: for host RAM smaller than the model).
enum class HostMem { Auto, Pinned, Mmap };

// Where the forward passes run. Auto: the CUDA backend when the build has it and a GPU is visible, else the CPU.
enum class Device { Auto, Cpu, Cuda };

// One participant of a split model: a device with its own budget, weights, expert cache and caches, running a
// contiguous run of the model's layers (Engine).
struct PartConfig {
    Device device = Device::Auto;
    int cuda_device = 0;
    uint64_t vram_budget = 0;  // 0: what is free
    int64_t n_layers = 0;      // layers it runs (0: chosen by the split; all parts 0 or none)
};

struct EngineConfig {
    Device device = Device::Auto;  // make_engine's choice (make_cpu_engine always uses the CPU)
    int cuda_device = 0;           // which GPU
    uint64_t vram_budget = 0;      // bytes of device memory the CUDA backend may use (0: what is free)
    int64_t expert_slots = 0;      // CUDA: at most this many expert slots (0: as many as the budget allows)
    uint64_t scratch_bytes = 0;    // CUDA: scratch allocated at start (0: the plan's estimate for n_batch; tests)
    int64_t loan_floor_slots = -1;  // slots a prompt loan leaves in the cache (-1: the plan's default; tests)
    bool cuda_graphs = true;       // CUDA: decoding passes as graphs where they can be (see cuda_graph.cpp)
    HostMem host_mem = HostMem::Auto;  // CUDA: the host stratum (STRATA_CUDA_HOST_PINNED=0 acts as mmap)
    SlotPolicy expert_cache_policy = SlotPolicy::Lfu;  // CUDA: which expert a full cache gives up (expert_slots.h)
    // CUDA under a budget: the share of decoding's misses computed on the host (strata/decode_hybrid.h; negative:
    // the cost model, 0: none), and its threads (0: the cores less one, at most 16)
    double cpu_share = -1.0;
    int cpu_threads = 0;
    int n_threads = 0;             // CPU threads (0: all)
    // Given: the model split into contiguous runs of layers, one per participant, in layer order (device, cuda_device
    // and vram_budget above are then unused; one participant runs the whole model); empty: those three say.
    std::vector<PartConfig> parts;
    int32_t n_seq_max = 1;         // sequences held at once (rows of the caches)
    int64_t n_ctx = 4096;          // positions per sequence
    int64_t n_batch = 512;         // tokens per forward pass (prefill chunk)
    KvType kv_type = KvType::F16;
    // Called while a model file's weights are read into memory at start (bytes done, bytes in all).
    std::function<void(uint64_t done, uint64_t total)> load_progress;
    // Start-up notes such as the CUDA placement plan (nullptr: quiet).
    std::function<void(const std::string &)> log;
};

// Work for one sequence in a decode() call: append `tokens` at its end; logits for every new position when
// all_logits, else for the last one only.
struct SeqInput {
    int32_t seq = 0;
    std::vector<int32_t> tokens;
    bool all_logits = false;
};

// A copy of one sequence's recurrent state (every GDN layer's conv and delta-rule state) as it was after `pos`
// positions, in host memory: what Engine::rewind needs to cut a sequence of a recurrent model back to `pos`.
struct StateCheckpoint {
    int64_t pos = 0;
    std::vector<uint8_t> data;  // the backend's layout (Backend::save_recurrent_state); empty without recurrent layers
};

// A split model (several participants): each participant holds the weights, expert cache, loan and caches of its
// layers only, on its own backend; a pass runs the parts in layer order, each handing the residual stream (and its
// next norm) to the next through host memory (forward.h's PassPart; page-locked where the writing part's backend has
// such memory, so a GPU's copies of it run at the bus's rate), so the result is bit for bit the one
// participant's wherever the parts run on backends of one kind. Sequences, checkpoints and cuts span all parts.
class Engine {
  public:
    Engine(std::unique_ptr<Model> model, std::unique_ptr<Backend> backend, const EngineConfig &cfg);
    // A split model: backends[i] runs layers [layers[i], layers[i + 1]) (layers: n + 1 boundaries from 0 to n_layer).
    Engine(std::unique_ptr<Model> model, std::vector<std::unique_ptr<Backend>> backends,
           const std::vector<int64_t> &layers, const EngineConfig &cfg);
    ~Engine();

    const Model &model() const { return *model_; }
    const HParams &hparams() const { return model_->hp; }
    const EngineConfig &config() const { return cfg_; }
    // The first participant's backend and plan (the only one's unless the model is split).
    Backend &backend() { return *parts_[0].backend; }
    const Backend &backend() const { return *parts_[0].backend; }
    const Placement &plan() const { return parts_[0].strata->plan(); }
    // Participants: how many, and each one's backend, plan and layers [first, second).
    size_t n_parts() const { return parts_.size(); }
    // Passes a split model's calls were cut into between their sequences (runtime/part_pipeline.h, micro-passes).
    uint64_t micro_passes() const { return micro_passes_; }
    Backend &part_backend(size_t i) { return *parts_[i].backend; }
    const Backend &part_backend(size_t i) const { return *parts_[i].backend; }
    const Placement &part_plan(size_t i) const { return parts_[i].strata->plan(); }
    std::pair<int64_t, int64_t> part_layers(size_t i) const { return {parts_[i].l0, parts_[i].l1}; }
    ExpertCacheStats part_stats(size_t i) const { return parts_[i].strata->stats(); }
    // A participant's expert slot table (nullptr: its backend reads experts in place).
    const ExpertSlotTable *part_slots(size_t i) const { return parts_[i].strata->slots(); }
    // An expert-popularity profile (runtime/expert_profile.h): the prompts' favourite scores of every participant's
    // layers (empty where no participant has a partial expert cache or none has scored a prompt yet), and such
    // scores given back, to turn the caches toward them as decoding next begins (throws strata::Error where the
    // profile is of another architecture or routing shape).
    ExpertProfile expert_profile() const;
    void seed_expert_profile(const ExpertProfile &p);
    // The expert cache's traffic since start: the one participant's, or for a split model every participant's slots,
    // experts, hits, misses and bytes summed (the rest as the first participant's).
    ExpertCacheStats expert_stats() const;
    int64_t n_vocab() const { return model_->hp.n_vocab; }

    // Sequences. new_sequence/fork throw strata::Error when every one is taken.
    int32_t new_sequence();
    int32_t fork(int32_t seq);  // a new sequence with a copy of seq's caches (shared prefix)
    void drop(int32_t seq);
    int64_t seq_len(int32_t seq) const;
    int32_t n_free_slots() const;

    // Prefix reuse: a sequence cut back to its first n_pos positions continues from there as if it had only ever
    // been fed those. Attention caches keep their first rows; recurrent (GDN) layers cannot be cut back, so they need
    // their state as it was at n_pos: a checkpoint taken then, by this sequence or any other that held the same first
    // n_pos tokens. The caller keeps checkpoints and decides which tokens a sequence holds; the engine checks
    // positions.
    bool has_recurrent() const { return model_->hp.has_recurrent(); }
    // Whether sequences can be cut back at all: always without recurrent layers, else when the backend saves state.
    bool can_rewind() const { return !has_recurrent() || recurrent_state_bytes() > 0; }
    // The recurrent state of seq now, at seq_len(seq) (data empty for a model without recurrent layers).
    StateCheckpoint checkpoint(int32_t seq);
    // Cuts seq back to n_pos <= seq_len(seq) positions. With recurrent layers, cp must be a checkpoint taken at n_pos
    // unless n_pos == seq_len(seq) (nothing changes) or n_pos == 0 (the state is cleared). Throws strata::Error and
    // changes nothing when the arguments do not fit.
    void rewind(int32_t seq, int64_t n_pos, const StateCheckpoint *cp = nullptr);
    // Makes dst, an existing sequence, hold src's first n_pos <= seq_len(src) positions instead of what it held. With
    // recurrent layers, cp must be a checkpoint taken at n_pos unless n_pos == seq_len(src) or n_pos == 0.
    void copy_prefix(int32_t src, int32_t dst, int64_t n_pos, const StateCheckpoint *cp = nullptr);

    // Runs the inputs and fills logits[i] with input i's logits (rows x n_vocab, packed). Throws strata::Error
    // (and changes no sequence) when an input is invalid: unknown sequence, token out of range, context full. When
    // a pass fails on the device (allocation, launch), its sequences keep their lengths, but with recurrent layers
    // their state may be half updated: they are marked lost, and decode() refuses them until they are rewound to a
    // checkpoint or cleared (rewind to 0), or dropped.
    void decode(const std::vector<SeqInput> &inputs, std::vector<std::vector<float>> &logits);
    // The same passes, giving each input only the arg-max of its last position's logits (core/argmax.h's: the
    // lowest id among equal maxima), picked by the backend where the logits are (Backend::download_argmax: on a
    // GPU, one id a row crosses the bus instead of a vocabulary's row): greedy decoding. Inputs may not ask for
    // all_logits.
    void decode_argmax(const std::vector<SeqInput> &inputs, std::vector<int32_t> &ids);
    // Greedy decoding of up to max_steps steps: step 0 decodes each input's one token, each later step the ids step
    // before picked (decode_argmax's), and take(step, ids) gets each step's ids (one an input, in input order) and
    // returns whether to go on. Returns the steps taken (each input's sequence is that many positions longer). The
    // same ids as decode_argmax called step by step; where the backend can (a GPU replaying recorded passes, every
    // expert resident, one participant, no recurrent state), the next step runs on the device while take reads one
    // (STRATA_DECODE_AHEAD=0: each step waits for take).
    using GreedyTake = std::function<bool(int64_t step, const std::vector<int32_t> &ids)>;
    int64_t decode_greedy(const std::vector<SeqInput> &inputs, int64_t max_steps, const GreedyTake &take);

    // Named intermediates of later decode() calls go to the tracer (nullptr: none).
    void set_tracer(const Tracer *t) { tracer_ = t; }
    // The routing of every MoE layer of later passes goes to o (nullptr: none); see MoeSchedule::set_observer.
    void set_routing_observer(RoutingObserver *o) {
        observed_ = o != nullptr;
        for (Part &p : parts_) p.strata->set_routing_observer(o);
    }
    // Benchmarks: later passes route by seeded draws (strata/route_override.h); RouteOverride{}: the router again.
    void set_route_override(const RouteOverride &o) {
        for (Part &p : parts_) p.strata->set_route_override(o);
    }

  private:
    // One participant: its view of the model (its layers' weights only; nullptr with one participant, which uses
    // model_), backend and strata, its layers, and the residual stream it leaves for the next.
    struct Part {
        std::unique_ptr<Model> model;
        std::unique_ptr<Backend> backend;
        std::unique_ptr<MemoryStrata> strata;
        int64_t l0 = 0, l1 = 0;
        Residual out[2];  // by pass parity (a pipelined call's next pass may be written while this one is read)
    };
    void add_part(std::unique_ptr<Backend> backend, int64_t l0, int64_t l1, uint64_t vram_budget);
    // Whether a call of n_passes runs its passes through the parts as a pipeline (runtime/part_pipeline.h;
    // STRATA_SPLIT_PIPELINE, not with a tracer or routing observer, whose sinks expect one thread).
    bool pipelined(size_t n_passes) const;
    bool parts_on_host() const;  // no part has device memory
    size_t recurrent_state_bytes() const;        // every part's, summed (0: some part cannot save its own)
    void load_state(int32_t seq, const StateCheckpoint &cp);  // each part its share, in layer order
    void check_seq(int32_t seq) const;
    // decode()'s passes; each output row goes to sink(row, input, row within that input's logits) as its pass ends,
    // or, where id_sink is given instead, the row's arg-max, picked by the backend where the logits are, to
    // id_sink(id, input).
    using RowSink = std::function<void(const float *row, size_t input, int64_t row_in_logits)>;
    using IdSink = std::function<void(int32_t id, size_t input)>;
    // ahead: a one-pass call's PassIo::ahead (decode_greedy's steps on one participant), else -1.
    void run_passes(const std::vector<SeqInput> &inputs, const RowSink &sink, const IdSink &id_sink, int ahead = -1);

    std::unique_ptr<Model> model_;
    EngineConfig cfg_;
    std::vector<Part> parts_;
    uint64_t micro_passes_ = 0;
    std::vector<int64_t> seq_len_;  // per sequence; -1 when free
    std::vector<char> state_lost_;  // per sequence: a failed pass may have changed its recurrent state
    // A decoding pass's logit rows (at most 16), kept from pass to pass: a vocabulary row is 600 KB on the Qwen
    // models, and allocating and zeroing it (page faults and all) at every step costs the host time the GPU waits.
    std::vector<float> pass_logits_;
    std::vector<int32_t> pass_ids_;  // a pass's arg-max ids (decode_argmax)
    const Tracer *tracer_ = nullptr;
    bool observed_ = false;  // a routing observer is set
};

// Reads every weight byte once, in parallel, so the first tokens don't wait on page faults; skipped when the file
// would not fit comfortably in memory (then the OS pages it in on demand). Reports progress as it goes.
void prefault_weights(const Model &m, int n_threads, const std::function<void(uint64_t, uint64_t)> &progress);

// Loads a model file and builds an engine on the CPU backend.
std::unique_ptr<Engine> make_cpu_engine(const std::string &path, const EngineConfig &cfg);

// Loads a model file and builds an engine on the CUDA backend (throws when the build has no CUDA or no GPU is
// visible, or the model does not fit the budget).
std::unique_ptr<Engine> make_cuda_engine(const std::string &path, const EngineConfig &cfg);

// Loads a model file and builds a split engine over cfg.parts (one is the whole model on that participant's device
// and budget): a backend per participant, the layers
// as each part's n_layers say, or where none is given, as the cost model of strata/split_plan.h chooses from the
// participants' memory and rates measured at start.
std::unique_ptr<Engine> make_split_engine(const std::string &path, const EngineConfig &cfg);
// The boundaries (parts + 1, from 0 to n_layer) make_split_engine uses for these backends.
std::vector<int64_t> choose_split(const Model &m, std::vector<std::unique_ptr<Backend>> &backends,
                                  const EngineConfig &cfg);

// The engine cfg.device asks for (cfg.parts given: make_split_engine's).
std::unique_ptr<Engine> make_engine(const std::string &path, const EngineConfig &cfg);

// Whether Device::Auto picks CUDA here (built with CUDA and a GPU is visible); the name for messages.
bool cuda_available();
const char *device_name(Device d);
Device parse_device(const std::string &s);  // "auto", "cpu", "cuda"; throws naming the flag otherwise

}  // namespace strata
