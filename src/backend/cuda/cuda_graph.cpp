// Decoding passes as CUDA graphs. A decode step launches about a thousand small kernels, each with its own launch
// cost on the host (about 5.7 us on the H200 machines, so the host took 5.8 ms to issue a 30B-A3B pass the GPU ran
// in 6.4) and gap on the GPU. Where a pass needs nothing from the host until its logits (every expert resident, so
// routing stays on the device), the pass's ops are recorded by stream capture once and the graph is then replayed:
// the same kernels with the same arguments in the same order, so the results are bit-identical to launching them one
// by one.
//
// Recording and replaying:
//   - A pass size runs once without a graph first, so tables and allocations that a first pass makes are made outside
//     any recording, and only a pass of the same shape as the one before is recorded (a sequence decoding; a
//     server's batches that change from step to step launch op by op). begin_pass() records the pass and end_pass()
//     turns the recording into an executable graph (updating one of the few kept, else building one), launches it
//     and waits for it.
//   - A recorded pass is replayable when everything in it that differs from one decoding step to the next reaches the
//     kernels through memory, not through their arguments: the token ids, the rows' {sequence, position} table and
//     the attention tiles are uploaded (their staging bytes are noted, tagged with what they hold), and attention's
//     split of the key range over blocks, the one launch parameter that depends on the positions, is noted with
//     it. Any other upload, or a layer choosing differently, makes the recording one that is not replayed.
//   - The graph's key is what its nodes depend on: the batch's shape (rows, and per segment the sequence, its
//     length and first row; not its position), the logit rows and whether the pass gives their arg-max ids, and the
//     generation of the memory it addresses (scratch chunks, the staging and download buffers, caches, slots and
//     expert tables; bumped when any of these is given back or moved).
//   - replay_pass(), called by forward() before any op: a graph with the batch's key, replayable, of the current
//     generation, whose attention split the batch gets too, and token ids inside the vocabulary and positions
//     inside the context (else the ops run, and they raise the errors): every noted staging range is rewritten
//     from the batch (passes run op by op since the recording stage their own uploads in the same buffer), the
//     graph launched, waited for, and its pinned logit rows (or arg-max ids) copied to the caller.
//   - A pass of one part of a split model (PassIo's in_x/in_cur and out_x/out_cur) is recorded and replayed the same
//     way: its input rows, the residual stream the part before left, are staged uploads rewritten from the caller's
//     rows at each replay (in place of the token ids where the part does not embed them), and its own residual
//     stream is a download copied to the caller's rows as the logits are.
//   - Greedy steps ahead of the host (replay_ahead, Engine::decode_greedy): a fed pass (PassIo::ahead 0 or 1) takes
//     its tokens from fed_ids_ on the device (begin_pass, or a replay, copies the caller's there first) and its
//     arg-max ids go to fed_ids_ before their download, so the next fed pass embeds them with no host in between. The
//     two of a pair are recorded with their staged inputs in the two halves of the staging buffer and their downloads
//     in the two halves of the download buffer. replay_ahead then, for step s: stages step s + 1's positions into the
//     other graph's half (that graph's step s - 1 is done: the host waited for it), launches it and records its
//     event, waits for step s's event, copies step s's ids out of its half and gives them to the caller; the GPU runs
//     step s + 1 meanwhile. A step whose attention split is not its graph's is not launched: the run ends with the
//     step before. Where the caller stops at step s, step s + 1 has run too (its cache rows lie past the sequences'
//     lengths, never read). The stream is drained before returning, also on a throw.
//
// Rules that keep a recorded pass valid: nothing in it synchronises with the host or reads device results on the
// host (the eligibility below, and upload() refusing to wrap its staging buffer while recording); host data it
// uploads sits in the pinned staging buffer until the graph has run (end_pass and replays synchronise before the
// next pass); downloads go to pinned memory and reach the caller's buffer once the graph is done.
//
// On by default (CudaOptions::graphs); STRATA_CUDA_GRAPHS=0 launches every pass op by op, =1 turns graphs on where
// the options left them off; profiling (STRATA_CUDA_PROFILE=1) keeps them off. STRATA_CUDA_GRAPH_REPLAY=0 records
// every pass again (the form that measured slower than direct launches: on the 30B's tg128, recording 1.5 ms and
// updating 0.5 ms per pass while the GPU waits).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/matmul.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

bool replay_enabled() {
    static const bool on = env_switch("STRATA_CUDA_GRAPH_REPLAY", true);
    return on;
}

constexpr size_t k_kept_graphs = 8;

bool same_shape(const std::vector<BatchSeg> &a, const std::vector<BatchSeg> &b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].seq != b[i].seq || a[i].n != b[i].n || a[i].row0 != b[i].row0) return false;
    return true;
}

}  // namespace

void CudaBackend::begin_pass(const BatchInfo &b, const PassIo &io_in, bool traced) {
    use_device();
    // A fed pass gives one arg-max id a token, at most k_mmv_max_rows of them (the pair replay_ahead runs); a bigger
    // one is an ordinary pass.
    PassIo io = io_in;
    if (io.ahead >= 0 && !(io.tokens && io.ids && io.out_rows && b.n_tokens <= k_mmv_max_rows &&
                           int64_t(io.out_rows->size()) == b.n_tokens))
        io.ahead = -1;
    STRATA_ASSERT(!capturing_);
    flush_mapped(-1);  // the mapped tables as the fills left them, before anything is recorded
    pass_t0_ = Clock::now();
    replay_end_ = {};  // (the host's time between replays counts only from one replay to the next)
    pass_small_ = b.n_tokens <= k_mmv_max_rows;
    fed_ = {};
    if (io.ahead >= 0) {
        feed_tokens(io.tokens, b.n_tokens);
        fed_ = {io.tokens, b.n_tokens};
    }
    // A shape seen in the pass before is likely to come again (a sequence decoding): only those are recorded, so
    // that batches changing from step to step (a server's) do not pay for recordings they never replay.
    const bool repeat = last_rows_ == b.n_tokens && same_shape(last_segs_, b.segs) && io.out_rows &&
                        last_out_rows_ == *io.out_rows && last_ids_ == (io.ids != nullptr);
    note_shape(b, io);
    if (!graphs_on_ || traced || prof_.on() || !graph_eligible_ || download_cols_ <= 0 || !repeat) return;
    if (b.n_tokens < 1 || b.n_tokens > k_mmv_max_rows) return;
    if (std::find(graph_warm_.begin(), graph_warm_.end(), b.n_tokens) == graph_warm_.end()) {
        graph_warm_.push_back(b.n_tokens);
        return;
    }
    // The pass downloads at most one row of logits per token, or a split part's two residual rows (download_cols);
    // a fed pair's two in halves of the buffer.
    const size_t one = size_t(b.n_tokens) * size_t(download_cols_), need = io.ahead >= 0 ? 2 * one : one;
    if (dl_floats_ < need) {
        if (dl_pinned_) STRATA_CUDA_CHECK(cudaFreeHost(dl_pinned_));
        dl_pinned_ = nullptr;
        graph_gen_++;
        dl_floats_ = 0;
        STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void **>(&dl_pinned_), need * sizeof(float)));
        dl_floats_ = need;
    }
    dl_used_ = 0;
    if (io.ahead >= 0) {
        // The pair's staged inputs and downloads apart (each in its half of both buffers), so that the host rewrites
        // one's while the other runs (replay_ahead). Every copy queued from the staging buffer is done first.
        STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        stage_used_ = io.ahead ? (stage_size_ / 2) & ~size_t(255) : 0;
        dl_used_ = io.ahead ? one : 0;
    }
    deferred_.clear();
    pass_io_ = io;
    pass_batch_ = b;
    rec_ok_ = replay_enabled() && io.tokens && io.out_rows && (io.logits || io.ids || io.out_x);
    rec_attn_ = {};
    rec_vocab_ = 0;
    rec_uploads_.clear();
    STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    graph_t0_ = Clock::now();
}

void CudaBackend::note_shape(const BatchInfo &b, const PassIo &io) {
    last_rows_ = b.n_tokens;
    last_ids_ = io.ids != nullptr;
    last_segs_ = b.segs;
    if (io.out_rows)
        last_out_rows_ = *io.out_rows;
    else
        last_out_rows_.clear();
}

void CudaBackend::note_upload(uint8_t *pinned, size_t bytes, UploadSrc src) {
    if (src == UploadSrc::None) rec_ok_ = false;
    rec_uploads_.push_back({pinned, bytes, src});
}

CudaBackend::PassGraph *CudaBackend::find_graph(const BatchInfo &b, const std::vector<int64_t> &out_rows, bool ids,
                                                int ahead) {
    for (PassGraph &g : graphs_)
        if (g.exec && g.rows == b.n_tokens && g.generation == graph_gen_ && same_shape(g.segs, b.segs) &&
            g.out_rows == out_rows && g.ids == ids && g.ahead == ahead)
            return &g;
    return nullptr;
}

bool CudaBackend::replay_fits(const PassGraph &g, const BatchInfo &b, const int32_t *tokens,
                              std::vector<AttnTile> &tiles) {
    if (tokens && g.vocab_rows > 0)  // (a split's later part embeds nothing)
        for (int64_t t = 0; t < b.n_tokens; t++)
            if (tokens[t] < 0 || tokens[t] >= g.vocab_rows) return false;
    if (!g.attn.present) return true;
    int64_t max_end = 0;
    for (const BatchSeg &s : b.segs) {
        if (s.pos0 + s.n > g.attn.n_ctx) return false;
        max_end = std::max(max_end, s.pos0 + s.n);
    }
    tiles = attention_tiles(b, g.attn.rpt);
    int64_t n_split = 1, chunk = 0;
    attention_split(int64_t(tiles.size()), g.attn.n_head_kv, max_end, g.attn.prompt, n_split, chunk);
    return n_split == g.attn.n_split && chunk == g.attn.chunk;
}

void CudaBackend::stage_replay(const PassGraph &g, const BatchInfo &b, const PassIo &io,
                               const std::vector<AttnTile> &tiles) {
    const std::vector<int2> sp = seq_pos_table(b);
    std::vector<int32_t> rows32(io.out_rows->begin(), io.out_rows->end());
    for (const StagedUpload &u : g.uploads) {
        const void *from = nullptr;
        size_t bytes = 0;
        switch (u.src) {
            case UploadSrc::Tokens: from = io.tokens, bytes = size_t(b.n_tokens) * 4; break;
            case UploadSrc::SeqPos: from = sp.data(), bytes = sp.size() * sizeof(int2); break;
            case UploadSrc::Tiles: from = tiles.data(), bytes = tiles.size() * sizeof(AttnTile); break;
            // part of the key, yet rewritten too: a pass between replays may have staged other bytes there
            case UploadSrc::OutRows: from = rows32.data(), bytes = rows32.size() * 4; break;
            // a split part's input, the rows the part before left (the key fixes their count)
            case UploadSrc::InX: from = io.in_x, bytes = u.bytes; break;
            case UploadSrc::InCur: from = io.in_cur, bytes = u.bytes; break;
            case UploadSrc::None: fail("internal: a replayed pass with an unknown upload");
        }
        if (!from) fail("internal: a replayed pass without its input");
        STRATA_ASSERT(bytes == u.bytes);
        std::memcpy(u.pinned, from, bytes);
    }
}

void CudaBackend::feed_tokens(const int32_t *tokens, int64_t n) {
    STRATA_ASSERT(n >= 1 && n <= k_mmv_max_rows);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the copy out of fed_host_ queued before is done
    std::memcpy(fed_host_, tokens, size_t(n) * sizeof(int32_t));
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(fed_ids_, fed_host_, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
}

bool CudaBackend::replay_pass(const BatchInfo &b, const PassIo &io) {
    use_device();
    if (!graphs_on_ || !replay_enabled() || prof_.on() || !graph_eligible_) return false;
    if (b.n_tokens < 1 || b.n_tokens > k_mmv_max_rows || !io.tokens || !io.out_rows ||
        (!io.logits && !io.ids && !io.out_x))
        return false;
    STRATA_ASSERT(!capturing_);
    PassGraph *g = find_graph(b, *io.out_rows, io.ids != nullptr, io.ahead);
    if (!g || !g->replayable) return false;
    const Clock::time_point t0 = Clock::now();
    if (replay_end_ != Clock::time_point{}) {
        replay_ms_[3] += std::chrono::duration<double, std::milli>(t0 - replay_end_).count();
        replay_gaps_++;
    }
    replay_end_ = {};
    std::vector<AttnTile> tiles;
    if (!replay_fits(*g, b, io.tokens, tiles)) return false;
    // The previous pass's copies out of the staging buffer are done (its download or replay waited for it).
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stage_replay(*g, b, io, tiles);
    if (io.ahead >= 0) feed_tokens(io.tokens, b.n_tokens);
    // Tables the ops keep for a pass no longer describe what the pass buffer holds.
    seq_pos_rows_ = -1, seq_pos_dev_ = nullptr;
    tiles_key_.clear(), tiles_dev_ = nullptr;
    flush_mapped(-1);
    const Clock::time_point t1 = Clock::now();
    STRATA_CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
    const Clock::time_point t1b = Clock::now();
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    deliver(*g, io);
    g->last_use = ++graph_clock_;
    note_shape(b, io);
    graph_launches_++;
    graph_replays_++;
    const Clock::time_point t2 = Clock::now();
    replay_ms_[0] += std::chrono::duration<double, std::milli>(t1 - t0).count();
    replay_ms_[1] += std::chrono::duration<double, std::milli>(t1b - t1).count();
    replay_ms_[2] += std::chrono::duration<double, std::milli>(t2 - t1).count();
    replay_end_ = t2;
    return true;
}

void CudaBackend::deliver(const PassGraph &g, const PassIo &io) {
    for (const ReplayDownload &d : g.downloads) {
        void *to = nullptr;
        switch (d.dst) {
            case DownloadDst::Logits: to = io.logits ? io.logits + d.offset : nullptr; break;
            case DownloadDst::Ids: to = io.ids ? io.ids + d.offset : nullptr; break;
            case DownloadDst::OutX: to = io.out_x ? io.out_x + d.offset : nullptr; break;
            case DownloadDst::OutCur: to = io.out_cur ? io.out_cur + d.offset : nullptr; break;
        }
        if (!to) fail("internal: a replayed pass without the output it was recorded with");
        std::memcpy(to, d.d.pinned, d.d.bytes);
    }
}

namespace {

// Whether two recorded passes' staged inputs and downloads lie apart (a fed pair's, one half of each buffer each).
bool apart(const std::vector<std::pair<const uint8_t *, size_t>> &a,
           const std::vector<std::pair<const uint8_t *, size_t>> &b) {
    for (const auto &x : a)
        for (const auto &y : b)
            if (x.first < y.first + y.second && y.first < x.first + x.second) return false;
    return true;
}

}  // namespace

int64_t CudaBackend::replay_ahead(const BatchInfo &b, const PassIo &io, int64_t max_steps, const AheadTake &take) {
    use_device();
    if (max_steps < 1 || !graphs_on_ || !replay_enabled() || prof_.on() || !graph_eligible_ || !io.tokens || !io.ids ||
        !io.out_rows || b.n_tokens < 1 || b.n_tokens > k_mmv_max_rows)
        return 0;
    STRATA_ASSERT(!capturing_);
    PassGraph *g[2] = {find_graph(b, *io.out_rows, true, 0), find_graph(b, *io.out_rows, true, 1)};
    if (!g[0] || !g[1] || !g[0]->replayable || !g[1]->replayable) return 0;
    std::vector<std::pair<const uint8_t *, size_t>> bytes[2];
    for (int p = 0; p < 2; p++) {
        for (const StagedUpload &u : g[p]->uploads) bytes[p].push_back({u.pinned, u.bytes});
        for (const ReplayDownload &d : g[p]->downloads)
            bytes[p].push_back({static_cast<const uint8_t *>(d.d.pinned), d.d.bytes});
    }
    if (!apart(bytes[0], bytes[1])) return 0;
    // The first step on whichever of the pair fits it (after a change of the attention's split, the one recorded
    // since), the rest in turn.
    std::vector<AttnTile> tiles;
    const int first = replay_fits(*g[0], b, io.tokens, tiles) ? 0 : replay_fits(*g[1], b, io.tokens, tiles) ? 1 : -1;
    if (first < 0) return 0;
    if (first == 1) std::swap(g[0], g[1]);
    feed_tokens(io.tokens, b.n_tokens);  // (waits for the stream: nothing of an earlier pass reads the staging)
    // Tables the ops keep for a pass no longer describe what the pass buffer holds.
    seq_pos_rows_ = -1, seq_pos_dev_ = nullptr;
    tiles_key_.clear(), tiles_dev_ = nullptr;
    flush_mapped(-1);
    // A throw on the way (take's, or a CUDA error) leaves no step running that reads the host's buffers.
    struct Drain {
        cudaStream_t s;
        ~Drain() { cudaStreamSynchronize(s); }
    } drain{stream_};
    BatchInfo step = b;
    // Step s: its batch staged into its graph's inputs (that graph's step s - 2 is done) and the graph launched.
    auto launch = [&](int64_t s) {
        PassGraph &gr = *g[s % 2];
        stage_replay(gr, step, io, tiles);
        STRATA_CUDA_CHECK(cudaGraphLaunch(gr.exec, stream_));
        STRATA_CUDA_CHECK(cudaEventRecord(ahead_done_[s % 2], stream_));
        gr.last_use = ++graph_clock_;
        graph_launches_++, graph_replays_++;
    };
    launch(0);
    ahead_runs_++;
    int64_t s = 0;
    for (;;) {
        // Step s + 1, the positions moved on by one, launched before step s's ids are read, where it fits its graph.
        bool next = false;
        if (s + 1 < max_steps) {
            for (BatchSeg &sg : step.segs) sg.pos0++;
            next = replay_fits(*g[(s + 1) % 2], step, nullptr, tiles);
            if (next) launch(s + 1);
        }
        STRATA_CUDA_CHECK(cudaEventSynchronize(ahead_done_[s % 2]));
        deliver(*g[s % 2], io);
        ahead_steps_++;
        const bool go = take(s, io.ids);
        s++;
        if (!go || !next) break;
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a step launched past the last taken
    note_shape(step, io);
    replay_end_ = {};
    return s;
}

void CudaBackend::note_direct_pass(Clock::time_point issued, Clock::time_point done) {
    if (!pass_small_) return;
    direct_passes_++;
    direct_ms_[0] += std::chrono::duration<double, std::milli>(issued - pass_t0_).count();
    direct_ms_[1] += std::chrono::duration<double, std::milli>(done - pass_t0_).count();
}

void CudaBackend::report_graphs() const {
    static const bool times = env_switch("STRATA_CUDA_PASS_TIMES", false);
    if (times && direct_passes_)
        std::fprintf(stderr,
                     "strata: CUDA%d decoding passes launched op by op: %llu; per pass: host issues its work in %.3f "
                     "ms, done after %.3f ms\n",
                     device_, (unsigned long long)direct_passes_, direct_ms_[0] / double(direct_passes_),
                     direct_ms_[1] / double(direct_passes_));
    if (ahead_runs_)
        std::fprintf(stderr, "strata: CUDA%d greedy steps replayed ahead of the host: %llu in %llu runs\n", device_,
                     (unsigned long long)ahead_steps_, (unsigned long long)ahead_runs_);
    if (!graph_launches_) return;
    const uint64_t recorded = graph_launches_ - graph_replays_;
    const double n = double(std::max<uint64_t>(recorded, 1)), r = double(std::max<uint64_t>(graph_replays_, 1));
    std::fprintf(stderr,
                 "strata: CUDA%d graphs: %llu passes recorded (%llu graphs built; per pass: recording %.3f ms, update "
                 "or build %.3f ms, launch to done %.3f ms), %llu replayed (per pass: host %.3f ms, the launch call "
                 "%.3f ms, launch to done %.3f ms; between one replay's end and the next's start %.3f ms)\n",
                 device_, (unsigned long long)recorded, (unsigned long long)graph_instantiations_, graph_ms_[0] / n,
                 graph_ms_[1] / n, graph_ms_[2] / n, (unsigned long long)graph_replays_, replay_ms_[0] / r,
                 replay_ms_[1] / r, replay_ms_[2] / r, replay_ms_[3] / double(std::max<uint64_t>(replay_gaps_, 1)));
}

void CudaBackend::drop_capture() {
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    deferred_.clear();
}

void CudaBackend::abort_pass() {
    use_device();
    fed_ = {};
    if (capturing_) drop_capture();
}

void CudaBackend::end_pass() {
    use_device();
    fed_ = {};
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    const Clock::time_point t1 = Clock::now();
    if (err != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        fail(
            "CUDA%d: recording a decoding pass as a graph failed: %s (graphs are opt-in: leave STRATA_CUDA_GRAPHS "
            "unset)",
            device_, cudaGetErrorString(err));
    }
    // The graph kept for this key, else a new one while few are kept, else the least recently used one: updated from
    // the new recording where the driver accepts it, else built anew.
    const std::vector<int64_t> no_rows;
    const std::vector<int64_t> &out_rows = pass_io_.out_rows ? *pass_io_.out_rows : no_rows;
    const bool ids = pass_io_.ids != nullptr;
    PassGraph *g = find_graph(pass_batch_, out_rows, ids, pass_io_.ahead);
    if (!g && graphs_.size() < k_kept_graphs) g = &graphs_.emplace_back();
    if (!g)
        g = &*std::min_element(graphs_.begin(), graphs_.end(),
                               [](const PassGraph &a, const PassGraph &b) { return a.last_use < b.last_use; });
    bool ready = false;
    if (g->exec) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess) {
            ready = true;
        } else {
            cudaGetLastError();
            cudaGraphExecDestroy(g->exec);
            g->exec = nullptr;
        }
    }
    if (!ready) {
        err = cudaGraphInstantiate(&g->exec, graph, 0);
        if (err != cudaSuccess) {
            g->exec = nullptr;
            cudaGraphDestroy(graph);
            cudaGetLastError();
            fail("CUDA%d: building a graph of a decoding pass failed: %s", device_, cudaGetErrorString(err));
        }
        graph_instantiations_++;
    }
    cudaGraphDestroy(graph);
    g->rows = pass_batch_.n_tokens;
    g->segs = pass_batch_.segs;
    g->out_rows = out_rows;
    g->ids = ids;
    g->ahead = pass_io_.ahead;
    g->generation = graph_gen_;
    g->attn = rec_attn_;
    g->vocab_rows = rec_vocab_;
    g->uploads = rec_uploads_;
    g->downloads.clear();
    // A pass that embedded the tokens, or a split part's that took both its inputs from the part before.
    bool in_x = false, in_cur = false;
    for (const StagedUpload &u : rec_uploads_) {
        if (u.src == UploadSrc::Tokens && u.bytes != size_t(pass_batch_.n_tokens) * 4) rec_ok_ = false;
        in_x = in_x || u.src == UploadSrc::InX;
        in_cur = in_cur || u.src == UploadSrc::InCur;
    }
    bool replayable = rec_ok_ && (rec_vocab_ > 0 || (in_x && in_cur));
    for (const Deferred &d : deferred_) {
        ReplayDownload r{DownloadDst::Logits, 0, d};
        ptrdiff_t off = -1;
        if (pass_io_.out_x && d.host == pass_io_.out_x)
            r.dst = DownloadDst::OutX, off = 0;
        else if (pass_io_.out_cur && d.host == pass_io_.out_cur)
            r.dst = DownloadDst::OutCur, off = 0;
        else if (d.ids)
            r.dst = DownloadDst::Ids, off = ids ? static_cast<int32_t *>(d.host) - pass_io_.ids : -1;
        else
            off = pass_io_.logits ? static_cast<float *>(d.host) - pass_io_.logits : -1;
        if (off < 0) replayable = false;
        r.offset = size_t(std::max<ptrdiff_t>(off, 0));
        g->downloads.push_back(r);
    }
    g->replayable = replayable;
    g->last_use = ++graph_clock_;
    const Clock::time_point t2 = Clock::now();
    STRATA_CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
    graph_launches_++;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const Clock::time_point t3 = Clock::now();
    auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    graph_ms_[0] += ms(graph_t0_, t1);
    graph_ms_[1] += ms(t1, t2);
    graph_ms_[2] += ms(t2, t3);
    for (const Deferred &d : deferred_) std::memcpy(d.host, d.pinned, d.bytes);
    deferred_.clear();
}

}  // namespace strata::cuda
