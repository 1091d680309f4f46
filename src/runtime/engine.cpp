// Sequence bookkeeping and the packing of inputs into forward passes.
#include "runtime/engine.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <mutex>

#include "core/env.h"
#include "core/error.h"
#include "core/threads.h"
#include "runtime/part_pipeline.h"
#include "runtime/sampler.h"
#include "strata/placement_plan.h"
#include "strata/split_plan.h"
#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace strata {

namespace {
void check_config(const EngineConfig &cfg) {
    if (cfg.n_seq_max <= 0) fail("the number of parallel sequences must be at least 1 (got %d)", cfg.n_seq_max);
    if (cfg.n_ctx <= 0) fail("the context size must be at least 1 (got %lld)", (long long)cfg.n_ctx);
    if (cfg.n_batch <= 0) fail("the batch size must be at least 1 (got %lld)", (long long)cfg.n_batch);
}
}  // namespace

Engine::Engine(std::unique_ptr<Model> model, std::unique_ptr<Backend> backend, const EngineConfig &cfg)
    : model_(std::move(model)), cfg_(cfg) {
    check_config(cfg_);
    add_part(std::move(backend), 0, model_->hp.n_layer, cfg_.vram_budget);
    seq_len_.assign(size_t(cfg_.n_seq_max), -1);
    state_lost_.assign(size_t(cfg_.n_seq_max), 0);
}

Engine::Engine(std::unique_ptr<Model> model, std::vector<std::unique_ptr<Backend>> backends,
               const std::vector<int64_t> &layers, const EngineConfig &cfg)
    : model_(std::move(model)), cfg_(cfg) {
    check_config(cfg_);
    const int64_t n = model_->hp.n_layer;
    if (backends.empty() || layers.size() != backends.size() + 1 || layers.front() != 0 || layers.back() != n)
        fail("a split model needs one run of layers per participant, from 0 to %lld", (long long)n);
    for (size_t i = 0; i < backends.size(); i++) {
        if (layers[i + 1] <= layers[i])
            fail("participant %zu of the split runs no layers ([%lld, %lld))", i, (long long)layers[i],
                 (long long)layers[i + 1]);
        const uint64_t budget = i < cfg_.parts.size() ? cfg_.parts[i].vram_budget : cfg_.vram_budget;
        add_part(std::move(backends[i]), layers[i], layers[i + 1], budget);
    }
    seq_len_.assign(size_t(cfg_.n_seq_max), -1);
    state_lost_.assign(size_t(cfg_.n_seq_max), 0);
}

void Engine::add_part(std::unique_ptr<Backend> backend, int64_t l0, int64_t l1, uint64_t vram_budget) {
    Part p;
    const bool whole = l0 == 0 && l1 == model_->hp.n_layer;
    if (!whole) p.model = model_part(*model_, l0, l1);
    p.backend = std::move(backend);
    p.l0 = l0, p.l1 = l1;
    Model &m = whole ? *model_ : *p.model;
    StrataOptions so;
    so.plan.vram_budget = vram_budget;
    so.plan.expert_slots = cfg_.expert_slots;
    so.plan.scratch_bytes = cfg_.scratch_bytes;
    so.plan.chunk_tokens = cfg_.n_batch;
    so.plan.loan_floor_slots = cfg_.loan_floor_slots;
    so.plan.logits = l1 == model_->hp.n_layer;
    so.plan = plan_options_from_env(so.plan);
    if (cfg_.host_mem == HostMem::Mmap) so.plan.host_pinned_copy = false;
    if (cfg_.host_mem == HostMem::Pinned) so.plan.host_pinned_copy = so.plan.require_pinned_copy = true;
    so.n_seqs = cfg_.n_seq_max;
    so.n_ctx = cfg_.n_ctx;
    so.kv_type = cfg_.kv_type;
    so.l0 = l0, so.l1 = l1;
    so.slot_policy = cfg_.expert_cache_policy;
    so.hybrid.share = cfg_.cpu_share;
    so.hybrid.threads = cfg_.cpu_threads;
    if (cfg_.log && !whole) {
        const std::string head = strfmt("part %zu (layers %lld-%lld): ", parts_.size(), (long long)l0,
                                        (long long)l1 - 1);
        const auto log = cfg_.log;
        so.log = [log, head](const std::string &line) { log(head + line); };
    } else {
        so.log = cfg_.log;
    }
    p.strata = std::make_unique<MemoryStrata>(*p.backend, m, so);
    parts_.push_back(std::move(p));
}

ExpertProfile Engine::expert_profile() const {
    ExpertProfile p;
    p.arch = model_->hp.arch_name;
    p.n_layer = model_->hp.n_layer;
    p.n_expert = model_->hp.n_expert;
    p.scores.resize(size_t(p.n_layer));
    for (const Part &part : parts_) {
        const ExpertSlotTable *t = part.strata->slots();
        if (!t || t->all_resident()) continue;
        const std::vector<std::vector<double>> &f = t->favourite_scores();
        for (size_t il = 0; il < f.size() && il < p.scores.size(); il++)
            if (!f[il].empty()) p.scores[il] = f[il];
    }
    return p;
}

void Engine::seed_expert_profile(const ExpertProfile &p) {
    const HParams &hp = model_->hp;
    if (p.arch != hp.arch_name || p.n_layer != hp.n_layer || p.n_expert != hp.n_expert)
        fail("expert profile of a %s model with %lld layers of %lld experts: this model is %s with %lld layers of "
             "%lld experts",
             p.arch.c_str(), (long long)p.n_layer, (long long)p.n_expert, hp.arch_name.c_str(), (long long)hp.n_layer,
             (long long)hp.n_expert);
    for (Part &part : parts_) {
        // each participant takes its own layers' scores (its table has none for the others')
        std::vector<std::vector<double>> mine(p.scores.size());
        for (size_t il = 0; il < p.scores.size(); il++)
            if (int64_t(il) >= part.l0 && int64_t(il) < part.l1) mine[il] = p.scores[il];
        part.strata->seed_favourites(mine);
    }
}

ExpertCacheStats Engine::expert_stats() const {
    ExpertCacheStats s = parts_[0].strata->stats();
    for (size_t i = 1; i < parts_.size(); i++) {
        const ExpertCacheStats o = parts_[i].strata->stats();
        s.n_slots += o.n_slots;
        s.n_experts += o.n_experts;
        s.expert_cache_hits += o.expert_cache_hits;
        s.expert_cache_misses += o.expert_cache_misses;
        s.bytes_streamed += o.bytes_streamed;
        s.mapped_misses += o.mapped_misses;
        s.mapped_admitted += o.mapped_admitted;
        s.favourite_fills += o.favourite_fills;
        PrefetchStats &f = s.prefetch;
        const PrefetchStats &g = o.prefetch;
        f.picks += g.picks, f.predicted += g.predicted, f.prefetched += g.prefetched;
        f.streamed_next += g.streamed_next, f.streamed_next_used += g.streamed_next_used;
        f.recall_predicted += g.recall_predicted, f.recall_missed += g.recall_missed;
        f.cost_full += g.cost_full, f.cost_predicted += g.cost_predicted;
    }
    return s;
}

size_t Engine::recurrent_state_bytes() const {
    size_t n = 0;
    for (const Part &p : parts_) {
        const size_t b = p.backend->recurrent_state_bytes();
        // a part with recurrent layers whose backend cannot save them: no part's state can be restored
        bool recurrent = false;
        for (int64_t il = p.l0; il < p.l1; il++) recurrent = recurrent || model_->hp.is_recurrent(il);
        if (b == 0 && recurrent) return 0;
        n += b;
    }
    return n;
}

Engine::~Engine() = default;

void Engine::check_seq(int32_t seq) const {
    if (seq < 0 || seq >= cfg_.n_seq_max || seq_len_[size_t(seq)] < 0) fail("unknown sequence %d", seq);
}

int32_t Engine::new_sequence() {
    for (int32_t s = 0; s < cfg_.n_seq_max; s++)
        if (seq_len_[size_t(s)] < 0) {
            for (Part &p : parts_) p.backend->clear_seq(s);
            seq_len_[size_t(s)] = 0;
            state_lost_[size_t(s)] = 0;
            return s;
        }
    fail("all %d sequences are in use", cfg_.n_seq_max);
}

int32_t Engine::fork(int32_t seq) {
    check_seq(seq);
    int32_t dst = new_sequence();
    for (Part &p : parts_) p.backend->copy_seq(seq, dst, seq_len_[size_t(seq)]);
    seq_len_[size_t(dst)] = seq_len_[size_t(seq)];
    state_lost_[size_t(dst)] = state_lost_[size_t(seq)];
    return dst;
}

void Engine::drop(int32_t seq) {
    check_seq(seq);
    seq_len_[size_t(seq)] = -1;
    state_lost_[size_t(seq)] = 0;
}

int64_t Engine::seq_len(int32_t seq) const {
    check_seq(seq);
    return seq_len_[size_t(seq)];
}

int32_t Engine::n_free_slots() const {
    return int32_t(std::count(seq_len_.begin(), seq_len_.end(), int64_t(-1)));
}

StateCheckpoint Engine::checkpoint(int32_t seq) {
    check_seq(seq);
    StateCheckpoint cp;
    cp.pos = seq_len_[size_t(seq)];
    if (!has_recurrent()) return cp;
    if (state_lost_[size_t(seq)])
        fail("sequence %d lost its recurrent state in a failed pass: no checkpoint of it", seq);
    if (!can_rewind()) fail("the %s backend cannot save recurrent state", backend().name().c_str());
    cp.data.resize(recurrent_state_bytes());
    uint8_t *at = cp.data.data();
    for (Part &p : parts_) {  // the parts' states one after the other, in layer order (none where a part has none)
        const size_t b = p.backend->recurrent_state_bytes();
        if (b) p.backend->save_recurrent_state(seq, at);
        at += b;
    }
    return cp;
}

namespace {
// Checks a checkpoint for a cut to n_pos of a sequence of length len; returns whether it must be loaded.
bool need_state(const Engine &e, size_t state_bytes, int64_t n_pos, int64_t len, const StateCheckpoint *cp) {
    if (!e.has_recurrent() || n_pos == len || n_pos == 0) return false;
    if (!cp) fail("cutting a recurrent sequence back to %lld positions needs a checkpoint", (long long)n_pos);
    if (cp->pos != n_pos) fail("the checkpoint is at position %lld, not %lld", (long long)cp->pos, (long long)n_pos);
    if (cp->data.size() != state_bytes || cp->data.empty())
        fail("the checkpoint holds %zu bytes of state, the engine %zu", cp->data.size(), state_bytes);
    return true;
}
}  // namespace

void Engine::load_state(int32_t seq, const StateCheckpoint &cp) {
    const uint8_t *at = cp.data.data();
    for (Part &p : parts_) {
        const size_t b = p.backend->recurrent_state_bytes();
        if (b) p.backend->load_recurrent_state(seq, at);
        at += b;
    }
}

void Engine::rewind(int32_t seq, int64_t n_pos, const StateCheckpoint *cp) {
    check_seq(seq);
    const int64_t len = seq_len_[size_t(seq)];
    if (n_pos < 0 || n_pos > len)
        fail("sequence %d: cannot cut %lld positions back to %lld", seq, (long long)len, (long long)n_pos);
    const bool load = need_state(*this, recurrent_state_bytes(), n_pos, len, cp);
    if (n_pos == 0)
        for (Part &p : parts_) p.backend->clear_seq(seq);
    else if (load)
        load_state(seq, *cp);
    if (n_pos == 0 || load) state_lost_[size_t(seq)] = 0;
    seq_len_[size_t(seq)] = n_pos;
}

void Engine::copy_prefix(int32_t src, int32_t dst, int64_t n_pos, const StateCheckpoint *cp) {
    check_seq(src);
    check_seq(dst);
    const int64_t len = seq_len_[size_t(src)];
    if (n_pos < 0 || n_pos > len)
        fail("sequence %d holds %lld positions, not %lld to copy", src, (long long)len, (long long)n_pos);
    if (src == dst) return rewind(dst, n_pos, cp);
    const bool load = need_state(*this, recurrent_state_bytes(), n_pos, len, cp);
    if (n_pos == 0) {
        for (Part &p : parts_) p.backend->clear_seq(dst);
    } else {
        for (Part &p : parts_) p.backend->copy_seq(src, dst, n_pos);
        if (load) load_state(dst, *cp);
    }
    state_lost_[size_t(dst)] = n_pos == 0 || load ? 0 : state_lost_[size_t(src)];
    seq_len_[size_t(dst)] = n_pos;
}

void Engine::decode(const std::vector<SeqInput> &inputs, std::vector<std::vector<float>> &logits) {
    const int64_t n_vocab_ = n_vocab();
    // Every row is written (each input's last token, or all of them), so vectors the caller passes back are resized
    // in place rather than allocated and zeroed again.
    logits.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); i++)
        logits[i].resize(size_t((inputs[i].all_logits ? int64_t(inputs[i].tokens.size()) : 1) * n_vocab_));
    run_passes(inputs, [&](const float *row, size_t input, int64_t row_in_logits) {
        std::copy_n(row, n_vocab_, logits[input].data() + row_in_logits * n_vocab_);
    }, nullptr);
}

void Engine::decode_argmax(const std::vector<SeqInput> &inputs, std::vector<int32_t> &ids) {
    for (const SeqInput &in : inputs)
        if (in.all_logits) fail("sequence %d: decode_argmax gives one token an input, not every position's", in.seq);
    ids.assign(inputs.size(), -1);
    run_passes(inputs, nullptr, [&](int32_t id, size_t input) { ids[input] = id; });
}

int64_t Engine::decode_greedy(const std::vector<SeqInput> &inputs, int64_t max_steps, const GreedyTake &take) {
    for (const SeqInput &in : inputs)
        if (in.all_logits || in.tokens.size() != 1)
            fail("sequence %d: greedy decoding takes one token a sequence, not %zu%s", in.seq, in.tokens.size(),
                 in.all_logits ? " with every position's logits" : "");
    if (inputs.empty() || max_steps <= 0) return 0;
    // Ahead of the host: one participant (a split's parts hand the residual stream over on the host), no recurrent
    // state (a step run past the last taken would have changed it), nothing reading the passes' insides.
    static const bool ahead_on = env_switch("STRATA_DECODE_AHEAD", true);
    const bool ahead = ahead_on && parts_.size() == 1 && !has_recurrent() && !tracer_ && !observed_ &&
                       int64_t(inputs.size()) <= cfg_.n_batch;
    std::vector<SeqInput> step = inputs;
    std::vector<int32_t> ids(inputs.size(), -1);
    const size_t n = inputs.size();
    int64_t s = 0, own = 0;  // steps taken, of them as passes of their own
    while (s < max_steps) {
        // (where the experts' runner cannot go ahead now, under a budget, a step is the plain pass it always was)
        const bool now = ahead && parts_[0].strata->moe().runs_ahead();
        if (now) {
            // The steps the context leaves (the ordinary step below says why none is left), the batch as
            // run_passes would pack it: a row a sequence, in input order.
            int64_t room = max_steps - s;
            BatchInfo b;
            std::vector<int64_t> out_rows;
            std::vector<int32_t> tokens;
            bool ok = true;
            for (size_t i = 0; i < n && ok; i++) {
                const int32_t seq = step[i].seq;
                ok = seq >= 0 && seq < int32_t(seq_len_.size()) && seq_len_[size_t(seq)] >= 0 &&
                     !state_lost_[size_t(seq)];
                for (size_t j = 0; ok && j < i; j++) ok = step[j].seq != seq;
                if (!ok) break;
                const int32_t t = step[i].tokens[0];
                ok = t >= 0 && t < n_vocab();
                room = std::min(room, cfg_.n_ctx - seq_len_[size_t(seq)]);
                b.segs.push_back({seq, seq_len_[size_t(seq)], 1, int64_t(i)});
                out_rows.push_back(int64_t(i));
                tokens.push_back(t);
            }
            b.n_tokens = int64_t(n);
            bool go = true;
            int64_t got = 0;
            if (ok && room > 0) {
                pass_ids_.resize(n);
                Part &pt = parts_[0];
                got = forward_ahead(*pt.backend, pt.strata->moe(), tokens.data(), b, out_rows, pass_ids_.data(), room,
                                    [&](int64_t k, const int32_t *got_ids) {
                                        for (size_t i = 0; i < n; i++) seq_len_[size_t(step[i].seq)]++;
                                        ids.assign(got_ids, got_ids + n);
                                        go = take(s + k, ids);
                                        return go;
                                    });
            }
            if (got > 0) {
                s += got;
                if (!go) return s;
                for (size_t i = 0; i < n; i++) step[i].tokens = {ids[i]};
                continue;
            }
        }
        // A step as a pass of its own: where ahead applies, a fed pass of the pair in turn (recorded by the backend
        // where it records passes, for the steps after to replay ahead; after a run that stopped because a step did
        // not fit its graph, the next of these records the other of the pair).
        run_passes(
            step, nullptr, [&](int32_t id, size_t input) { ids[input] = id; }, now ? int(own++ % 2) : -1);
        s++;
        if (!take(s - 1, ids)) return s;
        for (size_t i = 0; i < n; i++) step[i].tokens = {ids[i]};
    }
    return s;
}

bool Engine::parts_on_host() const {
    for (const Part &p : parts_)
        if (p.strata->plan().device) return false;
    return true;
}

bool Engine::pipelined(size_t n_passes) const {
    if (parts_.size() < 2 || n_passes < 2 || tracer_ || observed_) return false;
    // On by default where every part is on the host; parts on GPUs take it with STRATA_SPLIT_PIPELINE=1 (not yet
    // measured on a GPU).
    return env_switch("STRATA_SPLIT_PIPELINE", parts_on_host());
}

void Engine::run_passes(const std::vector<SeqInput> &inputs, const RowSink &sink, const IdSink &id_sink, int ahead) {
    // Validate everything before touching any cache, so a bad input changes nothing.
    std::vector<int32_t> seen;
    for (const SeqInput &in : inputs) {
        check_seq(in.seq);
        if (state_lost_[size_t(in.seq)])
            fail(
                "sequence %d lost its recurrent state when an earlier pass failed; rewind it to a checkpoint or start "
                "it "
                "again",
                in.seq);
        if (std::find(seen.begin(), seen.end(), in.seq) != seen.end())
            fail("sequence %d appears twice in one decode call", in.seq);
        seen.push_back(in.seq);
        if (in.tokens.empty()) fail("sequence %d: no tokens to decode", in.seq);
        if (seq_len_[size_t(in.seq)] + int64_t(in.tokens.size()) > cfg_.n_ctx)
            fail("sequence %d: %lld tokens after %lld exceed the context size %lld", in.seq,
                 (long long)in.tokens.size(), (long long)seq_len_[size_t(in.seq)], (long long)cfg_.n_ctx);
        for (int32_t t : in.tokens)
            if (t < 0 || t >= n_vocab())
                fail("sequence %d: token id %d is outside the vocabulary (0..%lld)", in.seq, t,
                     (long long)n_vocab() - 1);
    }

    const int64_t n_vocab_ = n_vocab();

    // Pack the remaining tokens of each input into passes of at most n_batch tokens (fewer where the plan's chunk is
    // smaller), in input order. A pass bigger than the resident scratch holds runs on a prompt loan, kept for the
    // rest of the call and ended (its slots refilled) before returning.
    // With several participants, the smallest chunk any of their plans allows.
    int64_t pass_max = cfg_.n_batch;
    for (const Part &p : parts_)
        if (p.strata->plan().chunk_tokens > 0) pass_max = std::min(pass_max, p.strata->plan().chunk_tokens);
    struct EndLoan {
        std::vector<Part> &parts;
        bool ok = false;
        ~EndLoan() {
            if (ok) return;
            for (Part &p : parts) try {
                    p.strata->end_loan();
                } catch (...) {  // the call's own error is the one to report
                }
        }
    } end_loan{parts_};
    // The call's passes, all packed before the first runs (each segment's position from the lengths so far).
    struct Dest {
        size_t input;
        int64_t row_in_logits;
    };
    struct Pass {
        BatchInfo b;
        std::vector<int32_t> tokens;
        std::vector<int64_t> out_rows;
        std::vector<Dest> dests;
    };
    std::vector<Pass> passes;
    {
        std::vector<size_t> done(inputs.size(), 0);
        std::vector<int64_t> len = seq_len_;
        size_t next = 0;
        while (next < inputs.size()) {
            Pass ps;
            BatchInfo &b = ps.b;
            for (size_t i = next; i < inputs.size() && b.n_tokens < pass_max; i++) {
                const SeqInput &in = inputs[i];
                const int64_t remaining = int64_t(in.tokens.size() - done[i]);
                if (remaining == 0) continue;
                const int64_t n = std::min(remaining, pass_max - b.n_tokens);
                BatchSeg sg;
                sg.seq = in.seq;
                sg.pos0 = len[size_t(in.seq)];
                sg.n = n;
                sg.row0 = b.n_tokens;
                b.segs.push_back(sg);
                ps.tokens.insert(ps.tokens.end(), in.tokens.begin() + int64_t(done[i]),
                                 in.tokens.begin() + int64_t(done[i]) + n);
                for (int64_t t = 0; t < n; t++) {
                    const int64_t idx = int64_t(done[i]) + t;  // index within this input's tokens
                    const bool last = idx == int64_t(in.tokens.size()) - 1;
                    if (in.all_logits || last) {
                        ps.out_rows.push_back(b.n_tokens + t);
                        ps.dests.push_back({i, in.all_logits ? idx : 0});
                    }
                }
                b.n_tokens += n;
                done[i] += size_t(n);
                len[size_t(in.seq)] += n;
            }
            while (next < inputs.size() && done[next] == inputs[next].tokens.size()) next++;
            passes.push_back(std::move(ps));
        }
    }
    if (passes.empty()) return;
    // One pass of several sequences through a split model: micro-passes of whole sequences, one a part, so the
    // parts work as a pipeline (runtime/part_pipeline.h). Only where every part is on the host, whose kernels give a
    // row the same bits whatever rows share its pass; a GPU's choose their form by the pass's rows (a mat-vec up to
    // k_mmv_max_rows, tiles above), so cutting a pass there would change bits (CudaEngine.SplitPassesAreNotCutOnGpus).
    // Opt-in there too: parts that share the host's cores gain nothing from working at once, and each micro-pass
    // reads the weights again (demo model, 4 sequences on two host parts of the 2-core development machine:
    // 0.88-0.95x).
    if (passes.size() == 1 && passes[0].b.segs.size() > 1 && pipelined(2) && parts_on_host() &&
        env_switch("STRATA_SPLIT_MICROBATCH", false)) {
        Pass whole = std::move(passes[0]);
        std::vector<int64_t> seg_tokens;
        for (const BatchSeg &sg : whole.b.segs) seg_tokens.push_back(sg.n);
        const std::vector<size_t> starts = micro_pass_starts(seg_tokens, parts_.size());
        passes.clear();
        size_t out = 0;  // whole's output rows are in row order, as its segments
        for (size_t g = 0; g < starts.size(); g++) {
            const size_t s0 = starts[g], s1 = g + 1 < starts.size() ? starts[g + 1] : whole.b.segs.size();
            const int64_t r0 = whole.b.segs[s0].row0, r1 = whole.b.segs[s1 - 1].row0 + whole.b.segs[s1 - 1].n;
            Pass ps;
            for (size_t i = s0; i < s1; i++) {
                BatchSeg sg = whole.b.segs[i];
                sg.row0 -= r0;
                ps.b.segs.push_back(sg);
            }
            ps.b.n_tokens = r1 - r0;
            ps.tokens.assign(whole.tokens.begin() + r0, whole.tokens.begin() + r1);
            for (; out < whole.out_rows.size() && whole.out_rows[out] < r1; out++) {
                ps.out_rows.push_back(whole.out_rows[out] - r0);
                ps.dests.push_back(whole.dests[out]);
            }
            passes.push_back(std::move(ps));
        }
        micro_passes_ += passes.size();
    }
    int64_t largest = 0;
    for (const Pass &ps : passes) largest = std::max(largest, ps.b.n_tokens);
    for (Part &p : parts_)
        if (largest > p.strata->plan().resident_chunk_tokens) p.strata->begin_loan(largest);

    // Decoding-sized passes reuse one buffer; a pass wanting many rows (a scored prompt) gets its own. A pass giving
    // ids needs none. Only the last part writes them, one pass after the other.
    std::vector<float> many;
    auto out_of = [&](const Pass &ps) {
        const size_t out_floats = id_sink ? 0 : ps.out_rows.size() * size_t(n_vocab_);
        if (ps.out_rows.size() <= 16) {
            if (pass_logits_.size() < out_floats) pass_logits_.resize(out_floats);
            return pass_logits_.data();
        }
        many.resize(out_floats);
        return many.data();
    };
    auto deliver = [&](const Pass &ps, const float *out) {
        for (size_t j = 0; j < ps.dests.size(); j++)
            if (id_sink)
                id_sink(pass_ids_[j], ps.dests[j].input);
            else
                sink(out + j * size_t(n_vocab_), ps.dests[j].input, ps.dests[j].row_in_logits);
    };
    // Part p's share of pass j: its layers, taking the residual stream part p - 1 left for pass j.
    float *last_out = nullptr;
    auto run_part = [&](size_t p, size_t j) {
        const Pass &ps = passes[j];
        Part &pt = parts_[p];
        const bool last = p + 1 == parts_.size();
        float *out = last ? (last_out = out_of(ps)) : nullptr;
        if (last) pass_ids_.resize(ps.out_rows.size());
        int32_t *ids = last && id_sink ? pass_ids_.data() : nullptr;
        if (parts_.size() == 1) {
            forward(*model_, *pt.backend, pt.strata->moe(), ps.tokens.data(), ps.b, ps.out_rows, out, tracer_, ids,
                    nullptr, passes.size() == 1 && ids ? ahead : -1);
            return;
        }
        const PassPart pp{pt.l0, pt.l1, p ? &parts_[p - 1].out[j % 2] : nullptr, &pt.out[j % 2]};
        forward(*pt.model, *pt.backend, pt.strata->moe(), ps.tokens.data(), ps.b, ps.out_rows, out, tracer_, ids,
                &pp);
    };
    auto advance = [&](const Pass &ps) {
        for (const BatchSeg &sg : ps.b.segs) seq_len_[size_t(sg.seq)] += sg.n;
    };
    // Attention rows past a sequence's length are never read, but recurrent state is updated in place: a failed
    // pass leaves its sequences' state lost (and with the pipeline, every pass a part may have begun).
    auto lose = [&](size_t from, size_t to) {
        if (!has_recurrent()) return;
        for (size_t j = from; j < to; j++)
            for (const BatchSeg &sg : passes[j].b.segs) state_lost_[size_t(sg.seq)] = 1;
    };
    if (pipelined(passes.size())) {
        PartPipeline pl;
        pl.bind = [&](size_t p) { parts_[p].backend->bind_thread(); };
        pl.run = run_part;
        pl.finished = [&](size_t j) { deliver(passes[j], last_out); };
        size_t finished = 0;
        try {
            run_part_pipeline(parts_.size(), passes.size(), pl, &finished);
        } catch (...) {
            for (size_t j = 0; j < finished; j++) advance(passes[j]);
            lose(finished, passes.size());
            throw;
        }
        for (const Pass &ps : passes) advance(ps);
    } else {
        for (size_t j = 0; j < passes.size(); j++) {
            try {
                for (size_t p = 0; p < parts_.size(); p++) run_part(p, j);
            } catch (...) {
                lose(j, j + 1);
                throw;
            }
            deliver(passes[j], last_out);
            advance(passes[j]);
        }
    }
    end_loan.ok = true;
    for (Part &p : parts_) p.strata->end_loan();
}

void prefault_weights(const Model &m, int n_threads, const std::function<void(uint64_t, uint64_t)> &progress) {
    const uint64_t begin = m.file->data_offset(), end = m.file->file_size();
    if (end <= begin) return;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && double(end - begin) > 0.75 * double(pages) * double(page)) return;
    const uint64_t total = end - begin, step = uint64_t(64) << 20;
    const uint8_t *base = m.file->bytes();
    ThreadPool pool(n_threads);
    std::atomic<uint64_t> done{0};
    std::mutex mu;
    const int64_t n_steps = int64_t((total + step - 1) / step);
    pool.parallel_for(n_steps, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; s++) {
            const uint64_t a = begin + uint64_t(s) * step, b = std::min(end, a + step);
            volatile uint8_t sink = 0;
            for (uint64_t o = a; o < b; o += 4096) sink = sink + base[o];
            const uint64_t d = done += b - a;
            if (progress) {
                std::lock_guard<std::mutex> lock(mu);
                progress(d, total);
            }
        }
    });
}

std::unique_ptr<Engine> make_cpu_engine(const std::string &path, const EngineConfig &cfg) {
    std::unique_ptr<Model> m = load_model(path);
    prefault_weights(*m, cfg.n_threads, cfg.load_progress);
    return std::make_unique<Engine>(std::move(m), make_cpu_backend(cfg.n_threads), cfg);
}

bool cuda_available() {
#ifdef STRATA_HAVE_CUDA
    return cuda_device_count() > 0;
#else
    return false;
#endif
}

const char *device_name(Device d) {
    switch (d) {
        case Device::Auto:
            return "auto";
        case Device::Cpu:
            return "cpu";
        case Device::Cuda:
            return "cuda";
    }
    return "?";
}

Device parse_device(const std::string &s) {
    if (s == "auto") return Device::Auto;
    if (s == "cpu") return Device::Cpu;
    if (s == "cuda" || s == "gpu") return Device::Cuda;
    fail("--device: expected auto, cpu or cuda, got '%s'", s.c_str());
}

namespace {
// A CUDA backend on that device with the config's options (throws where the build has no CUDA).
std::unique_ptr<Backend> cuda_backend_for(int device, const EngineConfig &cfg) {
#ifdef STRATA_HAVE_CUDA
    CudaOptions o;
    o.device = device;
    o.graphs = cfg.cuda_graphs;
    return make_cuda_backend(o);
#else
    (void)device, (void)cfg;
    fail("this build of strata has no CUDA backend (rebuild with -DSTRATA_CUDA=ON)");
#endif
}

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const std::string &path, const EngineConfig &cfg) {
#ifndef STRATA_HAVE_CUDA
    cuda_backend_for(cfg.cuda_device, cfg);  // says so before the model is read
#endif
    std::unique_ptr<Model> m = load_model(path);
    prefault_weights(*m, cfg.n_threads, cfg.load_progress);
    return std::make_unique<Engine>(std::move(m), cuda_backend_for(cfg.cuda_device, cfg), cfg);
}

namespace {

// The cost model's view of a model's layers (strata/split_plan.h).
std::vector<SplitLayer> split_costs(const Model &m, const EngineConfig &cfg) {
    const HParams &hp = m.hp;
    const CacheShape caches = cache_shape(hp, cfg.n_seq_max, cfg.n_ctx, cfg.kv_type);
    auto bytes = [](const Weight &w) { return w.present() ? double(w.matrix_bytes()) : 0.0; };
    std::vector<SplitLayer> v(size_t(hp.n_layer));
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const LayerWeights &L = m.layers[size_t(il)];
        SplitLayer &s = v[size_t(il)];
        for (Weight LayerWeights::*w : k_layer_matrices) s.read_bytes += bytes(L.*w);
        for (Weight LayerWeights::*w : k_layer_vectors) s.read_bytes += bytes(L.*w);
        s.resident_bytes = s.read_bytes + double(caches.first_bytes(size_t(il)) + caches.second_bytes(size_t(il)));
        const ExpertWeights e = expert_weights(il, L);
        if (e.present()) {
            s.expert_bytes = double(e.expert_bytes()) * double(hp.n_expert);
            s.routed_bytes = double(e.expert_bytes()) * double(hp.n_expert_used);
        }
    }
    return v;
}

std::unique_ptr<Backend> part_backend(const PartConfig &p, const EngineConfig &cfg) {
    const bool cuda = p.device == Device::Cuda || (p.device == Device::Auto && cuda_available());
    return cuda ? cuda_backend_for(p.cuda_device, cfg) : make_cpu_backend(cfg.n_threads);
}

}  // namespace

std::vector<int64_t> choose_split(const Model &m, std::vector<std::unique_ptr<Backend>> &backends,
                                  const EngineConfig &cfg) {
    const int64_t n = m.hp.n_layer;
    const size_t P = cfg.parts.size();
    size_t given = 0;
    for (const PartConfig &p : cfg.parts) given += p.n_layers > 0;
    std::vector<int64_t> b(P + 1, 0);
    auto say = [&](const char *how, const std::string &more) {
        if (!cfg.log) return;
        std::string line = strfmt("split (%s): layers", how);
        for (size_t i = 0; i < P; i++)
            line += strfmt("%s %lld-%lld on %s", i ? "," : "", (long long)b[i], (long long)b[i + 1] - 1,
                           backends[i]->name().c_str());
        cfg.log(line + more);
    };
    if (given == P) {
        for (size_t i = 0; i < P; i++) b[i + 1] = b[i] + cfg.parts[i].n_layers;
        if (b[P] != n)
            fail("--split: the parts' layers add up to %lld, the model has %lld", (long long)b[P], (long long)n);
        say("--split", "");
        return b;
    }
    if (given != 0) fail("--split: give every participant's layers or none");
    // the first part holds the token embedding, the last the output norm and matrix (model_part), tied or not
    const double tok = m.tok_embd.present() ? double(m.tok_embd.matrix_bytes()) : 0.0;
    const double out = double(m.output.matrix_bytes() + m.output_norm.matrix_bytes());
    std::vector<SplitPart> parts(P);
    for (size_t i = 0; i < P; i++) {
        const DeviceFacts f = backends[i]->device_facts();
        SplitPart &s = parts[i];
        s.device_memory = f.has_device_memory;
        s.first_bytes = tok;
        s.last_bytes = out;
        if (!s.device_memory) continue;
        const uint64_t budget = cfg.parts[i].vram_budget;
        s.capacity_bytes = double(budget ? std::min<uint64_t>(budget, f.free_bytes) : f.free_bytes);
        s.fixed_bytes = double(f.runtime_bytes + scratch_estimate(m.hp, cfg.n_batch, true, i + 1 == P) +
                               stage_estimate(m.hp, cfg.n_batch));
        const auto [read, bus] = backends[i]->start_rates_gbs();
        if (read > 0) s.read_gbs = read;
        if (bus > 0) s.bus_gbs = bus;
    }
    const std::vector<SplitLayer> costs = split_costs(m, cfg);
    b = split_layers(costs, parts);
    // predicted times only where every part's rates were measured (a host part's are relative: 1 GB/s)
    bool measured = true;
    for (const SplitPart &p : parts) measured = measured && p.device_memory;
    std::string more;
    if (measured) {
        more = "; predicted ms a token";
        for (size_t i = 0; i < P; i++)
            more += strfmt("%s %.2f", i ? " /" : "", 1e3 * split_part_seconds(costs, parts[i], b[i], b[i + 1]));
        more += " (read / bus GB/s measured at start:";
        for (size_t i = 0; i < P; i++) more += strfmt("%s %.0f / %.1f", i ? "," : "", parts[i].read_gbs, parts[i].bus_gbs);
        more += ")";
    }
    say("cost model", more);
    return b;
}

std::unique_ptr<Engine> make_split_engine(const std::string &path, const EngineConfig &cfg) {
    if (cfg.parts.empty()) fail("a split model needs at least one participant");
    std::unique_ptr<Model> m = load_model(path);
    prefault_weights(*m, cfg.n_threads, cfg.load_progress);
    std::vector<std::unique_ptr<Backend>> backends;
    for (const PartConfig &p : cfg.parts) backends.push_back(part_backend(p, cfg));
    const std::vector<int64_t> layers = choose_split(*m, backends, cfg);
    return std::make_unique<Engine>(std::move(m), std::move(backends), layers, cfg);
}

std::unique_ptr<Engine> make_engine(const std::string &path, const EngineConfig &cfg) {
    if (!cfg.parts.empty()) return make_split_engine(path, cfg);
    switch (cfg.device) {
        case Device::Cpu:
            return make_cpu_engine(path, cfg);
        case Device::Cuda:
            return make_cuda_engine(path, cfg);
        case Device::Auto:
            return cuda_available() ? make_cuda_engine(path, cfg) : make_cpu_engine(path, cfg);
    }
    return nullptr;
}

}  // namespace strata
