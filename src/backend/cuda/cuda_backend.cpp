// CUDA backend set-up: the device's facts for the plan, device memory under the plan's budget, weight uploads,
// caches, scratch and uploads, and the small ops. Protocol of streams and buffers: cuda_backend_impl.h.
#include "backend/cuda/cuda_backend_impl.h"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "backend/cuda/argmax.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/driver_memory.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"
#include "core/error.h"
#include "core/units.h"
#include "format/quant.h"

namespace strata {

namespace {

constexpr size_t k_align = 256;
// The CUDA runtime's share of a budget where the driver's count cannot be read.
constexpr uint64_t k_runtime_estimate = uint64_t(512) << 20;
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

CudaDeviceStats cuda_device_stats(const Backend &be) {
    const auto *cb = dynamic_cast<const cuda::CudaBackend *>(&be);
    if (!cb) fail("device statistics: the backend is not a CUDA backend");
    return cb->device_stats();
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

CudaBackend::CudaBackend(const CudaOptions &o)
    : opt_(o), device_(o.device), graphs_on_(env_switch("STRATA_CUDA_GRAPHS", o.graphs)) {
    const int n = cuda_device_count();
    if (n == 0) fail("CUDA: no GPU is visible (no driver, or no device)");
    if (device_ < 0 || device_ >= n) fail("CUDA: there is no device %d (devices 0..%d)", device_, n - 1);
    STRATA_CUDA_CHECK(cudaSetDevice(device_));
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (cudaEvent_t &e : read_done_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&fill_done_, cudaEventDisableTiming));
    for (cudaEvent_t &e : fill_events_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t &e : marks_) STRATA_CUDA_CHECK(cudaEventCreate(&e));
    // per-slot waits where a schedule fills ahead during passes (the streamed one is on unless its switch is 0)
    slot_waits_ = prefill_stream_ahead() > 0 || env_switch("STRATA_DECODE_PREFETCH", false);
    q8_gather_ = env_switch("STRATA_CUDA_EXPERT_Q8_GATHER", true);
    expert_fuse_ = env_switch("STRATA_CUDA_EXPERT_FUSE", true);
    upload_kernel_ = env_switch("STRATA_CUDA_UPLOAD_KERNEL", true);
    alloc_stage(size_t(4) << 20);
    // the fused router's count of finished blocks (route) and the rope tables' room, made here so that no pass
    // allocates them
    route_done_ = static_cast<unsigned *>(dev_alloc(sizeof(unsigned), "routing counter"));
    norm_q_ = static_cast<int8_t *>(dev_alloc(size_t(k_norm_quant_values), "norm activations"));
    norm_ds_ = static_cast<float2 *>(dev_alloc(size_t(k_norm_quant_values / 32) * sizeof(float2), "norm activations"));
    rope_area_ = static_cast<float *>(dev_alloc(k_rope_floats * sizeof(float), "rope tables"));
    fed_ids_ = static_cast<int32_t *>(dev_alloc(k_mmv_max_rows * sizeof(int32_t), "fed token ids"));
    STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void **>(&fed_host_), k_mmv_max_rows * sizeof(int32_t)));
    for (cudaEvent_t &e : ahead_done_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaMemsetAsync(route_done_, 0, sizeof(unsigned), stream_));
    iq_grids();
}

CudaBackend::~CudaBackend() {
    // Errors are ignored here: a destructor cannot fail, and a broken context frees everything with the process.
    cudaSetDevice(device_);
    if (capturing_) drop_capture();
    if (stream_) cudaStreamSynchronize(stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (PassGraph &g : graphs_)
        if (g.exec) cudaGraphExecDestroy(g.exec);
    if (dl_pinned_) cudaFreeHost(dl_pinned_);
    if (ids_pinned_) cudaFreeHost(ids_pinned_);
    if (fed_host_) cudaFreeHost(fed_host_);
    prof_.step();
    prof_.report();
    report_graphs();
    for (auto &a : allocations_) cudaFree(a.first), cuda::track_device_bytes(device_, -int64_t(a.second));
    free_slots();
    if (stage_) cudaFreeHost(stage_);
    if (handoff_) cudaFreeHost(handoff_);
    for (cudaEvent_t e : handoff_done_)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : read_done_)
        if (e) cudaEventDestroy(e);
    if (fill_done_) cudaEventDestroy(fill_done_);
    if (loan_done_) cudaEventDestroy(loan_done_);
    for (cudaEvent_t e : fill_events_)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : marks_)
        if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : ahead_done_)
        if (e) cudaEventDestroy(e);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    if (stream_) cudaStreamDestroy(stream_);
    cudaGetLastError();
}

std::string CudaBackend::name() const {
    return strfmt("CUDA%d (%s, sm_%d%d, %s)", device_, prop_.name, prop_.major, prop_.minor,
                  format_bytes(prop_.totalGlobalMem).c_str());
}

CudaDeviceStats CudaBackend::device_stats() const {
    CudaDeviceStats s;
    s.device_bytes = dev_bytes_;
    s.budget_bytes = budget_total_;
    DeviceMemory dm;
    device_memory(dm);
    s.driver_bytes = dm.driver;
    s.graph_launches = graph_launches_;
    s.graph_instantiations = graph_instantiations_;
    s.graph_replays = graph_replays_;
    s.ahead_steps = ahead_steps_;
    return s;
}

// What a placement plan needs to know: free and total memory, the runtime's share of the process as the driver
// counts it (NVML) less what Strata's backends have allocated, host RAM available for a pinned copy.
DeviceFacts CudaBackend::device_facts() {
    use_device();
    DeviceFacts f;
    f.has_device_memory = true;
    f.device = device_;
    f.name = strfmt("CUDA%d", device_);
    size_t free_b = 0, total_b = 0;
    STRATA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    f.free_bytes = free_b;
    f.total_bytes = total_b;
    const std::optional<uint64_t> process = cuda::process_device_bytes(device_);
    const uint64_t tracked = cuda::tracked_device_bytes(device_);
    f.runtime_estimated = !process || *process <= tracked;
    f.runtime_bytes = f.runtime_estimated ? k_runtime_estimate : *process - tracked;
    f.host_available_bytes = host_available_bytes();
    f.align = k_align;
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                    DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ3_XXS,
                    DType::IQ1_S, DType::IQ4_NL, DType::IQ3_S, DType::IQ2_S, DType::IQ4_XS, DType::IQ1_M,
                    DType::TQ1_0, DType::TQ2_0, DType::MXFP4})
        if (expert_input_int8(t)) f.int8_expert_input_types.push_back(t);
    return f;
}

// ---- device memory ------------------------------------------------------------------------------------------

bool CudaBackend::device_memory(DeviceMemory &out) const {
    use_device();
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

// Milliseconds of `reps` copies of `bytes` on `st` (copy i from src[i % 2] to dst[i % 2]) after one warm-up copy,
// between passes. Tables that lay in scratch are forgotten (the copies write the first scratch chunk).
float CudaBackend::time_copies(cudaStream_t st, void *const dst[2], const void *const src[2], size_t bytes, int reps) {
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreate(&e0));
    STRATA_CUDA_CHECK(cudaEventCreate(&e1));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst[1], src[1], bytes, cudaMemcpyDefault, st));
    STRATA_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; i++)
        STRATA_CUDA_CHECK(cudaMemcpyAsync(dst[i % 2], src[i % 2], bytes, cudaMemcpyDefault, st));
    STRATA_CUDA_CHECK(cudaEventRecord(e1, st));
    STRATA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    seq_pos_rows_ = -1, seq_pos_dev_ = nullptr;
    tiles_key_.clear(), tiles_dev_ = nullptr;
    return ms;
}

// Half of the first scratch chunk copied onto the other half and back, five times on the compute stream between
// passes (scratch holds nothing then); no allocation.
double CudaBackend::copy_rate_gbs() {
    use_device();
    if (copy_rate_gbs_ >= 0.0) return copy_rate_gbs_;
    copy_rate_gbs_ = 0.0;
    if (capturing_ || chunks_.empty()) return 0.0;
    const size_t half = std::min<size_t>(chunks_[0].size / 2, size_t(256) << 20) & ~size_t(255);
    if (half < (size_t(16) << 20)) return 0.0;
    uint8_t *a = chunks_[0].ptr, *b = a + half;
    void *const dst[2] = {b, a};
    const void *const src[2] = {a, b};
    const int reps = 5;
    const float ms = time_copies(stream_, dst, src, half, reps);
    if (ms > 0.0f) copy_rate_gbs_ = 2.0 * double(half) * reps / (double(ms) * 1e-3) / 1e9;  // read plus written
    return copy_rate_gbs_;
}

void CudaBackend::bind_thread() { STRATA_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaBackend::use_device() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) cudaGetLastError();
    if (current != device_) STRATA_CUDA_CHECK(cudaSetDevice(device_));
}

// 64 MiB copied within a device buffer and from a pinned host buffer, both allocated here and freed after (before
// prepare(): nothing of the budget is held yet); {0, 0} where either cannot be had.
std::pair<double, double> CudaBackend::start_rates_gbs() {
    if (start_rates_.first >= 0.0) return start_rates_;  // measured once (a split's choice, then its part's strata)
    use_device();
    start_rates_ = {0.0, 0.0};
    const size_t bytes = size_t(64) << 20;
    uint8_t *dev = nullptr, *host = nullptr;
    if (cudaMalloc(reinterpret_cast<void **>(&dev), 2 * bytes) != cudaSuccess) {
        cudaGetLastError();
        return {0.0, 0.0};
    }
    if (cudaMallocHost(reinterpret_cast<void **>(&host), bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(dev);
        return {0.0, 0.0};
    }
    std::memset(host, 0, bytes);
    const int reps = 5;
    void *const dd[2] = {dev + bytes, dev};
    const void *const ds[2] = {dev, dev + bytes};
    const float copy_ms = time_copies(stream_, dd, ds, bytes, reps);
    void *const ud[2] = {dev, dev};
    const void *const us[2] = {host, host};
    const float up_ms = time_copies(copy_stream_, ud, us, bytes, reps);
    cudaFreeHost(host);
    cudaFree(dev);
    const double gb = double(bytes) * reps / 1e9;
    start_rates_ = {copy_ms > 0 ? 2.0 * gb / (double(copy_ms) * 1e-3) : 0.0,
                    up_ms > 0 ? gb / (double(up_ms) * 1e-3) : 0.0};
    return start_rates_;
}

// A pinned host buffer of up to 256 MiB (the size of copy_rate_gbs' halves) copied into the first scratch chunk five
// times on the copy stream between passes; the host buffer is freed after (host memory, not counted against the
// budget), so the device allocates nothing.
double CudaBackend::upload_rate_gbs() {
    use_device();
    if (upload_rate_gbs_ >= 0.0) return upload_rate_gbs_;
    upload_rate_gbs_ = 0.0;
    if (capturing_ || chunks_.empty()) return 0.0;
    const size_t bytes = std::min<size_t>(chunks_[0].size, size_t(256) << 20) & ~size_t(255);
    if (bytes < (size_t(16) << 20)) return 0.0;
    uint8_t *host = nullptr;
    if (cudaMallocHost(reinterpret_cast<void **>(&host), bytes) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;  // no pinned memory to spare: not measured
    }
    std::memset(host, 0, bytes);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // scratch holds nothing of a pass any more
    void *const dst[2] = {chunks_[0].ptr, chunks_[0].ptr};
    const void *const src[2] = {host, host};
    const int reps = 5;
    const float ms = time_copies(copy_stream_, dst, src, bytes, reps);
    STRATA_CUDA_CHECK(cudaFreeHost(host));
    if (ms > 0.0f) upload_rate_gbs_ = double(bytes) * reps / (double(ms) * 1e-3) / 1e9;
    return upload_rate_gbs_;
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
    device_allocations_++;
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
    scratch_overflows_++;
    graph_gen_++;
    cur_chunk_ = chunks_.size() - 1;
    cur_off_ = bytes;
    return chunks_.back().ptr;
}

Act CudaBackend::alloc(int64_t rows, int64_t cols) {
    STRATA_ASSERT(rows >= 0 && cols > 0);
    return {static_cast<float *>(scratch_bytes(size_t(rows * cols) * 4)), rows, cols, cols};
}

void CudaBackend::reset_scratch() {
    use_device();
    if (capturing_) drop_capture();  // a pass left without end_pass or abort_pass
    expert_input_ = {};              // in the scratch being reset
    norm_quant_.src = nullptr;
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    prof_.step();
    // Chunks added past the plan are folded into one (a loan's borrowed chunk stays first, as it is).
    const size_t own0 = !chunks_.empty() && chunks_.front().borrowed ? 1 : 0;
    if (chunks_.size() > own0 + 1) {
        size_t total = 0;
        for (size_t i = own0; i < chunks_.size(); i++) total += chunks_[i].size;
        for (size_t i = own0; i < chunks_.size(); i++) dev_free(chunks_[i].ptr);
        chunks_.resize(own0);
        graph_gen_++;
        chunks_.push_back({static_cast<uint8_t *>(dev_alloc(total, "scratch")), total});
    }
    cur_chunk_ = 0;
    cur_off_ = 0;
    stage_used_ = 0;
    pass_used_ = 0;
    seq_pos_rows_ = -1;
    seq_pos_dev_ = nullptr;
    tiles_key_.clear();
    tiles_dev_ = nullptr;
}

// A prompt loan (backend.h): the slots are one range of the plan's loan allocation (make_slots lays the lendable
// slots out together), put first in the scratch list. Compute waits for every fill issued so far (a fill may still
// be writing one of them); every earlier read of them is on the compute stream, before the pass that writes them.
void CudaBackend::begin_loan(const std::vector<int32_t> &slots) {
    use_device();
    STRATA_ASSERT(!slots.empty());
    STRATA_ASSERT(chunks_.empty() || !chunks_.front().borrowed);
    uint8_t *lo = nullptr, *hi = nullptr;
    size_t bytes = 0;
    for (const int32_t s : slots) {
        STRATA_ASSERT(s >= 0 && size_t(s) < slots_.size());
        uint8_t *p = slots_[size_t(s)];
        lo = lo && lo < p ? lo : p;
        hi = hi && hi > p + slot_size_[size_t(s)] ? hi : p + slot_size_[size_t(s)];
        bytes += slot_size_[size_t(s)];
    }
    STRATA_ASSERT(size_t(hi - lo) == bytes);  // distinct slots that fill one range: the range
    STRATA_ASSERT(hi == loan_end_);           // the tail of the lendable slots' allocation
    wait_for_fills();
    for (const int32_t s : slots) unmap_slot(s);  // mapped layers read those experts from their copy
    reset_scratch();
    chunks_.insert(chunks_.begin(), Chunk{lo, bytes, true});
    graph_gen_++;
}

// The loan's end: the copy stream waits for the compute that used the borrowed slots as scratch before any fill
// (the slot table hands them out empty from here on).
void CudaBackend::end_loan() {
    use_device();
    if (chunks_.empty() || !chunks_.front().borrowed) return;
    if (!loan_done_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&loan_done_, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaEventRecord(loan_done_, stream_));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, loan_done_, 0));
    chunks_.erase(chunks_.begin());
    graph_gen_++;
    reset_scratch();
}

void CudaBackend::scratch_release(ScratchMark m) {
    release({m.a, m.b});
    const NormQuant &n = norm_quant_;  // a norm's form over rows whose scratch goes
    if (n.src && n.chunk != SIZE_MAX && (n.chunk > m.a || (n.chunk == m.a && n.off >= m.b))) norm_quant_.src = nullptr;
    // Pass tables that did not fit their buffer lie in scratch, perhaps in what was released.
    if (seq_pos_in_scratch_) seq_pos_rows_ = -1, seq_pos_dev_ = nullptr;
    if (tiles_in_scratch_) tiles_key_.clear(), tiles_dev_ = nullptr;
}

uint8_t *CudaBackend::stage(const void *host, size_t bytes) {
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
            graph_gen_++;
            alloc_stage(std::max(need, 2 * stage_size_));
        }
    }
    uint8_t *h = stage_ + stage_used_;
    std::memcpy(h, host, bytes);
    stage_used_ += need;
    return h;
}

void CudaBackend::alloc_stage(size_t bytes) {
    if (stage_) STRATA_CUDA_CHECK(cudaFreeHost(stage_));
    stage_ = stage_dev_ = nullptr;
    stage_size_ = 0;
    STRATA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&stage_), bytes, cudaHostAllocMapped));
    stage_size_ = bytes;
    STRATA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&stage_dev_), stage_, 0));
}

void CudaBackend::copy_up(void *dst, size_t pitch, const uint8_t *staged, size_t row, size_t rows) {
    STRATA_ASSERT(staged >= stage_ && staged + row * rows <= stage_ + stage_size_);
    uploads_++;
    if (upload_kernel_)
        cuda::launch_copy_from_host(dst, pitch, stage_dev_ + (staged - stage_), row, rows, stream_);
    else
        STRATA_CUDA_CHECK(cudaMemcpy2DAsync(dst, pitch, staged, row, row, rows, cudaMemcpyHostToDevice, stream_));
}

void *CudaBackend::upload(const void *host, size_t bytes, UploadSrc src) {
    void *dev = scratch_bytes(bytes);
    uint8_t *h = stage(host, bytes);
    if (capturing_) note_upload(h, bytes, src);
    copy_up(dev, bytes, h, bytes, 1);
    return dev;
}

void CudaBackend::upload_rows(const float *host, Act dst) {
    use_device();
    wrote(dst);
    if (dst.rows == 0) return;
    // Inside a recorded pass only a split part's input (PassIo::in_x, in_cur), whole: a replay rewrites its bytes.
    UploadSrc src = UploadSrc::None;
    if (capturing_) {
        const bool whole = dst.rows == pass_batch_.n_tokens;
        if (whole && host == pass_io_.in_x) src = UploadSrc::InX;
        if (whole && host == pass_io_.in_cur) src = UploadSrc::InCur;
        if (src == UploadSrc::None) fail("internal: an upload inside a recorded pass");
    }
    const size_t row = size_t(dst.cols) * sizeof(float);
    uint8_t *h = stage(host, row * size_t(dst.rows));
    if (capturing_) note_upload(h, row * size_t(dst.rows), src);
    copy_up(dst.data, size_t(dst.stride) * sizeof(float), h, row, size_t(dst.rows));
}

CudaBackend::RowsHandoff CudaBackend::rows_handoff(size_t bytes) {
    use_device();
    if (capturing_) return {};  // a recorded pass replays without its host
    bytes = align_up(std::max<size_t>(bytes, 1));
    if (bytes > handoff_bytes_) {
        // Every copy queued from the old block has run: each one's signal is stored whatever the caller does.
        STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const uint32_t signal = handoff_ ? *reinterpret_cast<uint32_t *>(handoff_) : 0;
        if (handoff_) STRATA_CUDA_CHECK(cudaFreeHost(handoff_));
        handoff_ = handoff_dev_ = nullptr;
        handoff_bytes_ = 0;
        const size_t each = std::max(bytes, size_t(64) << 10);
        STRATA_CUDA_CHECK(
            cudaHostAlloc(reinterpret_cast<void **>(&handoff_), k_handoff_head + 2 * each, cudaHostAllocMapped));
        STRATA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&handoff_dev_), handoff_, 0));
        *reinterpret_cast<uint32_t *>(handoff_) = signal;  // the tickets go on from where they were
        handoff_bytes_ = each;
        for (cudaEvent_t &e : handoff_done_)
            if (!e) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    const int i = handoff_next_;
    handoff_next_ ^= 1;
    STRATA_CUDA_CHECK(cudaEventSynchronize(handoff_done_[i]));  // the copy two handoffs ago (long since run)
    RowsHandoff h;
    h.host = reinterpret_cast<float *>(handoff_ + k_handoff_head + size_t(i) * handoff_bytes_);
    h.signal = reinterpret_cast<uint32_t *>(handoff_);
    h.ticket = ++handoff_tickets_;
    return h;
}

void CudaBackend::handoff_rows(const RowsHandoff &h, Act dst) {
    use_device();
    wrote(dst);
    const uint8_t *at = reinterpret_cast<const uint8_t *>(h.host);
    const size_t row = size_t(dst.cols) * sizeof(float), off = size_t(at - handoff_);
    STRATA_ASSERT(handoff_ && h.signal == reinterpret_cast<uint32_t *>(handoff_) && off >= k_handoff_head &&
                  (off - k_handoff_head) % handoff_bytes_ == 0 && row * size_t(dst.rows) <= handoff_bytes_ &&
                  !capturing_);
    cuda::launch_copy_from_host_after(dst.data, size_t(dst.stride) * sizeof(float), handoff_dev_ + off, row,
                                      size_t(dst.rows), reinterpret_cast<const uint32_t *>(handoff_dev_), h.ticket,
                                      stream_);
    STRATA_CUDA_CHECK(cudaEventRecord(handoff_done_[(off - k_handoff_head) / handoff_bytes_], stream_));
}

uint64_t CudaBackend::mark_device() {
    use_device();
    // Not inside a recorded pass: the event would be recorded by every replay of the graph, not once here, and a
    // query of an event last recorded into a capture fails (cudaErrorInvalidValue). Its spans read as lost.
    if (capturing_) return 0;
    const uint64_t n = ++n_marks_;
    STRATA_CUDA_CHECK(cudaEventRecord(marks_[n % k_marks], stream_));
    return n;
}

double CudaBackend::device_ms(uint64_t a, uint64_t b) {
    use_device();
    if (a == 0 || b == 0 || a > n_marks_ || b > n_marks_ || n_marks_ - std::min(a, b) >= uint64_t(k_marks)) return -1.0;
    // Marks are recorded on the one compute stream, in order: where the later has been reached, so has the other.
    const cudaError_t st = cudaEventQuery(marks_[std::max(a, b) % k_marks]);
    if (st == cudaErrorNotReady) return -1.0;
    STRATA_CUDA_CHECK(st);
    float ms = 0.0f;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[a % k_marks], marks_[b % k_marks]));
    return double(ms);
}

void *CudaBackend::upload_pass(const void *host, size_t bytes, bool &in_scratch, UploadSrc src) {
    const size_t need = align_up(std::max<size_t>(bytes, 1));
    // Where the buffer is full, or the staging buffer would have to wrap (upload() knows how): scratch.
    in_scratch = !pass_buf_ || pass_used_ + need > pass_buf_size_ || stage_used_ + need > stage_size_;
    if (in_scratch) return upload(host, bytes, src);
    void *dev = pass_buf_ + pass_used_;
    pass_used_ += need;
    uint8_t *h = stage_ + stage_used_;
    std::memcpy(h, host, bytes);
    stage_used_ += need;
    if (capturing_) note_upload(h, bytes, src);
    copy_up(dev, bytes, h, bytes, 1);
    return dev;
}

const AttnTile *CudaBackend::attn_tiles(const std::vector<AttnTile> &tiles) {
    auto same = [&] {
        if (tiles.size() != tiles_key_.size()) return false;
        for (size_t i = 0; i < tiles.size(); i++) {
            const AttnTile &a = tiles[i], &b = tiles_key_[i];
            if (a.row0 != b.row0 || a.n_rows != b.n_rows || a.seq != b.seq || a.pos0 != b.pos0 ||
                a.pos_new != b.pos_new)
                return false;
        }
        return true;
    };
    if (tiles_dev_ && same()) return tiles_dev_;
    tiles_dev_ =
        static_cast<const AttnTile *>(upload_pass(tiles.data(), tiles.size() * sizeof(AttnTile), tiles_in_scratch_,
                                                  UploadSrc::Tiles));
    tiles_key_ = tiles;
    return tiles_dev_;
}

void CudaBackend::download(const Act &src, float *host) {
    use_device();
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

// Portable: every device's copies run at the bus's rate from it (a split's next part may be on another GPU).
float *CudaBackend::alloc_host(size_t n) {
    use_device();
    float *p = nullptr;
    if (cudaHostAlloc(reinterpret_cast<void **>(&p), n * sizeof(float), cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return p;
}

void CudaBackend::free_host(float *p) {
    if (p) cudaFreeHost(p);
}

void CudaBackend::download_argmax(const Act &src, int32_t *host) {
    use_device();
    STRATA_CUDA_OP("argmax");
    if (src.rows == 0) return;
    const int64_t parts = argmax_parts(src.cols);
    float *part_v = scratch_array<float>(src.rows * parts);
    int32_t *part_i = scratch_array<int32_t>(src.rows * parts);
    // a fed pass's ids, one a sequence in row order, are the next fed pass's tokens (PassIo::ahead)
    int32_t *ids = fed_.tokens && src.rows == fed_.rows ? fed_ids_ : scratch_array<int32_t>(src.rows);
    launch_argmax_rows(rows_of(src), part_v, part_i, ids, stream_);
    const size_t bytes = size_t(src.rows) * sizeof(int32_t);
    if (capturing_) {  // as download(): into pinned memory now, to `host` once the graph has run
        if (dl_used_ + size_t(src.rows) > dl_floats_)
            fail("internal: a recorded pass downloads more than its %zu floats of pinned memory", dl_floats_);
        int32_t *pin = reinterpret_cast<int32_t *>(dl_pinned_ + dl_used_);
        STRATA_CUDA_CHECK(cudaMemcpyAsync(pin, ids, bytes, cudaMemcpyDeviceToHost, stream_));
        deferred_.push_back({host, pin, bytes, true});
        dl_used_ += size_t(src.rows);
        return;
    }
    const auto issued = Clock::now();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host, ids, bytes, cudaMemcpyDeviceToHost, stream_));
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

// The plan carried out: the weights' arena, scratch, pass tables, expert slots and the host stratum, under the
// plan's budget (dev_alloc refuses more).
void CudaBackend::prepare(WeightSet &ws, const Placement &plan) {
    use_device();
    STRATA_ASSERT(plan.device);
    budget_ = plan.budget_bytes;
    budget_total_ = plan.budget_total_bytes;
    download_cols_ = plan.download_cols;
    for (const Weight *w : ws.matrices)
        if (!cuda::cuda_can_dequantize(w->type))
            fail("CUDA: tensor '%.*s' has type %s, which the CUDA backend cannot compute with", int(w->name.size()),
                 w->name.data(), dtype_name(w->type));
    for (const ExpertWeights &e : ws.experts)
        if (e.present())
            for (const Weight *w : {e.gate, e.up, e.down})
                if (!cuda::cuda_can_dequantize(w->type))
                    fail("CUDA: tensor '%.*s' has type %s, which the CUDA backend cannot compute with",
                         int(w->name.size()), w->name.data(), dtype_name(w->type));
    upload_weights(ws, plan);
    if (plan.stage_bytes > stage_size_) {  // room for a whole pass's uploads, so no chunk waits on its own copies
        STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
        alloc_stage(size_t(plan.stage_bytes));
        stage_used_ = 0;
        graph_gen_++;
    }
    chunks_.push_back({static_cast<uint8_t *>(dev_alloc(plan.scratch_bytes, "scratch")), size_t(plan.scratch_bytes)});
    pass_buf_size_ = plan.pass_table_bytes;
    pass_buf_ = static_cast<uint8_t *>(dev_alloc(pass_buf_size_, "pass tables"));
    make_slots(plan);
    make_host_tier(ws, plan);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// Non-expert weights: one allocation (the driver hands out memory in 2 MiB pages, and hundreds of separate matrices
// would each waste part of their last page outside the budget's count); matrices keep their packed bytes, 1-D
// weights become f32.
void CudaBackend::upload_weights(WeightSet &ws, const Placement &plan) {
    std::unordered_map<const uint8_t *, void *> &dev = weights_dev_;
    uint8_t *arena = plan.weight_bytes ? static_cast<uint8_t *>(dev_alloc(plan.weight_bytes, "weights")) : nullptr;
    size_t arena_used = 0;
    auto carve = [&](size_t bytes) {
        void *p = arena + arena_used;
        arena_used += align_up(bytes);
        STRATA_ASSERT(arena_used <= plan.weight_bytes);
        return p;
    };
    for (Weight *w : ws.matrices) {
        auto it = dev.find(w->host);
        if (it == dev.end()) {
            void *p = carve(w->matrix_bytes());
            STRATA_CUDA_CHECK(cudaMemcpyAsync(p, w->host, w->matrix_bytes(), cudaMemcpyHostToDevice, stream_));
            it = dev.emplace(w->host, p).first;
        }
        w->backend = it->second;
    }
    for (Weight *w : ws.vectors) {
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
}

// ---- caches -------------------------------------------------------------------------------------------------

void CudaBackend::init_caches(const CacheShape &shape) {
    use_device();
    graph_gen_++;
    // One allocation for every layer's caches (see upload_weights: the driver's 2 MiB pages).
    if (cache_arena_) dev_free(cache_arena_);
    cache_arena_ = nullptr;
    caches_.assign(shape.layers.size(), {});
    cache_shape_ = shape;
    size_t total = 0;
    for (size_t il = 0; il < shape.layers.size(); il++)
        total += align_up(shape.first_bytes(il)) + align_up(shape.second_bytes(il));
    uint8_t *at = total ? static_cast<uint8_t *>(dev_alloc(total, "KV cache and GDN states")) : nullptr;
    cache_arena_ = at;
    for (size_t il = 0; il < shape.layers.size(); il++) {
        const CacheShape::Layer &S = shape.layers[il];
        LayerCache &c = caches_[il];
        const size_t a = shape.first_bytes(il), b = shape.second_bytes(il);
        uint8_t *first = at, *second = at + align_up(a);
        at = second + align_up(b);
        if (S.attention) {
            c.attn = true;
            c.kv.type = shape.kv_type;
            c.kv.kv_cols = S.kv_cols;
            c.kv.row_bytes = kv_row_bytes(shape.kv_type, S.kv_cols);
            c.kv.n_ctx = shape.n_ctx;
            c.kv.k = first;
            c.kv.v = second;
        } else {
            c.conv_floats = S.conv_rows * S.conv_cols;
            c.state_floats = S.state_floats;
            c.conv = reinterpret_cast<float *>(first);
            c.state = reinterpret_cast<float *>(second);
            STRATA_CUDA_CHECK(cudaMemsetAsync(c.conv, 0, a, stream_));
            STRATA_CUDA_CHECK(cudaMemsetAsync(c.state, 0, b, stream_));
        }
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_seq(int32_t src, int32_t dst, int64_t n_pos) {
    use_device();
    STRATA_ASSERT(src >= 0 && dst >= 0 && src < cache_shape_.n_seqs && dst < cache_shape_.n_seqs);
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

void CudaBackend::clear_seq(int32_t seq) {
    use_device();
    STRATA_ASSERT(seq >= 0 && seq < cache_shape_.n_seqs);
    for (LayerCache &c : caches_) {
        if (c.attn) continue;  // attention rows beyond a sequence's length are never read
        STRATA_CUDA_CHECK(cudaMemsetAsync(c.conv + seq * c.conv_floats, 0, size_t(c.conv_floats) * 4, stream_));
        STRATA_CUDA_CHECK(cudaMemsetAsync(c.state + seq * c.state_floats, 0, size_t(c.state_floats) * 4, stream_));
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

void CudaBackend::save_recurrent_state(int32_t seq, void *dst) {
    use_device();
    STRATA_ASSERT(seq >= 0 && seq < cache_shape_.n_seqs);
    auto *out = static_cast<float *>(dst);
    for (const LayerCache &c : caches_) {
        if (c.attn) continue;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(out, c.conv + seq * c.conv_floats, size_t(c.conv_floats) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
        out += c.conv_floats;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(out, c.state + seq * c.state_floats, size_t(c.state_floats) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
        out += c.state_floats;
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::load_recurrent_state(int32_t seq, const void *src) {
    use_device();
    STRATA_ASSERT(seq >= 0 && seq < cache_shape_.n_seqs);
    const auto *in = static_cast<const float *>(src);
    for (LayerCache &c : caches_) {
        if (c.attn) continue;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(c.conv + seq * c.conv_floats, in, size_t(c.conv_floats) * 4,
                                          cudaMemcpyHostToDevice, stream_));
        in += c.conv_floats;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(c.state + seq * c.state_floats, in, size_t(c.state_floats) * 4,
                                          cudaMemcpyHostToDevice, stream_));
        in += c.state_floats;
    }
    // The source is pageable caller memory that may be freed as soon as we return.
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- row tables -------------------------------------------------------------------------------------------

const int2 *CudaBackend::seq_pos(const BatchInfo &b) {
    auto same = [&] {
        if (seq_pos_rows_ != b.n_tokens || seq_pos_key_.size() != b.segs.size()) return false;
        for (size_t i = 0; i < b.segs.size(); i++) {
            const BatchSeg &x = b.segs[i], &y = seq_pos_key_[i];
            if (x.seq != y.seq || x.pos0 != y.pos0 || x.n != y.n || x.row0 != y.row0) return false;
        }
        return true;
    };
    if (seq_pos_dev_ && same()) return seq_pos_dev_;
    const std::vector<int2> sp = seq_pos_table(b);
    seq_pos_dev_ = static_cast<const int2 *>(
        upload_pass(sp.data(), sp.size() * sizeof(int2), seq_pos_in_scratch_, UploadSrc::SeqPos));
    seq_pos_key_ = b.segs;
    seq_pos_rows_ = b.n_tokens;
    return seq_pos_dev_;
}

std::vector<int2> CudaBackend::seq_pos_table(const BatchInfo &b) {
    std::vector<int2> sp(size_t(b.n_tokens), int2{0, 0});
    for (const BatchSeg &s : b.segs)
        for (int64_t t = 0; t < s.n; t++) sp[size_t(s.row0 + t)] = int2{s.seq, int(s.pos0 + t)};
    return sp;
}

const float *CudaBackend::inv_freq(const RopeParams &rp) {
    const auto key = std::make_pair(rp.theta, rp.n_rot);
    auto it = inv_freq_.find(key);
    if (it != inv_freq_.end()) return it->second;
    const int64_t half = rp.n_rot / 2;
    std::vector<float> f(size_t(std::max<int64_t>(half, 1)));
    for (int64_t i = 0; i < half; i++)
        f[size_t(i)] = float(1.0 / std::pow(double(rp.theta), double(2 * i) / double(rp.n_rot)));
    const size_t n = (f.size() + 63) & ~size_t(63);  // 256-byte steps
    float *p = nullptr;
    if (rope_used_ + n <= k_rope_floats) {
        p = rope_area_ + rope_used_;
        rope_used_ += n;
    } else {
        p = static_cast<float *>(dev_alloc(f.size() * 4, "rope table"));  // more kinds of rope than foreseen
    }
    uploads_++;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(p, f.data(), f.size() * 4, cudaMemcpyHostToDevice, stream_));
    inv_freq_[key] = p;
    return p;
}

// ---- small ops ----------------------------------------------------------------------------------------------

void CudaBackend::embed(const Weight &tok_embd, const int32_t *ids, Act out) {
    wrote(out);
    STRATA_CUDA_OP("embed");
    STRATA_ASSERT(out.cols == tok_embd.ne[0]);
    for (int64_t t = 0; t < out.rows; t++)
        if (ids[t] < 0 || ids[t] >= tok_embd.ne[1])
            fail("token id %d is outside the vocabulary (0..%lld)", ids[t], (long long)tok_embd.ne[1] - 1);
    if (capturing_) rec_vocab_ = tok_embd.ne[1];
    const int32_t *ids_dev = nullptr;
    if (fed_.tokens && ids == fed_.tokens && out.rows == fed_.rows) {
        ids_dev = fed_ids_;  // a fed pass's tokens, put there by begin_pass or by the pass before (PassIo::ahead)
    } else {
        const UploadSrc src = capturing_ && ids == pass_io_.tokens && out.rows == pass_batch_.n_tokens
                                  ? UploadSrc::Tokens
                                  : UploadSrc::None;
        ids_dev = static_cast<const int32_t *>(upload(ids, size_t(out.rows) * 4, src));
    }
    embed_rows(tok_embd.type, dev_matrix(tok_embd), tok_embd.row_bytes, tok_embd.ne[0], ids_dev, out.rows, out.data,
               out.stride, stream_);
}

void CudaBackend::rms_norm(Act x, const Weight &w, float eps, Act out) {
    STRATA_CUDA_OP("rms_norm");
    STRATA_ASSERT(out.rows == x.rows && out.cols == x.cols);
    wrote(out);
    const float *wd = dev_vector(w);
    const NormQ8 q8 = norm_quant_begin(wd, x, out, w.ne[0] == x.cols);
    launch_rms_norm(rows_of(x), wd, w.ne[0], eps, rows_of(out), stream_, q8);
    norm_quant_made(q8, out);
}

void CudaBackend::add_rms_norm(Act x, Act y, const Weight &w, float eps, Act out) {
    if (!fusion_enabled()) return Backend::add_rms_norm(x, y, w, eps, out);
    STRATA_CUDA_OP("add_rms_norm");
    STRATA_ASSERT(y.rows == x.rows && y.cols == x.cols && out.rows == x.rows && out.cols == x.cols);
    wrote(x), wrote(out);
    const float *wd = dev_vector(w);
    const NormQ8 q8 = norm_quant_begin(wd, x, out, w.ne[0] == x.cols && norm_quantizes(rows_of(y), rows_of(y), w.ne[0], wd, 1));
    launch_add_rms_norm(rows_of(x), rows_of(y), wd, w.ne[0], eps, rows_of(out), stream_, q8);
    norm_quant_made(q8, out);
}

void CudaBackend::add(Act a, Act b, Act out) {
    wrote(out);
    STRATA_CUDA_OP("add");
    STRATA_ASSERT(a.rows == b.rows && a.cols == b.cols && out.rows == a.rows && out.cols == a.cols);
    launch_add(rows_of(a), rows_of(b), rows_of(out), stream_);
}

void CudaBackend::mul_sigmoid(Act x, Act gate) {
    wrote(x);
    STRATA_CUDA_OP("mul_sigmoid");
    STRATA_ASSERT(x.rows == gate.rows && x.cols == gate.cols);
    launch_mul_sigmoid(rows_of(x), rows_of(gate), stream_);
}

void CudaBackend::gather_rows(Act src, const std::vector<int64_t> &rows, Act dst) {
    wrote(dst);
    STRATA_CUDA_OP("gather_rows");
    STRATA_ASSERT(dst.rows == int64_t(rows.size()) && dst.cols == src.cols);
    std::vector<int32_t> r32(rows.size());
    for (size_t i = 0; i < rows.size(); i++) {
        STRATA_ASSERT(rows[i] >= 0 && rows[i] < src.rows);
        r32[i] = int32_t(rows[i]);
    }
    if (r32.empty()) return;
    // In a recorded pass, the logit rows are part of the graph's key.
    const UploadSrc from = capturing_ && pass_io_.out_rows && rows == *pass_io_.out_rows ? UploadSrc::OutRows
                                                                                        : UploadSrc::None;
    launch_gather_rows(rows_of(src), static_cast<const int32_t *>(upload(r32.data(), r32.size() * 4, from)),
                       rows_of(dst), stream_);
}

void CudaBackend::deinterleave(Act src, int64_t width, Act a, Act b) {
    wrote(a), wrote(b);
    STRATA_CUDA_OP("deinterleave");
    const int64_t n_pairs = src.cols / (2 * width);
    STRATA_ASSERT(src.cols == 2 * width * n_pairs && a.cols == width * n_pairs && b.cols == a.cols);
    launch_deinterleave(rows_of(src), width, rows_of(a), rows_of(b), stream_);
}

bool CudaBackend::fits_qk_norm_rope(Act q, Act k, const Weight &q_norm, const Weight &k_norm,
                                    const RopeParams &rp) const {
    const int64_t hd = rp.head_dim;
    return hd <= 256 && q_norm.ne[0] == hd && k_norm.ne[0] == hd && q.cols % hd == 0 && k.cols % hd == 0 &&
           rp.n_rot <= hd && rp.n_rot % 2 == 0 && k.rows == q.rows && fusion_enabled();
}

void CudaBackend::qk_norm_rope(Act q, Act k, const Weight &q_norm, const Weight &k_norm, float eps,
                               const RopeParams &rp, const BatchInfo &b) {
    if (!fits_qk_norm_rope(q, k, q_norm, k_norm, rp)) return Backend::qk_norm_rope(q, k, q_norm, k_norm, eps, rp, b);
    STRATA_CUDA_OP("qk_norm_rope");
    wrote(q), wrote(k);
    const uint64_t u0 = uploads_;
    const float *freq = inv_freq(rp);
    const int2 *sp = seq_pos(b);
    launch_qk_norm_rope(rows_of(q), rows_of(k), dev_vector(q_norm), dev_vector(k_norm), rp.head_dim, eps, rp.n_rot,
                        freq, sp, stream_, nullptr, {}, early_reads_enabled() && uploads_ == u0);
}

void CudaBackend::rope(Act x, const RopeParams &rp, const BatchInfo &b) {
    wrote(x);
    STRATA_CUDA_OP("rope");
    STRATA_ASSERT(x.cols % rp.head_dim == 0 && rp.n_rot <= rp.head_dim && rp.n_rot % 2 == 0);
    launch_rope_neox(rows_of(x), rp.head_dim, rp.n_rot, inv_freq(rp), seq_pos(b), stream_);
}

}  // namespace cuda
}  // namespace strata
