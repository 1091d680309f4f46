// Runs a golden model through the engine the way its oracle was computed (tools/golden/README.md) and writes
// the logits as raw float32 rows: prompt_logits.f32, decode_logits.f32 (teacher-forced decode steps) and
// prompt2_logits.f32 (the second prompt, in the same batch as the first). Options vary how the work is packed
// (chunk size, one token per pass) and the KV cache type, so tests can check that none of that matters.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "runtime/engine.h"

using namespace strata;

namespace {

std::vector<int32_t> ids(const std::string &s) {
    std::vector<int32_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(int32_t(std::stol(item)));
    return out;
}

void write(const std::string &path, const std::vector<float> &v) {
    std::ofstream f(path, std::ios::binary);
    if (!f) fail("cannot write %s", path.c_str());
    f.write(reinterpret_cast<const char *>(v.data()), std::streamsize(v.size() * 4));
}

int usage() {
    std::fprintf(stderr,
                 "usage: golden_run MODEL.gguf --prompt IDS --decode IDS --prompt2 IDS --out DIR\n"
                 "                  [--batch N] [--kv f32|f16|q8_0] [--tokenwise] [--threads N]\n"
                 "                  [--device cpu|cuda] [--expert-slots N] [--vram-budget SIZE]\n");
    return 2;
}

}  // namespace

int main(int argc, char **argv) try {
    if (argc < 2) return usage();
    std::string model = argv[1], out;
    std::vector<int32_t> prompt, decode, prompt2;
    EngineConfig cfg;
    cfg.n_seq_max = 2;
    cfg.n_ctx = 256;
    cfg.n_threads = 2;
    cfg.kv_type = KvType::F32;
    cfg.device = Device::Cpu;
    bool tokenwise = false;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) fail("%s needs a value", a.c_str());
            return argv[++i];
        };
        if (a == "--prompt") prompt = ids(val());
        else if (a == "--decode") decode = ids(val());
        else if (a == "--prompt2") prompt2 = ids(val());
        else if (a == "--out") out = val();
        else if (a == "--batch") cfg.n_batch = std::stol(val());
        else if (a == "--threads") cfg.n_threads = int(std::stol(val()));
        else if (a == "--tokenwise") tokenwise = true;
        else if (a == "--device") cfg.device = parse_device(val());
        else if (a == "--expert-slots") cfg.expert_slots = std::stol(val());
        else if (a == "--vram-budget") cfg.vram_budget = parse_size(val(), "--vram-budget");
        else if (a == "--kv") {
            std::string k = val();
            cfg.kv_type = k == "f16" ? KvType::F16 : k == "q8_0" ? KvType::Q8_0 : k == "f32" ? KvType::F32
                                                                                          : (fail("bad --kv %s", k.c_str()), KvType::F32);
        } else return usage();
    }
    if (out.empty() || prompt.empty()) return usage();

    cfg.log = [](const std::string &line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    std::unique_ptr<Engine> eng = make_engine(model, cfg);
    const int64_t V = eng->n_vocab();
    const int32_t s1 = eng->new_sequence(), s2 = eng->new_sequence();
    std::vector<float> l1, l2;
    std::vector<std::vector<float>> l;
    if (!tokenwise) {
        std::vector<SeqInput> in = {{s1, prompt, true}};
        if (!prompt2.empty()) in.push_back({s2, prompt2, true});
        eng->decode(in, l);
        l1 = l[0];
        if (!prompt2.empty()) l2 = l[1];
    } else {
        // One token per sequence per pass, both sequences in the same pass while both have tokens left.
        for (size_t t = 0; t < std::max(prompt.size(), prompt2.size()); t++) {
            std::vector<SeqInput> in;
            if (t < prompt.size()) in.push_back({s1, {prompt[t]}, false});
            if (t < prompt2.size()) in.push_back({s2, {prompt2[t]}, false});
            eng->decode(in, l);
            size_t k = 0;
            if (t < prompt.size()) l1.insert(l1.end(), l[k].begin(), l[k].end()), k++;
            if (t < prompt2.size()) l2.insert(l2.end(), l[k].begin(), l[k].end());
        }
    }
    std::vector<float> ld;
    for (int32_t t : decode) {
        eng->decode({{s1, {t}, false}}, l);
        ld.insert(ld.end(), l[0].begin(), l[0].end());
    }
    write(out + "/prompt_logits.f32", l1);
    write(out + "/decode_logits.f32", ld);
    if (!prompt2.empty()) write(out + "/prompt2_logits.f32", l2);
    std::printf("vocab %lld prompt %zu decode %zu prompt2 %zu\n", (long long)V, prompt.size(), decode.size(),
                prompt2.size());
    return 0;
} catch (const std::exception &e) {
    std::fprintf(stderr, "golden_run: error: %s\n", e.what());
    return 1;
}
