// The server's scheduler: one thread owns the engine and runs it step by step over every active request
// (continuous batching). Each step makes one Engine::decode() call holding the next token of every request that is
// generating and the next prompt chunk of requests being read, within a budget of n_batch tokens, so a new long
// prompt delays the others by at most one chunk per step. Requests join between steps and leave as they finish.
//
// Prefix reuse: a sequence slot keeps what its cache holds after its request has finished. A new request goes to the
// free slot whose tokens share the longest prefix with its prompt (or gets that prefix copied from any other slot)
// and only the rest of the prompt is computed. Attention caches are simply cut back; recurrent (GDN) layers are
// restored from state checkpoints that slots take at prompt chunk boundaries and at the end of each prompt.
//
// HTTP handler threads submit jobs and read their results from a per-job channel; a job whose client went away is
// cancelled and its slot freed at the next step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace strata {
class Tokenizer;
}
namespace strata::grammar {
struct ConstraintSpec;
class Vocabulary;
}  // namespace strata::grammar

namespace strata::server {

struct GenParams {
    SamplerParams sampling;
    int64_t max_tokens = -1;  // -1: up to the end of the context
    std::vector<std::string> stop;
    int32_t top_logprobs = -1;  // -1: no logprobs; else this many alternatives per token (0..20)
    bool ignore_eos = false;
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to those tokens' logits before sampling
    std::shared_ptr<const grammar::ConstraintSpec> constraint;  // constrained decoding (grammar/); null: none
};

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;  // best first
};

struct Usage {
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    double prompt_ms = 0, gen_ms = 0;  // time reading the prompt, time generating (from the first token)
};

// What a job's channel carries.
struct Event {
    enum class Kind { Text, Done, Error } kind = Kind::Text;
    std::string text;                  // Text: output text since the last event (stop strings cut off)
    std::vector<TokenLogprob> tokens;  // Text: the tokens generated since the last event (when logprobs are asked)
    std::string finish_reason;         // Done: "stop" or "length"
    Usage usage;                       // Done
    std::string error;                 // Error: what went wrong (the request failed; others go on)
    uint64_t step = 0;                 // the scheduler step that produced it (for tests and tracing)
    bool shutting_down = false;        // Error: the server stopped before the request ended (not the request's fault)
};

class Channel {
  public:
    void push(Event e);
    // Waits up to `timeout` for an event (0: only looks); false when none came.
    bool pop(Event &e, std::chrono::milliseconds timeout);
    // Called (on the pushing thread, after the event is in) for every event pushed from now on: how an event-driven
    // HTTP layer learns that a suspended answer can go on. Set it before the job is submitted.
    void set_listener(std::function<void()> listener);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Event> q_;
    std::function<void()> listener_;
};

struct Job {
    std::vector<int32_t> prompt;
    GenParams params;
    Channel out;
    std::atomic<bool> cancelled{false};  // set by the client side; the scheduler stops the job at its next step
    std::atomic<bool> finished{false};   // set by the scheduler after its last event
};

struct SchedulerConfig {
    int32_t max_queue = 64;        // jobs waiting for a slot; submit() refuses more
    int64_t chunk = 0;             // prompt tokens per request per step (0: the engine's n_batch)
    int32_t max_checkpoints = 8;   // recurrent-state checkpoints kept per slot
    int64_t checkpoint_every = 0;  // tokens between checkpoints while reading a prompt (0: every chunk)
    bool prefix_reuse = true;
    // Test hook: a request whose next engine input holds this token fails as if the engine had failed on it (a
    // failed allocation, say); -1: off. `strata serve` takes it from $STRATA_TEST_FAIL_TOKEN. The CPU engine has no
    // natural failure for a valid request, and the server's answer to one must be tested end to end.
    int32_t fail_token = -1;
};

// One sequence slot as /slots shows it.
struct SlotState {
    int32_t id = 0;
    bool running = false;
    int64_t n_cached = 0;           // cache positions the slot holds (its prompt prefix for the next request)
    int64_t n_prompt = 0;           // the current (or last) request's prompt tokens
    int64_t n_prompt_reused = 0;    // of which taken from the prefix cache
    int64_t n_prompt_computed = 0;  // of which computed so far
    int64_t n_generated = 0;        // tokens generated so far
};

// Monotonic counters and gauges for /metrics.
struct SchedulerStats {
    uint64_t jobs_done = 0, jobs_cancelled = 0, jobs_failed = 0, jobs_rejected = 0;
    uint64_t prompt_tokens = 0, prompt_tokens_reused = 0, prompt_tokens_computed = 0, generated_tokens = 0;
    uint64_t steps = 0, step_tokens = 0, checkpoints_taken = 0, checkpoints_restored = 0;
    uint64_t max_step_tokens = 0;  // the most tokens one step has held
    double busy_seconds = 0;
    int64_t queued = 0, running = 0;
    int64_t kv_tokens_active = 0, kv_tokens_cached = 0, kv_capacity = 0;
    double gen_tokens_per_s = 0, prompt_tokens_per_s = 0;  // over the last few seconds
    // The expert cache over the same seconds: hits over lookups, the share of the misses the host computed, expert
    // bytes copied to the device per second; NaN where there were no lookups (or no misses).
    double expert_hit_ratio = 0, expert_cpu_share = 0, streamed_gb_per_s = 0;
    ExpertCacheStats backend;
    std::vector<SlotState> slots;
};

class Scheduler {
  public:
    Scheduler(Engine &engine, const Tokenizer &tok, SchedulerConfig cfg);
    ~Scheduler();  // stops the thread; unfinished jobs get an error event

    void start();
    void stop();

    // Queues a job; false (and the job untouched) when the queue is full or the scheduler is draining.
    bool submit(std::shared_ptr<Job> job);
    // Shutting down gracefully: refuses new jobs and ends the waiting ones with a shutting_down error; running
    // jobs go on until they finish or stop() is called.
    void drain();
    bool draining() const;
    // Wakes the scheduler so a cancelled job is dropped promptly.
    void notify();

    SchedulerStats stats() const;
    int64_t n_ctx() const { return engine_.config().n_ctx; }

  private:
    struct Slot;
    struct Active;
    void loop();
    void step();
    // The engine's step: each input's last logits, or, where ids is given, their arg-max ids (Engine::decode_argmax).
    void decode(const std::vector<SeqInput> &inputs, std::vector<std::vector<float>> &logits,
                std::vector<int32_t> *ids = nullptr);
    void admit(std::shared_ptr<Job> job);
    void finish(Slot &s, const char *reason);
    void fail_job(Slot &s, const std::string &what);
    void release(Slot &s);
    void after_prompt_chunk(Slot &s);
    void take_checkpoint(Slot &s);
    void emit_token(Slot &s, int32_t token, double now);
    bool reuse_from(const Slot &src, const std::vector<int32_t> &prompt, int64_t &n,
                    std::shared_ptr<const StateCheckpoint> &cp) const;

    Engine &engine_;
    const Tokenizer &tok_;
    std::shared_ptr<const grammar::Vocabulary> grammar_vocab_;  // built with the first constrained job
    SchedulerConfig cfg_;
    std::vector<std::unique_ptr<Slot>> slots_;
    uint64_t clock_ = 0;  // for least-recently-used slot choice

    mutable std::mutex mu_;  // guards queue_, stop_, stats_
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stop_ = false, draining_ = false;
    SchedulerStats stats_;                                                       // published after each step
    SchedulerStats local_;                                                       // the scheduler thread's own counters
    // A step's last events of its jobs (done, failed), sent once the step's counters and slots are published: a
    // client that has its answer and then reads /metrics or /slots sees the request ended there too.
    std::vector<std::pair<std::shared_ptr<Job>, Event>> ends_;
    struct RateSample {
        double t;
        uint64_t generated, computed, hits, misses, host, streamed;  // misses: copied in; host: computed there
    };
    std::deque<RateSample> rate_samples_;
    std::thread thread_;
};

}  // namespace strata::server
