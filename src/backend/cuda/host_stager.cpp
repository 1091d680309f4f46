#include "backend/cuda/host_stager.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace strata::cuda {

HostStager::HostStager(size_t buffer_bytes, int n_buffers, int n_threads) : buffer_bytes_(buffer_bytes) {
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
    // Host copies in pieces of at most 1 MiB, spread over the threads.
    constexpr size_t grain = size_t(1) << 20;
    struct Span {
        const uint8_t *src;
        uint8_t *dst;
        size_t bytes;
    };
    std::vector<Span> spans;
    for (const Piece &p : pending_)
        for (size_t o = 0; o < p.bytes; o += grain)
            spans.push_back({p.src + o, b.host + p.offset + o, std::min(grain, p.bytes - o)});
    pool_->parallel_for(int64_t(spans.size()), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; i++)
            std::memcpy(spans[size_t(i)].dst, spans[size_t(i)].src, spans[size_t(i)].bytes);
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
