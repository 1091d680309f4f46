// Benchmark of the CPU matmul per weight type and instruction-set level against cpu_matmul_reference: time, weight
// GB/s (bytes of the weight matrix streamed per call, next to the machine's streaming-read peak, measured first) and
// tokens/s, for decode- and prefill-shaped calls. Not a test and not run in CI; correctness is
// tests/cpp/test_vec_dot.cpp's job.
//
//   build/bin/bench_matmul [--types Q4_K,Q8_0,...] [--shapes expert,lmhead,prefill] [--threads N] [--reps N]
//                          [--no-reference] [--cpu-time]
//
// Shapes: expert = 1 token x K 2048 x N 768 (one MoE expert's gate/up at decode), lmhead = 1 x 2048 x 151936,
// prefill = 512 x 2048 x 768. Each configuration runs --reps times (default 5; the reference at most 3) after one
// warm-up; the best wall time and the best process CPU time are reported. GB/s, tok/s and the speedup over the
// reference come from the best wall time, or with --cpu-time from the best CPU time / threads: on a shared machine
// that is the measure that ignores time the threads spent descheduled (exact with --threads 1). Weights: 16
// distinct rows from the reference quantizer on Gaussian values, repeated to N rows (realistic bytes, and building
// them stays fast for every type).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_dot.h"
#include "core/error.h"
#include "format/quant.h"

using namespace strata;

namespace {

struct Shape {
    const char *name;
    int64_t T, K, N;
};

const Shape k_shapes[] = {{"expert", 1, 2048, 768}, {"lmhead", 1, 2048, 151936}, {"prefill", 512, 2048, 768}};

const DType k_default_types[] = {
    DType::F32,    DType::F16,    DType::BF16,   DType::Q8_0,    DType::Q4_0,   DType::Q4_1,    DType::Q5_0,
    DType::Q5_1,   DType::IQ4_NL, DType::MXFP4,  DType::Q2_K,    DType::Q3_K,   DType::Q4_K,    DType::Q5_K,
    DType::Q6_K,   DType::IQ4_XS, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,  DType::IQ3_XXS, DType::IQ3_S,
    DType::IQ1_S,  DType::IQ1_M,  DType::TQ1_0,  DType::TQ2_0,
};

double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timing {
    double wall = 1e30, cpu = 1e30;  // best of each, seconds
};

template <class Fn>
Timing best_of(int reps, Fn fn) {
    fn();  // warm-up: page faults, pool start, caches
    Timing best;
    for (int r = 0; r < reps; r++) {
        const double c0 = cpu_seconds(), w0 = wall_seconds();
        fn();
        best.wall = std::min(best.wall, wall_seconds() - w0);
        best.cpu = std::min(best.cpu, cpu_seconds() - c0);
    }
    return best;
}

// Streaming-read bandwidth of this machine with the pool's threads (sum of a 512 MiB buffer, best of 3): the
// ceiling for decode-shaped calls whose weights do not fit in cache.
double read_peak_gbs(ThreadPool &pool) {
    const size_t n = size_t(512) << 17;  // uint64 words: 512 MiB
    std::vector<uint64_t> buf(n, 1);
    std::vector<uint64_t> sums(size_t(pool.size()) * 8);
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        const double t0 = wall_seconds();
        pool.run([&](int ith, int nth) {
            const size_t b = n * size_t(ith) / size_t(nth), e = n * size_t(ith + 1) / size_t(nth);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = b; i + 4 <= e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
            sums[size_t(ith) * 8] = s0 + s1 + s2 + s3;
        });
        if (rep > 0) best = std::min(best, wall_seconds() - t0);  // the first pass faults the pages in
    }
    uint64_t total = 0;
    for (uint64_t v : sums) total += v;
    if (total == 0) std::printf("(unexpected zero sum)\n");
    return double(n * 8) * 1e-9 / best;
}

std::vector<DType> parse_types(const std::string &list) {
    std::vector<DType> out;
    size_t pos = 0;
    while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const std::string name = list.substr(pos, comma - pos);
        const auto t = dtype_from_name(name);
        if (!t) fail("--types: unknown type '%s'", name.c_str());
        out.push_back(*t);
        pos = comma + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        std::vector<DType> types(std::begin(k_default_types), std::end(k_default_types));
        std::string shapes = "expert,lmhead,prefill";
        int threads = 0, reps = 5;
        bool reference = true, by_cpu = false;
        for (int i = 1; i < argc; i++) {
            const std::string a = argv[i];
            auto next = [&]() -> std::string {
                if (i + 1 >= argc) fail("%s needs a value", a.c_str());
                return argv[++i];
            };
            if (a == "--types")
                types = parse_types(next());
            else if (a == "--shapes")
                shapes = next();
            else if (a == "--threads")
                threads = std::stoi(next());
            else if (a == "--reps")
                reps = std::max(1, std::stoi(next()));
            else if (a == "--no-reference")
                reference = false;
            else if (a == "--cpu-time")
                by_cpu = true;
            else
                fail("unknown argument '%s' (see the top of tests/tools/bench_matmul.cpp)", a.c_str());
        }
        ThreadPool pool(threads);
        std::printf("threads %d, CPU levels up to %s, reps %d; rates from the best %s\n", pool.size(),
                    cpu_isa_name(cpu_isa_supported()), reps, by_cpu ? "CPU time / threads" : "wall time");
        std::printf("memory read peak: %.1f GB/s\n", read_peak_gbs(pool));
        std::printf("%-8s %-8s %-9s %10s %9s %9s %10s %8s\n", "type", "shape", "level", "wall_ms", "cpu_ms", "GB/s",
                    "tok/s", "speedup");

        for (const Shape &s : k_shapes) {
            if (shapes.find(s.name) == std::string::npos) continue;
            std::vector<float> x(size_t(s.T * s.K));
            std::mt19937_64 rng(5);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (float &v : x) v = nd(rng);
            std::vector<float> y(size_t(s.T * s.N));
            for (DType t : types) {
                const size_t rb = row_bytes(t, s.K);
                std::vector<uint8_t> wbytes(rb * size_t(s.N));
                const int64_t distinct = 16;
                for (int64_t r = 0; r < distinct; r++) {
                    std::vector<float> wf(size_t(s.K));
                    for (float &v : wf) v = 0.05f * nd(rng);
                    quantize_row(t, wf.data(), wbytes.data() + size_t(r) * rb, s.K);
                }
                for (int64_t r = distinct; r < s.N; r++)
                    std::memcpy(wbytes.data() + size_t(r) * rb, wbytes.data() + size_t(r % distinct) * rb, rb);
                Weight w;
                w.name = "bench";
                w.type = t;
                w.ne[0] = s.K, w.ne[1] = s.N, w.ne[2] = 1;
                w.host = wbytes.data();
                w.row_bytes = rb;
                w.expert_stride = rb * size_t(s.N);
                const Act xa{x.data(), s.T, s.K, s.K}, ya{y.data(), s.T, s.N, s.N};
                const double gbytes = double(w.matrix_bytes()) * 1e-9;

                double ref_time = 0;
                auto report = [&](const char *level, const Timing &tm) {
                    const double time = by_cpu ? tm.cpu / pool.size() : tm.wall;
                    std::printf("%-8s %-8s %-9s %10.3f %9.3f %9.2f %10.1f", dtype_name(t), s.name, level,
                                tm.wall * 1e3, tm.cpu * 1e3, gbytes / time, double(s.T) / time);
                    if (ref_time > 0)
                        std::printf(" %7.1fx\n", ref_time / time);
                    else
                        std::printf(" %8s\n", "-");
                    std::fflush(stdout);
                    return time;
                };
                if (reference)
                    ref_time = report("reference",
                                      best_of(std::min(reps, 3), [&] { cpu_matmul_reference(pool, w, xa, ya); }));
                for (int l = 0; l <= int(cpu_isa_supported()); l++) {
                    const CpuIsa isa = CpuIsa(l);
                    if (isa != CpuIsa::scalar && !vec_dot_has_kernel(t, isa)) continue;  // same as the level below
                    report(cpu_isa_name(isa), best_of(reps, [&] { cpu_matmul_isa(pool, w, xa, ya, isa); }));
                }
            }
        }
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "bench_matmul: %s\n", e.what());
        return 1;
    }
}
