// Malformed GGUF files generated at test time from valid ones: every truncation point, huge counts, lengths,
// dimensions and offsets, unknown or mismatched types, broken UTF-8, bad bools and alignments, and random bit
// flips. Files that are certainly invalid must give one strata::Error naming a field and a byte offset; random
// flips may happen to leave a valid file, which must then satisfy every invariant the reader promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "format/gguf.h"
#include "gguf_samples.h"

using namespace strata;
using namespace strata::testing;

namespace {

constexpr const char *k_label = "corrupt.gguf";

// ---- where the fields of a valid file are (a plain walk, trusting the file) -----------------------------------

enum class Kind {
    Version,
    NTensors,
    NKv,
    KeyLen,
    KeyByte,
    ValueType,
    StrLen,
    StrByte,
    ElemType,
    Count,
    Bool,
    Alignment,
    NameLen,
    NDims,
    Dim,
    TensorType,
    Offset
};

struct Field {
    Kind kind;
    size_t pos;
    int64_t ne0 = 0;  // TensorType: the tensor's ne[0]
};

struct Walker {
    explicit Walker(const std::vector<uint8_t> &bytes) : b(bytes) { walk(); }
    const std::vector<uint8_t> &b;
    size_t p = 0;
    std::vector<Field> out;

    template <class T>
    T get(size_t at) const {
        T v;
        std::memcpy(&v, b.data() + at, sizeof(T));
        return v;
    }
    std::string_view string(Kind len_kind, Kind byte_kind) {
        out.push_back({len_kind, p});
        uint64_t n = get<uint64_t>(p);
        p += 8;
        if (n) out.push_back({byte_kind, p});
        std::string_view s(reinterpret_cast<const char *>(b.data() + p), n);
        p += n;
        return s;
    }
    void value(GgufType t) {
        if (t == GgufType::STRING) {
            string(Kind::StrLen, Kind::StrByte);
        } else if (t == GgufType::ARRAY) {
            out.push_back({Kind::ElemType, p});
            auto elem = GgufType(get<int32_t>(p));
            out.push_back({Kind::Count, p + 4});
            uint64_t n = get<uint64_t>(p + 4);
            p += 12;
            for (uint64_t i = 0; i < n; i++) value(elem);
        } else {
            if (t == GgufType::BOOL) out.push_back({Kind::Bool, p});
            p += gguf_type_size(t);
        }
    }
    void walk() {
        out.push_back({Kind::Version, 4});
        out.push_back({Kind::NTensors, 8});
        out.push_back({Kind::NKv, 16});
        uint64_t n_tensors = get<uint64_t>(8), n_kv = get<uint64_t>(16);
        p = 24;
        for (uint64_t i = 0; i < n_kv; i++) {
            std::string_view key = string(Kind::KeyLen, Kind::KeyByte);
            out.push_back({Kind::ValueType, p});
            auto t = GgufType(get<int32_t>(p));
            p += 4;
            if (key == "general.alignment") out.push_back({Kind::Alignment, p});
            value(t);
        }
        for (uint64_t i = 0; i < n_tensors; i++) {
            string(Kind::NameLen, Kind::KeyByte);
            out.push_back({Kind::NDims, p});
            uint32_t n_dims = get<uint32_t>(p);
            p += 4;
            int64_t ne0 = get<int64_t>(p);
            for (uint32_t d = 0; d < n_dims; d++, p += 8) out.push_back({Kind::Dim, p});
            out.push_back({Kind::TensorType, p, ne0});
            out.push_back({Kind::Offset, p + 4});
            p += 12;
        }
    }
};

// ---- what a parsed file must satisfy, checked independently of the reader ------------------------------------

bool inside(const std::vector<uint8_t> &b, const void *p, uint64_t n) {
    auto *q = static_cast<const uint8_t *>(p);
    return q >= b.data() && q <= b.data() + b.size() && n <= uint64_t(b.data() + b.size() - q);
}

void check_invariants(const GgufFile &f, const std::vector<uint8_t> &b) {
    std::set<std::string_view> keys;
    for (const GgufKV &kv : f.kvs()) {
        ASSERT_FALSE(kv.key.empty());
        ASSERT_TRUE(keys.insert(kv.key).second) << "duplicate key accepted";
        ASSERT_TRUE(inside(b, kv.key.data(), kv.key.size()));
        ASSERT_EQ(f.find(kv.key), &kv.value);
        const GgufValue &v = kv.value;
        if (v.type == GgufType::STRING) {
            ASSERT_TRUE(inside(b, v.str.data(), v.str.size()) && gguf_valid_utf8(v.str));
        }
        if (v.type == GgufType::BOOL) {
            ASSERT_LE(v.u, 1u);
        }
        if (v.type != GgufType::ARRAY) continue;
        ASSERT_NE(v.elem_type, GgufType::ARRAY);
        ASSERT_LE(v.count, GGUF_MAX_ARRAY_ELEMENTS);
        if (v.elem_type == GgufType::STRING) {
            ASSERT_EQ(v.array_strs.size(), v.count);
            for (std::string_view s : v.array_strs) ASSERT_TRUE(inside(b, s.data(), s.size()) && gguf_valid_utf8(s));
        } else if (v.count) {
            ASSERT_TRUE(inside(b, v.array_data, v.count * gguf_type_size(v.elem_type)));
        }
    }
    uint32_t a = f.alignment();
    ASSERT_TRUE(a && (a & (a - 1)) == 0);
    ASSERT_LE(f.data_offset(), b.size());
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    std::set<std::string_view> names;
    for (const GgufTensor &t : f.tensors()) {
        ASSERT_TRUE(names.insert(t.name).second) << "duplicate tensor accepted";
        ASSERT_TRUE(!t.name.empty() && t.name.size() < GGUF_MAX_NAME);
        ASSERT_TRUE(t.n_dims >= 1 && t.n_dims <= 4);
        ASSERT_EQ(gguf_tensor_bytes(t.type, t.ne, t.n_dims), t.n_bytes);
        ASSERT_EQ(t.offset % a, 0u);
        ASSERT_EQ(t.data, b.data() + f.data_offset() + t.offset);
        ASSERT_TRUE(inside(b, t.data, t.n_bytes));
        if (t.n_bytes) ranges.emplace_back(t.offset, t.offset + t.n_bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); i++) ASSERT_LE(ranges[i - 1].second, ranges[i].first) << "overlap accepted";
}

struct Tally {
    size_t rejected = 0, accepted = 0;
};

// A file that is certainly invalid: one strata::Error naming the file, a field and a byte offset.
void expect_rejected(const std::vector<uint8_t> &b, const std::string &what, Tally &tally) {
    try {
        auto f = GgufFile::from_memory(b.data(), b.size(), k_label);
        ADD_FAILURE() << what << ": accepted";
        return;
    } catch (const Error &e) {
        std::string m = e.what();
        EXPECT_EQ(m.rfind(std::string(k_label) + ": ", 0), 0u) << what << ": " << m;
        EXPECT_NE(m.find(" at byte "), std::string::npos) << what << ": " << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": " << m;
    }
    tally.rejected++;
}

// A file that may or may not be valid: never a crash; when accepted, every invariant holds.
void expect_sane(const std::vector<uint8_t> &b, const std::string &what, Tally &tally) {
    std::unique_ptr<GgufFile> f;
    try {
        f = GgufFile::from_memory(b.data(), b.size(), k_label);
    } catch (const Error &e) {
        EXPECT_EQ(std::string(e.what()).rfind(std::string(k_label) + ": ", 0), 0u) << what;
        tally.rejected++;
        return;
    }
    SCOPED_TRACE(what);
    check_invariants(*f, b);
    tally.accepted++;
}

template <class T>
std::vector<uint8_t> with(std::vector<uint8_t> b, size_t pos, T v) {
    std::memcpy(b.data() + pos, &v, sizeof(T));
    return b;
}

struct Sample {
    const char *name;
    std::vector<uint8_t> bytes;
};

std::vector<Sample> samples() {
    return {{"tiny", sample_tiny().write_to_memory()},
            {"every_value", sample_every_value().write_to_memory()},
            {"every_value_aligned_64", sample_every_value(64).write_to_memory()}};
}

}  // namespace

TEST(GgufCorrupt, EveryTruncationFailsUntilTheLastTensorByte) {
    size_t total = 0;
    for (const Sample &s : samples()) {
        auto f = GgufFile::from_memory(s.bytes.data(), s.bytes.size());
        size_t need = size_t(f->data_end());  // the padding after the last tensor is optional
        Tally t;
        for (size_t k = 0; k < s.bytes.size(); k++) {
            std::vector<uint8_t> cut(s.bytes.begin(), s.bytes.begin() + long(k));
            if (k < need)
                expect_rejected(cut, strfmt("%s cut at %zu", s.name, k), t);
            else
                EXPECT_NO_THROW(GgufFile::from_memory(cut.data(), cut.size())) << s.name << " cut at " << k;
        }
        EXPECT_EQ(t.rejected, need);
        total += s.bytes.size();
    }
    EXPECT_GE(total, 2000u);
}

TEST(GgufCorrupt, HugeCountsLengthsDimensionsAndOffsets) {
    Tally t;
    for (const Sample &s : samples()) {
        Walker w(s.bytes);
        const uint64_t huge[] = {UINT64_MAX, 1ull << 63, 1ull << 32, 1ull << 31, s.bytes.size() + 1};
        for (const Field &fd : w.out) {
            bool is_u64 = fd.kind == Kind::NTensors || fd.kind == Kind::NKv || fd.kind == Kind::KeyLen ||
                          fd.kind == Kind::StrLen || fd.kind == Kind::Count || fd.kind == Kind::NameLen ||
                          fd.kind == Kind::Dim || fd.kind == Kind::Offset;
            if (!is_u64) continue;
            for (uint64_t v : huge)
                expect_rejected(with(s.bytes, fd.pos, v),
                                strfmt("%s: field at %zu = %llu", s.name, fd.pos, (unsigned long long)v), t);
        }
    }
    EXPECT_GE(t.rejected, 200u);
}

TEST(GgufCorrupt, WrongTypesVersionsMagicAndValues) {
    Tally t;
    for (const Sample &s : samples()) {
        Walker w(s.bytes);
        for (uint32_t v : {0u, 1u, 2u, 4u, 0x03000000u}) expect_rejected(with(s.bytes, 4, v), "version", t);
        for (size_t k = 0; k < 4; k++) expect_rejected(with(s.bytes, k, uint8_t(s.bytes[k] ^ 0x20)), "magic", t);
        for (const Field &fd : w.out) {
            std::string what = strfmt("%s: field at %zu", s.name, fd.pos);
            switch (fd.kind) {
                case Kind::ValueType:
                    for (int32_t v : {13, -1, 1 << 30})
                        expect_rejected(with(s.bytes, fd.pos, v), what + " value type", t);
                    break;
                case Kind::ElemType:
                    for (int32_t v : {9, 13, -7}) expect_rejected(with(s.bytes, fd.pos, v), what + " element type", t);
                    break;
                case Kind::TensorType:
                    for (int32_t v : {4, 5, 31, 32, 33, 36, 37, 38, 40, -1})
                        expect_rejected(with(s.bytes, fd.pos, v), what + " removed ggml type", t);
                    if (fd.ne0 % 256 != 0)  // a K-quant needs whole 256-element blocks per row
                        expect_rejected(with(s.bytes, fd.pos, int32_t(DType::Q4_K)), what + " Q4_K", t);
                    break;
                case Kind::NDims:
                    for (uint32_t v : {0u, 5u, UINT32_MAX})
                        expect_rejected(with(s.bytes, fd.pos, v), what + " n_dims", t);
                    break;
                case Kind::Bool:
                    for (uint8_t v : {2, 0x80, 0xff}) expect_rejected(with(s.bytes, fd.pos, v), what + " bool", t);
                    break;
                case Kind::Alignment:
                    for (uint32_t v : {0u, 3u, 48u, 0x80000001u})
                        expect_rejected(with(s.bytes, fd.pos, v), what + " alignment", t);
                    break;
                case Kind::KeyByte:
                case Kind::StrByte:
                    // 0xff never occurs in UTF-8; 0x80 cannot start a character.
                    for (uint8_t v : {0xff, 0x80, 0xc0}) expect_rejected(with(s.bytes, fd.pos, v), what + " UTF-8", t);
                    break;
                default:
                    break;
            }
        }
    }
    EXPECT_GE(t.rejected, 200u);
}

TEST(GgufCorrupt, DuplicateKeysAndTensorNames) {
    Tally t;
    std::vector<uint8_t> b = sample_every_value().write_to_memory();
    // Respell one name as another of the same length.
    auto rename = [&](std::string_view from, std::string_view to) {
        auto it = std::search(b.begin(), b.end(), from.begin(), from.end());
        EXPECT_NE(it, b.end());
        std::vector<uint8_t> c = b;
        std::copy(to.begin(), to.end(), c.begin() + (it - b.begin()));
        return c;
    };
    expect_rejected(rename("test.u16", "test.i16"), "duplicate key", t);
    expect_rejected(rename("blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight"), "duplicate tensor", t);
    EXPECT_EQ(t.rejected, 2u);
    // Distinct names stay distinct even when one is a prefix of the other up to a NUL.
    expect_sane(rename("test.u16", std::string_view("test.u8\0", 8)), "key with a NUL", t);
    EXPECT_EQ(t.accepted, 1u);
}

TEST(GgufCorrupt, RandomBitFlipsAndByteWrites) {
    Tally t;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    auto next = [&] {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    };
    for (const Sample &s : samples()) {
        auto f = GgufFile::from_memory(s.bytes.data(), s.bytes.size());
        size_t header = size_t(f->data_offset());  // flips in tensor data change nothing the reader checks
        for (int round = 0; round < 1500; round++) {
            std::vector<uint8_t> b = s.bytes;
            int n = 1 + int(next() % 3);
            for (int k = 0; k < n; k++) {
                size_t pos = size_t(next() % header);
                if (next() & 1)
                    b[pos] ^= uint8_t(1u << (next() % 8));
                else
                    b[pos] = uint8_t(next());
            }
            expect_sane(b, strfmt("%s round %d", s.name, round), t);
        }
    }
    // Most damage is caught; some (a flipped letter in a key, a different valid number) is a valid file.
    EXPECT_GT(t.rejected, t.accepted);
    EXPECT_GT(t.accepted, 0u);
    std::printf("random mutations: %zu rejected, %zu still valid\n", t.rejected, t.accepted);
}
