// The CUDA backend's class, shared by its host source files (cuda_backend.cpp: set-up, memory, the plan carried out,
// caches, small ops; cuda_slots.cpp: expert slots, the copy stream and the host stratum; cuda_matmul.cpp: matmuls
// and the MoE steps; cuda_mixers.cpp: attention and Gated DeltaNet; cuda_graph.cpp: decoding passes as graphs).
// Not for other users.
//
// Streams and memory protocol: compute (kernels, small uploads, downloads) runs on one stream, `stream_`, so stream
// order alone orders producers before consumers there and a buffer may be reused as soon as the next user is queued
// after the last reader. Expert slot fills run on a second stream, `copy_stream_`, ordered against compute by events
// (cuda_slots.cpp opens with that protocol).
//   - Scratch: a bump arena of device memory. alloc() hands out activations valid until reset_scratch(); ops take
//     their own temporaries from the same arena and give them back when they return (mark/release), which is safe
//     because any later user is queued behind the kernels that read them.
//   - Uploads of small per-call tables (positions, routing groups) are copied into a pinned host staging buffer and
//     queued as async copies. The staging buffer is only rewound after a stream synchronisation (at reset_scratch,
//     or when it is full), so a queued copy never reads bytes that were overwritten. The plan sizes it for a whole
//     pass of its chunk (Placement::stage_bytes), so a prompt chunk neither waits for its own copies nor grows it.
//   - Downloads (logits, routing ids) synchronise the stream.
#pragma once

#include <cuda_runtime_api.h>
#include <chrono>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gdn.cuh"
#include "backend/cuda/host_stager.h"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/op_profiler.h"

namespace strata::cuda {

inline Rows rows_of(const Act &a) {
    return {a.data, a.rows, a.cols, a.stride};
}

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const CudaOptions &o);
    ~CudaBackend() override;

    std::string name() const override;
    DeviceFacts device_facts() override;
    void prepare(WeightSet &ws, const Placement &plan) override;
    std::string prepare_note() const override { return prepare_note_; }
    void init_caches(const CacheShape &shape) override;
    Act alloc(int64_t rows, int64_t cols) override;
    int32_t *alloc_i32(int64_t n) override { return scratch_array<int32_t>(n); }
    void reset_scratch() override;
    void begin_loan(const std::vector<int32_t> &slots) override;
    void end_loan() override;
    uint64_t scratch_overflows() const override { return scratch_overflows_; }
    ScratchMark scratch_mark() override { return {cur_chunk_, cur_off_}; }
    void scratch_release(ScratchMark m) override;
    void download(const Act &src, float *host) override;
    float *alloc_host(size_t n) override;
    void free_host(float *p) override;
    void download_i32(const int32_t *src, int64_t n, int32_t *host) override;
    const int32_t *ids_after_pass(int64_t key, const int32_t *src, int64_t n) override;
    void ids_ready() override;
    void download_argmax(const Act &src, int32_t *host) override;
    void download_many(std::initializer_list<ActDownload> acts, const int32_t *ids, int64_t n,
                       int32_t *ids_host) override;
    void upload(const float *host, Act dst) override;
    void upload_i32(const int32_t *host, int64_t n, int32_t *dst) override;
    void begin_pass(const BatchInfo &b, const PassIo &io, bool traced) override;
    std::pair<double, double> start_rates_gbs() override;
    void bind_thread() override;
    // This backend's device made the calling thread's current one (where it is not already). Every entry point that
    // makes CUDA calls outside a pass, and a pass's own (reset_scratch, begin_pass, replay_pass, end_pass), call it:
    // a thread may drive several backends (a split's parts, one after the other), each on its own device, and a
    // CUDA call goes to whatever device the thread last made current.
    void use_device() const;
    bool replay_pass(const BatchInfo &b, const PassIo &io) override;
    int64_t replay_ahead(const BatchInfo &b, const PassIo &io, int64_t max_steps, const AheadTake &take) override;
    void end_pass() override;
    void abort_pass() override;
    void region_begin(const char *name) override {
        if (prof_.on()) prof_.begin(name, stream_);
    }
    void region_end() override {
        if (prof_.on()) prof_.end(stream_);
    }
    void copy_seq(int32_t src, int32_t dst, int64_t n_pos) override;
    void clear_seq(int32_t seq) override;

    void embed(const Weight &tok_embd, const int32_t *ids, Act out) override;
    void rms_norm(Act x, const Weight &w, float eps, Act out) override;
    void add_rms_norm(Act x, Act y, const Weight &w, float eps, Act out) override;
    void matmul(const Weight &w, Act x, Act out) override;
    void matmuls(Act x, const std::vector<MatmulOut> &outs) override;
    void add(Act a, Act b, Act out) override;
    void mul_sigmoid(Act x, Act gate) override;
    void silu_mul(Act g, Act u) override;
    void gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) override;
    void deinterleave(Act src, int64_t width, Act a, Act b) override;
    void rope(Act x, const RopeParams &rp, const BatchInfo &b) override;
    void qk_norm_rope(Act q, Act k, const Weight &q_norm, const Weight &k_norm, float eps, const RopeParams &rp,
                      const BatchInfo &b) override;
    void qk_norm_rope_store(int64_t il, Act q, Act k, Act v, const Weight &q_norm, const Weight &k_norm, float eps,
                            const RopeParams &rp, const BatchInfo &b) override;
    void attention(int64_t il, Act q, Act k, Act v, int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale,
                   const BatchInfo &b, Act out) override;
    void gdn(int64_t il, const GdnWeights &w, Act qkv, Act z, Act beta_in, Act alpha_in, const GdnParams &p,
             const BatchInfo &b, Act out) override;

    // MoE steps (cuda_matmul.cpp) and expert slots (cuda_slots.cpp).
    void route_topk(Act logits, const MoeParams &p, int32_t *ids, float *weights) override;
    void route(const Weight &router, Act x, const MoeParams &p, Act logits, int32_t *ids, float *weights) override;
    void route_for_device(const Weight &router, const ExpertWeights &w, Act x, const MoeParams &p, Act logits,
                          int32_t *ids, float *weights) override;
    void add_rms_norm_route(Act resid, Act y, const Weight &norm_w, float eps, Act normed, const Weight &router,
                            const ExpertWeights &w, const MoeParams &p, Act logits, int32_t *ids,
                            float *weights) override;
    void route_draws(Act logits, const MoeParams &p, const RouteDraws &d, int64_t il, bool new_pass, int32_t *ids,
                     Act weights) override;
    void reset_draws() override;
    bool draws_on_device() const override { return true; }
    bool maps_host_experts(const ExpertWeights &w) const override {
        return size_t(w.il) < mapped_.size() && mapped_[size_t(w.il)].dev != nullptr;
    }
    MappedReads mapped_reads() const override;
    ExpertSrc mapped_expert(const ExpertWeights &w, int32_t e) const override {
        STRATA_ASSERT(maps_host_experts(w) && e >= 0 && 3 * size_t(e) + 2 < mapped_[size_t(w.il)].home.size());
        const std::vector<const uint8_t *> &h = mapped_[size_t(w.il)].home;
        return {h[3 * size_t(e)], h[3 * size_t(e) + 1], h[3 * size_t(e) + 2]};
    }
    ExpertSrc expert_slot(const ExpertWeights &w, int32_t slot) const override;
    void fill_slots(const ExpertWeights &w, const std::vector<SlotFill> &fills, bool ahead) override;
    void set_resident_experts(const ExpertWeights &w, const std::vector<int32_t> &slot_of) override;
    Act gather_expert_input(const ExpertWeights &w, Act x, const std::vector<int64_t> &rows) override;
    // Experts of type t (gate and up) have their input rows gathered in int8 only (DeviceFacts).
    bool expert_input_int8(DType t) const;
    void expert_ffn(const ExpertWeights &w, Act xs, const std::vector<ExpertGroup> &groups, Act ys) override;
    void wait_slot_fills(const std::vector<ExpertGroup> &groups) override;
    bool device_routing_applies(const ExpertWeights &w, int64_t n_tokens) const override;
    void experts_device_routed(const ExpertWeights &w, Act x, int64_t k, const int32_t *ids, const float *weights,
                               Act out, const MoeTail &tail) override;
    void moe_combine(Act ys, const std::vector<int32_t> &yrow, const std::vector<int32_t> &widx, const float *weights,
                     int64_t k, Act out) override;
    void shared_expert_add(Act x, const Weight &gate, Act y, Act out) override;
    bool host_computes_like(const ExpertWeights &w, int64_t n_rows) const override;
    ExpertSrc expert_host_bytes(const ExpertWeights &w, int32_t e) const override;
    void upload_rows(const float *host, Act dst) override;
    RowsHandoff rows_handoff(size_t bytes) override;
    void handoff_rows(const RowsHandoff &h, Act dst) override;
    uint64_t mark_device() override;
    double device_ms(uint64_t a, uint64_t b) override;

    size_t recurrent_state_bytes() const override;
    void save_recurrent_state(int32_t seq, void *dst) override;
    void load_recurrent_state(int32_t seq, const void *src) override;

    CudaDeviceStats device_stats() const;
    bool device_memory(DeviceMemory &out) const override;
    double copy_rate_gbs() override;
    double upload_rate_gbs() override;
    uint64_t device_allocations() const override { return device_allocations_; }
    cudaStream_t stream() const { return stream_; }

  private:
    // ---- device memory (counted against the budget) ----
    void *dev_alloc(size_t bytes, const char *what);
    float time_copies(cudaStream_t st, void *const dst[2], const void *const src[2], size_t bytes, int reps);
    void dev_free(void *p);

    struct Chunk {
        uint8_t *ptr;
        size_t size;
        bool borrowed = false;  // a prompt loan's slots (first in the list while it lasts; never freed here)
    };
    struct Mark {
        size_t chunk, offset;
    };
    void *scratch_bytes(size_t bytes);
    Mark mark() const { return {cur_chunk_, cur_off_}; }
    void release(Mark m) { cur_chunk_ = m.chunk, cur_off_ = m.offset; }
    template <class T>
    T *scratch_array(int64_t n) {
        return static_cast<T *>(scratch_bytes(size_t(n) * sizeof(T)));
    }

    // What an upload inside a recorded pass holds, so that a replay can write it anew (cuda_graph.cpp): the pass's
    // token ids, its rows' {sequence, position} table, its attention tiles, its logit rows (fixed by the graph's
    // key), a split part's input rows (PassIo::in_x, in_cur). Anything else makes the recording one that cannot be
    // replayed.
    enum class UploadSrc : uint8_t { None, Tokens, SeqPos, Tiles, OutRows, InX, InCur };
    // Copies host bytes to fresh scratch through the pinned staging buffer (async, stream-ordered).
    void *upload(const void *host, size_t bytes, UploadSrc src = UploadSrc::None);
    // Host bytes into the pinned staging buffer, for a copy queued on the compute stream (waits for the stream
    // only where the buffer has to wrap).
    uint8_t *stage(const void *host, size_t bytes);
    template <class T>
    const T *upload_vec(const std::vector<T> &v) {
        return static_cast<const T *>(upload(v.data(), v.size() * sizeof(T)));
    }

    // ---- weights ----
    const uint8_t *dev_matrix(const Weight &w) const;  // packed bytes on the device
    const float *dev_vector(const Weight &w) const;    // 1-D weights as f32
    void upload_weights(WeightSet &ws, const Placement &plan);

    // ---- per-forward row tables ----
    const int2 *seq_pos(const BatchInfo &b);  // {sequence, position} per row, uploaded once per forward
    static std::vector<int2> seq_pos_table(const BatchInfo &b);
    // attention(): a batch's query tiles of at most rpt rows, and the split of their key ranges over blocks
    static std::vector<AttnTile> attention_tiles(const BatchInfo &b, int rpt);
    void attention_split(int64_t n_tiles, int64_t n_head_kv, int64_t max_end, bool prompt, int64_t &n_split,
                         int64_t &chunk) const;
    const float *inv_freq(const RopeParams &rp);

    // ---- matmul (cuda_matmul.cpp) ----
    struct PreparedAct {  // activations in the forms the kernels read, made on first use within one op
        const float *src = nullptr;
        int64_t rows = 0, k = 0, stride = 0;
        DType round_trip_type = DType::F32;
        const float *round_trip = nullptr;
        DType q8_type = DType::F32;
        const int8_t *q8 = nullptr;
        const float2 *q8_ds = nullptr;
    };
    // STRATA_CUDA_EXPERT_Q8_GATHER=0 (read when the backend is made): the experts' input rows gathered as floats and
    // quantized in each expert_ffn instead.
    bool q8_gather_ = true;
    // STRATA_CUDA_EXPERT_FUSE=0 (read when the backend is made; STRATA_CUDA_FUSE=0 too): a prompt's expert_ffn
    // launches gate and up apart and silu(gate) * up on its own, not one grouped launch for both and the product
    // made while quantizing for down.
    bool expert_fuse_ = true;
    // gather_expert_input's rows kept quantized: xs (its int8 rows, no floats) stands for them in expert_ffn of that
    // layer.
    struct ExpertInput {
        const float *xs = nullptr;
        int64_t il = -1, rows = 0, k = 0;
        DType type = DType::F32;
        const int8_t *q8 = nullptr;
        const float2 *ds = nullptr;
    } expert_input_;
    struct WeightShape {
        DType type;
        int64_t k, n;
        size_t row_bytes;
        const char *name;
    };
    void grouped_matmul(const WeightShape &w, const std::vector<MatmulGroup> &groups, PreparedAct &x, Rows y);
    void quantize(PreparedAct &x, DType vt);  // x.q8 in activation format vt, made unless it is there
    // Norms that quantize for the next mat-vec (cuda_matmul.cpp; STRATA_CUDA_NORM_Q8=0: off, for A/B). A decode-sized
    // norm of whole rows also writes its output's 8-bit form (NormQ8) where the first matmul that quantized that
    // norm's output the time before (the norm known by its weight: norm_wants_) took a form the kernel makes; that
    // matmul then takes those bytes instead of quantizing (the same bytes). The form holds for norm_quant_.src's rows
    // until an op writes memory under them (wrote) or the scratch under them is released.
    struct NormQuant {
        const float *src = nullptr;
        int64_t rows = 0, k = 0, stride = 0;
        DType vt = DType::F32;
        size_t chunk = SIZE_MAX, off = 0;  // where src lies in the scratch (chunk SIZE_MAX: outside it)
    } norm_quant_;
    static constexpr int64_t k_norm_quant_values = int64_t(k_mmv_max_rows) * 8192;
    int8_t *norm_q_ = nullptr;  // room for k_norm_quant_values levels and their scales, made with the backend
    float2 *norm_ds_ = nullptr;
    std::unordered_map<const void *, DType> norm_wants_;  // by the norm's weight, or another producer's key
    const void *last_norm_w_ = nullptr;
    const float *last_norm_out_ = nullptr;
    bool norm_want_open_ = false;  // the latest norm's output has not been quantized by a matmul yet
    // A norm with weight w_dev writing out: the form to make (form 0: none).
    NormQ8 norm_quant_begin(const float *w_dev, const Act &x, const Act &out, bool wide);
    void norm_quant_made(const NormQ8 &q, const Act &out);
    // The same for another kernel that writes out and can make its Q8_0 form (can; the decoding attention's last
    // launch, known by key: its layer's cache): form 1 where the matmul that quantized out the time before took Q8_0.
    NormQ8 act_quant_begin(const void *key, const Act &out, bool can);
    // A matmul about to quantize rows (src, rows, k, stride) to vt: true with the norm's bytes where it made them.
    bool norm_quant_take(const float *src, int64_t rows, int64_t k, int64_t stride, DType vt, const int8_t *&q,
                         const float2 *&ds);
    void wrote(const Act &a);  // an op wrote a: a norm's form over those rows, k and v stored ahead no longer hold
    // Layer il's k and v rows stored in its cache by qk_norm_rope_store (cuda_mixers.cpp; STRATA_CUDA_KV_FUSE=0
    // turns it off): attention() over the same rows stores nothing. Cleared by that call, or by an op writing k or v.
    struct KvStored {
        int64_t il = -1;
        Act k, v;
    } kv_stored_;
    bool fits_qk_norm_rope(Act q, Act k, const Weight &q_norm, const Weight &k_norm, const RopeParams &rp) const;
    // route() with the one-launch router where it applies (false: the two-launch default ran, pairs not made).
    // rn: the residual step before it in the same launch (launch_router_norm), where router_norm_supported holds.
    bool route_launch(const Weight &router, Act x, const MoeParams &p, Act logits, int32_t *ids, float *weights,
                      const RouterPairs &pairs, const RouterNorm *rn = nullptr);
    void matmul_parts(const std::vector<MatmulOut> &outs, PreparedAct &x, std::vector<bool> &done);
    // STRATA_CUDA_FUSE=0 undoes the decode fusions (shared input quantization, several matrices of one input or gate
    // and up in one launch, silu fused into the down matrices' quantization, q/k norm and rope in one kernel, the
    // router's mat-vec and top-k in one kernel) for A/B checks; results are the same.
    static bool fusion_enabled();

    // ---- expert slots, the copy stream and the host stratum (cuda_slots.cpp) ----
    void make_slots(const Placement &plan);
    void make_host_tier(WeightSet &ws, const Placement &plan);
    std::string pin_host_copy(const WeightSet &ws);
    void free_slots();
    void wait_for_fills();  // compute waits for every fill issued so far
    // Compute waits for the copy-stream fills of the slots these groups read (not for later ones).
    void wait_for_slot_fills(const std::vector<ExpertGroup> &groups);
    bool device_routing_kernels(const ExpertWeights &w) const;  // decode kernels take the layer's expert types
    bool mat_vec_takes(const ExpertWeights &w) const;  // k_mmvq takes all three of its matrices
    void note_slots_read(const std::vector<ExpertGroup> &groups);  // after expert_ffn: the slots' last reader
    // Mapped misses (cuda_slots.cpp): the tables of every layer that can be mapped, from the pinned host copy.
    void map_host_copy(const WeightSet &ws);
    void map_expert(int64_t il, int32_t e, int32_t slot);  // the host table: e read from `slot`, or -1 its copy
    void unmap_slot(int32_t slot);                         // whatever slot held is read from its copy again
    void flush_mapped(int64_t il);                         // changed tables up (il < 0: every layer's)

    CudaOptions opt_;
    int device_ = 0;
    cudaDeviceProp prop_{};
    cudaStream_t stream_ = nullptr;       // compute
    cudaStream_t copy_stream_ = nullptr;  // expert slot fills
    uint64_t budget_ = 0;        // what dev_alloc may hold in all; 0 until planned
    uint64_t budget_total_ = 0;  // the budget for the whole process on this device, CUDA runtime included
    uint64_t dev_bytes_ = 0;
    uint64_t device_allocations_ = 0;  // dev_alloc calls since start
    std::unordered_map<void *, size_t> allocations_;
    int64_t download_cols_ = 0;  // the widest rows a pass downloads (graphs size their pinned buffer by it)

    std::vector<Chunk> chunks_;
    size_t cur_chunk_ = 0, cur_off_ = 0;
    uint64_t scratch_overflows_ = 0;  // allocations past the plan's scratch (a new chunk each)
    cudaEvent_t loan_done_ = nullptr;  // recorded on the compute stream when a loan ends (the copy stream waits)

    uint8_t *stage_ = nullptr;  // pinned host staging for uploads
    uint8_t *stage_dev_ = nullptr;  // its device address (mapped)
    size_t stage_size_ = 0, stage_used_ = 0;
    void alloc_stage(size_t bytes);  // stage_ (freed first) and stage_dev_
    // Staged bytes up to the device on the compute stream: rows x row bytes, pitch bytes apart at dst. By a kernel
    // that reads the staging buffer in place (STRATA_CUDA_UPLOAD_KERNEL=0: cudaMemcpy2DAsync): a copy on the copy
    // engine queues behind every expert fill issued before it on the copy stream, and a layer's small tables then
    // wait for the next layer's fills (bench/RESULTS.md, seventh round).
    void copy_up(void *dst, size_t pitch, const uint8_t *staged, size_t row, size_t rows);
    bool upload_kernel_ = true;
    // Handoffs (Backend::rows_handoff): one pinned, mapped block: the signal word (a line of its own), then two row
    // buffers used in turn, each free again once the copy last queued from it has run (handoff_done_).
    uint8_t *handoff_ = nullptr, *handoff_dev_ = nullptr;
    size_t handoff_bytes_ = 0;  // a buffer's
    int handoff_next_ = 0;
    uint32_t handoff_tickets_ = 0;
    cudaEvent_t handoff_done_[2] = {};
    static constexpr size_t k_handoff_head = 128;

    std::unordered_map<const uint8_t *, void *> weights_dev_;  // host bytes -> device copy (matrices and vectors)

    std::vector<BatchSeg> seq_pos_key_;
    int64_t seq_pos_rows_ = -1;
    const int2 *seq_pos_dev_ = nullptr;
    bool seq_pos_in_scratch_ = false;
    // Tables that hold for a whole pass (rows' sequences and positions, attention tiles) go to a small buffer of
    // their own, so the per-layer scratch release does not take them and each is uploaded once per pass, not per
    // layer.
    uint8_t *pass_buf_ = nullptr;
    size_t pass_buf_size_ = 0, pass_used_ = 0;
    void *upload_pass(const void *host, size_t bytes, bool &in_scratch, UploadSrc src);
    std::vector<AttnTile> tiles_key_;
    const AttnTile *tiles_dev_ = nullptr;
    bool tiles_in_scratch_ = false;
    const AttnTile *attn_tiles(const std::vector<AttnTile> &tiles);
    std::map<std::pair<float, int64_t>, float *> inv_freq_;
    // room for the rope tables, made at construction so that the first pass allocates nothing (inv_freq)
    static constexpr size_t k_rope_floats = 4096;
    float *rope_area_ = nullptr;
    size_t rope_used_ = 0;  // floats of rope_area_ handed out

    // caches
    struct LayerCache {
        bool attn = false;
        KvCacheView kv{};
        float *conv = nullptr, *state = nullptr;    // [seq][...]
        int64_t conv_floats = 0, state_floats = 0;  // per sequence
    };
    CacheShape cache_shape_;
    std::vector<LayerCache> caches_;
    void check_positions(const LayerCache &c, const BatchInfo &b) const;  // every row's position within the cache
    void *cache_arena_ = nullptr;  // every layer's caches, one allocation

    // expert slots
    std::vector<uint8_t *> slots_;   // slot memory
    std::vector<size_t> slot_size_;  // each slot's bytes (its class's: placement.h)
    uint8_t *loan_end_ = nullptr;    // the end of the lendable slots' allocation (nullptr: none); a loan ends there
    std::vector<ExpertSlotLayout> layouts_;      // per layer index
    std::vector<uint64_t> slot_last_read_;       // per slot: the expert_ffn that last read it (0: none)
    static constexpr int k_read_events = 64;
    cudaEvent_t read_done_[k_read_events] = {};  // read_done_[s % k]: recorded after expert_ffn number s
    uint64_t ffn_seq_ = 0;                       // expert_ffn calls that read slots, so far
    // Uploads issued so far (copy_up's, the rope tables'): an op whose kernel would read before its wait
    // (early_reads_enabled, pdl.cuh) does so only where none of its own uploads (seq_pos, attn_tiles, inv_freq) went
    // just before it, since such an upload may be a kernel the early reads would overtake.
    uint64_t uploads_ = 0;
    uint64_t copy_waited_ = 0;                   // the copy stream waits for every expert_ffn up to this one
    cudaEvent_t fill_done_ = nullptr;            // recorded on the copy stream after the latest fill
    bool fills_pending_ = false;                 // fills issued that compute has not waited for yet
    static constexpr int k_fill_events = 64;
    cudaEvent_t fill_events_[k_fill_events] = {};  // fill_events_[n % k]: recorded after copy-stream fill call n
    uint64_t fill_seq_ = 0, fill_waited_ = 0;      // copy-stream fill calls so far; compute has waited up to this
    std::vector<uint64_t> slot_fill_seq_;          // per slot: the copy-stream fill call that last wrote it
    // expert_ffn waits for its own slots' fills only where the schedule fills ahead during passes (the streamed MoE
    // schedule, next-layer prefetch; both opt-in until measured); else for every fill, as before them
    bool slot_waits_ = false;
    // the host stratum: per layer a pinned copy of every expert in the layout of a slot (gate, up and down at the
    // slot's offsets, experts `stride` = the layout's bytes apart), so that a fill is one DMA
    struct HostCopy {
        const uint8_t *base = nullptr;
        size_t stride = 0;
    };
    std::vector<HostCopy> host_copy_;
    bool fill_whole_ = true;  // STRATA_CUDA_FILL_WHOLE: a fill from the host copy is one copy, not one per matrix
    std::vector<void *> host_allocs_;
    std::unique_ptr<HostStager> stager_;
    const uint8_t *pinned_base_ = nullptr;  // the registered mapping, if any
    std::string prepare_note_;
    // per layer, when every expert is resident or the layer is mapped: the device table of its experts' matrices
    // (device routing)
    std::vector<const uint8_t *const *> expert_tables_;
    int64_t moe_layers_ = 0, resident_layers_ = 0, tables_set_ = 0;
    // Mapped misses (STRATA_DECODE_MAPPED, on where the host stratum is the pinned copy): per layer the device table
    // (3 pointers per expert, then a byte per expert: 1 where the pointers are into the host copy), its host image,
    // and each expert's matrices in the host copy as the device addresses them. Protocol: fills and loans change
    // the host image at once (the evicted expert back to its copy before the copy into its slot is issued, the new
    // one to its slot after), and mark the layer; a device-routed pass uploads its layer's table first, after
    // compute has waited for every fill, and begin_pass / replay_pass upload every marked table, so no recorded
    // pass uploads one. A fill on the copy stream waits for the last device-routed pass issued (it may have read
    // any slot: device_read_seq_).
    struct MappedTable {
        const uint8_t **dev = nullptr;
        std::vector<const uint8_t *> ptrs, home;
        std::vector<uint8_t> from_host;
        size_t expert_bytes = 0;
        bool dirty = false;
    };
    std::vector<MappedTable> mapped_;
    std::vector<std::pair<int32_t, int32_t>> slot_owner_;  // per slot: (layer, expert) of a mapped layer, or -1
    unsigned long long *mapped_counts_ = nullptr;          // per layer: pairs read from slots, from the host copy
    uint64_t device_read_seq_ = 0;                         // the ffn_seq_ of the last device-routed pass
    int64_t *draw_pass_dev_ = nullptr;                     // route_draws' pass count
    std::map<std::tuple<int64_t, double, uint64_t, int64_t>, std::pair<double *, int32_t *>> zipf_dev_;

    unsigned *route_done_ = nullptr;  // the one-launch router's count of finished blocks (zero between launches)
    // The tables experts_device_routed reads, made by route_for_device's launch for these ids of layer il (il -1:
    // none). Taken by the next experts_device_routed of that layer and ids; route_draws drops them (it rewrites ids).
    struct RoutedPairs {
        int64_t il = -1, n_tokens = 0, k = 0;
        const int32_t *ids = nullptr;
        MatmulGroup *groups = nullptr;
        int32_t *yrow = nullptr, *widx = nullptr;
    } routed_pairs_;

    OpProfiler prof_;
    double copy_rate_gbs_ = -1.0;    // measured once (copy_rate_gbs)
    std::pair<double, double> start_rates_{-1.0, -1.0};  // measured once (start_rates_gbs)
    double upload_rate_gbs_ = -1.0;  // measured once (upload_rate_gbs)
    // mark_device(): timing events, mark n recorded into marks_[n % k_marks]
    static constexpr int k_marks = 1024;  // a streamed layer's batches take three each (pass_timing.h)
    cudaEvent_t marks_[k_marks] = {};
    uint64_t n_marks_ = 0;

    // ---- graphs (cuda_graph.cpp): a decoding pass recorded by stream capture and launched as one graph ----
    bool graphs_on_ = false;           // CudaOptions::graphs, or STRATA_CUDA_GRAPHS where set
    bool graph_eligible_ = false;      // every MoE layer routes on the device at decode sizes
    bool capturing_ = false;           // inside begin_pass .. end_pass, recording
    std::vector<int64_t> graph_warm_;  // pass sizes that have run once without a graph (tables made, kernels loaded)
    struct Deferred {  // a download recorded in the graph: pinned rows copied to the caller's memory at end_pass
        void *host;
        const void *pinned;
        size_t bytes;
        bool ids = false;  // arg-max ids (PassIo::ids), else rows of floats (PassIo::logits, out_x or out_cur)
    };
    // Where a recorded download lands in a replay: elements from one of the pass's outputs.
    enum class DownloadDst : uint8_t { Logits, Ids, OutX, OutCur };
    struct ReplayDownload {
        DownloadDst dst;
        size_t offset;  // elements from the output's start
        Deferred d;
    };
    std::vector<Deferred> deferred_;
    // ids_after_pass: one pinned block, ids_cap_ ids a key, made on the first call (a direct pass: a size is recorded
    // only after it ran once without a graph).
    int32_t *ids_pinned_ = nullptr;
    int64_t ids_keys_ = 0, ids_cap_ = 0;
    bool ids_pending_ = false;  // copies queued that the host has not waited for (a pass may end without a wait)
    float *dl_pinned_ = nullptr;
    size_t dl_floats_ = 0, dl_used_ = 0;
    // What a recorded pass depended on beyond its kernels' arguments, and so what a replay must check or rewrite.
    struct StagedUpload {
        uint8_t *pinned;  // where in the staging buffer the graph's copy reads
        size_t bytes;
        UploadSrc src;
    };
    struct AttnRecord {  // attention()'s choices, the same for every attention layer of a replayable pass
        bool present = false, prompt = false;
        int rpt = 0;
        int64_t n_head_kv = 0, n_split = 0, chunk = 0, n_ctx = 0;
    };
    struct PassGraph {
        // the key: the batch's shape (positions aside), the logit rows, the memory the graph's nodes address
        int64_t rows = 0;
        std::vector<BatchSeg> segs;  // pos0 not compared
        std::vector<int64_t> out_rows;
        uint64_t generation = 0;
        cudaGraphExec_t exec = nullptr;
        bool replayable = false;
        AttnRecord attn;
        int64_t vocab_rows = 0;  // the embedding's rows, for the token check
        std::vector<StagedUpload> uploads;
        bool ids = false;  // the pass gives arg-max ids (part of the key)
        int ahead = -1;    // PassIo::ahead (part of the key)
        std::vector<ReplayDownload> downloads;
        uint64_t last_use = 0;
    };
    std::vector<PassGraph> graphs_;  // a few recorded passes, the least recently used one rebuilt from the next
    PassIo pass_io_;                 // the pass being recorded
    int64_t last_rows_ = -1;         // the previous pass's shape (rows, segments, logit rows)
    std::vector<BatchSeg> last_segs_;
    std::vector<int64_t> last_out_rows_;
    bool last_ids_ = false;  // whether it gave arg-max ids
    void note_shape(const BatchInfo &b, const PassIo &io);
    BatchInfo pass_batch_;
    bool rec_ok_ = false;  // the pass being recorded can be replayed so far
    AttnRecord rec_attn_;
    int64_t rec_vocab_ = 0;
    std::vector<StagedUpload> rec_uploads_;
    // Bumped whenever memory that recorded graphs address is given back or moved (scratch chunks, the staging and
    // download buffers, caches, slots): graphs of an older generation are recorded again before use.
    uint64_t graph_gen_ = 0, graph_clock_ = 0;
    uint64_t graph_launches_ = 0, graph_instantiations_ = 0, graph_replays_ = 0;
    void note_upload(uint8_t *pinned, size_t bytes, UploadSrc src);
    PassGraph *find_graph(const BatchInfo &b, const std::vector<int64_t> &out_rows, bool ids, int ahead);
    // Whether graph g can replay batch b (positions inside the context, tokens, where given, inside the vocabulary,
    // the attention's split the recorded one): tiles, the batch's attention tiles where g has attention.
    bool replay_fits(const PassGraph &g, const BatchInfo &b, const int32_t *tokens, std::vector<AttnTile> &tiles);
    // g's staged inputs rewritten from the batch and the pass's inputs (the staging buffer's copies done).
    void stage_replay(const PassGraph &g, const BatchInfo &b, const PassIo &io, const std::vector<AttnTile> &tiles);
    // A fed pass (PassIo::ahead >= 0): its tokens on the host, which embed() takes from fed_ids_, where the pass's
    // download_argmax leaves its ids for the next.
    struct Fed {
        const int32_t *tokens = nullptr;
        int64_t rows = 0;
    } fed_;
    int32_t *fed_ids_ = nullptr;   // device, k_mmv_max_rows
    int32_t *fed_host_ = nullptr;  // pinned: a fed pass's first tokens on their way to fed_ids_
    void feed_tokens(const int32_t *tokens, int64_t n);
    void deliver(const PassGraph &g, const PassIo &io);  // a replayed graph's downloads to the pass's outputs
    cudaEvent_t ahead_done_[2] = {};                     // replay_ahead: each of the pair's last step done
    uint64_t ahead_runs_ = 0, ahead_steps_ = 0;
    void drop_capture();
    void report_graphs() const;  // stderr, at exit: passes, and where their time went
    using Clock = std::chrono::steady_clock;
    Clock::time_point graph_t0_;
    double graph_ms_[3] = {0, 0, 0};  // recording, update or build, launch to done
    // replays: host work to launch, the launch call, launch to done, and the host's time outside the backend from
    // the end of one replay to the start of the next (over gaps_ of them)
    double replay_ms_[4] = {0, 0, 0, 0};
    uint64_t replay_gaps_ = 0;
    Clock::time_point replay_end_{};
    Clock::time_point pass_t0_;
    bool pass_small_ = false;
    uint64_t direct_passes_ = 0;
    double direct_ms_[2] = {0, 0};  // decoding passes without graphs: host issue time, time to done
    void note_direct_pass(Clock::time_point issued, Clock::time_point done);
};

// Times the enclosing op when STRATA_CUDA_PROFILE=1 (op_profiler.h).
#define STRATA_CUDA_OP(name) OpScope op_scope_(prof_, name, stream_)

}  // namespace strata::cuda
