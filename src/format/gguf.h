// GGUF v3 container: a validating, zero-copy reader over an mmap'd (or in-memory) file, and a writer.
// The reader checks every count, length and offset before anything is used; the model layer above it decides
// what the keys and tensors mean. Shapes use ggml order: ne[0] is the contiguous dimension.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/dtype.h"

namespace strata {

enum class GgufType : int32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
    U64 = 10, I64 = 11, F64 = 12,
};
const char *gguf_type_name(GgufType t);  // "u8", "i32", "f32", "bool", "string", "array", ...

// Limits the reader enforces (the same as ggml's, so that files we accept load there too).
constexpr uint32_t GGUF_VERSION = 3;
constexpr uint32_t GGUF_DEFAULT_ALIGNMENT = 32;
constexpr size_t GGUF_MAX_NAME = 64;  // tensor names are shorter than this
constexpr uint64_t GGUF_MAX_ARRAY_ELEMENTS = 1ull << 30;
constexpr uint64_t GGUF_MAX_STRING_BYTES = 1ull << 30;
constexpr int GGUF_MAX_DIMS = 4;

// Bytes of one element of a numeric or bool type; 0 for STRING and ARRAY.
size_t gguf_type_size(GgufType t);
// Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
bool gguf_valid_utf8(std::string_view s);
// Bytes of a tensor of `type` and shape `ne` (n_dims entries); nothing when ne[0] is not a multiple of the block
// size, a dimension is negative, or the size overflows 64 bits.
std::optional<uint64_t> gguf_tensor_bytes(DType type, const int64_t *ne, int n_dims);

// One metadata value. Scalars are held by value; strings and arrays point into the file's bytes (reader) or into
// storage the value owns (writer side). Arrays are flat: one element type, no nesting.
struct GgufValue {
    GgufType type = GgufType::U8;
    GgufType elem_type = GgufType::U8;  // for ARRAY
    uint64_t u = 0;                     // unsigned integer types and BOOL
    int64_t i = 0;                      // signed integer types
    double f = 0;                       // F32, F64
    std::string_view str;               // STRING
    uint64_t count = 0;                 // ARRAY: number of elements
    const uint8_t *array_data = nullptr;        // ARRAY of numbers/bools: the packed little-endian elements
    std::vector<std::string_view> array_strs;   // ARRAY of strings

    // Typed access; each throws strata::Error naming `key` and the expected vs found type.
    uint64_t as_uint(std::string_view key) const;  // any integer type >= 0, or bool
    int64_t as_int(std::string_view key) const;    // any integer type in range
    double as_float(std::string_view key) const;   // F32, F64 or any integer
    bool as_bool(std::string_view key) const;
    std::string_view as_string(std::string_view key) const;
    std::vector<int64_t> as_int_array(std::string_view key) const;
    std::vector<double> as_float_array(std::string_view key) const;
    const std::vector<std::string_view> &as_string_array(std::string_view key) const;

    // Element i of a numeric/bool array, converted like the scalar accessors (i < count is checked).
    int64_t int_at(std::string_view key, uint64_t i) const;
    double float_at(std::string_view key, uint64_t i) const;
    bool is_array() const { return type == GgufType::ARRAY; }
};

struct GgufKV {
    std::string_view key;
    GgufValue value;
};

struct GgufTensor {
    std::string_view name;
    DType type = DType::F32;
    int32_t n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] contiguous; unused dims are 1
    uint64_t offset = 0;           // relative to the data section
    uint64_t n_bytes = 0;          // exact size of the tensor data
    const uint8_t *data = nullptr; // into the mapped file

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    std::string shape_str() const;  // "[2048, 128, 512]"
};

class GgufFile {
public:
    // mmap and validate; throws strata::Error "FILE: field at byte N: problem" on anything malformed.
    static std::unique_ptr<GgufFile> open(const std::string &path);
    // Validate and view a byte buffer the caller keeps alive (tests, fuzzing).
    static std::unique_ptr<GgufFile> from_memory(const uint8_t *data, size_t size, std::string label = "<memory>");
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile &operator=(const GgufFile &) = delete;

    const std::string &path() const { return path_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // absolute byte offset of the data section
    size_t file_size() const { return size_; }
    const uint8_t *bytes() const { return base_; }

    const std::vector<GgufKV> &kvs() const { return kvs_; }
    const GgufValue *find(std::string_view key) const;  // nullptr when absent
    const GgufValue &get(std::string_view key) const;   // throws naming the missing key
    const GgufKV *find_kv(std::string_view key) const;  // nullptr when absent

    const std::vector<GgufTensor> &tensors() const { return tensors_; }
    const GgufTensor *find_tensor(std::string_view name) const;
    std::optional<size_t> tensor_index(std::string_view name) const;
    // End of the last tensor's bytes (absolute); data_offset() when there are no tensors.
    uint64_t data_end() const { return data_end_; }

    // general.architecture, or "" when absent.
    std::string_view architecture() const;

private:
    GgufFile() = default;
    friend class GgufParser;  // gguf.cpp: fills the fields below, validating as it goes

    std::string path_;
    const uint8_t *base_ = nullptr;
    size_t size_ = 0;
    void *map_ = nullptr;  // non-null when we own an mmap
    size_t map_size_ = 0;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    uint64_t data_end_ = 0;
    std::vector<GgufKV> kvs_;
    std::vector<GgufTensor> tensors_;
    struct Index;
    std::unique_ptr<Index> index_;  // name -> position lookups
};

// Writer: collects metadata and tensors, then writes a v3 file. Values are owned here.
class GgufWriter {
public:
    GgufWriter();
    ~GgufWriter();
    GgufWriter(GgufWriter &&) noexcept;
    GgufWriter &operator=(GgufWriter &&) noexcept;

    void set_alignment(uint32_t alignment);  // also written as general.alignment when not 32

    void add_u8(std::string key, uint8_t v);
    void add_i8(std::string key, int8_t v);
    void add_u16(std::string key, uint16_t v);
    void add_i16(std::string key, int16_t v);
    void add_u32(std::string key, uint32_t v);
    void add_i32(std::string key, int32_t v);
    void add_u64(std::string key, uint64_t v);
    void add_i64(std::string key, int64_t v);
    void add_f32(std::string key, float v);
    void add_f64(std::string key, double v);
    void add_bool(std::string key, bool v);
    void add_string(std::string key, std::string v);
    // Numeric/bool arrays: raw little-endian elements of elem_type.
    void add_array(std::string key, GgufType elem_type, const void *elems, uint64_t count);
    void add_string_array(std::string key, std::vector<std::string> v);
    // Any value as read from another file (copied; strings included), e.g. to carry metadata across.
    void add_kv(std::string key, const GgufValue &v);

    // Tensor bytes are copied (or produced later by `fill`, for files larger than memory). The size must be exactly
    // what the type and shape need. `fill` is called once, at write time, with a buffer of the tensor's size.
    void add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void *data, size_t n_bytes);
    using Fill = void (*)(void *ctx, uint8_t *dst, size_t n_bytes);
    void add_tensor_lazy(std::string name, DType type, std::vector<int64_t> ne, Fill fill, void *ctx);
    // Streamed: at write time `fill` is called for consecutive pieces [offset, offset + n_bytes) of the tensor, in
    // order, each a whole number of rows of at most about stream_chunk_bytes(), so that a tensor larger than memory
    // never has to be held at once.
    using FillRange = std::function<void(uint64_t offset, uint8_t *dst, size_t n_bytes)>;
    void add_tensor_streamed(std::string name, DType type, std::vector<int64_t> ne, FillRange fill);
    static size_t stream_chunk_bytes();

    size_t n_kv() const;
    size_t n_tensors() const;

    // Throws strata::Error on a bad key/name/shape or an I/O failure.
    void write(const std::string &path) const;
    std::vector<uint8_t> write_to_memory() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace strata
