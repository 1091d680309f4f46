// GGUF v3 reader: maps the file and validates the header, metadata and tensor table before anything is used.
// Values and tensors are views into the mapped bytes (no copies); the only allocations are the tables themselves.
// Every failure throws one strata::Error "FILE: FIELD at byte N: PROBLEM".
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "format/gguf.h"

namespace strata {

struct GgufFile::Index {
    std::unordered_map<std::string_view, uint32_t> keys;
    std::unordered_map<std::string_view, uint32_t> tensors;
};

namespace {

// A name from the file, shortened and made printable for an error message.
std::string shown(std::string_view s) {
    std::string out;
    for (char c : s.substr(0, 80)) out += (uint8_t(c) < 0x20 || c == 0x7f) ? '?' : c;
    if (s.size() > 80) out += "...";
    return out;
}

// Smallest encodings, used to refuse counts that cannot fit in the rest of the file before reserving for them.
constexpr uint64_t k_min_kv_bytes = 8 + 1 + 4 + 1;                   // key length, 1-byte key, type, u8 value
constexpr uint64_t k_min_tensor_info_bytes = 8 + 1 + 4 + 8 + 4 + 8;  // name length, name, n_dims, 1 dim, type, offset

}  // namespace

// Bounds-checked little-endian reads. `What` is a callable returning the field's description; it is only called
// when something is wrong, so the common path builds no strings.
class GgufParser {
  public:
    GgufParser(GgufFile &f) : f_(f), base_(f.base_), size_(f.size_) {}

    void parse();

  private:
    template <class What>
    [[noreturn]] void fail_at(size_t at, const What &what, const std::string &problem) const {
        fail("%s: %s at byte %zu: %s", f_.path_.c_str(), std::string(what()).c_str(), at, problem.c_str());
    }

    template <class What>
    void need(uint64_t n, const What &what) const {
        if (n > size_ - pos_)
            fail_at(pos_, what, strfmt("needs %" PRIu64 " bytes but the file ends at byte %zu", n, size_));
    }

    template <class T, class What>
    T read(const What &what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    template <class What>
    std::string_view read_string(const What &what, uint64_t max_bytes = GGUF_MAX_STRING_BYTES);
    template <class What>
    void read_value(GgufValue &v, GgufType type, const What &what);
    template <class What>
    void read_array(GgufValue &v, const What &what);
    template <class What>
    GgufType read_type(const What &what);

    void parse_header(uint64_t &n_tensors, uint64_t &n_kv);
    void parse_kvs(uint64_t n_kv);
    void check_alignment(size_t kv_index, size_t value_pos);
    void parse_tensor_info(size_t i);
    void check_tensor_data();

    GgufFile &f_;
    const uint8_t *base_;
    size_t size_;
    size_t pos_ = 0;
    std::vector<size_t> offset_pos_;  // where each tensor's offset field is, for messages
};

template <class What>
std::string_view GgufParser::read_string(const What &what, uint64_t max_bytes) {
    size_t at = pos_;
    uint64_t n = read<uint64_t>([&] { return std::string(what()) + " length"; });
    if (n > max_bytes)
        fail_at(at, what, strfmt("string of %" PRIu64 " bytes is longer than the limit of %" PRIu64, n, max_bytes));
    if (n > size_ - pos_)
        fail_at(at, what, strfmt("string of %" PRIu64 " bytes runs past the end of the file (size %zu)", n, size_));
    std::string_view s(reinterpret_cast<const char *>(base_ + pos_), size_t(n));
    if (!gguf_valid_utf8(s)) fail_at(at, what, "string is not valid UTF-8");
    pos_ += size_t(n);
    return s;
}

template <class What>
GgufType GgufParser::read_type(const What &what) {
    size_t at = pos_;
    int32_t t = read<int32_t>(what);
    if (t < 0 || t > int32_t(GgufType::F64)) fail_at(at, what, strfmt("unknown value type %" PRId32, t));
    return GgufType(t);
}

template <class What>
void GgufParser::read_value(GgufValue &v, GgufType type, const What &what) {
    v.type = type;
    size_t at = pos_;
    switch (type) {
        case GgufType::U8:
            v.u = read<uint8_t>(what);
            break;
        case GgufType::I8:
            v.i = read<int8_t>(what);
            break;
        case GgufType::U16:
            v.u = read<uint16_t>(what);
            break;
        case GgufType::I16:
            v.i = read<int16_t>(what);
            break;
        case GgufType::U32:
            v.u = read<uint32_t>(what);
            break;
        case GgufType::I32:
            v.i = read<int32_t>(what);
            break;
        case GgufType::U64:
            v.u = read<uint64_t>(what);
            break;
        case GgufType::I64:
            v.i = read<int64_t>(what);
            break;
        case GgufType::F32:
            v.f = read<float>(what);
            break;
        case GgufType::F64:
            v.f = read<double>(what);
            break;
        case GgufType::BOOL:
            v.u = read<uint8_t>(what);
            if (v.u > 1) fail_at(at, what, strfmt("bool must be 0 or 1, found %" PRIu64, v.u));
            break;
        case GgufType::STRING:
            v.str = read_string(what);
            break;
        case GgufType::ARRAY:
            read_array(v, what);
            break;
    }
}

template <class What>
void GgufParser::read_array(GgufValue &v, const What &what) {
    auto what_type = [&] { return std::string(what()) + " element type"; };
    size_t at = pos_;
    v.elem_type = read_type(what_type);
    if (v.elem_type == GgufType::ARRAY) fail_at(at, what_type, "nested arrays are not allowed");
    at = pos_;
    auto what_count = [&] { return std::string(what()) + " element count"; };
    v.count = read<uint64_t>(what_count);
    if (v.count > GGUF_MAX_ARRAY_ELEMENTS)
        fail_at(at, what_count,
                strfmt("%" PRIu64 " elements is more than the limit of %" PRIu64, v.count, GGUF_MAX_ARRAY_ELEMENTS));
    // Each element takes at least its size (8 for a string's length) in the rest of the file: refuse counts that
    // cannot fit before allocating anything for them. count <= 2^30 and size <= 8, so no overflow.
    size_t elem_bytes = v.elem_type == GgufType::STRING ? 8 : gguf_type_size(v.elem_type);
    if (v.count * elem_bytes > size_ - pos_)
        fail_at(at, what_count,
                strfmt("%" PRIu64 " elements of %s need at least %" PRIu64 " bytes but only %zu remain in the file",
                       v.count, gguf_type_name(v.elem_type), v.count * elem_bytes, size_ - pos_));
    if (v.elem_type != GgufType::STRING) {
        v.array_data = base_ + pos_;
        if (v.elem_type == GgufType::BOOL)
            for (uint64_t k = 0; k < v.count; k++)
                if (v.array_data[k] > 1)
                    fail_at(pos_ + k, what,
                            strfmt("element %" PRIu64 " is a bool but holds %d", k, int(v.array_data[k])));
        pos_ += size_t(v.count * elem_bytes);
        return;
    }
    v.array_strs.reserve(size_t(v.count));
    for (uint64_t k = 0; k < v.count; k++)
        v.array_strs.push_back(read_string([&] { return std::string(what()) + strfmt(" element %" PRIu64, k); }));
}

void GgufParser::parse_header(uint64_t &n_tensors, uint64_t &n_kv) {
    auto what_magic = [] { return "magic"; };
    need(4, what_magic);
    if (std::memcmp(base_, "GGUF", 4) != 0) {
        std::string seen;
        for (int k = 0; k < 4; k++) seen += (base_[k] >= 0x20 && base_[k] < 0x7f) ? char(base_[k]) : '?';
        fail_at(0, what_magic, strfmt("expected \"GGUF\", found \"%s\": not a GGUF file", seen.c_str()));
    }
    pos_ = 4;
    auto what_version = [] { return "version"; };
    uint32_t version = read<uint32_t>(what_version);
    if (version != GGUF_VERSION) {
        if (version != 0 && (version & 0xffff) == 0)
            fail_at(4, what_version,
                    strfmt("found 0x%08" PRIx32 ", which looks like a big-endian file (byte-swapped version %" PRIu32
                           "); only little-endian GGUF version %" PRIu32 " is supported",
                           version, __builtin_bswap32(version), GGUF_VERSION));
        fail_at(4, what_version,
                strfmt("found GGUF version %" PRIu32 "; only version %" PRIu32 " is supported", version, GGUF_VERSION));
    }
    f_.version_ = version;

    auto what_nt = [] { return "tensor count"; };
    auto what_nkv = [] { return "metadata key count"; };
    n_tensors = read<uint64_t>(what_nt);
    n_kv = read<uint64_t>(what_nkv);
    // The counts are checked against what could possibly fit after the header.
    uint64_t rest = size_ - pos_;
    if (n_kv > rest / k_min_kv_bytes)
        fail_at(16, what_nkv,
                strfmt("%" PRIu64 " metadata keys cannot fit in the %" PRIu64 " bytes after the header", n_kv, rest));
    if (n_tensors > rest / k_min_tensor_info_bytes)
        fail_at(
            8, what_nt,
            strfmt("%" PRIu64 " tensor infos cannot fit in the %" PRIu64 " bytes after the header", n_tensors, rest));
}

void GgufParser::parse_kvs(uint64_t n_kv) {
    f_.kvs_.reserve(size_t(n_kv));
    f_.index_->keys.reserve(size_t(n_kv));
    for (size_t i = 0; i < n_kv; i++) {
        size_t key_pos = pos_;
        std::string_view key = read_string([&] { return strfmt("metadata key %zu", i); });
        auto what_key = [&] { return strfmt("metadata key %zu ('%s')", i, shown(key).c_str()); };
        if (key.empty()) fail_at(key_pos, what_key, "key is empty");
        auto [it, inserted] = f_.index_->keys.emplace(key, uint32_t(i));
        if (!inserted) fail_at(key_pos, what_key, strfmt("duplicate of metadata key %" PRIu32, it->second));

        GgufKV kv;
        kv.key = key;
        GgufType type = read_type([&] { return what_key() + " type"; });
        size_t value_pos = pos_;
        read_value(kv.value, type, [&] { return what_key() + " value"; });
        f_.kvs_.push_back(std::move(kv));
        if (key == "general.alignment") check_alignment(i, value_pos);
    }
}

void GgufParser::check_alignment(size_t i, size_t value_pos) {
    const GgufValue &v = f_.kvs_[i].value;
    auto what = [&] { return strfmt("metadata key %zu ('general.alignment') value", i); };
    if (v.type != GgufType::U32)
        fail_at(value_pos, what,
                strfmt("must be a u32, found %s", gguf_type_name(v.type == GgufType::ARRAY ? v.elem_type : v.type)));
    if (v.u == 0 || (v.u & (v.u - 1)) != 0)
        fail_at(value_pos, what, strfmt("alignment %" PRIu64 " is not a power of two", v.u));
    f_.alignment_ = uint32_t(v.u);
}

void GgufParser::parse_tensor_info(size_t i) {
    GgufTensor t;
    size_t name_pos = pos_;
    t.name = read_string([&] { return strfmt("tensor info %zu name", i); }, UINT64_MAX);
    auto what = [&](const char *field) {
        return [&, field] { return strfmt("tensor info %zu (%s) %s", i, shown(t.name).c_str(), field); };
    };
    if (t.name.empty()) fail_at(name_pos, what("name"), "name is empty");
    if (t.name.size() >= GGUF_MAX_NAME)
        fail_at(name_pos, what("name"),
                strfmt("name of %zu bytes is too long (must be shorter than %zu)", t.name.size(), GGUF_MAX_NAME));
    auto [it, inserted] = f_.index_->tensors.emplace(t.name, uint32_t(i));
    if (!inserted) fail_at(name_pos, what("name"), strfmt("duplicate of tensor info %" PRIu32, it->second));

    size_t at = pos_;
    uint32_t n_dims = read<uint32_t>(what("n_dims"));
    if (n_dims < 1 || n_dims > uint32_t(GGUF_MAX_DIMS))
        fail_at(at, what("n_dims"), strfmt("%" PRIu32 " dimensions; must be 1 to %d", n_dims, GGUF_MAX_DIMS));
    t.n_dims = int32_t(n_dims);
    for (uint32_t d = 0; d < n_dims; d++) {
        at = pos_;
        t.ne[d] = read<int64_t>(what("dimension"));
        if (t.ne[d] < 0) fail_at(at, what("dimension"), strfmt("ne[%u] = %" PRId64 " is negative", d, t.ne[d]));
    }

    at = pos_;
    int32_t type_id = read<int32_t>(what("type"));
    const DTypeInfo *info = dtype_info(type_id);
    if (info == nullptr)
        fail_at(at, what("type"), strfmt("ggml type id %" PRId32 " is unknown or was removed from ggml", type_id));
    t.type = info->type;
    if (t.ne[0] % info->block_size != 0)
        fail_at(at, what("type"),
                strfmt("%s packs %d elements per block but ne[0] = %" PRId64 " is not a multiple of it", info->name,
                       info->block_size, t.ne[0]));
    std::optional<uint64_t> bytes = gguf_tensor_bytes(t.type, t.ne, t.n_dims);
    if (!bytes)
        fail_at(at, what("type"), strfmt("shape %s of %s is too large to address", t.shape_str().c_str(), info->name));
    t.n_bytes = *bytes;

    offset_pos_.push_back(pos_);
    t.offset = read<uint64_t>(what("offset"));
    f_.tensors_.push_back(t);
}

// Tensor data: aligned, inside the file, no two tensors sharing bytes.
void GgufParser::check_tensor_data() {
    const std::vector<GgufTensor> &ts = f_.tensors_;
    auto what = [&](size_t i) {
        return [&, i] { return strfmt("tensor info %zu (%s) offset", i, shown(ts[i].name).c_str()); };
    };
    auto range = [&](size_t i) {
        return strfmt("data [file offset %" PRIu64 ", %" PRIu64 " bytes]", f_.data_offset_ + ts[i].offset,
                      ts[i].n_bytes);
    };
    for (size_t i = 0; i < ts.size(); i++) {
        const GgufTensor &t = ts[i];
        if (t.offset % f_.alignment_ != 0)
            fail_at(offset_pos_[i], what(i),
                    strfmt("offset %" PRIu64 " is not a multiple of the alignment %" PRIu32, t.offset, f_.alignment_));
        uint64_t start, end;
        if (__builtin_add_overflow(f_.data_offset_, t.offset, &start) ||
            __builtin_add_overflow(start, t.n_bytes, &end) || end > size_)
            fail_at(offset_pos_[i], what(i),
                    strfmt("data [data section + %" PRIu64 ", %" PRIu64 " bytes] runs past the end of the file "
                           "(size %zu)",
                           t.offset, t.n_bytes, size_));
        f_.tensors_[i].data = base_ + start;
        f_.data_end_ = std::max(f_.data_end_, end);
    }
    // Sorted by offset, each non-empty tensor must start at or after the furthest end seen so far.
    std::vector<uint32_t> order(ts.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = uint32_t(i);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return ts[a].offset != ts[b].offset ? ts[a].offset < ts[b].offset : a < b;
    });
    uint64_t furthest = 0;
    size_t owner = SIZE_MAX;
    for (uint32_t i : order) {
        if (ts[i].n_bytes == 0) continue;
        if (owner != SIZE_MAX && ts[i].offset < furthest)
            fail_at(offset_pos_[i], what(i),
                    strfmt("%s overlaps tensor info %zu (%s) %s", range(i).c_str(), owner,
                           shown(ts[owner].name).c_str(), range(owner).c_str()));
        if (ts[i].offset + ts[i].n_bytes > furthest) {
            furthest = ts[i].offset + ts[i].n_bytes;
            owner = i;
        }
    }
}

void GgufParser::parse() {
    f_.index_ = std::make_unique<GgufFile::Index>();
    uint64_t n_tensors = 0, n_kv = 0;
    parse_header(n_tensors, n_kv);
    parse_kvs(n_kv);

    f_.tensors_.reserve(size_t(n_tensors));
    f_.index_->tensors.reserve(size_t(n_tensors));
    offset_pos_.reserve(size_t(n_tensors));
    for (size_t i = 0; i < n_tensors; i++) parse_tensor_info(i);

    // The data section starts at the next multiple of the alignment. ggml only pads when there are tensors, and
    // files without tensors (vocabularies) often end right after the metadata.
    uint64_t end_of_infos = pos_;
    uint64_t a = f_.alignment_;
    f_.data_offset_ = n_tensors == 0 ? end_of_infos : (end_of_infos + a - 1) / a * a;
    if (f_.data_offset_ > size_)
        fail_at(
            size_t(end_of_infos), [] { return "tensor data section"; },
            strfmt("padded to the alignment %" PRIu64 " it starts at byte %" PRIu64
                   ", past the end of the file (size %zu)",
                   a, f_.data_offset_, size_));
    f_.data_end_ = f_.data_offset_;
    check_tensor_data();
}

// ---- GgufFile --------------------------------------------------------------------------------------------------

std::unique_ptr<GgufFile> GgufFile::open(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = errno;
        ::close(fd);
        fail("%s: not a regular file%s%s", path.c_str(), err ? ": " : "", err ? std::strerror(err) : "");
    }
    std::unique_ptr<GgufFile> f(new GgufFile);
    f->path_ = path;
    f->size_ = size_t(st.st_size);
    if (f->size_ > 0) {
        // Read-only and private: the engine never writes through the map, and pages stay shareable.
        void *m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        int err = errno;
        ::close(fd);
        if (m == MAP_FAILED) fail("%s: cannot map %zu bytes: %s", path.c_str(), f->size_, std::strerror(err));
        f->map_ = m;
        f->map_size_ = f->size_;
        f->base_ = static_cast<const uint8_t *>(m);
    } else {
        ::close(fd);
    }
    GgufParser(*f).parse();
    return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const uint8_t *data, size_t size, std::string label) {
    std::unique_ptr<GgufFile> f(new GgufFile);
    f->path_ = std::move(label);
    f->base_ = data;
    f->size_ = data ? size : 0;
    GgufParser(*f).parse();
    return f;
}

GgufFile::~GgufFile() {
    if (map_ != nullptr) munmap(map_, map_size_);
}

const GgufKV *GgufFile::find_kv(std::string_view key) const {
    auto it = index_->keys.find(key);
    return it == index_->keys.end() ? nullptr : &kvs_[it->second];
}

const GgufValue *GgufFile::find(std::string_view key) const {
    const GgufKV *kv = find_kv(key);
    return kv ? &kv->value : nullptr;
}

const GgufValue &GgufFile::get(std::string_view key) const {
    const GgufValue *v = find(key);
    if (v == nullptr) fail("%s: metadata key '%.*s' is missing", path_.c_str(), int(key.size()), key.data());
    return *v;
}

std::optional<size_t> GgufFile::tensor_index(std::string_view name) const {
    auto it = index_->tensors.find(name);
    if (it == index_->tensors.end()) return std::nullopt;
    return it->second;
}

const GgufTensor *GgufFile::find_tensor(std::string_view name) const {
    std::optional<size_t> i = tensor_index(name);
    return i ? &tensors_[*i] : nullptr;
}

std::string_view GgufFile::architecture() const {
    const GgufValue *v = find("general.architecture");
    return v && v->type == GgufType::STRING ? v->str : std::string_view();
}

}  // namespace strata
