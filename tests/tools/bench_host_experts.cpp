// Benchmark of HostExperts::run (backend/host/host_experts.h) as decoding calls it: many small calls, one per MoE
// layer, with the caller away (waiting for the GPU) between them. Not a test and not run in CI; the bits are
// tests/cpp/test_host_experts.cpp's job (checked here once per thread count all the same).
//
//   build/bin/bench_host_experts [--threads 1,2,4,8,12,16] [--calls 1000] [--gap-us 50] [--gap sleep|spin]
//                                [--jobs 1] [--rows 1] [--experts 48] [--type Q4_K] [--down-type T]
//                                [--dim 2048] [--ff 768]
//
// Each call runs --jobs experts of --rows input rows each (gate/up dim -> ff, down ff -> dim), taken in turn from
// --experts distinct copies of the weights (48 of the 30B's, 2.6 MB each: more than a last-level cache, as 48
// layers are), then the caller sleeps (or spins) --gap-us. Reported per thread count (the pool's, at most the
// machine's threads, and the ones a call takes, HostExperts::threads_for): microseconds per call (mean, median, 90th
// and 99th percentile, best) and the expert bytes read per call over the median as GB/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/host/host_experts.h"
#include "core/error.h"
#include "format/quant.h"

using namespace strata;

namespace {

std::vector<int> parse_ints(const std::string &s) {
    std::vector<int> out;
    size_t at = 0;
    while (at <= s.size()) {
        const size_t comma = std::min(s.find(',', at), s.size());
        out.push_back(std::stoi(s.substr(at, comma - at)));
        at = comma + 1;
    }
    return out;
}

DType parse_type(const std::string &s) {
    const auto t = dtype_from_name(s);
    if (!t) fail("unknown type '%s'", s.c_str());
    return *t;
}

struct Expert {
    std::vector<uint8_t> bytes[3];
    HostMatrix m[3];
};

// One expert of Gaussian weights from the reference quantizer; the others are copies of its bytes (the same speed,
// and building them stays fast).
std::vector<Expert> make_experts(int n, DType gu, DType dn, int64_t dim, int64_t ff) {
    std::vector<Expert> ex(static_cast<size_t>(n));
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    const DType types[3] = {gu, gu, dn};
    const int64_t ks[3] = {dim, dim, ff}, ns[3] = {ff, ff, dim};
    for (int i = 0; i < 3; i++) {
        const size_t rb = row_bytes(types[i], ks[i]);
        std::vector<uint8_t> &b = ex[0].bytes[i];
        b.resize(rb * size_t(ns[i]));
        std::vector<float> f(static_cast<size_t>(ks[i]));
        for (int64_t r = 0; r < ns[i]; r++) {
            for (float &v : f) v = nd(rng);
            quantize_row(types[i], f.data(), b.data() + size_t(r) * rb, ks[i]);
        }
        for (int e = 1; e < n; e++) ex[size_t(e)].bytes[i] = b;
        for (Expert &x : ex) x.m[i] = {types[i], x.bytes[i].data(), rb, ks[i], ns[i]};
    }
    return ex;
}

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

}  // namespace

int main(int argc, char **argv) {
    try {
        std::vector<int> thread_counts = {1, 2, 4, 8, 12, 16};
        int calls = 1000, gap_us = 50, n_jobs = 1, n_experts = 48;
        int64_t rows = 1, dim = 2048, ff = 768;
        bool gap_spin = false;
        DType gu = DType::Q4_K;
        std::optional<DType> dn;
        for (int i = 1; i < argc; i++) {
            const std::string a = argv[i];
            auto next = [&]() -> std::string {
                if (i + 1 >= argc) fail("%s needs a value", a.c_str());
                return argv[++i];
            };
            if (a == "--threads")
                thread_counts = parse_ints(next());
            else if (a == "--calls")
                calls = std::max(1, std::stoi(next()));
            else if (a == "--gap-us")
                gap_us = std::max(0, std::stoi(next()));
            else if (a == "--gap") {
                const std::string g = next();
                if (g != "sleep" && g != "spin") fail("--gap takes sleep or spin, not '%s'", g.c_str());
                gap_spin = g == "spin";
            } else if (a == "--jobs")
                n_jobs = std::max(1, std::stoi(next()));
            else if (a == "--rows")
                rows = std::max(1, std::stoi(next()));
            else if (a == "--experts")
                n_experts = std::max(1, std::stoi(next()));
            else if (a == "--type")
                gu = parse_type(next());
            else if (a == "--down-type")
                dn = parse_type(next());
            else if (a == "--dim")
                dim = std::stoll(next());
            else if (a == "--ff")
                ff = std::stoll(next());
            else
                fail("unknown argument '%s' (see the top of tests/tools/bench_host_experts.cpp)", a.c_str());
        }
        n_experts = std::max(n_experts, n_jobs);
        const std::vector<Expert> ex = make_experts(n_experts, gu, dn.value_or(gu), dim, ff);
        const double call_bytes =
            double(n_jobs) * double(ex[0].bytes[0].size() + ex[0].bytes[1].size() + ex[0].bytes[2].size());

        std::vector<float> x(static_cast<size_t>(n_jobs * rows * dim)), y(x.size()), want(x.size());
        std::mt19937 rng(9);
        std::normal_distribution<float> nd;
        for (float &v : x) v = nd(rng);
        for (int64_t r = 0; r < n_jobs * rows; r++)
            expert_ffn_host(ex[0].m[0], ex[0].m[1], ex[0].m[2], x.data() + r * dim, want.data() + r * dim);

        std::printf(
            "%d calls of %d job(s) x %lld row(s), %s/%s %lldx%lld, %.2f MB of weights a call, %d experts in "
            "turn, %s %d us between calls\n",
            calls, n_jobs, (long long)rows, dtype_name(gu), dtype_name(dn.value_or(gu)), (long long)dim, (long long)ff,
            call_bytes * 1e-6, n_experts, gap_spin ? "spinning" : "sleeping", gap_us);
        const MmvqHostTiming ft = mmvq_host_timing();
        std::printf(
            "mat-vec form %s (256 Q4_K rows of 2048 in cache: AVX2 %.1f us, AVX-512 %.1f us; STRATA_CPU_ISA caps "
            "it)\n",
            cpu_isa_name(mmvq_host_form()), ft.avx2_us, ft.avx512_us);
        std::printf("%7s %5s %9s %9s %9s %9s %9s %8s\n", "threads", "used", "mean_us", "p50_us", "p90_us", "p99_us",
                    "best_us", "GB/s");
        for (int t : thread_counts) {
            HostExperts pool(t);
            std::vector<double> us(static_cast<size_t>(calls));
            int used = 0;
            for (int c = -1; c < calls; c++) {  // call -1: a warm-up, checked against expert_ffn_host
                std::vector<HostExpertJob> jobs;
                for (int j = 0; j < n_jobs; j++) {
                    const Expert &e = ex[size_t((std::max(c, 0) * n_jobs + j) % n_experts)];
                    jobs.push_back(
                        {e.m[0], e.m[1], e.m[2], x.data() + j * rows * dim, y.data() + j * rows * dim, rows});
                }
                used = pool.threads_for(jobs);
                const auto t0 = std::chrono::steady_clock::now();
                pool.run(jobs);
                const auto t1 = std::chrono::steady_clock::now();
                if (c < 0) {
                    if (std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) != 0)
                        fail("%d threads: the outputs differ from expert_ffn_host's", t);
                } else {
                    us[size_t(c)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
                }
                if (gap_spin) {
                    while (std::chrono::steady_clock::now() - t1 < std::chrono::microseconds(gap_us)) {
                    }
                } else if (gap_us > 0) {
                    std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
                }
            }
            double sum = 0.0;
            for (double v : us) sum += v;
            const double p50 = percentile(us, 0.5);
            std::printf("%7d %5d %9.1f %9.1f %9.1f %9.1f %9.1f %8.2f\n", pool.threads(), used, sum / double(calls), p50,
                        percentile(us, 0.9), percentile(us, 0.99), percentile(us, 0.0), call_bytes / p50 * 1e-3);
            std::fflush(stdout);
        }
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "bench_host_experts: %s\n", e.what());
        return 1;
    }
}
