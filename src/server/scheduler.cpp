// The scheduler thread: admission with prefix reuse, one engine step over every active job, sampling, stop
// conditions and streaming out.
#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/error.h"
#include "grammar/constraint.h"
#include "server/text.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

namespace {
double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
constexpr double kRateWindow = 10.0;  // seconds over which the tok/s gauges are computed
}  // namespace

// ---- Channel -------------------------------------------------------------------------------------------------

void Channel::push(Event e) {
    std::function<void()> listener;
    {
        std::lock_guard<std::mutex> lock(mu_);
        q_.push_back(std::move(e));
        listener = listener_;
    }
    cv_.notify_one();
    if (listener) listener();
}

void Channel::set_listener(std::function<void()> listener) {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = std::move(listener);
}

bool Channel::pop(Event &e, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return false;
    e = std::move(q_.front());
    q_.pop_front();
    return true;
}

// ---- slots ---------------------------------------------------------------------------------------------------

struct Scheduler::Active {
    std::shared_ptr<Job> job;
    uint64_t order = 0;   // admission order: earlier prompts are read first
    size_t n_fed = 0;     // prompt tokens in the cache
    bool prefill = true;  // still reading the prompt
    int32_t next = -1;    // the sampled token the next step feeds
    int64_t max_new = 0;  // tokens to generate at most
    int64_t last_checkpoint = 0;
    Sampler sampler;
    StreamDecoder decoder;
    StopMatcher stopper;
    std::vector<int32_t> generated;
    std::vector<TokenLogprob> logprobs;  // not yet sent
    Usage usage;
    double t_start = 0, t_first = 0;

    Active(std::shared_ptr<Job> j, const Tokenizer &tok, std::unique_ptr<TokenConstraint> constraint)
        : job(std::move(j)), sampler(job->params.sampling, std::move(constraint)), decoder(tok),
          stopper(job->params.stop) {}
};

struct Scheduler::Slot {
    int32_t seq = -1;
    std::vector<int32_t> tokens;                                      // what the cache holds
    std::vector<std::shared_ptr<const StateCheckpoint>> checkpoints;  // by position, each <= tokens.size()
    uint64_t last_used = 0;
    std::unique_ptr<Active> act;  // the job it serves; null when free
    SlotState last;               // the counts of the last job it served, for /slots
};

Scheduler::Scheduler(Engine &engine, const Tokenizer &tok, SchedulerConfig cfg)
    : engine_(engine), tok_(tok), cfg_(cfg) {
    if (cfg_.chunk <= 0) cfg_.chunk = engine_.config().n_batch;
    if (cfg_.checkpoint_every <= 0) cfg_.checkpoint_every = cfg_.chunk;
    if (cfg_.max_queue < 0) cfg_.max_queue = 0;
    while (engine_.n_free_slots() > 0) {
        auto s = std::make_unique<Slot>();
        s->seq = engine_.new_sequence();
        slots_.push_back(std::move(s));
    }
    if (slots_.empty()) fail("the engine has no free sequence slot for the server");
    stats_.kv_capacity = int64_t(slots_.size()) * engine_.config().n_ctx;
    for (size_t i = 0; i < slots_.size(); i++) stats_.slots.push_back({int32_t(i)});
}

Scheduler::~Scheduler() {
    stop();
}

void Scheduler::start() {
    if (thread_.joinable()) return;
    thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto &s : slots_)
        if (s->act) {
            s->act->job->out.push({Event::Kind::Error, {}, {}, {}, {}, "the server is shutting down", 0, true});
            s->act->job->finished = true;
            s->act.reset();
        }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &j : queue_) {
        j->out.push({Event::Kind::Error, {}, {}, {}, {}, "the server is shutting down", 0, true});
        j->finished = true;
    }
    queue_.clear();
}

bool Scheduler::submit(std::shared_ptr<Job> job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_ || draining_) return false;
        if (int64_t(queue_.size()) >= cfg_.max_queue) {
            stats_.jobs_rejected++;
            return false;
        }
        queue_.push_back(std::move(job));
        stats_.queued = int64_t(queue_.size());
    }
    cv_.notify_all();
    return true;
}

void Scheduler::drain() {
    std::deque<std::shared_ptr<Job>> waiting;
    {
        std::lock_guard<std::mutex> lock(mu_);
        draining_ = true;
        waiting.swap(queue_);
        stats_.queued = 0;
    }
    for (auto &j : waiting) {
        j->out.push({Event::Kind::Error, {}, {}, {}, {}, "the server is shutting down", 0, true});
        j->finished = true;
    }
    cv_.notify_all();
}

bool Scheduler::draining() const {
    std::lock_guard<std::mutex> lock(mu_);
    return draining_ || stop_;
}

void Scheduler::notify() {
    cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    SchedulerStats s = stats_;
    // Rates over the last few seconds, counting the idle time since the last step.
    const double t = now_s();
    auto first = std::find_if(rate_samples_.begin(), rate_samples_.end(),
                              [&](const RateSample &x) { return x.t >= t - kRateWindow; });
    if (first != rate_samples_.end() && first != rate_samples_.begin()) --first;  // the sample before the window
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.expert_hit_ratio = s.expert_cpu_share = nan;
    if (first != rate_samples_.end()) {
        const double dt = std::max(t - first->t, 1e-3);
        s.gen_tokens_per_s = double(s.generated_tokens - first->generated) / dt;
        s.prompt_tokens_per_s = double(s.prompt_tokens_computed - first->computed) / dt;
        const ExpertCacheStats &b = s.backend;
        const double hits = double(b.expert_cache_hits - first->hits),
                     copied = double(b.expert_cache_misses - first->misses),
                     host = double(b.hybrid.host_experts - first->host);
        if (hits + copied + host > 0) s.expert_hit_ratio = hits / (hits + copied + host);
        if (copied + host > 0) s.expert_cpu_share = host / (copied + host);
        s.streamed_gb_per_s = double(b.bytes_streamed - first->streamed) / dt / 1e9;
    }
    return s;
}

// ---- the loop ----------------------------------------------------------------------------------------------------

void Scheduler::loop() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            const bool busy = std::any_of(slots_.begin(), slots_.end(), [](const auto &s) { return bool(s->act); });
            if (!busy) {
#if defined(__GLIBC__)
                // Idle: give freed memory (the handler threads' arenas included) back to the system.
                if (queue_.empty()) {
                    lock.unlock();
                    malloc_trim(0);
                    lock.lock();
                }
#endif
                cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            }
            if (stop_) return;
        }
        try {
            step();
        } catch (const std::exception &e) {
            // Anything that escaped the per-job handling: fail the jobs of this step, keep serving.
            for (auto &s : slots_)
                if (s->act) fail_job(*s, std::string("internal error: ") + e.what());
        }
    }
}

bool Scheduler::reuse_from(const Slot &src, const std::vector<int32_t> &prompt, int64_t &n,
                           std::shared_ptr<const StateCheckpoint> &cp) const {
    const size_t cap = prompt.empty() ? 0 : prompt.size() - 1;  // the last prompt token is always computed
    size_t lcp = 0;
    const size_t lim = std::min({src.tokens.size(), prompt.size(), cap});
    while (lcp < lim && src.tokens[lcp] == prompt[lcp]) lcp++;
    cp.reset();
    n = 0;
    if (lcp == 0) return false;
    if (!engine_.has_recurrent()) {
        n = int64_t(lcp);
        return true;
    }
    if (lcp == src.tokens.size()) {  // the live state is at exactly the shared prefix
        n = int64_t(lcp);
        return true;
    }
    if (!engine_.can_rewind()) return false;
    for (auto it = src.checkpoints.rbegin(); it != src.checkpoints.rend(); ++it)
        if ((*it)->pos <= int64_t(lcp) && (*it)->pos > 0) {
            n = (*it)->pos;
            cp = *it;
            return true;
        }
    return false;
}

void Scheduler::admit(std::shared_ptr<Job> job) {
    // Target: the free slot with the longest reusable prefix, else the least recently used free slot.
    Slot *target = nullptr;
    int64_t n_target = 0;
    std::shared_ptr<const StateCheckpoint> cp_target;
    for (auto &s : slots_) {
        if (s->act) continue;
        int64_t n = 0;
        std::shared_ptr<const StateCheckpoint> cp;
        if (cfg_.prefix_reuse) reuse_from(*s, job->prompt, n, cp);
        if (!target || n > n_target || (n == n_target && s->last_used < target->last_used)) {
            target = s.get();
            n_target = n;
            cp_target = cp;
        }
    }
    STRATA_ASSERT(target);
    // Source: any slot, busy ones included, holding a longer reusable prefix.
    Slot *source = target;
    int64_t n_source = n_target;
    std::shared_ptr<const StateCheckpoint> cp_source = cp_target;
    if (cfg_.prefix_reuse)
        for (auto &s : slots_) {
            if (s.get() == target) continue;
            int64_t n = 0;
            std::shared_ptr<const StateCheckpoint> cp;
            if (reuse_from(*s, job->prompt, n, cp) && n > n_source) {
                source = s.get();
                n_source = n;
                cp_source = cp;
            }
        }

    Slot &t = *target;
    int64_t reused = 0;
    try {
        if (source != target) {
            engine_.copy_prefix(source->seq, t.seq, n_source, cp_source.get());
            t.tokens.assign(source->tokens.begin(), source->tokens.begin() + n_source);
            t.checkpoints.clear();
            for (const auto &c : source->checkpoints)
                if (c->pos <= n_source) t.checkpoints.push_back(c);
            reused = n_source;
            if (cp_source) local_.checkpoints_restored++;
        } else {
            engine_.rewind(t.seq, n_target, cp_target.get());
            t.tokens.resize(size_t(n_target));
            std::erase_if(t.checkpoints, [&](const auto &c) { return c->pos > n_target; });
            reused = n_target;
            if (cp_target) local_.checkpoints_restored++;
        }
    } catch (const std::exception &) {
        engine_.rewind(t.seq, 0);  // no reuse then
        t.tokens.clear();
        t.checkpoints.clear();
        reused = 0;
    }

    try {
        std::unique_ptr<TokenConstraint> constraint;
        if (job->params.constraint) {
            if (!grammar_vocab_) grammar_vocab_ = grammar::Vocabulary::from_tokenizer(tok_);
            constraint = grammar::make_constraint(*job->params.constraint, grammar_vocab_);
        }
        t.act = std::make_unique<Active>(job, tok_, std::move(constraint));
    } catch (const std::exception &e) {
        local_.jobs_failed++;
        ends_.push_back({job, {Event::Kind::Error, {}, {}, {}, {}, e.what()}});
        return;
    }
    Active &a = *t.act;
    a.order = ++clock_;
    a.n_fed = size_t(reused);
    a.last_checkpoint = reused;
    const int64_t room = engine_.config().n_ctx - int64_t(job->prompt.size());
    a.max_new = job->params.max_tokens >= 0 ? std::min(job->params.max_tokens, room) : room;
    a.usage.prompt_tokens = int64_t(job->prompt.size());
    a.usage.cached_tokens = reused;
    a.t_start = now_s();
    local_.prompt_tokens += job->prompt.size();
    local_.prompt_tokens_reused += uint64_t(reused);
    t.last_used = clock_;
}

void Scheduler::release(Slot &s) {
    s.last.n_prompt = int64_t(s.act->job->prompt.size());
    s.last.n_prompt_reused = s.act->usage.cached_tokens;
    s.last.n_prompt_computed = int64_t(s.act->n_fed) - s.act->usage.cached_tokens;
    s.last.n_generated = int64_t(s.act->generated.size());
    s.act.reset();
    s.last_used = ++clock_;
}

void Scheduler::finish(Slot &s, const char *reason) {
    Active &a = *s.act;
    Event e;
    e.kind = Event::Kind::Done;
    e.finish_reason = reason;
    e.step = local_.steps;
    e.usage = a.usage;
    e.usage.completion_tokens = int64_t(a.generated.size());
    e.usage.gen_ms = a.t_first > 0 ? (now_s() - a.t_first) * 1e3 : 0;
    local_.jobs_done++;
    ends_.push_back({a.job, std::move(e)});
    release(s);
}

void Scheduler::fail_job(Slot &s, const std::string &what) {
    local_.jobs_failed++;
    ends_.push_back({s.act->job, {Event::Kind::Error, {}, {}, {}, {}, what}});
    try {
        engine_.rewind(s.seq, 0);
    } catch (const std::exception &) {
    }
    s.tokens.clear();
    s.checkpoints.clear();
    release(s);
}

void Scheduler::take_checkpoint(Slot &s) {
    auto cp = std::make_shared<StateCheckpoint>(engine_.checkpoint(s.seq));
    std::erase_if(s.checkpoints, [&](const auto &c) { return c->pos >= cp->pos; });
    s.checkpoints.push_back(std::move(cp));
    local_.checkpoints_taken++;
    // Over the limit: drop the checkpoint (never the newest) whose neighbours are closest, so they stay spread out
    // over the whole sequence: early ones serve shared system prompts, late ones the same conversation.
    while (int32_t(s.checkpoints.size()) > std::max(cfg_.max_checkpoints, 1)) {
        size_t drop = 0;
        int64_t best = INT64_MAX;
        for (size_t i = 0; i + 1 < s.checkpoints.size(); i++) {
            const int64_t prev = i == 0 ? 0 : s.checkpoints[i - 1]->pos;
            const int64_t gap = s.checkpoints[i + 1]->pos - prev;
            if (gap < best) {
                best = gap;
                drop = i;
            }
        }
        s.checkpoints.erase(s.checkpoints.begin() + int64_t(drop));
    }
}

void Scheduler::after_prompt_chunk(Slot &s) {
    Active &a = *s.act;
    if (!engine_.has_recurrent() || !engine_.can_rewind() || cfg_.max_checkpoints <= 0 || !cfg_.prefix_reuse) return;
    const int64_t pos = int64_t(s.tokens.size());
    if (a.n_fed == a.job->prompt.size() || pos - a.last_checkpoint >= cfg_.checkpoint_every) {
        take_checkpoint(s);
        a.last_checkpoint = pos;
    }
}

void Scheduler::emit_token(Slot &s, int32_t token, double now) {
    Active &a = *s.act;
    const GenParams &p = a.job->params;
    if (a.t_first == 0) a.t_first = now;
    if (p.top_logprobs >= 0) {
        const std::vector<float> &lp = a.sampler.last_logprobs();
        TokenLogprob t;
        t.id = token;
        t.logprob = lp[size_t(token)];
        // the top_logprobs best by log-probability, ties to the lower id
        for (int32_t id : best_candidates(lp.data(), nullptr, int64_t(lp.size()), size_t(p.top_logprobs)))
            t.top.emplace_back(id, lp[size_t(id)]);
        a.logprobs.push_back(std::move(t));
    }
    a.generated.push_back(token);
    local_.generated_tokens++;

    auto send = [&](std::string text) {
        if (text.empty() && a.logprobs.empty()) return;
        Event e;
        e.text = std::move(text);
        e.tokens = std::move(a.logprobs);
        e.step = local_.steps;
        a.logprobs.clear();
        a.job->out.push(std::move(e));
    };
    auto rest = [&] {  // everything still held back, at the end of the output
        std::string t = a.stopper.push(a.decoder.flush());
        if (!a.stopper.stopped()) t += a.stopper.flush();
        return t;
    };

    if (!p.ignore_eos && tok_.is_eog(token)) {
        send(rest());
        return finish(s, "stop");
    }
    std::string text = a.stopper.push(a.decoder.push(token));
    if (a.stopper.stopped()) {
        send(std::move(text));
        return finish(s, "stop");
    }
    if (int64_t(a.generated.size()) >= a.max_new) {
        text += rest();
        send(std::move(text));
        return finish(s, a.stopper.stopped() ? "stop" : "length");
    }
    send(std::move(text));
    a.next = token;
}

void Scheduler::decode(const std::vector<SeqInput> &inputs, std::vector<std::vector<float>> &logits,
                       std::vector<int32_t> *ids) {
    if (cfg_.fail_token >= 0)
        for (const SeqInput &in : inputs)
            if (std::find(in.tokens.begin(), in.tokens.end(), cfg_.fail_token) != in.tokens.end())
                fail("injected failure on token %d (test hook)", cfg_.fail_token);  // before the engine: no change
    if (ids)
        engine_.decode_argmax(inputs, *ids);
    else
        engine_.decode(inputs, logits);
}

void Scheduler::step() {
    // New jobs into free slots; cancelled ones out of the queue.
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::lock_guard<std::mutex> lock(mu_);
            for (auto it = queue_.begin(); it != queue_.end();)
                if ((*it)->cancelled) {
                    (*it)->finished = true;
                    local_.jobs_cancelled++;
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            const bool free_slot = std::any_of(slots_.begin(), slots_.end(), [](const auto &s) { return !s->act; });
            if (queue_.empty() || !free_slot) break;
            job = std::move(queue_.front());
            queue_.pop_front();
        }
        admit(std::move(job));
    }
    for (auto &s : slots_)
        if (s->act && s->act->job->cancelled) {
            s->act->job->finished = true;
            local_.jobs_cancelled++;
            release(*s);
        }

    // This step's work: the next token of every generating job, then prompt chunks in admission order.
    std::vector<Slot *> order;
    for (auto &s : slots_)
        if (s->act) order.push_back(s.get());
    std::sort(order.begin(), order.end(), [](Slot *a, Slot *b) { return a->act->order < b->act->order; });
    int64_t budget = engine_.config().n_batch;
    std::vector<SeqInput> inputs;
    std::vector<Slot *> who;
    for (Slot *s : order)
        if (!s->act->prefill) {
            inputs.push_back({s->seq, {s->act->next}, false});
            who.push_back(s);
            budget--;
        }
    bool any_prefill = false;
    for (Slot *s : order) {
        Active &a = *s->act;
        if (!a.prefill) continue;
        int64_t n = std::min({int64_t(a.job->prompt.size() - a.n_fed), cfg_.chunk, budget});
        if (n <= 0) {
            if (any_prefill) break;
            n = 1;  // always some progress on prompts, even when generating jobs fill the budget
        }
        any_prefill = true;
        inputs.push_back({s->seq,
                          std::vector<int32_t>(a.job->prompt.begin() + int64_t(a.n_fed),
                                               a.job->prompt.begin() + int64_t(a.n_fed) + n),
                          false});
        who.push_back(s);
        budget -= n;
    }

    if (!inputs.empty()) {
        const double t0 = now_s();
        // Where every job's pick is the arg-max of its logits (greedy, no penalty, grammar, logit bias or
        // log-probabilities), the engine picks where the logits are: on a GPU an id a sequence crosses the bus.
        bool picks = true;
        for (const Slot *s : who) {
            const Active &a = *s->act;
            picks =
                picks && a.sampler.picks_argmax() && a.job->params.logit_bias.empty() && a.job->params.top_logprobs < 0;
        }
        std::vector<std::vector<float>> logits;
        std::vector<int32_t> ids;
        std::vector<bool> ok(inputs.size(), true);
        try {
            decode(inputs, logits, picks ? &ids : nullptr);
        } catch (const std::exception &e) {
            // Find which inputs fail: an invalid input changes no sequence, so the others can run alone.
            logits.assign(inputs.size(), {});
            ids.assign(inputs.size(), -1);
            for (size_t i = 0; i < inputs.size(); i++) {
                Slot &s = *who[i];
                if (engine_.seq_len(s.seq) != int64_t(s.tokens.size())) {
                    ok[i] = false;
                    continue;
                }
                try {
                    std::vector<std::vector<float>> one;
                    std::vector<int32_t> one_id;
                    decode({inputs[i]}, one, picks ? &one_id : nullptr);
                    if (picks)
                        ids[i] = one_id[0];
                    else
                        logits[i] = std::move(one[0]);
                } catch (const std::exception &) {
                    ok[i] = false;
                }
            }
            for (size_t i = 0; i < inputs.size(); i++)
                if (!ok[i]) fail_job(*who[i], std::string("the engine failed on this request: ") + e.what());
        }
        const double t1 = now_s();
        local_.steps++;
        uint64_t n_step = 0;
        for (const SeqInput &in : inputs) n_step += in.tokens.size();
        local_.max_step_tokens = std::max(local_.max_step_tokens, n_step);
        local_.busy_seconds += t1 - t0;
        for (size_t i = 0; i < inputs.size(); i++) {
            if (!ok[i]) continue;
            Slot &s = *who[i];
            Active &a = *s.act;
            local_.step_tokens += inputs[i].tokens.size();
            s.tokens.insert(s.tokens.end(), inputs[i].tokens.begin(), inputs[i].tokens.end());
            try {
                if (a.prefill) {
                    local_.prompt_tokens_computed += inputs[i].tokens.size();
                    a.n_fed += inputs[i].tokens.size();
                    after_prompt_chunk(s);
                    if (a.n_fed < a.job->prompt.size()) continue;
                    a.prefill = false;
                    a.usage.prompt_ms = (t1 - a.t_start) * 1e3;
                }
                int32_t token = -1;
                if (picks) {
                    token = ids[i];
                } else {
                    for (auto [id, bias] : a.job->params.logit_bias) logits[i][size_t(id)] += bias;
                    token = a.sampler.sample(logits[i].data(), engine_.n_vocab(), a.generated);
                }
                emit_token(s, token, t1);
            } catch (const std::exception &e) {
                if (s.act) fail_job(s, e.what());
            }
        }
    }

    // Publish the counters.
    int64_t active_kv = 0, cached_kv = 0, running = 0;
    for (auto &s : slots_) {
        cached_kv += int64_t(s->tokens.size());
        if (s->act) {
            active_kv += int64_t(s->tokens.size());
            running++;
        }
    }
    std::vector<SlotState> slot_states;
    for (size_t i = 0; i < slots_.size(); i++) {
        const Slot &s = *slots_[i];
        SlotState st;
        st.id = int32_t(i);
        st.n_cached = int64_t(s.tokens.size());
        st.running = bool(s.act);
        if (s.act) {
            st.n_prompt = int64_t(s.act->job->prompt.size());
            st.n_prompt_reused = s.act->usage.cached_tokens;
            st.n_prompt_computed = int64_t(s.act->n_fed) - s.act->usage.cached_tokens;
            st.n_generated = int64_t(s.act->generated.size());
        } else {
            st.n_prompt = s.last.n_prompt;
            st.n_prompt_reused = s.last.n_prompt_reused;
            st.n_prompt_computed = s.last.n_prompt_computed;
            st.n_generated = s.last.n_generated;
        }
        slot_states.push_back(st);
    }
    ExpertCacheStats bs = engine_.expert_stats();
    {
        std::lock_guard<std::mutex> lock(mu_);
        const uint64_t rejected = stats_.jobs_rejected;
        const double t = now_s();
        stats_ = local_;
        stats_.jobs_rejected = rejected;
        stats_.queued = int64_t(queue_.size());
        stats_.running = running;
        stats_.kv_tokens_active = active_kv;
        stats_.kv_tokens_cached = cached_kv;
        stats_.kv_capacity = int64_t(slots_.size()) * engine_.config().n_ctx;
        stats_.backend = bs;
        stats_.slots = std::move(slot_states);
        rate_samples_.push_back({t, local_.generated_tokens, local_.prompt_tokens_computed, bs.expert_cache_hits,
                                 bs.expert_cache_misses, bs.hybrid.host_experts, bs.bytes_streamed});
        while (rate_samples_.size() > 2 && rate_samples_[1].t < t - kRateWindow) rate_samples_.pop_front();
    }
    for (auto &[job, e] : ends_) {
        job->out.push(std::move(e));
        job->finished = true;
    }
    ends_.clear();
}

}  // namespace strata::server
