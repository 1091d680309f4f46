// Sequence bookkeeping and the packing of inputs into forward passes.
#include "runtime/engine.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <mutex>

#include "core/error.h"
#include "core/threads.h"
#include "runtime/sampler.h"
#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace strata {

Engine::Engine(std::unique_ptr<Model> model, std::unique_ptr<Backend> backend, const EngineConfig &cfg)
    : model_(std::move(model)), backend_(std::move(backend)), cfg_(cfg) {
    if (cfg_.n_seq_max <= 0) fail("the number of parallel sequences must be at least 1 (got %d)", cfg_.n_seq_max);
    if (cfg_.n_ctx <= 0) fail("the context size must be at least 1 (got %lld)", (long long)cfg_.n_ctx);
    if (cfg_.n_batch <= 0) fail("the batch size must be at least 1 (got %lld)", (long long)cfg_.n_batch);
    StrataOptions so;
    so.plan.vram_budget = cfg_.vram_budget;
    so.plan.expert_slots = cfg_.expert_slots;
    so.plan.scratch_bytes = cfg_.scratch_bytes;
    so.plan.chunk_tokens = cfg_.n_batch;
    so.plan.loan_floor_slots = cfg_.loan_floor_slots;
    so.plan = plan_options_from_env(so.plan);
    if (cfg_.host_mem == HostMem::Mmap) so.plan.host_pinned_copy = false;
    if (cfg_.host_mem == HostMem::Pinned) so.plan.host_pinned_copy = so.plan.require_pinned_copy = true;
    so.n_seqs = cfg_.n_seq_max;
    so.n_ctx = cfg_.n_ctx;
    so.kv_type = cfg_.kv_type;
    so.slot_policy = cfg_.expert_cache_policy;
    so.hybrid.share = cfg_.cpu_share;
    so.hybrid.threads = cfg_.cpu_threads;
    so.log = cfg_.log;
    strata_ = std::make_unique<MemoryStrata>(*backend_, *model_, so);
    seq_len_.assign(size_t(cfg_.n_seq_max), -1);
    state_lost_.assign(size_t(cfg_.n_seq_max), 0);
}

Engine::~Engine() = default;

void Engine::check_seq(int32_t seq) const {
    if (seq < 0 || seq >= cfg_.n_seq_max || seq_len_[size_t(seq)] < 0) fail("unknown sequence %d", seq);
}

int32_t Engine::new_sequence() {
    for (int32_t s = 0; s < cfg_.n_seq_max; s++)
        if (seq_len_[size_t(s)] < 0) {
            backend_->clear_seq(s);
            seq_len_[size_t(s)] = 0;
            state_lost_[size_t(s)] = 0;
            return s;
        }
    fail("all %d sequences are in use", cfg_.n_seq_max);
}

int32_t Engine::fork(int32_t seq) {
    check_seq(seq);
    int32_t dst = new_sequence();
    backend_->copy_seq(seq, dst, seq_len_[size_t(seq)]);
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
    if (!can_rewind()) fail("the %s backend cannot save recurrent state", backend_->name().c_str());
    cp.data.resize(backend_->recurrent_state_bytes());
    backend_->save_recurrent_state(seq, cp.data.data());
    return cp;
}

namespace {
// Checks a checkpoint for a cut to n_pos of a sequence of length len; returns whether it must be loaded.
bool need_state(const Engine &e, const Backend &b, int64_t n_pos, int64_t len, const StateCheckpoint *cp) {
    if (!e.has_recurrent() || n_pos == len || n_pos == 0) return false;
    if (!cp) fail("cutting a recurrent sequence back to %lld positions needs a checkpoint", (long long)n_pos);
    if (cp->pos != n_pos) fail("the checkpoint is at position %lld, not %lld", (long long)cp->pos, (long long)n_pos);
    if (cp->data.size() != b.recurrent_state_bytes() || cp->data.empty())
        fail("the checkpoint holds %zu bytes of state, the backend %zu", cp->data.size(), b.recurrent_state_bytes());
    return true;
}
}  // namespace

void Engine::rewind(int32_t seq, int64_t n_pos, const StateCheckpoint *cp) {
    check_seq(seq);
    const int64_t len = seq_len_[size_t(seq)];
    if (n_pos < 0 || n_pos > len)
        fail("sequence %d: cannot cut %lld positions back to %lld", seq, (long long)len, (long long)n_pos);
    const bool load = need_state(*this, *backend_, n_pos, len, cp);
    if (n_pos == 0)
        backend_->clear_seq(seq);
    else if (load)
        backend_->load_recurrent_state(seq, cp->data.data());
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
    const bool load = need_state(*this, *backend_, n_pos, len, cp);
    if (n_pos == 0) {
        backend_->clear_seq(dst);
    } else {
        backend_->copy_seq(src, dst, n_pos);
        if (load) backend_->load_recurrent_state(dst, cp->data.data());
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

void Engine::run_passes(const std::vector<SeqInput> &inputs, const RowSink &sink, const IdSink &id_sink) {
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
    const Placement &plan = strata_->plan();
    const int64_t pass_max = plan.chunk_tokens > 0 ? std::min(cfg_.n_batch, plan.chunk_tokens) : cfg_.n_batch;
    struct EndLoan {
        MemoryStrata &s;
        bool ok = false;
        ~EndLoan() {
            if (ok) return;
            try {
                s.end_loan();
            } catch (...) {  // the call's own error is the one to report
            }
        }
    } end_loan{*strata_};
    std::vector<size_t> done(inputs.size(), 0);
    size_t next = 0;
    while (next < inputs.size()) {
        BatchInfo b;
        std::vector<int32_t> tokens;
        std::vector<int64_t> out_rows;
        struct Dest {
            size_t input;
            int64_t row_in_logits;
        };
        std::vector<Dest> dests;
        for (size_t i = next; i < inputs.size() && b.n_tokens < pass_max; i++) {
            const SeqInput &in = inputs[i];
            const int64_t remaining = int64_t(in.tokens.size() - done[i]);
            const int64_t n = std::min(remaining, pass_max - b.n_tokens);
            BatchSeg s;
            s.seq = in.seq;
            s.pos0 = seq_len_[size_t(in.seq)];
            s.n = n;
            s.row0 = b.n_tokens;
            b.segs.push_back(s);
            tokens.insert(tokens.end(), in.tokens.begin() + int64_t(done[i]), in.tokens.begin() + int64_t(done[i]) + n);
            for (int64_t t = 0; t < n; t++) {
                const int64_t idx = int64_t(done[i]) + t;  // index within this input's tokens
                const bool last = idx == int64_t(in.tokens.size()) - 1;
                if (in.all_logits || last) {
                    out_rows.push_back(b.n_tokens + t);
                    dests.push_back({i, in.all_logits ? idx : 0});
                }
            }
            b.n_tokens += n;
        }
        // Decoding-sized passes reuse one buffer; a pass wanting many rows (a scored prompt) gets its own. A pass
        // giving ids needs none.
        const size_t out_floats = id_sink ? 0 : out_rows.size() * size_t(n_vocab_);
        std::vector<float> many;
        if (out_rows.size() <= 16 && pass_logits_.size() < out_floats) pass_logits_.resize(out_floats);
        if (out_rows.size() > 16) many.resize(out_floats);
        float *out = out_rows.size() <= 16 ? pass_logits_.data() : many.data();
        // the first pass is the call's largest: every one but the last has pass_max tokens
        if (b.n_tokens > plan.resident_chunk_tokens) strata_->begin_loan(b.n_tokens);
        try {
            pass_ids_.resize(out_rows.size());
            forward(*model_, *backend_, strata_->moe(), tokens.data(), b, out_rows, out, tracer_,
                    id_sink ? pass_ids_.data() : nullptr);
        } catch (...) {
            // Attention rows past a sequence's length are never read, but recurrent state is updated in place.
            if (has_recurrent())
                for (const BatchSeg &sg : b.segs) state_lost_[size_t(sg.seq)] = 1;
            throw;
        }
        for (size_t j = 0; j < dests.size(); j++)
            if (id_sink)
                id_sink(pass_ids_[j], dests[j].input);
            else
                sink(out + j * size_t(n_vocab_), dests[j].input, dests[j].row_in_logits);
        for (const BatchSeg &s : b.segs) {
            seq_len_[size_t(s.seq)] += s.n;
            for (size_t i = next; i < inputs.size(); i++)
                if (inputs[i].seq == s.seq) done[i] += size_t(s.n);
        }
        while (next < inputs.size() && done[next] == inputs[next].tokens.size()) next++;
    }
    end_loan.ok = true;
    strata_->end_loan();
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

std::unique_ptr<Engine> make_cuda_engine(const std::string &path, const EngineConfig &cfg) {
#ifdef STRATA_HAVE_CUDA
    std::unique_ptr<Model> m = load_model(path);
    prefault_weights(*m, cfg.n_threads, cfg.load_progress);
    CudaOptions o;
    o.device = cfg.cuda_device;
    o.graphs = cfg.cuda_graphs;
    return std::make_unique<Engine>(std::move(m), make_cuda_backend(o), cfg);
#else
    (void)path;
    (void)cfg;
    fail("this build of strata has no CUDA backend (rebuild with -DSTRATA_CUDA=ON)");
#endif
}

std::unique_ptr<Engine> make_engine(const std::string &path, const EngineConfig &cfg) {
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
