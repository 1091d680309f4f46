// Test-only bridge for the Python cross-checks against the gguf package:
//   gguf_tool write-sample OUT.gguf [ALIGNMENT]   write tests/cpp/gguf_samples.h's every-value file with our writer
//   gguf_tool dump FILE.gguf                      print everything our reader parsed as one JSON document
// Tensor bytes are dumped as hex: the files involved are tiny.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "../cpp/gguf_samples.h"
#include "core/error.h"
#include "format/gguf.h"

using namespace strata;
using json = nlohmann::ordered_json;

namespace {

json scalar_json(const GgufValue &v) {
    switch (v.type) {
        case GgufType::U8:
        case GgufType::U16:
        case GgufType::U32:
        case GgufType::U64:
            return v.u;
        case GgufType::I8:
        case GgufType::I16:
        case GgufType::I32:
        case GgufType::I64:
            return v.i;
        case GgufType::F32:
        case GgufType::F64:
            return v.f;
        case GgufType::BOOL:
            return v.u != 0;
        case GgufType::STRING:
            return std::string(v.str);
        case GgufType::ARRAY:
            break;
    }
    STRATA_ASSERT(false);
    return nullptr;
}

json value_json(std::string_view key, const GgufValue &v) {
    if (v.type != GgufType::ARRAY) return scalar_json(v);
    json out = json::array();
    if (v.elem_type == GgufType::STRING) {
        for (std::string_view s : v.array_strs) out.push_back(std::string(s));
    } else if (v.elem_type == GgufType::BOOL) {
        for (uint64_t i = 0; i < v.count; i++) out.push_back(v.array_data[i] != 0);
    } else if (v.elem_type == GgufType::F32 || v.elem_type == GgufType::F64) {
        for (uint64_t i = 0; i < v.count; i++) out.push_back(v.float_at(key, i));
    } else if (v.elem_type == GgufType::U64) {
        for (uint64_t i = 0; i < v.count; i++) {
            uint64_t x;
            std::memcpy(&x, v.array_data + 8 * i, 8);
            out.push_back(x);
        }
    } else {
        for (uint64_t i = 0; i < v.count; i++) out.push_back(v.int_at(key, i));
    }
    return out;
}

std::string hex(const uint8_t *p, uint64_t n) {
    static const char *d = "0123456789abcdef";
    std::string s;
    s.reserve(size_t(2 * n));
    for (uint64_t i = 0; i < n; i++) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}

int dump(const char *path) {
    auto f = GgufFile::open(path);
    json out;
    out["version"] = f->version();
    out["alignment"] = f->alignment();
    out["data_offset"] = f->data_offset();
    json kvs = json::array();
    for (const GgufKV &kv : f->kvs()) {
        json j;
        j["key"] = std::string(kv.key);
        j["type"] = gguf_type_name(kv.value.type);
        if (kv.value.type == GgufType::ARRAY) j["elem_type"] = gguf_type_name(kv.value.elem_type);
        j["value"] = value_json(kv.key, kv.value);
        kvs.push_back(std::move(j));
    }
    out["kvs"] = std::move(kvs);
    json ts = json::array();
    for (const GgufTensor &t : f->tensors()) {
        json j;
        j["name"] = std::string(t.name);
        j["type"] = dtype_name(t.type);
        j["type_id"] = int(t.type);
        j["shape"] = std::vector<int64_t>(t.ne, t.ne + t.n_dims);
        j["offset"] = t.offset;
        j["n_bytes"] = t.n_bytes;
        j["data"] = hex(t.data, t.n_bytes);
        ts.push_back(std::move(j));
    }
    out["tensors"] = std::move(ts);
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        std::string cmd = argc > 1 ? argv[1] : "";
        if (cmd == "write-sample" && (argc == 3 || argc == 4)) {
            uint32_t alignment = argc == 4 ? uint32_t(std::strtoul(argv[3], nullptr, 10)) : 32;
            testing::sample_every_value(alignment).write(argv[2]);
            return 0;
        }
        if (cmd == "dump" && argc == 3) return dump(argv[2]);
        std::fprintf(stderr, "usage: gguf_tool write-sample OUT.gguf [ALIGNMENT] | dump FILE.gguf\n");
        return 2;
    } catch (const Error &e) {
        std::fprintf(stderr, "gguf_tool: error: %s\n", e.what());
        return 1;
    }
}
