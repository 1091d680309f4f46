// A timeline of every kernel and copy a CUDA process runs, for machines without Nsight Systems: a CUDA injection
// library (the driver loads it at the first CUDA call when CUDA_INJECTION64_PATH names it) that turns on CUPTI's
// activity records for kernels (graph replays included) and memory copies, and writes them at exit as CSV to
// $STRATA_KERNEL_TRACE (default kernel_trace.csv):
//   kind,name,start_ns,end_ns,stream,graph
// kind is "kernel" or "copy" (name: HtoD, DtoH, DtoD, ...), times are the GPU's clock in ns, graph the graph id
// (0 when not launched from one). Build: tools/profile/build_kernel_trace.sh. Summary: tools/profile/timeline.py.
//   CUDA_INJECTION64_PATH=$PWD/kernel_trace.so STRATA_KERNEL_TRACE=s.csv strata bench -m F -p 1 -n 32 -r 1
//
// Protocol: CUPTI calls buffer_requested on its own threads for empty buffers and buffer_completed with full ones;
// completed records are formatted into one string under a mutex, and the file is written once, at exit, after the
// last buffers are flushed.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr size_t k_buffer_bytes = size_t(8) << 20;

std::mutex g_mu;
std::string g_out;
bool g_started = false;

const char *copy_kind(uint8_t k) {
    switch (k) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
        default: return "other";
    }
}

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, k_buffer_bytes));
    *size = *buffer ? k_buffer_bytes : 0;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    std::string lines;
    CUpti_Activity *rec = nullptr;
    char line[1024];
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(rec);
            std::string name = k->name ? k->name : "?";
            for (char &c : name)
                if (c == ',' || c == '\n') c = ';';
            std::snprintf(line, sizeof line, "kernel,%s,%llu,%llu,%u,%u\n", name.c_str(),
                          (unsigned long long)k->start, (unsigned long long)k->end, k->streamId, k->graphId);
            lines += line;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const auto *m = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(rec);
            std::snprintf(line, sizeof line, "copy,%s %llu,%llu,%llu,%u,%u\n", copy_kind(m->copyKind),
                          (unsigned long long)m->bytes, (unsigned long long)m->start, (unsigned long long)m->end,
                          m->streamId, m->graphId);
            lines += line;
        }
    }
    std::free(buffer);
    std::lock_guard<std::mutex> lock(g_mu);
    g_out += lines;
}

void write_trace() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const char *path = std::getenv("STRATA_KERNEL_TRACE");
    if (!path || !*path) path = "kernel_trace.csv";
    std::lock_guard<std::mutex> lock(g_mu);
    FILE *f = std::fopen(path, "w");
    if (!f) {
        std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return;
    }
    std::fputs("kind,name,start_ns,end_ns,stream,graph\n", f);
    std::fwrite(g_out.data(), 1, g_out.size(), f);
    std::fclose(f);
    std::fprintf(stderr, "kernel_trace: wrote %s\n", path);
}

bool check(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return true;
    const char *msg = nullptr;
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg ? msg : "?");
    return false;
}

}  // namespace

extern "C" int InitializeInjection() {
    if (g_started) return 1;
    g_started = true;
    if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks"))
        return 0;
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
    std::atexit(write_trace);
    return 1;
}
