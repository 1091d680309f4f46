// Test-only driver of the reference (de)quantizers for the Python cross-checks: raw little-endian files in and out.
//   quant_io dequant TYPE in.bin out.f32   blocks of TYPE -> f32 values (one row: the whole file)
//   quant_io quant TYPE in.f32 out.bin     f32 values -> blocks of TYPE
//   quant_io speed TYPE [n]                quantize n Gaussian values (default 2^20), report MB/s of f32 input per
//                                          second of this process's CPU time (steadier than wall time on a busy box)
// Exit status: 0 on success, 1 on bad input (the message names the file or type), 2 on bad usage.
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/dtype.h"
#include "format/quant.h"

using namespace strata;

namespace {

std::vector<uint8_t> read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot open %s for reading", path.c_str());
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return data;
}

void write_file(const std::string &path, const void *data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    if (!f) fail("cannot open %s for writing", path.c_str());
    f.write(static_cast<const char *>(data), std::streamsize(bytes));
    if (!f) fail("cannot write %s", path.c_str());
}

DType parse_type(const std::string &name) {
    auto t = dtype_from_name(name);
    if (!t) fail("unknown type %s", name.c_str());
    return *t;
}

int cmd_dequant(DType t, const std::string &in, const std::string &out) {
    if (!can_dequantize(t)) fail("no dequantizer for %s", dtype_name(t));
    const std::vector<uint8_t> data = read_file(in);
    const DTypeInfo &info = dtype_info(t);
    if (data.size() % size_t(info.block_bytes) != 0)
        fail("%s: %zu bytes is not a whole number of %d-byte %s blocks", in.c_str(), data.size(), info.block_bytes,
             info.name);
    const int64_t n = int64_t(data.size() / size_t(info.block_bytes)) * info.block_size;
    std::vector<float> values(static_cast<size_t>(n));
    dequantize_row(t, data.data(), values.data(), n);
    write_file(out, values.data(), values.size() * sizeof(float));
    return 0;
}

int cmd_quant(DType t, const std::string &in, const std::string &out) {
    if (!can_quantize(t)) fail("no quantizer for %s", dtype_name(t));
    const std::vector<uint8_t> data = read_file(in);
    if (data.size() % 4 != 0) fail("%s: %zu bytes is not a whole number of f32 values", in.c_str(), data.size());
    const int64_t n = int64_t(data.size() / 4);
    const DTypeInfo &info = dtype_info(t);
    if (n % info.block_size != 0)
        fail("%s: %lld values is not a whole number of %d-element %s blocks", in.c_str(), (long long)n, info.block_size,
             info.name);
    std::vector<float> values(static_cast<size_t>(n));
    std::memcpy(values.data(), data.data(), data.size());
    std::vector<uint8_t> blocks(row_bytes(t, n));
    quantize_row(t, values.data(), blocks.data(), n);
    write_file(out, blocks.data(), blocks.size());
    return 0;
}

double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

int cmd_speed(DType t, int64_t n) {
    if (!can_quantize(t)) fail("no quantizer for %s", dtype_name(t));
    const int64_t bs = dtype_info(t).block_size;
    n = (n + bs - 1) / bs * bs;
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float &v : x) v = normal(rng);
    std::vector<uint8_t> q(row_bytes(t, n));
    std::vector<float> y(static_cast<size_t>(n));
    const double t0 = cpu_seconds();
    quantize_row(t, x.data(), q.data(), n);
    const double t1 = cpu_seconds();
    dequantize_row(t, q.data(), y.data(), n);
    const double t2 = cpu_seconds();
    const double qs = t1 - t0, ds = t2 - t1;
    std::printf("%-8s quantize %8.2f MB/s   dequantize %8.1f MB/s   (of f32, %lld values, one thread, CPU time)\n",
                dtype_name(t), double(n) * 4 / qs / 1e6, double(n) * 4 / ds / 1e6, (long long)n);
    return 0;
}

int usage() {
    std::fprintf(stderr,
                 "usage: quant_io dequant TYPE in.bin out.f32\n"
                 "       quant_io quant TYPE in.f32 out.bin\n"
                 "       quant_io speed TYPE [n]\n");
    return 2;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    const std::string cmd = argv[1];
    try {
        const DType t = parse_type(argv[2]);
        if (cmd == "dequant" && argc == 5) return cmd_dequant(t, argv[3], argv[4]);
        if (cmd == "quant" && argc == 5) return cmd_quant(t, argv[3], argv[4]);
        if (cmd == "speed" && (argc == 3 || argc == 4)) return cmd_speed(t, argc == 4 ? std::stoll(argv[3]) : 1 << 20);
        return usage();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "quant_io: %s\n", e.what());
        return 1;
    }
}
