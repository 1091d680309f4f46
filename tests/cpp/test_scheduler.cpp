// The server's scheduler on tiny synthetic models: engine checkpoints and rewinds that prefix reuse relies on, and
// the scheduler itself (continuous batching equals one request at a time, prefix reuse, cancellation, engine
// failures, the bounded queue).
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "synth/synth.h"
#include "runtime/engine.h"
#include "server/scheduler.h"
#include "synth_cache.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::server;

namespace {

// ---- engine rewinds --------------------------------------------------------------------------------------------

std::string synth_model(const std::string &preset) {
    SynthOptions o;
    o.preset = preset;
    o.seed = 11;
    return test::cached_synth_model("serve-" + preset, o);
}

std::vector<int32_t> tokens_of(int n, int salt) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; i++) t.push_back(int32_t((i * 31 + salt * 17 + 3) % 250));
    return t;
}

std::unique_ptr<Engine> engine_for(const std::string &preset, int32_t slots, int64_t n_batch = 16) {
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.n_seq_max = slots;
    cfg.n_ctx = 256;
    cfg.n_batch = n_batch;
    return make_cpu_engine(synth_model(preset), cfg);
}

class Rewind : public ::testing::TestWithParam<const char *> {};

TEST_P(Rewind, RestoredCheckpointContinuesExactly) {
    auto e = engine_for(GetParam(), 2);
    const std::vector<int32_t> all = tokens_of(40, 1);
    const std::vector<int32_t> head(all.begin(), all.begin() + 24), tail(all.begin() + 24, all.end());
    std::vector<std::vector<float>> ref, out;
    const int32_t s = e->new_sequence();
    e->decode({{s, head, false}}, out);
    StateCheckpoint cp = e->checkpoint(s);
    EXPECT_EQ(cp.pos, 24);
    EXPECT_EQ(cp.data.empty(), !e->has_recurrent());
    e->decode({{s, tail, true}}, ref);
    // Something else after the checkpoint, then back to it: the same tail gives the same logits, bit for bit.
    e->decode({{s, tokens_of(9, 5), false}}, out);
    e->rewind(s, 24, &cp);
    EXPECT_EQ(e->seq_len(s), 24);
    e->decode({{s, tail, true}}, out);
    EXPECT_EQ(out[0], ref[0]);
    // Another sequence gets the prefix copied.
    const int32_t d = e->new_sequence();
    e->decode({{d, tokens_of(30, 9), false}}, out);
    e->copy_prefix(s, d, 24, &cp);
    EXPECT_EQ(e->seq_len(d), 24);
    e->decode({{d, tail, true}}, out);
    EXPECT_EQ(out[0], ref[0]);
    // A recurrent model cannot be cut back without the state; a wrong checkpoint is refused, nothing changes.
    if (e->has_recurrent()) {
        EXPECT_THROW(e->rewind(s, 30), Error);
        EXPECT_THROW(e->rewind(s, 30, &cp), Error);
        EXPECT_EQ(e->seq_len(s), 40);
    } else {
        EXPECT_NO_THROW(e->rewind(s, 30));
    }
    EXPECT_THROW(e->rewind(s, 100, &cp), Error);
    e->rewind(s, 0);
    EXPECT_EQ(e->seq_len(s), 0);
}

INSTANTIATE_TEST_SUITE_P(Tiny, Rewind, ::testing::Values("tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35moe"),
                         [](const auto &info) {
                             std::string n = info.param;
                             for (char &c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

// ---- scheduler ---------------------------------------------------------------------------------------------------

struct Result {
    std::string text, finish, error;
    std::vector<int32_t> ids;
    Usage usage;
    bool shutting_down = false;
};

Result collect(Job &job) {
    Result r;
    Event e;
    for (;;) {
        if (!job.out.pop(e, std::chrono::seconds(60))) {
            r.error = "timeout";
            return r;
        }
        r.text += e.text;
        for (auto &t : e.tokens) r.ids.push_back(t.id);
        if (e.kind == Event::Kind::Done) {
            r.finish = e.finish_reason;
            r.usage = e.usage;
            return r;
        }
        if (e.kind == Event::Kind::Error) {
            r.error = e.error;
            r.shutting_down = e.shutting_down;
            return r;
        }
    }
}

std::shared_ptr<Job> greedy_job(std::vector<int32_t> prompt, int64_t max_tokens) {
    auto j = std::make_shared<Job>();
    j->prompt = std::move(prompt);
    j->params.sampling.temperature = 0;
    j->params.max_tokens = max_tokens;
    j->params.ignore_eos = true;
    j->params.top_logprobs = 0;  // to see the ids
    return j;
}

class SchedulerTest : public ::testing::TestWithParam<const char *> {};

TEST_P(SchedulerTest, ConcurrentEqualsOneAtATime) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 7; i++) prompts.push_back(tokens_of(3 + 11 * i, i));
    prompts.push_back(prompts[2]);  // the same prompt twice at once
    std::vector<Result> alone;
    {
        auto e = engine_for(GetParam(), 1);
        auto tok = Tokenizer::from_gguf(*e->model().file);
        SchedulerConfig c;
        c.prefix_reuse = false;
        Scheduler s(*e, *tok, c);
        s.start();
        for (auto &p : prompts) {
            auto j = greedy_job(p, 10);
            ASSERT_TRUE(s.submit(j));
            alone.push_back(collect(*j));
            ASSERT_EQ(alone.back().error, "");
            EXPECT_EQ(alone.back().ids.size(), 10u);
            EXPECT_EQ(alone.back().finish, "length");
        }
    }
    auto e = engine_for(GetParam(), 3);  // fewer slots than requests: some wait in the queue
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto &p : prompts) {
        jobs.push_back(greedy_job(p, 10));
        ASSERT_TRUE(s.submit(jobs.back()));
    }
    for (size_t i = 0; i < jobs.size(); i++) {
        Result r = collect(*jobs[i]);
        ASSERT_EQ(r.error, "");
        EXPECT_EQ(r.ids, alone[i].ids) << "request " << i;
        EXPECT_EQ(r.text, alone[i].text) << "request " << i;
        EXPECT_EQ(r.usage.prompt_tokens, int64_t(prompts[i].size()));
        EXPECT_EQ(r.usage.completion_tokens, 10);
    }
    SchedulerStats st = s.stats();
    for (int i = 0; i < 200 && st.jobs_done < jobs.size(); i++) {  // published at the end of the step
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        st = s.stats();
    }
    EXPECT_EQ(st.jobs_done, jobs.size());
    EXPECT_LT(st.steps, 8u * 10u);  // requests shared steps
}

// Greedy jobs that ask for no log-probabilities take the engine's arg-max picks (decode_argmax: ids, not logits,
// from the engine); with log-probabilities they sample from the logits on the host. The same text either way,
// alone and with both kinds sharing steps.
TEST_P(SchedulerTest, GreedyPicksOnTheEngineAreTheSamplers) {
    auto e = engine_for(GetParam(), 4);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    SchedulerConfig c;
    c.prefix_reuse = false;
    Scheduler s(*e, *tok, c);
    s.start();
    std::vector<std::vector<int32_t>> prompts = {tokens_of(7, 1), tokens_of(19, 2)};
    for (auto &p : prompts) {
        auto host = greedy_job(p, 12), picks = greedy_job(p, 12);
        picks->params.top_logprobs = -1;
        ASSERT_TRUE(s.submit(host));
        const Result want = collect(*host);
        ASSERT_TRUE(s.submit(picks));
        const Result got = collect(*picks);
        ASSERT_EQ(want.error, "");
        ASSERT_EQ(got.error, "");
        EXPECT_EQ(want.ids.size(), 12u);
        EXPECT_EQ(got.text, want.text);
        EXPECT_EQ(got.usage.completion_tokens, 12);
        // both at once (the step samples on the host for both), and two picking ones at once
        auto a = greedy_job(p, 12), b = greedy_job(p, 12), d = greedy_job(p, 12);
        b->params.top_logprobs = d->params.top_logprobs = -1;
        ASSERT_TRUE(s.submit(a));
        ASSERT_TRUE(s.submit(b));
        ASSERT_TRUE(s.submit(d));
        const Result ra = collect(*a), rb = collect(*b), rd = collect(*d);
        EXPECT_EQ(ra.ids, want.ids);
        EXPECT_EQ(rb.text, want.text);
        EXPECT_EQ(rd.text, want.text);
    }
}

TEST_P(SchedulerTest, PrefixReuseGivesTheSameOutput) {
    auto e = engine_for(GetParam(), 2);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    const std::vector<int32_t> first = tokens_of(50, 3);
    auto j1 = greedy_job(first, 6);
    ASSERT_TRUE(s.submit(j1));
    Result r1 = collect(*j1);
    EXPECT_EQ(r1.usage.cached_tokens, 0);
    // The conversation goes on: the next prompt starts with the first prompt and the reply.
    std::vector<int32_t> second = first;
    second.insert(second.end(), r1.ids.begin(), r1.ids.end());
    for (int32_t t : tokens_of(20, 8)) second.push_back(t);
    auto j2 = greedy_job(second, 6);
    ASSERT_TRUE(s.submit(j2));
    Result r2 = collect(*j2);
    EXPECT_GE(r2.usage.cached_tokens, 48) << "the first prompt (50) less at most one chunk boundary";
    // The same request once more: reused up to a checkpoint or the last token.
    auto j3 = greedy_job(second, 6);
    ASSERT_TRUE(s.submit(j3));
    Result r3 = collect(*j3);
    EXPECT_GT(r3.usage.cached_tokens, 0);
    EXPECT_EQ(r3.ids, r2.ids);

    // Reference without any reuse.
    auto e2 = engine_for(GetParam(), 1);
    SchedulerConfig c;
    c.prefix_reuse = false;
    Scheduler fresh(*e2, *tok, c);
    fresh.start();
    auto k2 = greedy_job(second, 6);
    ASSERT_TRUE(fresh.submit(k2));
    Result f2 = collect(*k2);
    EXPECT_EQ(f2.usage.cached_tokens, 0);
    EXPECT_EQ(r2.ids, f2.ids);
    if (e->has_recurrent()) {
        EXPECT_GT(s.stats().checkpoints_restored, 0u);
    }
    EXPECT_GT(s.stats().prompt_tokens_reused, 0u);
}

TEST_P(SchedulerTest, SharedPrefixIsCopiedFromABusySlot) {
    auto e = engine_for(GetParam(), 2);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    const std::vector<int32_t> system = tokens_of(40, 4);
    auto long_job = greedy_job(system, 200);  // keeps its slot busy
    ASSERT_TRUE(s.submit(long_job));
    Event ev;
    ASSERT_TRUE(long_job->out.pop(ev, std::chrono::seconds(60)));  // it has read its prompt
    std::vector<int32_t> p = system;
    for (int32_t t : tokens_of(5, 6)) p.push_back(t);
    auto j = greedy_job(p, 4);
    ASSERT_TRUE(s.submit(j));
    Result r = collect(*j);
    EXPECT_GE(r.usage.cached_tokens, 32);  // from the other slot (a checkpoint at a chunk boundary at least)
    long_job->cancelled = true;
    s.notify();
}

TEST_P(SchedulerTest, StopStringsCutTheText) {
    auto e = engine_for(GetParam(), 1);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    auto j = greedy_job(tokens_of(12, 2), 24);
    j->params.top_logprobs = -1;
    ASSERT_TRUE(s.submit(j));
    Result full = collect(*j);
    ASSERT_GE(full.text.size(), 8u);
    const std::string stop = full.text.substr(full.text.size() / 2, 3);
    auto k = greedy_job(tokens_of(12, 2), 24);
    k->params.stop = {stop};
    ASSERT_TRUE(s.submit(k));
    Result cut = collect(*k);
    EXPECT_EQ(cut.finish, "stop");
    EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
    EXPECT_LT(cut.usage.completion_tokens, 24);
}

TEST_P(SchedulerTest, CancelledJobFreesItsSlot) {
    auto e = engine_for(GetParam(), 1);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    auto j = greedy_job(tokens_of(8, 1), 250);
    ASSERT_TRUE(s.submit(j));
    Event ev;
    ASSERT_TRUE(j->out.pop(ev, std::chrono::seconds(60)));
    j->cancelled = true;
    s.notify();
    auto k = greedy_job(tokens_of(8, 2), 3);  // the only slot is free again
    ASSERT_TRUE(s.submit(k));
    Result r = collect(*k);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.ids.size(), 3u);
    EXPECT_TRUE(j->finished);
    EXPECT_EQ(s.stats().jobs_cancelled, 1u);
}

TEST_P(SchedulerTest, ContextEndFinishesWithLength) {
    auto e = engine_for(GetParam(), 1);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    auto j = greedy_job(tokens_of(250, 1), -1);  // n_ctx 256: room for 6
    ASSERT_TRUE(s.submit(j));
    Result r = collect(*j);
    EXPECT_EQ(r.finish, "length");
    EXPECT_EQ(r.usage.completion_tokens, 6);
}

INSTANTIATE_TEST_SUITE_P(Tiny, SchedulerTest, ::testing::Values("tiny-qwen3moe", "tiny-qwen3next"),
                         [](const auto &info) {
                             std::string n = info.param;
                             for (char &c : n)
                                 if (c == '-') c = '_';
                             return n;
                         });

TEST(Scheduler, LongPromptDelaysOthersByOneChunkPerStep) {
    auto e = engine_for("tiny-qwen3moe", 2, 16);  // 16 tokens per step
    auto tok = Tokenizer::from_gguf(*e->model().file);
    Scheduler s(*e, *tok, {});
    s.start();
    auto a = greedy_job(tokens_of(4, 1), 60);
    ASSERT_TRUE(s.submit(a));
    std::vector<Event> a_events(1);
    ASSERT_TRUE(a->out.pop(a_events[0], std::chrono::seconds(60)));  // a is generating
    auto b = greedy_job(tokens_of(200, 2), 2);
    ASSERT_TRUE(s.submit(b));
    uint64_t b_first = 0;
    for (Event ev; b->out.pop(ev, std::chrono::seconds(60));) {
        if (!b_first) b_first = ev.step;
        if (ev.kind != Event::Kind::Text) break;
    }
    for (Event ev; a->out.pop(ev, std::chrono::seconds(60));) {
        a_events.push_back(ev);
        if (ev.kind != Event::Kind::Text) break;
    }
    ASSERT_EQ(a_events.back().kind, Event::Kind::Done);
    // a got a token in every step, b's 200 prompt tokens took at least 200 / 15 steps beside it, and no step held
    // more than 16 tokens.
    for (size_t i = 1; i + 1 < a_events.size(); i++) EXPECT_EQ(a_events[i].step, a_events[i - 1].step + 1);
    EXPECT_GE(b_first, a_events[0].step + 13);
    EXPECT_LE(s.stats().max_step_tokens, 16u);
}

TEST(Scheduler, EngineFailureFailsOnlyThatRequest) {
    auto e = engine_for("tiny-qwen3moe", 2);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    SchedulerConfig c;
    c.fail_token = 7;  // the test hook: the engine fails on an input holding token 7
    Scheduler s(*e, *tok, c);
    s.start();
    std::vector<int32_t> healthy = tokens_of(20, 3);
    std::erase(healthy, c.fail_token);
    auto ref = greedy_job(healthy, 12);
    ASSERT_TRUE(s.submit(ref));
    const Result alone = collect(*ref);
    ASSERT_EQ(alone.error, "");

    // One fails while reading its prompt, one after its first token, beside a healthy one.
    auto in_prompt = greedy_job({1, 2, c.fail_token, 3}, 12);
    auto after_first = greedy_job(tokens_of(6, 4), 12);
    after_first->params.logit_bias = {{c.fail_token, 100.0f}};  // greedy: the first token is the failing one
    auto good = greedy_job(healthy, 12);
    for (auto &j : {in_prompt, after_first, good}) ASSERT_TRUE(s.submit(j));
    const Result a = collect(*in_prompt), b = collect(*after_first), g = collect(*good);
    EXPECT_NE(a.error.find("test hook"), std::string::npos) << a.error;
    EXPECT_FALSE(a.shutting_down) << "a failed request is the server's error (500), not a shutdown";
    EXPECT_TRUE(a.ids.empty());
    EXPECT_NE(b.error.find("test hook"), std::string::npos) << b.error;
    EXPECT_EQ(b.ids, std::vector<int32_t>{c.fail_token});
    EXPECT_EQ(g.error, "");
    EXPECT_EQ(g.ids, alone.ids);
    EXPECT_TRUE(in_prompt->finished && after_first->finished);
    EXPECT_EQ(s.stats().jobs_failed, 2u);
}

TEST(Scheduler, BoundedQueueRefusesAndShutdownAnswersEveryone) {
    auto e = engine_for("tiny-qwen3moe", 1);
    auto tok = Tokenizer::from_gguf(*e->model().file);
    SchedulerConfig c;
    c.max_queue = 2;
    Scheduler s(*e, *tok, c);  // not started: nothing leaves the queue
    auto a = greedy_job(tokens_of(4, 1), 3), b = greedy_job(tokens_of(4, 2), 3), d = greedy_job(tokens_of(4, 3), 3);
    EXPECT_TRUE(s.submit(a));
    EXPECT_TRUE(s.submit(b));
    EXPECT_FALSE(s.submit(d));
    EXPECT_EQ(s.stats().jobs_rejected, 1u);
    s.stop();
    for (auto *j : {a.get(), b.get()}) {
        const Result r = collect(*j);
        EXPECT_EQ(r.error, "the server is shutting down");
        EXPECT_TRUE(r.shutting_down) << "the HTTP layer answers these 503, not 500";
    }
}

}  // namespace
