// Test driver for the tokenizer: encodes records (one JSON string per input line) and prints one line of ids per
// record, so Python can compare them with a reference tokenizer; --bench measures throughput instead. Not a user
// tool (that is `strata tokenize`).
//
//   tok_encode -m FILE.gguf [--pre NAME] [--no-parse-special] [--add-special]
//              [--check-roundtrip] [--bench SECONDS] < records.jsonl
//
// --pre swaps the file's pre-tokenizer for another, so every pre-tokenizer can be checked on the one real
// vocabulary we have. --check-roundtrip also decodes every record and fails on a difference. --bench encodes all
// records repeatedly for about SECONDS of CPU time and prints "MB/s <rate> bytes <n> tokens <n> ...".
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace strata;

namespace {

int run(int argc, char **argv) {
    std::string gguf_path, pre;
    bool parse_special = true, add_special = false, roundtrip = false;
    double bench_s = 0;
    for (int i = 1; i < argc; i++) {
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) fail("%s needs a value", argv[i]);
            return argv[++i];
        };
        if (!std::strcmp(argv[i], "-m"))
            gguf_path = value();
        else if (!std::strcmp(argv[i], "--pre"))
            pre = value();
        else if (!std::strcmp(argv[i], "--no-parse-special"))
            parse_special = false;
        else if (!std::strcmp(argv[i], "--add-special"))
            add_special = true;
        else if (!std::strcmp(argv[i], "--check-roundtrip"))
            roundtrip = true;
        else if (!std::strcmp(argv[i], "--bench"))
            bench_s = std::stod(value());
        else
            fail("unknown argument %s", argv[i]);
    }
    if (gguf_path.empty()) fail("-m FILE.gguf is required");
    auto file = GgufFile::open(gguf_path);
    VocabSpec spec = read_vocab_spec(*file);
    if (!pre.empty()) spec.pre = pre;
    auto tok = Tokenizer::from_spec(std::move(spec));

    std::vector<std::string> records;
    std::string line;
    while (std::getline(std::cin, line)) records.push_back(nlohmann::json::parse(line).get<std::string>());

    if (bench_s > 0) {
        size_t bytes = 0, tokens = 0;
        for (const auto &r : records) bytes += r.size();
        std::vector<int32_t> ids;
        // One untimed pass first, so the word cache is as warm as in a long-running server.
        for (const auto &r : records) tok->encode(r, add_special, parse_special);
        // CPU time of this thread, not wall time: the rate on one core, whatever else the machine is doing.
        auto cpu_s = [] {
            timespec ts;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
            return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
        };
        const double t0 = cpu_s();
        double elapsed = 0;
        size_t passes = 0;
        do {
            for (const auto &r : records) {
                ids.clear();
                tok->encode(r, add_special, parse_special, ids);
                tokens += ids.size();
            }
            passes++;
            elapsed = cpu_s() - t0;
        } while (elapsed < bench_s);
        std::printf("MB/s %.2f bytes %zu tokens %zu passes %zu cpu_s %.2f\n", double(bytes * passes) / elapsed / 1e6,
                    bytes, tokens / passes, passes, elapsed);
        return 0;
    }

    int failures = 0;
    std::string out;
    for (size_t i = 0; i < records.size(); i++) {
        const std::vector<int32_t> ids = tok->encode(records[i], add_special, parse_special);
        out.clear();
        for (size_t k = 0; k < ids.size(); k++) {
            if (k) out += ' ';
            out += std::to_string(ids[k]);
        }
        std::printf("%s\n", out.c_str());
        if (roundtrip && tok->decode(ids, /*render_special=*/true) != records[i]) {
            std::fprintf(stderr, "tok_encode: record %zu does not decode back to itself\n", i);
            failures++;
        }
    }
    return failures ? 3 : 0;
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tok_encode: %s\n", e.what());
        return 1;
    }
}
