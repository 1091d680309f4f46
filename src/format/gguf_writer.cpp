// GGUF v3 writer. Everything the reader would refuse is refused here, when it is added, so that a file we write
// always reads back. Tensor bytes are written in order through a large buffer; lazily filled tensors are produced
// at write time, one tensor (or one piece of a streamed tensor) at a time, so files larger than memory work.
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "format/gguf.h"

namespace strata {

namespace {

// Where serialized bytes go: a growing buffer or a buffered file.
class Sink {
  public:
    virtual ~Sink() = default;
    virtual void write(const void *p, size_t n) = 0;
    void zeros(size_t n) {
        static const uint8_t k_zero[256] = {};
        for (size_t k = 0; k < n; k += sizeof(k_zero)) write(k_zero, std::min(sizeof(k_zero), n - k));
    }
    template <class T>
    void put(T v) {
        write(&v, sizeof(v));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        write(s.data(), s.size());
    }
    uint64_t written = 0;
};

class MemorySink : public Sink {
  public:
    void write(const void *p, size_t n) override {
        const auto *b = static_cast<const uint8_t *>(p);
        out.insert(out.end(), b, b + n);
        written += n;
    }
    std::vector<uint8_t> out;
};

class FileSink : public Sink {
  public:
    FileSink(const std::string &path) : path_(path) {
        f_ = std::fopen(path.c_str(), "wb");
        if (f_ == nullptr) fail("%s: cannot create: %s", path.c_str(), std::strerror(errno));
        buf_.resize(8u << 20);  // metadata is many small writes; tensor data bypasses this in large pieces
        std::setvbuf(f_, buf_.data(), _IOFBF, buf_.size());
    }
    ~FileSink() override {
        if (f_) std::fclose(f_);
    }
    void write(const void *p, size_t n) override {
        if (n && std::fwrite(p, 1, n, f_) != n) fail("%s: write failed: %s", path_.c_str(), std::strerror(errno));
        written += n;
    }
    void close() {
        std::FILE *f = f_;
        f_ = nullptr;
        if (std::fclose(f) != 0) fail("%s: write failed: %s", path_.c_str(), std::strerror(errno));
    }

  private:
    std::string path_;
    std::FILE *f_ = nullptr;
    std::vector<char> buf_;
};

uint64_t pad_to(uint64_t n, uint64_t a) {
    return (n + a - 1) / a * a;
}

}  // namespace

struct GgufWriter::Impl {
    struct Kv {
        std::string key;
        GgufType type = GgufType::U8;
        GgufType elem_type = GgufType::U8;
        uint64_t count = 0;             // ARRAY
        std::vector<uint8_t> raw;       // a scalar's bytes or an array's packed elements
        std::vector<std::string> strs;  // STRING (one) or ARRAY of STRING
    };
    struct Tensor {
        std::string name;
        DType type = DType::F32;
        int n_dims = 0;
        int64_t ne[4] = {1, 1, 1, 1};
        uint64_t n_bytes = 0;
        std::vector<uint8_t> data;  // copied bytes, or empty when filled at write time
        Fill fill = nullptr;
        void *fill_ctx = nullptr;
        FillRange fill_range;
    };

    uint32_t alignment = GGUF_DEFAULT_ALIGNMENT;
    std::vector<Kv> kvs;
    std::unordered_map<std::string, size_t> key_index;
    std::vector<Tensor> tensors;
    std::unordered_set<std::string> tensor_names;

    Kv &new_kv(std::string key, GgufType type);
    // Checks a tensor's name and shape (nothing is stored); insert() adds it.
    Tensor make_tensor(std::string name, DType type, const std::vector<int64_t> &ne) const;
    Tensor &insert(Tensor t);
    void serialize(Sink &out) const;
    void write_tensor_data(Sink &out, const Tensor &t, std::vector<uint8_t> &scratch) const;
};

namespace {

void check_string(std::string_view what, std::string_view s) {
    if (s.size() > GGUF_MAX_STRING_BYTES)
        fail("GGUF writer: %.*s: string of %zu bytes is longer than the limit of %" PRIu64, int(what.size()),
             what.data(), s.size(), GGUF_MAX_STRING_BYTES);
    if (!gguf_valid_utf8(s)) fail("GGUF writer: %.*s: string is not valid UTF-8", int(what.size()), what.data());
}

template <class T>
std::string shape_of(const T &t) {
    GgufTensor g;
    g.n_dims = t.n_dims;
    std::copy(t.ne, t.ne + 4, g.ne);
    return g.shape_str();
}

}  // namespace

GgufWriter::Impl::Kv &GgufWriter::Impl::new_kv(std::string key, GgufType type) {
    if (key.empty()) fail("GGUF writer: metadata key is empty");
    check_string(strfmt("metadata key '%s'", key.c_str()), key);
    if (key_index.count(key)) fail("GGUF writer: metadata key '%s' added twice", key.c_str());
    if (key == "general.alignment" && type != GgufType::U32)
        fail("GGUF writer: general.alignment must be a u32, not %s", gguf_type_name(type));
    key_index.emplace(key, kvs.size());
    Kv &kv = kvs.emplace_back();
    kv.key = std::move(key);
    kv.type = type;
    return kv;
}

GgufWriter::GgufWriter() : impl_(std::make_unique<Impl>()) {}
GgufWriter::~GgufWriter() = default;
GgufWriter::GgufWriter(GgufWriter &&) noexcept = default;
GgufWriter &GgufWriter::operator=(GgufWriter &&) noexcept = default;

size_t GgufWriter::n_kv() const {
    return impl_->kvs.size();
}
size_t GgufWriter::n_tensors() const {
    return impl_->tensors.size();
}
size_t GgufWriter::stream_chunk_bytes() {
    return 16u << 20;
}

void GgufWriter::set_alignment(uint32_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        fail("GGUF writer: alignment %" PRIu32 " is not a power of two", alignment);
    impl_->alignment = alignment;
    auto it = impl_->key_index.find("general.alignment");
    if (it != impl_->key_index.end()) {
        std::memcpy(impl_->kvs[it->second].raw.data(), &alignment, 4);
    } else if (alignment != GGUF_DEFAULT_ALIGNMENT) {
        Impl::Kv &kv = impl_->new_kv("general.alignment", GgufType::U32);
        kv.raw.resize(4);
        std::memcpy(kv.raw.data(), &alignment, 4);
    }
}

namespace {

template <class T>
void set_scalar(std::vector<uint8_t> &raw, T v) {
    raw.resize(sizeof(T));
    std::memcpy(raw.data(), &v, sizeof(T));
}

}  // namespace

void GgufWriter::add_u8(std::string key, uint8_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::U8).raw, v);
}
void GgufWriter::add_i8(std::string key, int8_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::I8).raw, v);
}
void GgufWriter::add_u16(std::string key, uint16_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::U16).raw, v);
}
void GgufWriter::add_i16(std::string key, int16_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::I16).raw, v);
}
void GgufWriter::add_u32(std::string key, uint32_t v) {
    if (key == "general.alignment") {
        // The value decides the layout, so it is checked and used like set_alignment's.
        if (v == 0 || (v & (v - 1)) != 0) fail("GGUF writer: alignment %" PRIu32 " is not a power of two", v);
        set_scalar(impl_->new_kv(std::move(key), GgufType::U32).raw, v);
        impl_->alignment = v;
        return;
    }
    set_scalar(impl_->new_kv(std::move(key), GgufType::U32).raw, v);
}
void GgufWriter::add_i32(std::string key, int32_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::I32).raw, v);
}
void GgufWriter::add_u64(std::string key, uint64_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::U64).raw, v);
}
void GgufWriter::add_i64(std::string key, int64_t v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::I64).raw, v);
}
void GgufWriter::add_f32(std::string key, float v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::F32).raw, v);
}
void GgufWriter::add_f64(std::string key, double v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::F64).raw, v);
}
void GgufWriter::add_bool(std::string key, bool v) {
    set_scalar(impl_->new_kv(std::move(key), GgufType::BOOL).raw, uint8_t(v ? 1 : 0));
}

void GgufWriter::add_string(std::string key, std::string v) {
    check_string(strfmt("metadata key '%s'", key.c_str()), v);
    impl_->new_kv(std::move(key), GgufType::STRING).strs.push_back(std::move(v));
}

void GgufWriter::add_array(std::string key, GgufType elem_type, const void *elems, uint64_t count) {
    size_t size = gguf_type_size(elem_type);
    if (size == 0)
        fail("GGUF writer: metadata key '%s': arrays of %s cannot be added as raw elements%s", key.c_str(),
             gguf_type_name(elem_type), elem_type == GgufType::STRING ? " (use add_string_array)" : "");
    if (count > GGUF_MAX_ARRAY_ELEMENTS)
        fail("GGUF writer: metadata key '%s': %" PRIu64 " elements is more than the limit of %" PRIu64, key.c_str(),
             count, GGUF_MAX_ARRAY_ELEMENTS);
    const auto *p = static_cast<const uint8_t *>(elems);
    if (elem_type == GgufType::BOOL)
        for (uint64_t k = 0; k < count; k++)
            if (p[k] > 1) fail("GGUF writer: metadata key '%s': bool element %" PRIu64 " is %d", key.c_str(), k, p[k]);
    Impl::Kv &kv = impl_->new_kv(std::move(key), GgufType::ARRAY);
    kv.elem_type = elem_type;
    kv.count = count;
    if (count) kv.raw.assign(p, p + count * size);
}

void GgufWriter::add_string_array(std::string key, std::vector<std::string> v) {
    if (v.size() > GGUF_MAX_ARRAY_ELEMENTS)
        fail("GGUF writer: metadata key '%s': %zu elements is more than the limit of %" PRIu64, key.c_str(), v.size(),
             GGUF_MAX_ARRAY_ELEMENTS);
    for (size_t k = 0; k < v.size(); k++)
        if (!gguf_valid_utf8(v[k]) || v[k].size() > GGUF_MAX_STRING_BYTES)
            check_string(strfmt("metadata key '%s' element %zu", key.c_str(), k), v[k]);
    Impl::Kv &kv = impl_->new_kv(std::move(key), GgufType::ARRAY);
    kv.elem_type = GgufType::STRING;
    kv.count = v.size();
    kv.strs = std::move(v);
}

void GgufWriter::add_kv(std::string key, const GgufValue &v) {
    switch (v.type) {
        case GgufType::U8:
            add_u8(std::move(key), uint8_t(v.u));
            break;
        case GgufType::I8:
            add_i8(std::move(key), int8_t(v.i));
            break;
        case GgufType::U16:
            add_u16(std::move(key), uint16_t(v.u));
            break;
        case GgufType::I16:
            add_i16(std::move(key), int16_t(v.i));
            break;
        case GgufType::U32:
            add_u32(std::move(key), uint32_t(v.u));
            break;
        case GgufType::I32:
            add_i32(std::move(key), int32_t(v.i));
            break;
        case GgufType::U64:
            add_u64(std::move(key), v.u);
            break;
        case GgufType::I64:
            add_i64(std::move(key), v.i);
            break;
        case GgufType::F32:
            add_f32(std::move(key), float(v.f));
            break;
        case GgufType::F64:
            add_f64(std::move(key), v.f);
            break;
        case GgufType::BOOL:
            add_bool(std::move(key), v.u != 0);
            break;
        case GgufType::STRING:
            add_string(std::move(key), std::string(v.str));
            break;
        case GgufType::ARRAY:
            if (v.elem_type == GgufType::STRING)
                add_string_array(std::move(key), std::vector<std::string>(v.array_strs.begin(), v.array_strs.end()));
            else
                add_array(std::move(key), v.elem_type, v.array_data, v.count);
            break;
    }
}

// ---- tensors ---------------------------------------------------------------------------------------------------

GgufWriter::Impl::Tensor GgufWriter::Impl::make_tensor(std::string name, DType type,
                                                       const std::vector<int64_t> &ne) const {
    if (name.empty()) fail("GGUF writer: tensor name is empty");
    if (name.size() >= GGUF_MAX_NAME)
        fail("GGUF writer: tensor name '%s' is %zu bytes; names must be shorter than %zu", name.c_str(), name.size(),
             GGUF_MAX_NAME);
    check_string("tensor name", name);
    if (tensor_names.count(name)) fail("GGUF writer: tensor '%s' added twice", name.c_str());
    if (ne.empty() || ne.size() > size_t(GGUF_MAX_DIMS))
        fail("GGUF writer: tensor '%s' has %zu dimensions; must be 1 to %d", name.c_str(), ne.size(), GGUF_MAX_DIMS);
    const DTypeInfo *info = dtype_info(int32_t(type));
    if (info == nullptr) fail("GGUF writer: tensor '%s': unknown type id %d", name.c_str(), int(type));
    Tensor t;
    t.name = std::move(name);
    t.type = type;
    t.n_dims = int(ne.size());
    for (size_t d = 0; d < ne.size(); d++) t.ne[d] = ne[d];
    std::optional<uint64_t> bytes = gguf_tensor_bytes(type, t.ne, t.n_dims);
    if (!bytes) {
        if (t.ne[0] >= 0 && t.ne[0] % info->block_size != 0)
            fail("GGUF writer: tensor '%s' %s: ne[0] is not a multiple of the %s block size %d", t.name.c_str(),
                 shape_of(t).c_str(), info->name, info->block_size);
        fail("GGUF writer: tensor '%s': shape %s is negative or too large", t.name.c_str(), shape_of(t).c_str());
    }
    t.n_bytes = *bytes;
    return t;
}

GgufWriter::Impl::Tensor &GgufWriter::Impl::insert(Tensor t) {
    tensor_names.insert(t.name);
    return tensors.emplace_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void *data, size_t n_bytes) {
    Impl::Tensor t = impl_->make_tensor(std::move(name), type, ne);
    if (n_bytes != t.n_bytes)
        fail("GGUF writer: tensor '%s' of type %s and shape %s needs %" PRIu64 " bytes, got %zu", t.name.c_str(),
             dtype_name(type), shape_of(t).c_str(), t.n_bytes, n_bytes);
    if (n_bytes != 0 && data == nullptr) fail("GGUF writer: tensor '%s': no data", t.name.c_str());
    const auto *p = static_cast<const uint8_t *>(data);
    t.data.assign(p, p + n_bytes);
    impl_->insert(std::move(t));
}

void GgufWriter::add_tensor_lazy(std::string name, DType type, std::vector<int64_t> ne, Fill fill, void *ctx) {
    if (fill == nullptr) fail("GGUF writer: tensor '%s': no fill function", name.c_str());
    Impl::Tensor t = impl_->make_tensor(std::move(name), type, ne);
    t.fill = fill;
    t.fill_ctx = ctx;
    impl_->insert(std::move(t));
}

void GgufWriter::add_tensor_streamed(std::string name, DType type, std::vector<int64_t> ne, FillRange fill) {
    if (!fill) fail("GGUF writer: tensor '%s': no fill function", name.c_str());
    Impl::Tensor t = impl_->make_tensor(std::move(name), type, ne);
    t.fill_range = std::move(fill);
    impl_->insert(std::move(t));
}

// ---- serialization ---------------------------------------------------------------------------------------------

void GgufWriter::Impl::write_tensor_data(Sink &out, const Tensor &t, std::vector<uint8_t> &scratch) const {
    if (t.fill_range) {
        uint64_t rows = uint64_t(t.ne[1]) * uint64_t(t.ne[2]) * uint64_t(t.ne[3]);
        uint64_t row = rows ? t.n_bytes / rows : 0;
        if (row == 0) return;
        uint64_t rows_per_piece = std::max<uint64_t>(1, stream_chunk_bytes() / row);
        for (uint64_t r = 0; r < rows; r += rows_per_piece) {
            size_t n = size_t(std::min(rows_per_piece, rows - r) * row);
            scratch.resize(std::max(scratch.size(), n));
            t.fill_range(r * row, scratch.data(), n);
            out.write(scratch.data(), n);
        }
    } else if (t.fill) {
        scratch.resize(std::max<size_t>(scratch.size(), t.n_bytes));
        t.fill(t.fill_ctx, scratch.data(), size_t(t.n_bytes));
        out.write(scratch.data(), size_t(t.n_bytes));
    } else {
        out.write(t.data.data(), t.data.size());
    }
}

void GgufWriter::Impl::serialize(Sink &out) const {
    out.write("GGUF", 4);
    out.put<uint32_t>(GGUF_VERSION);
    out.put<uint64_t>(tensors.size());
    out.put<uint64_t>(kvs.size());
    for (const Kv &kv : kvs) {
        out.put_string(kv.key);
        out.put<int32_t>(int32_t(kv.type));
        if (kv.type == GgufType::STRING) {
            out.put_string(kv.strs[0]);
        } else if (kv.type == GgufType::ARRAY) {
            out.put<int32_t>(int32_t(kv.elem_type));
            out.put<uint64_t>(kv.count);
            if (kv.elem_type == GgufType::STRING)
                for (const std::string &s : kv.strs) out.put_string(s);
            else
                out.write(kv.raw.data(), kv.raw.size());
        } else {
            out.write(kv.raw.data(), kv.raw.size());
        }
    }
    uint64_t offset = 0;
    for (const Tensor &t : tensors) {
        out.put_string(t.name);
        out.put<uint32_t>(uint32_t(t.n_dims));
        for (int d = 0; d < t.n_dims; d++) out.put<int64_t>(t.ne[d]);
        out.put<int32_t>(int32_t(t.type));
        out.put<uint64_t>(offset);
        offset += pad_to(t.n_bytes, alignment);
    }
    out.zeros(size_t(pad_to(out.written, alignment) - out.written));
    std::vector<uint8_t> scratch;
    for (const Tensor &t : tensors) {
        write_tensor_data(out, t, scratch);
        out.zeros(size_t(pad_to(t.n_bytes, alignment) - t.n_bytes));
    }
}

std::vector<uint8_t> GgufWriter::write_to_memory() const {
    MemorySink sink;
    impl_->serialize(sink);
    return std::move(sink.out);
}

void GgufWriter::write(const std::string &path) const {
    // Written beside the target and renamed at the end: a failed or interrupted write never leaves a file that
    // looks complete.
    std::string tmp = path + ".partial";
    try {
        FileSink sink(tmp);
        impl_->serialize(sink);
        sink.close();
    } catch (...) {
        std::remove(tmp.c_str());
        throw;
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        std::remove(tmp.c_str());
        fail("%s: cannot rename %s into place: %s", path.c_str(), tmp.c_str(), std::strerror(err));
    }
}

}  // namespace strata
