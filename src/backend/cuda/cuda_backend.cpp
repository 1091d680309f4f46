// CUDA backend set-up: device memory under a budget, the placement plan, weight uploads, caches, scratch and
// uploads, and the small ops. Protocol of streams and buffers: cuda_backend_impl.h.
#include "backend/cuda/cuda_backend_impl.h"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/driver_memory.h"
#include "core/env.h"
#include "core/error.h"
#include "core/units.h"
#include "format/quant.h"
#include "model/forward.h"

namespace strata {

namespace {

constexpr size_t k_align = 256;
// The CUDA runtime's share of a budget where the driver's count cannot be read, and the margin kept for what it may
// add after the plan (kernels loaded at first launch, local memory grown for a kernel that needs more).
constexpr uint64_t k_runtime_estimate = uint64_t(512) << 20;
constexpr uint64_t k_runtime_margin = uint64_t(64) << 20;
inline size_t align_up(size_t n) {
    return (n + k_align - 1) / k_align * k_align;
}

}  // namespace

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions &o) {
    return std::make_unique<cuda::CudaBackend>(o);
}

CudaExpertStats cuda_expert_stats(const Backend &be) {
    const auto *cb = dynamic_cast<const cuda::CudaBackend *>(&be);
    if (!cb) fail("expert statistics: the backend is not a CUDA backend");
    return cb->expert_stats();
}

namespace cuda {

namespace {

// MemAvailable from /proc/meminfo, 0 when unknown.
uint64_t host_available_bytes() {
    FILE *f = std::fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    std::fclose(f);
    return uint64_t(kb) * 1024;
}

}  // namespace

// The "pinned where it fits" host stratum: every routed expert copied once into pinned host memory, so that misses
// are DMA copies at the bus's speed with no CPU work (on the H200 machine, Qwen3-30B-A3B under a 12 GiB budget:
// pp512 3386 against 2487 t/s through the stager, tg64 105 against 78). Costs start-up time (allocating pinned
// memory took ~0.5 s per GiB there: 9.5 s for 15.2 GiB of experts) and host RAM; where the RAM is not there (less
// available than the experts plus 4 GiB), the mapping and the stager serve instead. STRATA_CUDA_HOST_PINNED=0
// turns it off.
std::string CudaBackend::pin_host_copy(const Model &m) {
    const uint64_t need = m.expert_bytes, avail = host_available_bytes();
    if (avail && need + (uint64_t(4) << 30) > avail)
        return strfmt("host %s pageable (a pinned copy needs %s, %s available)", format_bytes(need).c_str(),
                      format_bytes(need + (uint64_t(4) << 30)).c_str(), format_bytes(avail).c_str());
    const auto t0 = std::chrono::steady_clock::now();
    ThreadPool pool(std::min(8, hardware_threads()));
    for (int64_t il = 0; il < int64_t(m.layers.size()); il++) {
        const LayerWeights &L = m.layers[size_t(il)];
        if (!L.gate_exps.present() || il >= m.hp.n_layer) continue;
        const Weight *ws[3] = {&L.gate_exps, &L.up_exps, &L.down_exps};
        uint8_t *copies[3];
        for (int j = 0; j < 3; j++) {
            const Weight &w = *ws[j];
            const size_t mb = w.matrix_bytes(), n = size_t(m.hp.n_expert) * mb;
            const cudaError_t err = cudaMallocHost(reinterpret_cast<void **>(&copies[j]), n);
            if (err != cudaSuccess) {
                cudaGetLastError();
                fail("CUDA%d: pinning %s of host memory for expert copies failed: %s", device_, format_bytes(n).c_str(),
                     cudaGetErrorString(err));
            }
            host_copies_.push_back(copies[j]);
            pool.parallel_for(m.hp.n_expert, 1, [&](int64_t e0, int64_t e1) {
                for (int64_t e = e0; e < e1; e++) std::memcpy(copies[j] + size_t(e) * mb, w.expert_host(e), mb);
            });
        }
        experts_.set_host_copy(il, copies[0], copies[1], copies[2]);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return strfmt("host %s pinned copy (%.1f s)", format_bytes(need).c_str(), secs);
}

CudaBackend::CudaBackend(const CudaOptions &o) : opt_(o), device_(o.device) {
    const int n = cuda_device_count();
    if (n == 0) fail("CUDA: no GPU is visible (no driver, or no device)");
    if (device_ < 0 || device_ >= n) fail("CUDA: there is no device %d (devices 0..%d)", device_, n - 1);
    STRATA_CUDA_CHECK(cudaSetDevice(device_));
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    stage_size_ = size_t(4) << 20;
    STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void **>(&stage_), stage_size_));
    iq_grids();
}

CudaBackend::~CudaBackend() {
    // Errors are ignored here: a destructor cannot fail, and a broken context frees everything with the process.
    cudaSetDevice(device_);
    if (capturing_) drop_capture();
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto &e : graph_execs_)
        if (e.second) cudaGraphExecDestroy(e.second);
    if (dl_pinned_) cudaFreeHost(dl_pinned_);
    prof_.step();
    prof_.report();
    report_graphs();
    for (auto &a : allocations_) cudaFree(a.first), cuda::track_device_bytes(device_, -int64_t(a.second));
    if (pinned_base_) cudaHostUnregister(const_cast<uint8_t *>(pinned_base_));
    for (void *p : host_copies_) cudaFreeHost(p);
    if (stage_) cudaFreeHost(stage_);
    if (stream_) cudaStreamDestroy(stream_);
    cudaGetLastError();
}

std::string CudaBackend::name() const {
    return strfmt("CUDA%d (%s, sm_%d%d, %s)", device_, prop_.name, prop_.major, prop_.minor,
                  format_bytes(prop_.totalGlobalMem).c_str());
}

Backend::Stats CudaBackend::stats() const {
    Stats s;
    s.expert_cache_hits = experts_.stats().hits;
    s.expert_cache_misses = experts_.stats().misses;
    s.bytes_streamed = experts_.stats().bytes_uploaded;
    return s;
}

CudaExpertStats CudaBackend::expert_stats() const {
    CudaExpertStats s;
    s.n_slots = experts_.n_slots();
    s.n_experts = experts_.n_experts_total();
    s.hits = experts_.stats().hits;
    s.misses = experts_.stats().misses;
    s.bytes_uploaded = experts_.stats().bytes_uploaded;
    s.device_bytes = dev_bytes_;
    s.budget_bytes = budget_total_;
    DeviceMemory dm;
    device_memory(dm);
    s.driver_bytes = dm.driver;
    s.graph_launches = graph_launches_;
    s.graph_instantiations = graph_instantiations_;
    return s;
}

// ---- device memory ------------------------------------------------------------------------------------------

bool CudaBackend::device_memory(DeviceMemory &out) const {
    out.held = dev_bytes_;
    out.budget = budget_total_;
    out.driver = 0;
    // This backend's share of the process as the driver counts it: everything but other backends' allocations.
    if (const std::optional<uint64_t> p = cuda::process_device_bytes(device_)) {
        const uint64_t others = cuda::tracked_device_bytes(device_) - dev_bytes_;
        out.driver = *p > others ? *p - others : 0;
    }
    return true;
}

void *CudaBackend::dev_alloc(size_t bytes, const char *what) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    if (budget_ && dev_bytes_ + bytes > budget_)
        fail("CUDA%d: %s needs %s more device memory, over the budget of %s (%s in use)", device_, what,
             format_bytes(bytes).c_str(), format_bytes(budget_).c_str(), format_bytes(dev_bytes_).c_str());
    void *p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        fail("CUDA%d: allocating %s for %s failed: %s", device_, format_bytes(bytes).c_str(), what,
             cudaGetErrorString(err));
    }
    allocations_[p] = bytes;
    dev_bytes_ += bytes;
    cuda::track_device_bytes(device_, int64_t(bytes));
    return p;
}

void CudaBackend::dev_free(void *p) {
    auto it = allocations_.find(p);
    STRATA_ASSERT(it != allocations_.end());
    STRATA_CUDA_CHECK(cudaFree(p));
    dev_bytes_ -= it->second;
    cuda::track_device_bytes(device_, -int64_t(it->second));
    allocations_.erase(it);
}

// ---- scratch ------------------------------------------------------------------------------------------------

void *CudaBackend::scratch_bytes(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    while (cur_chunk_ < chunks_.size()) {
        if (cur_off_ + bytes <= chunks_[cur_chunk_].size) {
            void *p = chunks_[cur_chunk_].ptr + cur_off_;
            cur_off_ += bytes;
            return p;
        }
        cur_chunk_++;
        cur_off_ = 0;
    }
    // Past the planned arena: one more chunk (reset_scratch folds the chunks into one).
    const size_t size = std::max(bytes, size_t(64) << 20);
    chunks_.push_back({static_cast<uint8_t *>(dev_alloc(size, "scratch")), size});
    cur_chunk_ = chunks_.size() - 1;
    cur_off_ = bytes;
    return chunks_.back().ptr;
}

Act CudaBackend::alloc(int64_t rows, int64_t cols) {
    STRATA_ASSERT(rows >= 0 && cols > 0);
    return {static_cast<float *>(scratch_bytes(size_t(rows * cols) * 4)), rows, cols, cols};
}

void CudaBackend::reset_scratch() {
    if (capturing_) drop_capture();  // a pass left without end_pass or abort_pass
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    prof_.step();
    if (chunks_.size() > 1) {
        size_t total = 0;
        for (const Chunk &c : chunks_) total += c.size;
        for (const Chunk &c : chunks_) dev_free(c.ptr);
        chunks_.clear();
        chunks_.push_back({static_cast<uint8_t *>(dev_alloc(total, "scratch")), total});
    }
    cur_chunk_ = 0;
    cur_off_ = 0;
    stage_used_ = 0;
    pass_used_ = 0;
    slot_pos_rows_ = -1;
    slot_pos_dev_ = nullptr;
    tiles_key_.clear();
    tiles_dev_ = nullptr;
}

void CudaBackend::scratch_release(ScratchMark m) {
    release({m.a, m.b});
    // Pass tables that did not fit their buffer lie in scratch, perhaps in what was released.
    if (slot_pos_in_scratch_) slot_pos_rows_ = -1, slot_pos_dev_ = nullptr;
    if (tiles_in_scratch_) tiles_key_.clear(), tiles_dev_ = nullptr;
}

void *CudaBackend::upload(const void *host, size_t bytes) {
    void *dev = scratch_bytes(bytes);
    const size_t need = align_up(bytes);
    if (stage_used_ + need > stage_size_) {
        // A recorded pass cannot wait for its earlier copies; passes small enough to record upload far less.
        if (capturing_)
            fail("internal: a recorded pass uploads more than the %s staging buffer",
                 format_bytes(stage_size_).c_str());
        // Every copy queued from the staging buffer has to finish before it is rewritten.
        STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        stage_used_ = 0;
        if (need > stage_size_) {
            STRATA_CUDA_CHECK(cudaFreeHost(stage_));
            stage_ = nullptr;
            stage_size_ = std::max(need, 2 * stage_size_);
            STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void **>(&stage_), stage_size_));
        }
    }
    uint8_t *h = stage_ + stage_used_;
    std::memcpy(h, host, bytes);
    stage_used_ += need;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, stream_));
    return dev;
}

void *CudaBackend::upload_pass(const void *host, size_t bytes, bool &in_scratch) {
    const size_t need = align_up(std::max<size_t>(bytes, 1));
    // Where the buffer is full, or the staging buffer would have to wrap (upload() knows how): scratch.
    in_scratch = !pass_buf_ || pass_used_ + need > pass_buf_size_ || stage_used_ + need > stage_size_;
    if (in_scratch) return upload(host, bytes);
    void *dev = pass_buf_ + pass_used_;
    pass_used_ += need;
    uint8_t *h = stage_ + stage_used_;
    std::memcpy(h, host, bytes);
    stage_used_ += need;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice, stream_));
    return dev;
}

const AttnTile *CudaBackend::attn_tiles(const std::vector<AttnTile> &tiles) {
    auto same = [&] {
        if (tiles.size() != tiles_key_.size()) return false;
        for (size_t i = 0; i < tiles.size(); i++) {
            const AttnTile &a = tiles[i], &b = tiles_key_[i];
            if (a.row0 != b.row0 || a.n_rows != b.n_rows || a.slot != b.slot || a.pos0 != b.pos0) return false;
        }
        return true;
    };
    if (tiles_dev_ && same()) return tiles_dev_;
    tiles_dev_ =
        static_cast<const AttnTile *>(upload_pass(tiles.data(), tiles.size() * sizeof(AttnTile), tiles_in_scratch_));
    tiles_key_ = tiles;
    return tiles_dev_;
}

void CudaBackend::download(const Act &src, float *host) {
    STRATA_CUDA_OP("download");
    if (src.rows == 0) return;
    if (capturing_) {  // recorded: into pinned memory now, to `host` once the graph has run (end_pass)
        const size_t n = size_t(src.rows * src.cols);
        if (dl_used_ + n > dl_floats_)
            fail("internal: a recorded pass downloads more than its %zu floats of pinned memory", dl_floats_);
        float *pin = dl_pinned_ + dl_used_;
        STRATA_CUDA_CHECK(cudaMemcpy2DAsync(pin, size_t(src.cols) * 4, src.data, size_t(src.stride) * 4,
                                            size_t(src.cols) * 4, size_t(src.rows), cudaMemcpyDeviceToHost, stream_));
        deferred_.push_back({host, pin, n * sizeof(float)});
        dl_used_ += n;
        return;
    }
    const auto issued = Clock::now();
    STRATA_CUDA_CHECK(cudaMemcpy2DAsync(host, size_t(src.cols) * 4, src.data, size_t(src.stride) * 4,
                                        size_t(src.cols) * 4, size_t(src.rows), cudaMemcpyDeviceToHost, stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    note_direct_pass(issued, Clock::now());
}

// ---- weights and the plan -------------------------------------------------------------------------------------

const uint8_t *CudaBackend::dev_matrix(const Weight &w) const {
    if (w.backend) return static_cast<const uint8_t *>(w.backend);
    auto it = weights_dev_.find(w.host);
    if (it == weights_dev_.end()) fail("internal: weight '%.*s' has no device copy", int(w.name.size()), w.name.data());
    return static_cast<const uint8_t *>(it->second);
}

const float *CudaBackend::dev_vector(const Weight &w) const {
    return reinterpret_cast<const float *>(dev_matrix(w));
}

int64_t CudaBackend::layer_index(const LayerWeights &L) const {
    STRATA_ASSERT(model_ && !model_->layers.empty());
    const int64_t il = &L - model_->layers.data();
    STRATA_ASSERT(il >= 0 && il < int64_t(model_->layers.size()));
    return il;
}

uint64_t CudaBackend::cache_bytes(const HParams &hp, const CacheConfig &cfg) const {
    uint64_t total = 0;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        if (hp.is_recurrent(il)) {
            total += align_up(size_t(cfg.n_slots) * size_t((hp.ssm_conv_kernel - 1) * hp.gdn_conv_dim()) * 4);
            total += align_up(size_t(cfg.n_slots) * size_t(hp.ssm_dt_rank * hp.ssm_d_state * hp.gdn_head_v_dim()) * 4);
        } else {
            const int64_t kv_cols = hp.n_head_kv * hp.head_dim_k;
            const size_t rb = cfg.kv_type == KvType::F32   ? size_t(kv_cols) * 4
                              : cfg.kv_type == KvType::F16 ? size_t(kv_cols) * 2
                                                           : row_bytes(DType::Q8_0, kv_cols);
            total += 2 * align_up(size_t(cfg.n_slots) * size_t(cfg.n_ctx) * rb);
        }
    }
    return total;
}

// The scratch one forward pass of n_batch tokens takes: activations the model allocates (they live until the
// pass ends) plus the largest set of temporaries one op holds, each allocation rounded up, with a margin.
uint64_t CudaBackend::scratch_estimate(const HParams &hp) const {
    const uint64_t T = uint64_t(std::max<int64_t>(opt_.n_batch, 1)), E = uint64_t(hp.n_embd);
    const uint64_t q_cols = uint64_t(hp.n_head * hp.head_dim_k), kv = uint64_t(hp.n_head_kv * hp.head_dim_k);
    const uint64_t attn = T * (q_cols * (hp.attn_output_gate ? 4 : 2) + 2 * kv + E);
    const uint64_t conv = uint64_t(hp.gdn_conv_dim()), d_inner = uint64_t(hp.ssm_d_inner),
                   n_v = uint64_t(hp.ssm_dt_rank);
    const uint64_t gdn = T * (conv + 2 * d_inner + 2 * n_v + E);
    // A pass keeps one layer's temporaries at a time (the forward pass releases them per layer).
    uint64_t layers = 0;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const uint64_t mix = hp.is_recurrent(il) ? gdn : attn;
        layers = std::max(layers, (mix + 2 * T * E) * 4 + 16 * k_align);
    }
    const uint64_t M = T * uint64_t(hp.n_expert_used), F = uint64_t(std::max(hp.n_ff_exp, hp.n_ff_shexp));
    const uint64_t K = std::max({E, F, q_cols, d_inner});
    const uint64_t moe_tmp =
        4 * (T * uint64_t(hp.n_expert) + 2 * M + M * (3 * E + 4 * F) + T * (3 * F + E)) + M * (E + F) * 2 + 5 * M * K;
    const uint64_t gdn_tmp = 4 * (T * (conv + 2 * n_v) + conv * uint64_t(hp.ssm_conv_kernel) +
                                  n_v * 64 * (2 * uint64_t(hp.ssm_d_state) + 128));
    const uint64_t mm_tmp = 5 * T * K;
    const uint64_t out_rows = std::min<uint64_t>(T, uint64_t(k_logit_slice_rows));
    const uint64_t out = 4 * out_rows * (2 * E + uint64_t(hp.n_vocab)) + 5 * out_rows * E;
    const uint64_t total = 4 * T * E + layers + std::max({moe_tmp, gdn_tmp, mm_tmp}) + out;
    return total + total / 8 + (uint64_t(32) << 20);
}

void CudaBackend::prepare(Model &m) {
    model_ = &m;
    const HParams &hp = m.hp;
    if (uint64_t(opt_.n_batch) * uint64_t(std::max<int64_t>(hp.n_expert_used, 1)) > 65535)
        fail(
            "CUDA: a batch of %lld tokens routes more rows than the kernels take (at most 65535 token-expert "
            "pairs per pass); use a smaller batch",
            (long long)opt_.n_batch);

    // Non-expert weights of the trunk: matrices keep their packed bytes, 1-D weights become f32.
    std::vector<Weight *> matrices, vectors;
    auto add = [](std::vector<Weight *> &v, Weight &w) {
        if (w.present()) v.push_back(&w);
    };
    add(matrices, m.tok_embd);
    add(matrices, m.output);
    add(vectors, m.output_norm);
    for (int64_t il = 0; il < hp.n_layer; il++) {
        LayerWeights &L = m.layers[size_t(il)];
        for (Weight *w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ssm_qkv, &L.ssm_z, &L.ssm_ba, &L.ssm_beta, &L.ssm_alpha,
                          &L.ssm_out, &L.gate_inp, &L.gate_shexp, &L.up_shexp, &L.down_shexp})
            add(matrices, *w);
        for (Weight *w : {&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.k_norm, &L.ssm_dt_bias, &L.ssm_a, &L.ssm_norm,
                          &L.gate_inp_shexp, &L.ssm_conv1d})
            add(vectors, *w);
    }
    for (Weight *w : matrices)
        if (!cuda::cuda_can_dequantize(w->type))
            fail("CUDA: tensor '%.*s' has type %s, which the CUDA backend cannot compute with", int(w->name.size()),
                 w->name.data(), dtype_name(w->type));
    uint64_t weight_bytes = 0;
    {
        std::unordered_map<const uint8_t *, bool> seen;
        for (Weight *w : matrices)
            if (!seen[w->host]) seen[w->host] = true, weight_bytes += align_up(w->matrix_bytes());
        for (Weight *w : vectors)
            if (!seen[w->host]) seen[w->host] = true, weight_bytes += align_up(size_t(w->ne[0] * w->ne[1]) * 4);
    }

    // Expert slots: one expert's gate, up and down, each matrix aligned; the largest layer sets the slot size.
    std::vector<ExpertLayout> layouts(size_t(hp.n_layer));
    size_t slot_bytes = 0;
    int64_t n_moe_layers = 0;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const LayerWeights &L = m.layers[size_t(il)];
        if (!L.gate_exps.present()) continue;
        for (const Weight *w : {&L.gate_exps, &L.up_exps, &L.down_exps})
            if (!cuda::cuda_can_dequantize(w->type))
                fail("CUDA: tensor '%.*s' has type %s, which the CUDA backend cannot compute with", int(w->name.size()),
                     w->name.data(), dtype_name(w->type));
        ExpertLayout &E = layouts[size_t(il)];
        E.gate = &L.gate_exps;
        E.up = &L.up_exps;
        E.down = &L.down_exps;
        E.gate_off = 0;
        E.up_off = align_up(L.gate_exps.matrix_bytes());
        E.down_off = E.up_off + align_up(L.up_exps.matrix_bytes());
        E.bytes = E.down_off + align_up(L.down_exps.matrix_bytes());
        slot_bytes = std::max(slot_bytes, E.bytes);
        n_moe_layers++;
    }
    const int64_t n_experts_total = n_moe_layers * hp.n_expert;

    // The budget bounds what this process holds on the device, the CUDA context included: the driver's count for
    // the process (NVML) less what Strata's backends have allocated is the runtime's share, and a margin covers what
    // the runtime may still add (kernels loaded on first launch, local memory). Without a budget: what is free less
    // a reserve.
    size_t free_b = 0, total_b = 0;
    STRATA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const std::optional<uint64_t> process = cuda::process_device_bytes(device_);
    const uint64_t tracked = cuda::tracked_device_bytes(device_);
    const uint64_t runtime = process && *process > tracked ? *process - tracked : k_runtime_estimate;
    const uint64_t runtime_total = runtime + k_runtime_margin;
    const std::string runtime_note = strfmt("CUDA runtime %s%s", format_bytes(runtime).c_str(),
                                            process ? "" : " (estimated: the driver's count is not readable)");
    const uint64_t reserve = std::max<uint64_t>(uint64_t(512) << 20, total_b / 32);
    const uint64_t usable = free_b > reserve ? free_b - reserve : 0;
    const uint64_t given = opt_.vram_budget_bytes;
    uint64_t budget = given ? (given > runtime_total ? given - runtime_total : 0) : usable;
    if (given && budget > free_b)
        fail("--vram-budget %s is more than CUDA%d can give (%s free besides the CUDA runtime's %s)",
             format_bytes(given).c_str(), device_, format_bytes(free_b).c_str(), format_bytes(runtime_total).c_str());

    const uint64_t kv_bytes = cache_bytes(hp, opt_.cache);
    const uint64_t scratch = align_up(opt_.scratch_bytes ? opt_.scratch_bytes : scratch_estimate(hp));
    // The pass tables (rows' slots and positions, attention tiles: see upload_pass) and the small rest: i-quant and
    // rope tables, expert tables, rounding.
    pass_buf_size_ = align_up(size_t(16) << 10) + align_up(size_t(opt_.n_batch) * (sizeof(int2) + 2 * 16));
    const uint64_t misc = pass_buf_size_ + (uint64_t(4) << 20);
    const uint64_t resident = weight_bytes + kv_bytes + scratch + misc;
    const int64_t min_slots =
        n_experts_total ? std::min<int64_t>(n_experts_total, std::max<int64_t>(hp.n_expert_used, 1)) : 0;
    const uint64_t minimum = resident + uint64_t(min_slots) * slot_bytes;
    if (minimum > budget)
        fail(
            "%s %s is too small for this model: the resident part needs %s (weights %s, KV cache and states %s, "
            "scratch for %lld-token passes %s), the expert cache at least %lld slots of %s and the CUDA runtime %s; "
            "give at least %s",
            given ? "--vram-budget" : "the free memory of CUDA", format_bytes(given ? given : budget).c_str(),
            format_bytes(resident).c_str(), format_bytes(weight_bytes).c_str(), format_bytes(kv_bytes).c_str(),
            (long long)opt_.n_batch, format_bytes(scratch).c_str(), (long long)min_slots,
            format_bytes(slot_bytes).c_str(), format_bytes(runtime_total).c_str(),
            format_bytes(minimum + (given ? runtime_total : 0)).c_str());
    int64_t n_slots =
        slot_bytes ? int64_t(std::min<uint64_t>(uint64_t(n_experts_total), (budget - resident) / slot_bytes)) : 0;
    if (opt_.expert_slots > 0) n_slots = std::min(n_slots, opt_.expert_slots);
    budget_ = budget;
    budget_total_ = given ? given : budget + runtime_total;

    // Place: weights, scratch, expert slots (caches come in init_caches, planned above). The weights share one
    // allocation: the driver hands out memory in 2 MiB pages, and hundreds of separate matrices would each waste part
    // of their last page outside the budget's count.
    std::unordered_map<const uint8_t *, void *> &dev = weights_dev_;
    uint8_t *arena = weight_bytes ? static_cast<uint8_t *>(dev_alloc(weight_bytes, "weights")) : nullptr;
    size_t arena_used = 0;
    auto carve = [&](size_t bytes) {
        void *p = arena + arena_used;
        arena_used += align_up(bytes);
        STRATA_ASSERT(arena_used <= weight_bytes);
        return p;
    };
    for (Weight *w : matrices) {
        auto it = dev.find(w->host);
        if (it == dev.end()) {
            void *p = carve(w->matrix_bytes());
            STRATA_CUDA_CHECK(cudaMemcpyAsync(p, w->host, w->matrix_bytes(), cudaMemcpyHostToDevice, stream_));
            it = dev.emplace(w->host, p).first;
        }
        w->backend = it->second;
    }
    for (Weight *w : vectors) {
        auto it = dev.find(w->host);
        if (it == dev.end()) {
            std::vector<float> f(size_t(w->ne[0] * w->ne[1]));
            for (int64_t r = 0; r < w->ne[1]; r++)
                dequantize_row(w->type, w->host + size_t(r) * w->row_bytes, f.data() + r * w->ne[0], w->ne[0]);
            void *p = carve(f.size() * 4);
            // pageable source: the call returns once the bytes are staged, so f may go right after
            STRATA_CUDA_CHECK(cudaMemcpyAsync(p, f.data(), f.size() * 4, cudaMemcpyHostToDevice, stream_));
            it = dev.emplace(w->host, p).first;
        }
        w->backend = it->second;
    }
    chunks_.push_back({static_cast<uint8_t *>(dev_alloc(scratch, "scratch")), size_t(scratch)});
    pass_buf_ = static_cast<uint8_t *>(dev_alloc(pass_buf_size_, "pass tables"));

    std::vector<uint8_t *> slots;
    for (int64_t done = 0; done < n_slots;) {
        // pools of at most 1 GiB, so no single allocation is huge
        const int64_t per_pool = std::max<int64_t>(1, int64_t((uint64_t(1) << 30) / std::max<size_t>(slot_bytes, 1)));
        const int64_t n = std::min(per_pool, n_slots - done);
        uint8_t *pool = static_cast<uint8_t *>(dev_alloc(size_t(n) * slot_bytes, "expert slots"));
        for (int64_t i = 0; i < n; i++) slots.push_back(pool + size_t(i) * slot_bytes);
        done += n;
    }
    experts_.init(std::move(layouts), hp.n_expert, slot_bytes, std::move(slots));
    // Expert bytes come from the mapped file through a pinned stager (STRATA_CUDA_STAGER=0: plain pageable copies).
    const bool use_stager = n_experts_total > 0 && env_switch("STRATA_CUDA_STAGER", true);
    if (use_stager && !stager_)
        stager_ = std::make_unique<HostStager>(size_t(32) << 20, 4, std::min(8, hardware_threads()));
    experts_.set_stager(use_stager ? stager_.get() : nullptr);
    const std::string copy_note = use_stager ? strfmt(" via pinned stager %d x %s", stager_->n_buffers(),
                                                      format_bytes(stager_->buffer_bytes()).c_str())
                                             : std::string();
    std::string host_note = "host 0 GiB";
    // The stager's pinned buffers and threads are kept only while misses can come from the mapping.
    auto drop_stager = [&] {
        experts_.set_stager(nullptr);
        stager_.reset();
    };
    if (n_slots >= n_experts_total) {
        experts_.load_all(stream_);
        drop_stager();
        // Per layer, the device table of its experts' matrices, for routing without the host (moe()).
        expert_tables_.assign(size_t(hp.n_layer), nullptr);
        for (int64_t il = 0; il < hp.n_layer; il++) {
            if (!m.layers[size_t(il)].gate_exps.present()) continue;
            std::vector<const uint8_t *> tab(size_t(3 * hp.n_expert));
            for (int32_t e = 0; e < int32_t(hp.n_expert); e++) {
                const ExpertPtrs p = experts_.resident(il, e);
                tab[size_t(3 * e)] = p.gate, tab[size_t(3 * e + 1)] = p.up, tab[size_t(3 * e + 2)] = p.down;
            }
            auto *dev = static_cast<const uint8_t **>(dev_alloc(tab.size() * sizeof(void *), "expert tables"));
            STRATA_CUDA_CHECK(
                cudaMemcpyAsync(dev, tab.data(), tab.size() * sizeof(void *), cudaMemcpyHostToDevice, stream_));
            expert_tables_[size_t(il)] = dev;
        }
    } else if (m.file && env_switch("STRATA_CUDA_HOST_PINNED", true) && !env_switch("STRATA_CUDA_PIN", false)) {
        host_note = pin_host_copy(m);
        if (host_copies_.empty())
            host_note += copy_note;  // refused: the mapping through the stager
        else
            drop_stager();
    } else if (m.file) {
        // Streaming from the mapped file, through the stager. Pinning the mapping itself (cudaHostRegister,
        // read-only; STRATA_CUDA_PIN=1) would let copies run as DMA straight from it, but on the Firecracker H200
        // machines registering the 16.75 GiB mapping of Qwen3-30B-A3B did not finish within 150 s.
        if (!env_switch("STRATA_CUDA_PIN", false)) {
            host_note = strfmt("host %s pageable%s", format_bytes(m.expert_bytes).c_str(), copy_note.c_str());
        } else {
            const uint8_t *base = m.file->bytes();
            const long page = sysconf(_SC_PAGESIZE);
            const size_t len = (m.file->file_size() + size_t(page) - 1) / size_t(page) * size_t(page);
            const auto t0 = std::chrono::steady_clock::now();
            const cudaError_t err =
                cudaHostRegister(const_cast<uint8_t *>(base), len, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (err == cudaSuccess) {
                pinned_base_ = base;
                experts_.set_stager(nullptr);  // straight DMA from the pinned mapping
                host_note = strfmt("host %s pinned (%.2f s)", format_bytes(m.expert_bytes).c_str(), secs);
            } else {
                cudaGetLastError();
                host_note = strfmt("host %s pageable%s (pinning failed: %s)", format_bytes(m.expert_bytes).c_str(),
                                   copy_note.c_str(), cudaGetErrorName(err));
            }
        }
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // Decoding passes can run as graphs where no layer needs the host for its experts.
    graph_eligible_ = true;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        const LayerWeights &L = m.layers[size_t(il)];
        if (L.gate_exps.present() && !device_routing_applies(L, il, 1)) graph_eligible_ = false;
    }
    const double pct = n_experts_total ? 100.0 * double(n_slots) / double(n_experts_total) : 100.0;
    plan_line_ = strfmt(
        "strata: CUDA%d plan: resident %s, expert cache %lld slots (%s, %.0f%% of experts), %s, "
        "KV %s %d x %lld (%s with states), scratch %s, %s, budget %s",
        device_, format_bytes(weight_bytes + kv_bytes + scratch).c_str(), (long long)n_slots,
        format_bytes(uint64_t(n_slots) * slot_bytes).c_str(), pct, host_note.c_str(), kv_type_name(opt_.cache.kv_type),
        opt_.cache.n_slots, (long long)opt_.cache.n_ctx, format_bytes(kv_bytes).c_str(), format_bytes(scratch).c_str(),
        runtime_note.c_str(), format_bytes(budget_total_).c_str());
    if (opt_.log) opt_.log(plan_line_);
}

// ---- caches -------------------------------------------------------------------------------------------------

void CudaBackend::init_caches(const HParams &hp, const CacheConfig &cfg) {
    if (cfg.n_slots <= 0 || cfg.n_ctx <= 0) fail("cache: need at least one slot and one position");
    if (cfg.kv_type == KvType::Q8_0 && hp.head_dim_k % 32 != 0)
        fail("--kv-type q8_0 needs a head size that is a multiple of 32 (this model: %lld)", (long long)hp.head_dim_k);
    // One allocation for every layer's caches (see the weights in plan_and_place: the driver's 2 MiB pages).
    if (cache_arena_) dev_free(cache_arena_);
    cache_arena_ = nullptr;
    caches_.assign(size_t(hp.n_layer), {});
    cache_cfg_ = cfg;
    size_t total = 0;
    std::vector<size_t> sizes;  // per layer: conv and state, or k and v
    for (int64_t il = 0; il < hp.n_layer; il++) {
        LayerCache &c = caches_[size_t(il)];
        if (hp.is_recurrent(il)) {
            c.conv_floats = (hp.ssm_conv_kernel - 1) * hp.gdn_conv_dim();
            c.state_floats = hp.ssm_dt_rank * hp.ssm_d_state * hp.gdn_head_v_dim();
            sizes.push_back(std::max<size_t>(size_t(cfg.n_slots * c.conv_floats) * 4, 4));
            sizes.push_back(size_t(cfg.n_slots * c.state_floats) * 4);
        } else {
            c.attn = true;
            c.kv.type = cfg.kv_type;
            c.kv.kv_cols = hp.n_head_kv * hp.head_dim_k;
            c.kv.row_bytes = cfg.kv_type == KvType::F32   ? size_t(c.kv.kv_cols) * 4
                             : cfg.kv_type == KvType::F16 ? size_t(c.kv.kv_cols) * 2
                                                          : row_bytes(DType::Q8_0, c.kv.kv_cols);
            c.kv.n_ctx = cfg.n_ctx;
            const size_t bytes = size_t(cfg.n_slots) * size_t(cfg.n_ctx) * c.kv.row_bytes;
            sizes.push_back(bytes);
            sizes.push_back(bytes);
        }
        total += align_up(sizes[sizes.size() - 2]) + align_up(sizes.back());
    }
    uint8_t *at = total ? static_cast<uint8_t *>(dev_alloc(total, "KV cache and GDN states")) : nullptr;
    cache_arena_ = at;
    for (int64_t il = 0; il < hp.n_layer; il++) {
        LayerCache &c = caches_[size_t(il)];
        const size_t a = sizes[size_t(2 * il)], b = sizes[size_t(2 * il + 1)];
        uint8_t *first = at, *second = at + align_up(a);
        at = second + align_up(b);
        if (c.attn) {
            c.kv.k = first;
            c.kv.v = second;
        } else {
            c.conv = reinterpret_cast<float *>(first);
            c.state = reinterpret_cast<float *>(second);
            STRATA_CUDA_CHECK(cudaMemsetAsync(c.conv, 0, a, stream_));
            STRATA_CUDA_CHECK(cudaMemsetAsync(c.state, 0, b, stream_));
        }
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_slot(int32_t src, int32_t dst, int64_t n_pos) {
    STRATA_ASSERT(src >= 0 && dst >= 0 && src < cache_cfg_.n_slots && dst < cache_cfg_.n_slots);
    if (src == dst) return;
    for (LayerCache &c : caches_) {
        if (c.attn) {
            const size_t slot = size_t(c.kv.n_ctx) * c.kv.row_bytes, n = size_t(n_pos) * c.kv.row_bytes;
            STRATA_CUDA_CHECK(cudaMemcpyAsync(c.kv.k + size_t(dst) * slot, c.kv.k + size_t(src) * slot, n,
                                              cudaMemcpyDeviceToDevice, stream_));
            STRATA_CUDA_CHECK(cudaMemcpyAsync(c.kv.v + size_t(dst) * slot, c.kv.v + size_t(src) * slot, n,
                                              cudaMemcpyDeviceToDevice, stream_));
        } else {
            STRATA_CUDA_CHECK(cudaMemcpyAsync(c.conv + dst * c.conv_floats, c.conv + src * c.conv_floats,
                                              size_t(c.conv_floats) * 4, cudaMemcpyDeviceToDevice, stream_));
            STRATA_CUDA_CHECK(cudaMemcpyAsync(c.state + dst * c.state_floats, c.state + src * c.state_floats,
                                              size_t(c.state_floats) * 4, cudaMemcpyDeviceToDevice, stream_));
        }
    }
}

void CudaBackend::clear_slot(int32_t slot) {
    STRATA_ASSERT(slot >= 0 && slot < cache_cfg_.n_slots);
    for (LayerCache &c : caches_) {
        if (c.attn) continue;  // attention rows beyond a sequence's length are never read
        STRATA_CUDA_CHECK(cudaMemsetAsync(c.conv + slot * c.conv_floats, 0, size_t(c.conv_floats) * 4, stream_));
        STRATA_CUDA_CHECK(cudaMemsetAsync(c.state + slot * c.state_floats, 0, size_t(c.state_floats) * 4, stream_));
    }
}

// Recurrent-state checkpoints: the same layout as the CPU backend's (each GDN layer's conv state, then its delta-rule
// state, f32, in layer order). Copies go through the stream and end with a synchronisation, so the host blob holds
// the state after every op issued before the call, and a load is ordered before every later op.
size_t CudaBackend::recurrent_state_bytes() const {
    size_t n = 0;
    for (const LayerCache &c : caches_)
        if (!c.attn) n += size_t(c.conv_floats + c.state_floats) * sizeof(float);
    return n;
}

void CudaBackend::save_recurrent_state(int32_t slot, void *dst) {
    STRATA_ASSERT(slot >= 0 && slot < cache_cfg_.n_slots);
    auto *out = static_cast<float *>(dst);
    for (const LayerCache &c : caches_) {
        if (c.attn) continue;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(out, c.conv + slot * c.conv_floats, size_t(c.conv_floats) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
        out += c.conv_floats;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(out, c.state + slot * c.state_floats, size_t(c.state_floats) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
        out += c.state_floats;
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::load_recurrent_state(int32_t slot, const void *src) {
    STRATA_ASSERT(slot >= 0 && slot < cache_cfg_.n_slots);
    const auto *in = static_cast<const float *>(src);
    for (LayerCache &c : caches_) {
        if (c.attn) continue;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(c.conv + slot * c.conv_floats, in, size_t(c.conv_floats) * 4,
                                          cudaMemcpyHostToDevice, stream_));
        in += c.conv_floats;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(c.state + slot * c.state_floats, in, size_t(c.state_floats) * 4,
                                          cudaMemcpyHostToDevice, stream_));
        in += c.state_floats;
    }
    // The source is pageable caller memory that may be freed as soon as we return.
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- row tables -------------------------------------------------------------------------------------------

const int2 *CudaBackend::slot_pos(const BatchInfo &b) {
    auto same = [&] {
        if (slot_pos_rows_ != b.n_tokens || slot_pos_key_.size() != b.segs.size()) return false;
        for (size_t i = 0; i < b.segs.size(); i++) {
            const BatchSeg &x = b.segs[i], &y = slot_pos_key_[i];
            if (x.slot != y.slot || x.pos0 != y.pos0 || x.n != y.n || x.row0 != y.row0) return false;
        }
        return true;
    };
    if (slot_pos_dev_ && same()) return slot_pos_dev_;
    std::vector<int2> sp(size_t(b.n_tokens), int2{0, 0});
    for (const BatchSeg &s : b.segs)
        for (int64_t t = 0; t < s.n; t++) sp[size_t(s.row0 + t)] = int2{s.slot, int(s.pos0 + t)};
    slot_pos_dev_ = static_cast<const int2 *>(upload_pass(sp.data(), sp.size() * sizeof(int2), slot_pos_in_scratch_));
    slot_pos_key_ = b.segs;
    slot_pos_rows_ = b.n_tokens;
    return slot_pos_dev_;
}

const float *CudaBackend::inv_freq(const RopeParams &rp) {
    const auto key = std::make_pair(rp.theta, rp.n_rot);
    auto it = inv_freq_.find(key);
    if (it != inv_freq_.end()) return it->second;
    const int64_t half = rp.n_rot / 2;
    std::vector<float> f(size_t(std::max<int64_t>(half, 1)));
    for (int64_t i = 0; i < half; i++)
        f[size_t(i)] = float(1.0 / std::pow(double(rp.theta), double(2 * i) / double(rp.n_rot)));
    float *p = static_cast<float *>(dev_alloc(f.size() * 4, "rope table"));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(p, f.data(), f.size() * 4, cudaMemcpyHostToDevice, stream_));
    inv_freq_[key] = p;
    return p;
}

// ---- small ops ----------------------------------------------------------------------------------------------

void CudaBackend::embed(const Weight &tok_embd, const int32_t *ids, Act out) {
    STRATA_CUDA_OP("embed");
    STRATA_ASSERT(out.cols == tok_embd.ne[0]);
    for (int64_t t = 0; t < out.rows; t++)
        if (ids[t] < 0 || ids[t] >= tok_embd.ne[1])
            fail("token id %d is outside the vocabulary (0..%lld)", ids[t], (long long)tok_embd.ne[1] - 1);
    const int32_t *ids_dev = static_cast<const int32_t *>(upload(ids, size_t(out.rows) * 4));
    embed_rows(tok_embd.type, dev_matrix(tok_embd), tok_embd.row_bytes, tok_embd.ne[0], ids_dev, out.rows, out.data,
               out.stride, stream_);
}

void CudaBackend::rms_norm(Act x, const Weight &w, float eps, Act out) {
    STRATA_CUDA_OP("rms_norm");
    STRATA_ASSERT(out.rows == x.rows && out.cols == x.cols);
    launch_rms_norm(rows_of(x), dev_vector(w), w.ne[0], eps, rows_of(out), stream_);
}

void CudaBackend::add(Act a, Act b, Act out) {
    STRATA_CUDA_OP("add");
    STRATA_ASSERT(a.rows == b.rows && a.cols == b.cols && out.rows == a.rows && out.cols == a.cols);
    launch_add(rows_of(a), rows_of(b), rows_of(out), stream_);
}

void CudaBackend::mul_sigmoid(Act x, Act gate) {
    STRATA_CUDA_OP("mul_sigmoid");
    STRATA_ASSERT(x.rows == gate.rows && x.cols == gate.cols);
    launch_mul_sigmoid(rows_of(x), rows_of(gate), stream_);
}

void CudaBackend::gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) {
    STRATA_CUDA_OP("gather_rows");
    STRATA_ASSERT(dst.rows == int64_t(rows.size()) && dst.cols == src.cols);
    std::vector<int32_t> r32(rows.size());
    for (size_t i = 0; i < rows.size(); i++) {
        STRATA_ASSERT(rows[i] >= 0 && rows[i] < src.rows);
        r32[i] = int32_t(rows[i]);
    }
    if (r32.empty()) return;
    launch_gather_rows(rows_of(src), upload_vec(r32), rows_of(dst), stream_);
}

void CudaBackend::deinterleave(Act src, int64_t width, Act a, Act b) {
    STRATA_CUDA_OP("deinterleave");
    const int64_t n_pairs = src.cols / (2 * width);
    STRATA_ASSERT(src.cols == 2 * width * n_pairs && a.cols == width * n_pairs && b.cols == a.cols);
    launch_deinterleave(rows_of(src), width, rows_of(a), rows_of(b), stream_);
}

void CudaBackend::qk_norm_rope(Act q, Act k, const Weight &q_norm, const Weight &k_norm, float eps,
                               const RopeParams &rp, const BatchInfo &b) {
    const int64_t hd = rp.head_dim;
    const bool fits = hd <= 256 && q_norm.ne[0] == hd && k_norm.ne[0] == hd && q.cols % hd == 0 && k.cols % hd == 0 &&
                      rp.n_rot <= hd && rp.n_rot % 2 == 0 && k.rows == q.rows && fusion_enabled();
    if (!fits) return Backend::qk_norm_rope(q, k, q_norm, k_norm, eps, rp, b);
    STRATA_CUDA_OP("qk_norm_rope");
    launch_qk_norm_rope(rows_of(q), rows_of(k), dev_vector(q_norm), dev_vector(k_norm), hd, eps, rp.n_rot, inv_freq(rp),
                        slot_pos(b), stream_);
}

void CudaBackend::rope(Act x, const RopeParams &rp, const BatchInfo &b) {
    STRATA_CUDA_OP("rope");
    STRATA_ASSERT(x.cols % rp.head_dim == 0 && rp.n_rot <= rp.head_dim && rp.n_rot % 2 == 0);
    launch_rope_neox(rows_of(x), rp.head_dim, rp.n_rot, inv_freq(rp), slot_pos(b), stream_);
}

}  // namespace cuda
}  // namespace strata
