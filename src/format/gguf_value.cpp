// GGUF value types: names, sizes, typed access to metadata values, UTF-8 and tensor-size checks shared by the
// reader and the writer. Values read from a file were validated by the reader; these accessors only convert.
#include <cinttypes>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "format/gguf.h"

namespace strata {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF values are read in place: little-endian hosts only");

const char *gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::U8:
            return "u8";
        case GgufType::I8:
            return "i8";
        case GgufType::U16:
            return "u16";
        case GgufType::I16:
            return "i16";
        case GgufType::U32:
            return "u32";
        case GgufType::I32:
            return "i32";
        case GgufType::F32:
            return "f32";
        case GgufType::BOOL:
            return "bool";
        case GgufType::STRING:
            return "string";
        case GgufType::ARRAY:
            return "array";
        case GgufType::U64:
            return "u64";
        case GgufType::I64:
            return "i64";
        case GgufType::F64:
            return "f64";
    }
    return "unknown";
}

size_t gguf_type_size(GgufType t) {
    switch (t) {
        case GgufType::U8:
        case GgufType::I8:
        case GgufType::BOOL:
            return 1;
        case GgufType::U16:
        case GgufType::I16:
            return 2;
        case GgufType::U32:
        case GgufType::I32:
        case GgufType::F32:
            return 4;
        case GgufType::U64:
        case GgufType::I64:
        case GgufType::F64:
            return 8;
        case GgufType::STRING:
        case GgufType::ARRAY:
            return 0;
    }
    return 0;
}

bool gguf_valid_utf8(std::string_view s) {
    const auto *p = reinterpret_cast<const uint8_t *>(s.data());
    const uint8_t *end = p + s.size();
    while (p < end) {
        // Vocabularies are mostly ASCII: skip eight such bytes at a time.
        if (end - p >= 8) {
            uint64_t w;
            std::memcpy(&w, p, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                p += 8;
                continue;
            }
        }
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int n;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf)
            n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            n = 3, cp = c & 0x07;
        else
            return false;  // stray continuation byte, overlong 2-byte lead (c0/c1) or past U+10FFFF (f5..ff)
        if (end - p <= n) return false;
        for (int k = 1; k <= n; k++) {
            if ((p[k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[k] & 0x3f);
        }
        if (n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return false;  // overlong or surrogate
        if (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) return false;
        p += n + 1;
    }
    return true;
}

std::optional<uint64_t> gguf_tensor_bytes(DType type, const int64_t *ne, int n_dims) {
    const DTypeInfo *info = dtype_info(int32_t(type));
    if (info == nullptr || n_dims < 1 || n_dims > GGUF_MAX_DIMS) return std::nullopt;
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 0) return std::nullopt;
    if (ne[0] % info->block_size != 0) return std::nullopt;
    // The element count must fit in int64 (ggml indexes with it), and so must every partial product on the way
    // (a later zero dimension does not make an overflowing prefix safe for code that multiplies in order).
    uint64_t elems = 1;
    for (int d = 0; d < n_dims; d++)
        if (__builtin_mul_overflow(elems, uint64_t(ne[d]), &elems) ||
            elems > uint64_t(std::numeric_limits<int64_t>::max()))
            return std::nullopt;
    uint64_t bytes = uint64_t(ne[0] / info->block_size);
    if (__builtin_mul_overflow(bytes, uint64_t(info->block_bytes), &bytes)) return std::nullopt;
    for (int d = 1; d < n_dims; d++)
        if (__builtin_mul_overflow(bytes, uint64_t(ne[d]), &bytes)) return std::nullopt;
    return bytes;
}

// ---- typed access ----------------------------------------------------------------------------------------------

namespace {

bool is_unsigned(GgufType t) {
    return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}
bool is_signed(GgufType t) {
    return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}
bool is_float(GgufType t) {
    return t == GgufType::F32 || t == GgufType::F64;
}

[[noreturn]] void wrong_type(std::string_view key, const char *expected, const GgufValue &v) {
    if (v.type == GgufType::ARRAY)
        fail("metadata key '%.*s': expected %s, found an array of %s", int(key.size()), key.data(), expected,
             gguf_type_name(v.elem_type));
    fail("metadata key '%.*s': expected %s, found %s", int(key.size()), key.data(), expected, gguf_type_name(v.type));
}

// One packed little-endian element, widened. Integers go to u/i, floats to f, as in a scalar GgufValue.
GgufValue element(const GgufValue &v, uint64_t i) {
    GgufValue e;
    e.type = v.elem_type;
    const uint8_t *p = v.array_data + i * gguf_type_size(v.elem_type);
    switch (v.elem_type) {
        case GgufType::U8:
        case GgufType::BOOL:
            e.u = p[0];
            break;
        case GgufType::I8:
            e.i = int8_t(p[0]);
            break;
        case GgufType::U16: {
            uint16_t x;
            std::memcpy(&x, p, 2);
            e.u = x;
            break;
        }
        case GgufType::I16: {
            int16_t x;
            std::memcpy(&x, p, 2);
            e.i = x;
            break;
        }
        case GgufType::U32: {
            uint32_t x;
            std::memcpy(&x, p, 4);
            e.u = x;
            break;
        }
        case GgufType::I32: {
            int32_t x;
            std::memcpy(&x, p, 4);
            e.i = x;
            break;
        }
        case GgufType::U64:
            std::memcpy(&e.u, p, 8);
            break;
        case GgufType::I64:
            std::memcpy(&e.i, p, 8);
            break;
        case GgufType::F32: {
            float x;
            std::memcpy(&x, p, 4);
            e.f = x;
            break;
        }
        case GgufType::F64:
            std::memcpy(&e.f, p, 8);
            break;
        case GgufType::STRING:
        case GgufType::ARRAY:
            STRATA_ASSERT(false);
    }
    return e;
}

void check_numeric_array(std::string_view key, const GgufValue &v, const char *expected) {
    if (v.type != GgufType::ARRAY || v.elem_type == GgufType::STRING) wrong_type(key, expected, v);
    STRATA_ASSERT(v.array_data != nullptr || v.count == 0);
}

}  // namespace

uint64_t GgufValue::as_uint(std::string_view key) const {
    if (is_unsigned(type) || type == GgufType::BOOL) return u;
    if (is_signed(type)) {
        if (i < 0) fail("metadata key '%.*s': expected a value >= 0, found %" PRId64, int(key.size()), key.data(), i);
        return uint64_t(i);
    }
    wrong_type(key, "an unsigned integer", *this);
}

int64_t GgufValue::as_int(std::string_view key) const {
    if (is_signed(type)) return i;
    if (is_unsigned(type)) {
        if (u > uint64_t(std::numeric_limits<int64_t>::max()))
            fail("metadata key '%.*s': %" PRIu64 " does not fit a signed 64-bit integer", int(key.size()), key.data(),
                 u);
        return int64_t(u);
    }
    wrong_type(key, "an integer", *this);
}

double GgufValue::as_float(std::string_view key) const {
    if (is_float(type)) return f;
    if (is_unsigned(type)) return double(u);
    if (is_signed(type)) return double(i);
    wrong_type(key, "a number", *this);
}

bool GgufValue::as_bool(std::string_view key) const {
    if (type != GgufType::BOOL) wrong_type(key, "a bool", *this);
    return u != 0;
}

std::string_view GgufValue::as_string(std::string_view key) const {
    if (type != GgufType::STRING) wrong_type(key, "a string", *this);
    return str;
}

int64_t GgufValue::int_at(std::string_view key, uint64_t idx) const {
    check_numeric_array(key, *this, "an array of integers");
    if (idx >= count)
        fail("metadata key '%.*s': element %" PRIu64 " of an array of %" PRIu64, int(key.size()), key.data(), idx,
             count);
    if (is_float(elem_type)) wrong_type(key, "an array of integers", *this);
    return element(*this, idx).as_int(key);
}

double GgufValue::float_at(std::string_view key, uint64_t idx) const {
    check_numeric_array(key, *this, "an array of numbers");
    if (idx >= count)
        fail("metadata key '%.*s': element %" PRIu64 " of an array of %" PRIu64, int(key.size()), key.data(), idx,
             count);
    if (elem_type == GgufType::BOOL) wrong_type(key, "an array of numbers", *this);
    return element(*this, idx).as_float(key);
}

std::vector<int64_t> GgufValue::as_int_array(std::string_view key) const {
    check_numeric_array(key, *this, "an array of integers");
    if (is_float(elem_type) || elem_type == GgufType::BOOL) wrong_type(key, "an array of integers", *this);
    std::vector<int64_t> out(count);
    for (uint64_t k = 0; k < count; k++) out[k] = element(*this, k).as_int(key);
    return out;
}

std::vector<double> GgufValue::as_float_array(std::string_view key) const {
    check_numeric_array(key, *this, "an array of numbers");
    if (elem_type == GgufType::BOOL) wrong_type(key, "an array of numbers", *this);
    std::vector<double> out(count);
    for (uint64_t k = 0; k < count; k++) out[k] = element(*this, k).as_float(key);
    return out;
}

const std::vector<std::string_view> &GgufValue::as_string_array(std::string_view key) const {
    if (type != GgufType::ARRAY || elem_type != GgufType::STRING) wrong_type(key, "an array of strings", *this);
    return array_strs;
}

std::string GgufTensor::shape_str() const {
    std::string s = "[";
    for (int d = 0; d < n_dims; d++) {
        if (d) s += ", ";
        s += std::to_string(ne[d]);
    }
    return s + "]";
}

}  // namespace strata
