// A weight as the engine sees it: a view of one tensor in the mapped GGUF file (name, type, shape, bytes), with a
// handle where a backend attaches its own copy. Shapes are in ggml order: ne[0] is the row length (input features);
// 3-D tensors hold one matrix per expert. Not what a model does with its weights (model/weights.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "format/dtype.h"

namespace strata {

struct Weight {
    std::string_view name;   // GGUF tensor name; empty when absent
    DType type = DType::F32;
    int64_t ne[3] = {0, 0, 0};       // {row length, rows, experts (1 for plain matrices)}
    const uint8_t *host = nullptr;   // first byte in the mapped file
    size_t row_bytes = 0;            // bytes of one row
    size_t expert_stride = 0;        // bytes from one expert's matrix to the next (3-D tensors)
    void *backend = nullptr;         // a backend's own handle for this weight (device copy), if any

    bool present() const { return host != nullptr; }
    const uint8_t *expert_host(int64_t e) const { return host + size_t(e) * expert_stride; }
    size_t matrix_bytes() const { return row_bytes * size_t(ne[1]); }  // one expert's matrix
};

}  // namespace strata
