// Copies from pageable host memory (the mapped model file) to the device through a ring of pinned buffers. A copy
// straight from pageable memory goes through the driver's own small staging at a fraction of the bus's speed (about
// 6-9 GB/s on the H200 machines, against 40-50 GB/s from pinned memory), and pinning a whole mapping with
// cudaHostRegister took minutes there. Here worker threads read the source into a pinned buffer in parallel (page-cache
// reads, ~30 GB/s with 8 threads), then one DMA per piece goes out on the caller's stream, and an event per buffer
// says when the buffer may be filled again. While a buffer's DMA runs, the threads fill the next one. With
// `streaming`, the threads' stores bypass the caches (backend/host/stream_copy.h), as the DMA reads the buffer from
// memory next; otherwise memcpy.
//
// Copies are queued on the stream like a cudaMemcpyAsync: after everything queued before them, before everything
// queued after. The source must stay valid until copy() returns; the destination is written in stream order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/threads.h"

namespace strata::cuda {

class HostStager {
  public:
    struct Item {
        void *dst;        // device
        const void *src;  // host, pageable
        size_t bytes;
    };

    HostStager(size_t buffer_bytes, int n_buffers, int n_threads, bool streaming = false);
    ~HostStager();
    HostStager(const HostStager &) = delete;
    HostStager &operator=(const HostStager &) = delete;

    void copy(const std::vector<Item> &items, cudaStream_t stream);

    size_t buffer_bytes() const { return buffer_bytes_; }
    int n_buffers() const { return int(bufs_.size()); }

  private:
    struct Piece {
        uint8_t *dst;
        const uint8_t *src;
        size_t bytes, offset;  // offset in the buffer
    };
    struct Buffer {
        uint8_t *host = nullptr;
        cudaEvent_t done = nullptr;
        bool in_flight = false;
    };
    void flush(cudaStream_t stream);

    size_t buffer_bytes_;
    bool streaming_;
    std::vector<Buffer> bufs_;
    int cur_ = 0;
    size_t fill_ = 0;
    std::vector<Piece> pending_;
    std::unique_ptr<ThreadPool> pool_;
};

}  // namespace strata::cuda
