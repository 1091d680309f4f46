// Valid GGUF files for tests and fuzz seeds, written with our writer, plus a raw byte builder for files the writer
// (rightly) refuses to produce. Tensor bytes follow sample_byte() so any reader can recompute them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace strata::testing {

inline uint8_t sample_byte(size_t tensor_index, size_t k) {
    return uint8_t((k * 131 + tensor_index * 29 + 7) & 0xff);
}

inline std::vector<uint8_t> sample_bytes(size_t tensor_index, size_t n) {
    std::vector<uint8_t> b(n);
    for (size_t k = 0; k < n; k++) b[k] = sample_byte(tensor_index, k);
    return b;
}

inline void add_sample_tensor(GgufWriter &w, size_t index, const char *name, DType type, std::vector<int64_t> ne) {
    auto bytes = gguf_tensor_bytes(type, ne.data(), int(ne.size()));
    std::vector<uint8_t> data = sample_bytes(index, size_t(*bytes));
    w.add_tensor(name, type, std::move(ne), data.data(), data.size());
}

// Every scalar and array type, strings with multi-byte UTF-8, and tensors of several types and ranks.
inline GgufWriter sample_every_value(uint32_t alignment = 32) {
    GgufWriter w;
    w.add_string("general.architecture", "qwen3moe");
    if (alignment != 32) w.set_alignment(alignment);
    w.add_u8("test.u8", 200);
    w.add_i8("test.i8", -100);
    w.add_u16("test.u16", 60000);
    w.add_i16("test.i16", -30000);
    w.add_u32("test.u32", 4000000000u);
    w.add_i32("test.i32", -2000000000);
    w.add_u64("test.u64", 18000000000000000000ull);
    w.add_i64("test.i64", -9000000000000000000ll);
    w.add_f32("test.f32", 0.15625f);
    w.add_f64("test.f64", -1.0e300);
    w.add_bool("test.bool", true);
    w.add_string("test.string", "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
    w.add_string("test.empty_string", "");
    const uint8_t u8s[] = {0, 1, 255};
    w.add_array("test.arr_u8", GgufType::U8, u8s, 3);
    const int8_t i8s[] = {-128, 0, 127};
    w.add_array("test.arr_i8", GgufType::I8, i8s, 3);
    const uint16_t u16s[] = {1, 65535};
    w.add_array("test.arr_u16", GgufType::U16, u16s, 2);
    const int16_t i16s[] = {-32768, 32767};
    w.add_array("test.arr_i16", GgufType::I16, i16s, 2);
    const uint32_t u32s[] = {7, 4294967295u};
    w.add_array("test.arr_u32", GgufType::U32, u32s, 2);
    const int32_t i32s[] = {11, 11, 10, 0};
    w.add_array("test.arr_i32", GgufType::I32, i32s, 4);
    const uint64_t u64s[] = {1ull << 63};
    w.add_array("test.arr_u64", GgufType::U64, u64s, 1);
    const int64_t i64s[] = {-(1ll << 62), 5};
    w.add_array("test.arr_i64", GgufType::I64, i64s, 2);
    const float f32s[] = {1.5f, -2.25f, 1e-30f};
    w.add_array("test.arr_f32", GgufType::F32, f32s, 3);
    const double f64s[] = {3.141592653589793, -0.0};
    w.add_array("test.arr_f64", GgufType::F64, f64s, 2);
    const uint8_t bools[] = {1, 0, 1};
    w.add_array("test.arr_bool", GgufType::BOOL, bools, 3);
    w.add_array("test.arr_empty", GgufType::F32, nullptr, 0);
    w.add_string_array("test.arr_str", {"a", "", "\xc4\xa0the", "<|im_end|>"});
    add_sample_tensor(w, 0, "token_embd.weight", DType::F32, {8, 3});
    add_sample_tensor(w, 1, "blk.0.attn_q.weight", DType::F16, {16, 2});
    add_sample_tensor(w, 2, "blk.0.ffn_gate_exps.weight", DType::Q8_0, {64, 2, 2});
    add_sample_tensor(w, 3, "blk.0.ffn_down_exps.weight", DType::Q4_K, {256, 1, 2});
    add_sample_tensor(w, 4, "blk.0.ffn_up_exps.weight", DType::MXFP4, {32, 2, 2, 1});
    add_sample_tensor(w, 5, "output.weight", DType::BF16, {5});
    add_sample_tensor(w, 6, "blk.0.attn_sinks", DType::I32, {3});
    return w;
}

// Small enough that every truncation point is cheap: two keys, two tensors.
inline GgufWriter sample_tiny() {
    GgufWriter w;
    w.add_string("general.architecture", "tiny");
    const int32_t ids[] = {1, 2};
    w.add_array("tiny.ids", GgufType::I32, ids, 2);
    w.add_string_array("tiny.toks", {"x", "yz"});
    add_sample_tensor(w, 0, "a", DType::F32, {4});
    add_sample_tensor(w, 1, "b", DType::Q8_0, {32, 2});
    return w;
}

// Little-endian byte builder for hand-made files.
struct RawGguf {
    std::vector<uint8_t> b;
    template <class T>
    RawGguf &put(T v) {
        uint8_t tmp[sizeof(T)];
        std::memcpy(tmp, &v, sizeof(T));
        b.insert(b.end(), tmp, tmp + sizeof(T));
        return *this;
    }
    RawGguf &str(std::string_view s) {
        put<uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    RawGguf &header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        b.insert(b.end(), {'G', 'G', 'U', 'F'});
        put<uint32_t>(version);
        put<uint64_t>(n_tensors);
        return put<uint64_t>(n_kv);
    }
    RawGguf &kv_u32(std::string_view key, uint32_t v) {
        str(key);
        put<int32_t>(int32_t(GgufType::U32));
        return put<uint32_t>(v);
    }
    RawGguf &tensor_info(std::string_view name, std::vector<int64_t> ne, int32_t type, uint64_t offset) {
        str(name);
        put<uint32_t>(uint32_t(ne.size()));
        for (int64_t d : ne) put<int64_t>(d);
        put<int32_t>(type);
        return put<uint64_t>(offset);
    }
    RawGguf &pad(size_t alignment) {
        while (b.size() % alignment) b.push_back(0);
        return *this;
    }
    RawGguf &zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
};

}  // namespace strata::testing
