#include "backend/cuda/host_stager.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/host/stream_copy.h"
#include "core/error.h"

namespace strata::cuda {

HostStager::HostStager(size_t buffer_bytes, int n_buffers, int n_threads, bool streaming)
    : buffer_bytes_(buffer_bytes), streaming_(streaming) {
    STRATA_ASSERT(buffer_bytes > 0 && n_buffers >= 2);
    bufs_.resize(size_t(n_buffers));
    for (Buffer &b : bufs_) {
        STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void **>(&b.host), buffer_bytes));
        STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    }
    pool_ = std::make_unique<ThreadPool>(n_threads);
}

HostStager::~HostStager() {
    for (Buffer &b : bufs_) {
        if (b.done) cudaEventSynchronize(b.done), cudaEventDestroy(b.done);
        if (b.host) cudaFreeHost(b.host);
    }
    cudaGetLastError();
}

void HostStager::copy(const std::vector<Item> &items, cudaStream_t stream) {
    for (const Item &it : items) {
        size_t off = 0;
        while (off < it.bytes) {
            const size_t n = std::min(it.bytes - off, buffer_bytes_ - fill_);
            pending_.push_back(
                {static_cast<uint8_t *>(it.dst) + off, static_cast<const uint8_t *>(it.src) + off, n, fill_});
            fill_ += n;
            off += n;
            if (fill_ == buffer_bytes_) flush(stream);
        }
    }
    flush(stream);
}

void HostStager::flush(cudaStream_t stream) {
    if (pending_.empty()) return;
    Buffer &b = bufs_[size_t(cur_)];
    // The buffer's previous DMA has to be done before its bytes are overwritten.
    if (b.in_flight) STRATA_CUDA_CHECK(cudaEventSynchronize(b.done));
    // Host copies in spans of at most 256 KiB, each thread taking the next as it finishes its last: a full buffer
    // is 128 spans, so the threads end within a span of each other, and one expert (2-3 MB) still reaches ten of
    // them. (Spans of 1 MiB handed out in even ranges gave 15 threads 2 or 3 of a buffer's 32, the slowest a third
    // over the mean, and an expert's copy 3 threads.)
    constexpr size_t grain = size_t(256) << 10;
    struct Span {
        const uint8_t *src;
        uint8_t *dst;
        size_t bytes;
    };
    std::vector<Span> spans;
    for (const Piece &p : pending_)
        for (size_t o = 0; o < p.bytes; o += grain)
            spans.push_back({p.src + o, b.host + p.offset + o, std::min(grain, p.bytes - o)});
    std::atomic<size_t> next{0};
    const int nth = int(std::min(spans.size(), size_t(pool_->size())));
    pool_->run([&](int ith, int) {
        if (ith >= nth) return;
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < spans.size();)
            if (streaming_)
                stream_copy(spans[i].dst, spans[i].src, spans[i].bytes);
            else
                std::memcpy(spans[i].dst, spans[i].src, spans[i].bytes);
    });
    for (const Piece &p : pending_)
        STRATA_CUDA_CHECK(cudaMemcpyAsync(p.dst, b.host + p.offset, p.bytes, cudaMemcpyHostToDevice, stream));
    STRATA_CUDA_CHECK(cudaEventRecord(b.done, stream));
    b.in_flight = true;
    pending_.clear();
    fill_ = 0;
    cur_ = (cur_ + 1) % int(bufs_.size());
}

}  // namespace strata::cuda
