// libFuzzer entry for the GGUF reader. Any input must either be refused with one non-empty strata::Error, or
// parse into values and tensor views that all lie inside the input: every parsed byte is read here, so ASan
// reports any view that points outside it. Other exceptions (bad_alloc, length_error) escape and count as findings.
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "format/gguf.h"

using namespace strata;

namespace {

volatile uint64_t g_sink;  // keeps the reads below from being optimised away

uint64_t sum(const void *p, uint64_t n) {
    const auto *b = static_cast<const uint8_t *>(p);
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += b[i];
    return s;
}

uint64_t touch_value(std::string_view key, const GgufValue &v) {
    uint64_t s = v.u + uint64_t(v.i) + sum(v.str.data(), v.str.size());
    if (v.type != GgufType::ARRAY) return s;
    if (v.elem_type == GgufType::STRING) {
        if (v.array_strs.size() != v.count) __builtin_trap();
        for (std::string_view e : v.array_strs) s += sum(e.data(), e.size());
        return s;
    }
    s += sum(v.array_data, v.count * gguf_type_size(v.elem_type));
    // The typed accessors may refuse (wrong type, out of range) but must not misbehave.
    try {
        for (int64_t x : v.as_int_array(key)) s += uint64_t(x);
    } catch (const Error &) {
    }
    try {
        for (double x : v.as_float_array(key)) s += x != x ? 1 : 0;
    } catch (const Error &) {
    }
    return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::unique_ptr<GgufFile> f;
    try {
        f = GgufFile::from_memory(data, size, "fuzz.gguf");
    } catch (const Error &e) {
        if (e.what()[0] == '\0') __builtin_trap();
        return 0;
    }
    uint64_t s = 0;
    for (const GgufKV &kv : f->kvs()) {
        if (f->find(kv.key) != &kv.value) __builtin_trap();
        s += sum(kv.key.data(), kv.key.size()) + touch_value(kv.key, kv.value);
    }
    for (const GgufTensor &t : f->tensors()) {
        if (f->find_tensor(t.name) != &t) __builtin_trap();
        if (t.data < data || t.n_bytes > uint64_t(data + size - t.data)) __builtin_trap();
        s += sum(t.name.data(), t.name.size()) + sum(t.data, t.n_bytes) + uint64_t(t.n_elements());
    }
    g_sink = s + f->architecture().size();
    return 0;
}
