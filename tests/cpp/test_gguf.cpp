// GGUF reader and writer: round trips of every value type and several tensor types, the layout rules (alignment,
// offsets, data section), typed access, and one test per kind of malformed file with the message it must give.
#include <gtest/gtest.h>

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "format/gguf.h"
#include "gguf_samples.h"

using namespace strata;
using namespace strata::testing;

namespace {

std::unique_ptr<GgufFile> parse(const std::vector<uint8_t> &b, const char *label = "t.gguf") {
    return GgufFile::from_memory(b.data(), b.size(), label);
}

// The message of the strata::Error that parsing `b` throws; fails the test when it parses.
std::string parse_error(const std::vector<uint8_t> &b) {
    try {
        parse(b);
    } catch (const Error &e) {
        return e.what();
    }
    ADD_FAILURE() << "parsed without error";
    return "";
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << haystack

std::filesystem::path temp_path(const char *name) {
    return std::filesystem::temp_directory_path() / (std::string("strata_test_") + std::to_string(getpid()) + name);
}

}  // namespace

// ---- round trips -----------------------------------------------------------------------------------------------

TEST(GgufRoundTrip, EveryScalarType) {
    auto bytes = sample_every_value().write_to_memory();
    auto f = parse(bytes);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->architecture(), "qwen3moe");
    auto scalar = [&](const char *k, GgufType t) {
        const GgufValue &v = f->get(k);
        EXPECT_EQ(v.type, t) << k;
        return &v;
    };
    EXPECT_EQ(scalar("test.u8", GgufType::U8)->u, 200u);
    EXPECT_EQ(scalar("test.i8", GgufType::I8)->i, -100);
    EXPECT_EQ(scalar("test.u16", GgufType::U16)->u, 60000u);
    EXPECT_EQ(scalar("test.i16", GgufType::I16)->i, -30000);
    EXPECT_EQ(scalar("test.u32", GgufType::U32)->u, 4000000000u);
    EXPECT_EQ(scalar("test.i32", GgufType::I32)->i, -2000000000);
    EXPECT_EQ(scalar("test.u64", GgufType::U64)->u, 18000000000000000000ull);
    EXPECT_EQ(scalar("test.i64", GgufType::I64)->i, -9000000000000000000ll);
    EXPECT_EQ(scalar("test.f32", GgufType::F32)->f, 0.15625);
    EXPECT_EQ(scalar("test.f64", GgufType::F64)->f, -1.0e300);
    EXPECT_TRUE(scalar("test.bool", GgufType::BOOL)->as_bool("test.bool"));
    EXPECT_EQ(scalar("test.string", GgufType::STRING)->str, "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
    EXPECT_EQ(scalar("test.empty_string", GgufType::STRING)->str, "");
    EXPECT_EQ(f->kvs().size(), 27u);
    EXPECT_EQ(f->kvs()[0].key, "general.architecture");  // order is the file's
    EXPECT_EQ(f->kvs()[1].key, "test.u8");
}

TEST(GgufRoundTrip, EveryArrayType) {
    auto bytes = sample_every_value().write_to_memory();
    auto f = parse(bytes);
    auto arr = [&](const char *k, GgufType elem, uint64_t n) {
        const GgufValue &v = f->get(k);
        EXPECT_EQ(v.type, GgufType::ARRAY) << k;
        EXPECT_EQ(v.elem_type, elem) << k;
        EXPECT_EQ(v.count, n) << k;
        return &v;
    };
    EXPECT_EQ(arr("test.arr_u8", GgufType::U8, 3)->as_int_array("k"), (std::vector<int64_t>{0, 1, 255}));
    EXPECT_EQ(arr("test.arr_i8", GgufType::I8, 3)->as_int_array("k"), (std::vector<int64_t>{-128, 0, 127}));
    EXPECT_EQ(arr("test.arr_u16", GgufType::U16, 2)->as_int_array("k"), (std::vector<int64_t>{1, 65535}));
    EXPECT_EQ(arr("test.arr_i16", GgufType::I16, 2)->as_int_array("k"), (std::vector<int64_t>{-32768, 32767}));
    EXPECT_EQ(arr("test.arr_u32", GgufType::U32, 2)->as_int_array("k"), (std::vector<int64_t>{7, 4294967295}));
    EXPECT_EQ(arr("test.arr_i32", GgufType::I32, 4)->as_int_array("k"), (std::vector<int64_t>{11, 11, 10, 0}));
    EXPECT_EQ(arr("test.arr_i64", GgufType::I64, 2)->as_int_array("k"), (std::vector<int64_t>{-(1ll << 62), 5}));
    EXPECT_EQ(arr("test.arr_f32", GgufType::F32, 3)->as_float_array("k"),
              (std::vector<double>{1.5, -2.25, double(1e-30f)}));
    auto f64 = arr("test.arr_f64", GgufType::F64, 2)->as_float_array("k");
    EXPECT_EQ(f64[0], 3.141592653589793);
    EXPECT_TRUE(std::signbit(f64[1]));
    const GgufValue *b = arr("test.arr_bool", GgufType::BOOL, 3);
    EXPECT_EQ(b->array_data[0], 1);
    EXPECT_EQ(b->array_data[1], 0);
    EXPECT_EQ(arr("test.arr_empty", GgufType::F32, 0)->as_float_array("k").size(), 0u);
    EXPECT_EQ(arr("test.arr_str", GgufType::STRING, 4)->as_string_array("k"),
              (std::vector<std::string_view>{"a", "", "\xc4\xa0the", "<|im_end|>"}));
    // u64 element 2^63 does not fit an int64: refused rather than wrapped.
    const GgufValue *u64 = arr("test.arr_u64", GgufType::U64, 1);
    EXPECT_THROW(u64->as_int_array("test.arr_u64"), Error);
    EXPECT_EQ(u64->float_at("k", 0), 9223372036854775808.0);
}

TEST(GgufRoundTrip, TensorsAreZeroCopyViewsWithTheirBytes) {
    auto bytes = sample_every_value().write_to_memory();
    auto f = parse(bytes);
    ASSERT_EQ(f->tensors().size(), 7u);
    struct Want {
        const char *name;
        DType type;
        std::vector<int64_t> ne;
        uint64_t n_bytes;
    } want[] = {
        {"token_embd.weight", DType::F32, {8, 3}, 96},
        {"blk.0.attn_q.weight", DType::F16, {16, 2}, 64},
        {"blk.0.ffn_gate_exps.weight", DType::Q8_0, {64, 2, 2}, 4 * 2 * 34},
        {"blk.0.ffn_down_exps.weight", DType::Q4_K, {256, 1, 2}, 2 * 144},
        {"blk.0.ffn_up_exps.weight", DType::MXFP4, {32, 2, 2, 1}, 4 * 17},
        {"output.weight", DType::BF16, {5}, 10},
        {"blk.0.attn_sinks", DType::I32, {3}, 12},
    };
    EXPECT_EQ(f->data_offset() % 32, 0u);
    for (size_t i = 0; i < 7; i++) {
        const GgufTensor &t = f->tensors()[i];
        EXPECT_EQ(t.name, want[i].name);
        EXPECT_EQ(t.type, want[i].type);
        ASSERT_EQ(t.n_dims, int(want[i].ne.size()));
        for (int d = 0; d < 4; d++) EXPECT_EQ(t.ne[d], d < t.n_dims ? want[i].ne[size_t(d)] : 1);
        EXPECT_EQ(t.n_bytes, want[i].n_bytes) << t.name;
        EXPECT_EQ(t.offset % 32, 0u);
        EXPECT_EQ(t.data, bytes.data() + f->data_offset() + t.offset);  // a view, not a copy
        EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), sample_bytes(i, t.n_bytes)) << t.name;
        EXPECT_EQ(f->find_tensor(t.name), &t);
        EXPECT_EQ(f->tensor_index(t.name), i);
    }
    EXPECT_EQ(f->tensors()[2].shape_str(), "[64, 2, 2]");
    EXPECT_EQ(f->tensors()[2].n_elements(), 256);
    EXPECT_EQ(f->find_tensor("missing"), nullptr);
    EXPECT_EQ(f->data_end(), f->data_offset() + f->tensors()[6].offset + 12);
}

TEST(GgufRoundTrip, CustomAlignmentPlacesDataAndTensors) {
    auto bytes = sample_every_value(256).write_to_memory();
    auto f = parse(bytes);
    EXPECT_EQ(f->alignment(), 256u);
    EXPECT_EQ(f->get("general.alignment").type, GgufType::U32);
    EXPECT_EQ(f->get("general.alignment").u, 256u);
    EXPECT_EQ(f->data_offset() % 256, 0u);
    for (const GgufTensor &t : f->tensors()) EXPECT_EQ(t.offset % 256, 0u) << t.name;
    EXPECT_EQ(f->tensors()[1].offset, 256u);  // 96 bytes padded to 256
    EXPECT_EQ(bytes.size() % 256, 0u);        // the last tensor is padded too
}

TEST(GgufRoundTrip, FileOnDiskMatchesMemoryAndIsMapped) {
    GgufWriter w = sample_every_value();
    auto path = temp_path("roundtrip.gguf");
    w.write(path.string());
    auto mem = w.write_to_memory();
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(disk, mem);
    EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
    auto f = GgufFile::open(path.string());
    EXPECT_EQ(f->path(), path.string());
    EXPECT_EQ(f->file_size(), mem.size());
    EXPECT_EQ(std::vector<uint8_t>(f->bytes(), f->bytes() + f->file_size()), mem);
    EXPECT_EQ(f->tensors()[3].data[5], sample_byte(3, 5));
    f.reset();
    std::filesystem::remove(path);
}

TEST(GgufRoundTrip, CopyingEveryValueThroughAddKvIsExact) {
    auto first = sample_every_value().write_to_memory();
    auto f = parse(first);
    GgufWriter w;
    for (const GgufKV &kv : f->kvs()) w.add_kv(std::string(kv.key), kv.value);
    for (const GgufTensor &t : f->tensors())
        w.add_tensor(std::string(t.name), t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
    EXPECT_EQ(w.write_to_memory(), first);
}

TEST(GgufRoundTrip, ZeroElementTensorsAreAllowedAsInGgml) {
    GgufWriter w;
    w.add_tensor("empty", DType::Q4_K, {0, 8}, nullptr, 0);
    add_sample_tensor(w, 1, "after", DType::F32, {4});
    auto bytes = w.write_to_memory();
    auto f = parse(bytes);
    EXPECT_EQ(f->tensors()[0].n_bytes, 0u);
    EXPECT_EQ(f->tensors()[0].n_elements(), 0);
    EXPECT_EQ(f->tensors()[1].data[0], sample_byte(1, 0));
}

TEST(GgufRoundTrip, NoTensorsNeedsNoPaddingAfterTheMetadata) {
    RawGguf r;
    r.header(0, 1).kv_u32("general.x", 5);  // 41 bytes, no padding, as vocabulary files often end
    auto f = parse(r.b);
    EXPECT_EQ(f->data_offset(), r.b.size());
    EXPECT_EQ(f->get("general.x").u, 5u);
}

// ---- writer: tensors produced at write time ---------------------------------------------------------------------

TEST(GgufWriterFill, LazyAndStreamedTensorsMatchCopiedOnes) {
    // 3 x 2^21 F32 rows of 8 MiB each: a streamed tensor arrives in row-aligned pieces below the chunk size.
    const int64_t ne0 = 1 << 21, ne1 = 3;
    const size_t n = size_t(ne0 * ne1 * 4);
    std::vector<uint8_t> data = sample_bytes(9, n);
    GgufWriter copied, lazy, streamed;
    copied.add_tensor("x", DType::F32, {ne0, ne1}, data.data(), n);
    struct Ctx {
        const std::vector<uint8_t> *src;
        int calls = 0;
    } ctx{&data};
    lazy.add_tensor_lazy(
        "x", DType::F32, {ne0, ne1},
        [](void *c, uint8_t *dst, size_t nb) {
            auto *cx = static_cast<Ctx *>(c);
            cx->calls++;
            std::memcpy(dst, cx->src->data(), nb);
        },
        &ctx);
    std::vector<std::pair<uint64_t, size_t>> pieces;
    streamed.add_tensor_streamed("x", DType::F32, {ne0, ne1}, [&](uint64_t off, uint8_t *dst, size_t nb) {
        pieces.emplace_back(off, nb);
        std::memcpy(dst, data.data() + off, nb);
    });
    auto want = copied.write_to_memory();
    EXPECT_EQ(lazy.write_to_memory(), want);
    EXPECT_EQ(ctx.calls, 1);
    EXPECT_EQ(streamed.write_to_memory(), want);
    ASSERT_EQ(pieces.size(), 2u);  // 8 MiB rows in 16 MiB chunks: two rows, then the last one
    uint64_t next = 0;
    for (auto [off, nb] : pieces) {
        EXPECT_EQ(off, next);
        EXPECT_EQ(nb % (size_t(ne0) * 4), 0u);
        EXPECT_LE(nb, GgufWriter::stream_chunk_bytes());
        next = off + nb;
    }
    EXPECT_EQ(next, n);
}

TEST(GgufWriterFill, AFailedWriteLeavesNoFile) {
    GgufWriter w;
    w.add_tensor_streamed("x", DType::F32, {4}, [](uint64_t, uint8_t *, size_t) { fail("generator broke"); });
    auto path = temp_path("failed.gguf");
    try {
        w.write(path.string());
        ADD_FAILURE() << "write succeeded";
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "generator broke");
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
}

TEST(GgufWriterChecks, RefusesWhatTheReaderWouldRefuse) {
    GgufWriter w;
    w.add_u32("k", 1);
    auto msg = [&](auto f) {
        try {
            f();
        } catch (const Error &e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_HAS(msg([&] { w.add_u32("k", 2); }), "'k' added twice");
    EXPECT_HAS(msg([&] { w.add_bool("", true); }), "key is empty");
    EXPECT_HAS(msg([&] { w.add_string("s", "\xff"); }), "not valid UTF-8");
    EXPECT_HAS(msg([&] { w.add_string_array("sa", {"ok", "\xc0\x80"}); }), "element 1");
    uint8_t two = 2;
    EXPECT_HAS(msg([&] { w.add_array("b", GgufType::BOOL, &two, 1); }), "bool element 0 is 2");
    EXPECT_HAS(msg([&] { w.add_array("s2", GgufType::STRING, nullptr, 0); }), "add_string_array");
    EXPECT_HAS(msg([&] { w.set_alignment(48); }), "alignment 48 is not a power of two");
    EXPECT_HAS(msg([&] { w.add_u32("general.alignment", 0); }), "alignment 0");
    EXPECT_HAS(msg([&] { w.add_u64("general.alignment", 64); }), "must be a u32");
    std::vector<uint8_t> buf(1024);
    EXPECT_HAS(msg([&] { w.add_tensor("t", DType::Q4_K, {128}, buf.data(), 72); }),
               "ne[0] is not a multiple of the Q4_K block size 256");
    EXPECT_HAS(msg([&] { w.add_tensor("t", DType::F32, {4, 2}, buf.data(), 16); }), "needs 32 bytes, got 16");
    EXPECT_HAS(msg([&] { w.add_tensor(std::string(64, 'n'), DType::F32, {1}, buf.data(), 4); }), "shorter than 64");
    EXPECT_HAS(msg([&] { w.add_tensor("t", DType::F32, {1, 1, 1, 1, 1}, buf.data(), 4); }), "5 dimensions");
    EXPECT_HAS(msg([&] { w.add_tensor("t", DType::F32, {-1}, buf.data(), 4); }), "negative or too large");
    w.add_tensor("t", DType::F32, {2}, buf.data(), 8);
    EXPECT_HAS(msg([&] { w.add_tensor("t", DType::F32, {2}, buf.data(), 8); }), "'t' added twice");
    // The refused calls left nothing behind.
    EXPECT_EQ(w.n_kv(), 1u);
    EXPECT_EQ(w.n_tensors(), 1u);
    auto f = parse(w.write_to_memory());
    EXPECT_EQ(f->kvs().size(), 1u);
    EXPECT_EQ(f->alignment(), 32u);
}

TEST(GgufWriterChecks, AlignmentKeyAddedDirectlyDecidesTheLayout) {
    GgufWriter w;
    w.add_u32("general.alignment", 64);
    add_sample_tensor(w, 0, "a", DType::F32, {3});
    add_sample_tensor(w, 1, "b", DType::F32, {3});
    auto bytes = w.write_to_memory();
    auto f = parse(bytes);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->tensors()[1].offset, 64u);
    EXPECT_EQ(f->kvs().size(), 1u);
}

// ---- typed access ----------------------------------------------------------------------------------------------

TEST(GgufValueAccess, ConvertsOnlyWhatFits) {
    auto bytes = sample_every_value().write_to_memory();
    auto f = parse(bytes);
    EXPECT_EQ(f->get("test.u16").as_int("test.u16"), 60000);
    EXPECT_EQ(f->get("test.i8").as_float("test.i8"), -100.0);
    EXPECT_EQ(f->get("test.bool").as_uint("test.bool"), 1u);
    EXPECT_EQ(f->get("test.f32").as_float("test.f32"), 0.15625);
    EXPECT_EQ(f->get("test.arr_i32").int_at("test.arr_i32", 2), 10);
    try {
        f->get("test.i8").as_uint("test.i8");
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "metadata key 'test.i8': expected a value >= 0, found -100");
    }
    try {
        f->get("test.string").as_float("test.string");
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "metadata key 'test.string': expected a number, found string");
    }
    try {
        f->get("test.arr_str").as_int_array("test.arr_str");
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "expected an array of integers, found an array of string");
    }
    EXPECT_THROW(f->get("test.u64").as_int("test.u64"), Error);
    EXPECT_THROW(f->get("test.f32").as_int("test.f32"), Error);
    EXPECT_THROW(f->get("test.u8").as_bool("test.u8"), Error);
    EXPECT_THROW(f->get("test.u8").as_string("test.u8"), Error);
    EXPECT_THROW(f->get("test.arr_f32").as_int_array("test.arr_f32"), Error);
    EXPECT_THROW(f->get("test.arr_i32").int_at("test.arr_i32", 4), Error);
    EXPECT_THROW(f->get("test.arr_i32").as_string_array("test.arr_i32"), Error);
    try {
        f->get("nope");
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "t.gguf: metadata key 'nope' is missing");
    }
    EXPECT_EQ(f->find("nope"), nullptr);
    EXPECT_EQ(f->find_kv("test.u8")->key, "test.u8");
}

// ---- malformed files: one clear message each ------------------------------------------------------------------

TEST(GgufReject, VersionsOtherThanThree) {
    for (uint32_t v : {1u, 2u, 4u, 0u}) {
        RawGguf r;
        r.header(0, 0, v);
        std::string m = parse_error(r.b);
        EXPECT_HAS(m, "t.gguf: version at byte 4");
        EXPECT_HAS(m, strfmt("found GGUF version %u; only version 3 is supported", v));
    }
    RawGguf r;
    r.header(0, 0, 0x03000000);
    EXPECT_HAS(parse_error(r.b), "big-endian");
}

TEST(GgufReject, BadMagicAndEmpty) {
    EXPECT_HAS(parse_error({}), "magic at byte 0: needs 4 bytes but the file ends at byte 0");
    std::vector<uint8_t> ggml = {'g', 'g', 'j', 't', 3, 0, 0, 0};
    EXPECT_HAS(parse_error(ggml), "expected \"GGUF\", found \"ggjt\"");
}

TEST(GgufReject, CountsThatCannotFit) {
    RawGguf r;
    r.header(0, 1000);
    EXPECT_HAS(parse_error(r.b), "metadata key count at byte 16: 1000 metadata keys cannot fit");
    RawGguf t;
    t.header(UINT64_MAX, 0);
    EXPECT_HAS(parse_error(t.b), "tensor count at byte 8");
}

TEST(GgufReject, KeysEmptyDuplicateOrNotUtf8) {
    RawGguf r;
    r.header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2);
    EXPECT_HAS(parse_error(r.b), "metadata key 1 ('a.b') at byte 43: duplicate of metadata key 0");
    RawGguf e;
    e.header(0, 1).kv_u32("", 1);
    EXPECT_HAS(parse_error(e.b), "metadata key 0 ('') at byte 24: key is empty");
    RawGguf u;
    u.header(0, 1).kv_u32("a\xed\xa0\x80", 1);  // a UTF-16 surrogate encoded as UTF-8
    EXPECT_HAS(parse_error(u.b), "metadata key 0 at byte 24: string is not valid UTF-8");
}

TEST(GgufReject, ValueTypesAndArrays) {
    auto kv_raw = [](int32_t type, auto &&body) {
        RawGguf r;
        r.header(0, 1).str("k");
        r.put<int32_t>(type);
        body(r);
        return r.b;
    };
    EXPECT_HAS(parse_error(kv_raw(13, [](RawGguf &r) { r.zeros(8); })),
               "metadata key 0 ('k') type at byte 33: unknown value type 13");
    EXPECT_HAS(parse_error(kv_raw(7, [](RawGguf &r) { r.put<uint8_t>(2); })), "bool must be 0 or 1, found 2");
    EXPECT_HAS(parse_error(kv_raw(8, [](RawGguf &r) { r.put<uint64_t>(1ull << 40); })),
               "metadata key 0 ('k') value at byte 37: string of 1099511627776 bytes is longer than the limit");
    EXPECT_HAS(parse_error(kv_raw(8, [](RawGguf &r) { r.put<uint64_t>(10).put<uint32_t>(0); })),
               "string of 10 bytes runs past the end of the file (size 49)");
    EXPECT_HAS(parse_error(kv_raw(9, [](RawGguf &r) { r.put<int32_t>(9).put<uint64_t>(0); })),
               "element type at byte 37: nested arrays are not allowed");
    EXPECT_HAS(parse_error(kv_raw(9, [](RawGguf &r) { r.put<int32_t>(0).put<uint64_t>((1ull << 30) + 1); })),
               "element count at byte 41: 1073741825 elements is more than the limit of 1073741824");
    EXPECT_HAS(parse_error(kv_raw(9, [](RawGguf &r) { r.put<int32_t>(8).put<uint64_t>(1000).zeros(64); })),
               "1000 elements of string need at least 8000 bytes but only 64 remain");
    EXPECT_HAS(
        parse_error(kv_raw(
            9, [](RawGguf &r) { r.put<int32_t>(7).put<uint64_t>(3).put<uint8_t>(1).put<uint8_t>(0).put<uint8_t>(5); })),
        "element 2 is a bool but holds 5");
    EXPECT_HAS(parse_error(kv_raw(9, [](RawGguf &r) { r.put<int32_t>(8).put<uint64_t>(2).str("ok").str("\x80"); })),
               "metadata key 0 ('k') value element 1 at byte 59: string is not valid UTF-8");
}

TEST(GgufReject, AlignmentKey) {
    RawGguf r;
    r.header(0, 1).kv_u32("general.alignment", 48);
    EXPECT_HAS(parse_error(r.b), "metadata key 0 ('general.alignment') value at byte 53: alignment 48 is not a power");
    RawGguf z;
    z.header(0, 1).kv_u32("general.alignment", 0);
    EXPECT_HAS(parse_error(z.b), "alignment 0 is not a power of two");
    RawGguf t;
    t.header(0, 1).str("general.alignment").put<int32_t>(int32_t(GgufType::U64)).put<uint64_t>(64);
    EXPECT_HAS(parse_error(t.b), "must be a u32, found u64");
}

namespace {

// One tensor info after no metadata; data section at 64 (with `pad_data` bytes of data).
std::vector<uint8_t> one_tensor(std::string_view name, std::vector<int64_t> ne, int32_t type, uint64_t offset,
                                size_t data_bytes) {
    RawGguf r;
    r.header(1, 0).tensor_info(name, std::move(ne), type, offset).pad(32).zeros(data_bytes);
    return r.b;
}

}  // namespace

TEST(GgufReject, TensorTypesRemovedOrUnknownAreNamed) {
    for (int32_t id : {4, 5, 31, 32, 33, 36, 37, 38, 40, -1, 1000}) {
        std::string m = parse_error(one_tensor("w", {32}, id, 0, 1024));
        EXPECT_HAS(m, "tensor info 0 (w) type at byte 45");
        EXPECT_HAS(m, strfmt("ggml type id %d is unknown or was removed from ggml", id));
    }
}

TEST(GgufReject, TensorShapes) {
    EXPECT_HAS(parse_error(one_tensor("w", {}, 0, 0, 64)),
               "tensor info 0 (w) n_dims at byte 33: 0 dimensions; must be 1 to 4");
    EXPECT_HAS(parse_error(one_tensor("w", {1, 1, 1, 1, 1}, 0, 0, 64)), "5 dimensions");
    EXPECT_HAS(parse_error(one_tensor("w", {4, -2}, 0, 0, 64)),
               "tensor info 0 (w) dimension at byte 45: ne[1] = -2 is negative");
    EXPECT_HAS(parse_error(one_tensor("w", {100}, 12, 0, 1024)),
               "Q4_K packs 256 elements per block but ne[0] = 100 is not a multiple of it");
    EXPECT_HAS(parse_error(one_tensor("w", {1ll << 40, 1ll << 40}, 0, 0, 64)), "is too large to address");
    EXPECT_HAS(parse_error(one_tensor("w", {1ll << 31, 1ll << 31, 1ll << 2}, 0, 0, 64)), "is too large to address");
    // A zero dimension after an overflowing prefix: no elements, but multiplying the dims in order overflows
    // (found by the fuzzer).
    EXPECT_HAS(parse_error(one_tensor("w", {64, (1ll << 57) + 2, 0}, 0, 0, 64)), "is too large to address");
}

TEST(GgufReject, TensorNames) {
    std::string long_name(64, 'x');
    EXPECT_HAS(parse_error(one_tensor(long_name, {1}, 0, 0, 64)),
               "name of 64 bytes is too long (must be shorter than 64)");
    EXPECT_HAS(parse_error(one_tensor("", {1}, 0, 0, 64)), "tensor info 0 () name at byte 24: name is empty");
    RawGguf r;
    r.header(2, 0).tensor_info("w", {1}, 0, 0).tensor_info("w", {1}, 0, 32).pad(32).zeros(64);
    EXPECT_HAS(parse_error(r.b), "tensor info 1 (w) name at byte 57: duplicate of tensor info 0");
}

TEST(GgufReject, TensorDataPlacement) {
    // The example from the format notes: data past the end names the tensor, the range and the file size.
    std::string m = parse_error(one_tensor("blk.0.attn_q.weight", {64, 4}, 0, 0, 512));
    EXPECT_HAS(m,
               "t.gguf: tensor info 0 (blk.0.attn_q.weight) offset at byte 75: data [data section + 0, 1024 bytes] "
               "runs past the end of the file (size 608)");
    EXPECT_HAS(parse_error(one_tensor("w", {4}, 0, 8, 64)), "offset 8 is not a multiple of the alignment 32");
    EXPECT_HAS(parse_error(one_tensor("w", {4}, 0, UINT64_MAX - 31, 64)), "runs past the end of the file");
    RawGguf o;
    o.header(2, 0).tensor_info("a", {16}, 0, 0).tensor_info("b", {8}, 0, 32).pad(32).zeros(128);
    EXPECT_HAS(parse_error(o.b),
               "tensor info 1 (b) offset at byte 82: data [file offset 128, 32 bytes] overlaps "
               "tensor info 0 (a) data [file offset 96, 64 bytes]");
    // A zero-byte tensor between them must not hide the overlap.
    RawGguf z;
    z.header(3, 0)
        .tensor_info("a", {16}, 0, 0)
        .tensor_info("z", {0}, 0, 32)
        .tensor_info("b", {8}, 0, 32)
        .pad(32)
        .zeros(128);
    EXPECT_HAS(parse_error(z.b), "tensor info 2 (b) offset");
    // Tensors need not be in offset order, only apart.
    RawGguf ok;
    ok.header(2, 0).tensor_info("a", {8}, 0, 32).tensor_info("b", {8}, 0, 0).pad(32).zeros(64);
    EXPECT_EQ(parse(ok.b)->tensors()[1].offset, 0u);
}

TEST(GgufReject, DataSectionPastTheEnd) {
    RawGguf r;
    r.header(1, 0).tensor_info("w", {0}, 0, 0);  // 57 bytes; padded data section at 64 > size
    EXPECT_HAS(parse_error(r.b),
               "tensor data section at byte 57: padded to the alignment 32 it starts at byte 64, "
               "past the end of the file (size 57)");
}

TEST(GgufOpen, ReportsMissingAndNonRegularFiles) {
    try {
        GgufFile::open("/nonexistent/model.gguf");
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "/nonexistent/model.gguf: cannot open: No such file or directory");
    }
    EXPECT_THROW(GgufFile::open(std::filesystem::temp_directory_path().string()), Error);
    auto empty = temp_path("empty.gguf");
    { std::ofstream(empty.string()); }
    try {
        GgufFile::open(empty.string());
        ADD_FAILURE();
    } catch (const Error &e) {
        EXPECT_HAS(e.what(), "magic at byte 0: needs 4 bytes but the file ends at byte 0");
    }
    std::filesystem::remove(empty);
}

// ---- a real file ------------------------------------------------------------------------------------------------

TEST(GgufRealFile, QwenVocabulary) {
    std::filesystem::path p = std::filesystem::path(STRATA_SHARED_DIR) / "testdata/vocab/ggml-vocab-qwen2.gguf";
    if (!std::filesystem::exists(p)) GTEST_SKIP() << "shared test data not found at " << p;
    auto t0 = std::chrono::steady_clock::now();
    auto f = GgufFile::open(p.string());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("parsed %s (%zu bytes) in %.1f ms\n", p.c_str(), f->file_size(), ms);
    EXPECT_LT(ms, 2000.0);  // generous: this is ~10 ms in a release build
    EXPECT_EQ(f->architecture(), "qwen2");
    EXPECT_EQ(f->tensors().size(), 0u);
    const auto &toks = f->get("tokenizer.ggml.tokens").as_string_array("tokenizer.ggml.tokens");
    EXPECT_EQ(toks.size(), 151936u);
    EXPECT_EQ(toks[0], "!");
    EXPECT_EQ(f->get("tokenizer.ggml.token_type").count, 151936u);
    EXPECT_EQ(f->get("tokenizer.ggml.merges").count, 151387u);
    EXPECT_EQ(f->get("tokenizer.ggml.pre").as_string("p"), "qwen2");
    uint64_t eos = f->get("tokenizer.ggml.eos_token_id").as_uint("eos");
    EXPECT_EQ(toks[eos], "<|endoftext|>");
}
