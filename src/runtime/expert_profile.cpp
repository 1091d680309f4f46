#include "runtime/expert_profile.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "format/gguf.h"
#include "runtime/engine.h"
#include "strata/expert_slots.h"

namespace strata {

namespace {
constexpr const char *k_type = "expert_profile";
constexpr const char *k_tensor = "favourite_scores";
}  // namespace

bool ExpertProfile::empty() const {
    for (const std::vector<double> &l : scores)
        if (!l.empty()) return false;
    return true;
}

ExpertProfile read_expert_profile(const std::string &path) {
    const std::unique_ptr<GgufFile> f = GgufFile::open(path);
    const GgufValue *type = f->find("general.type");
    if (!type || type->type != GgufType::STRING || type->str != k_type)
        fail("%s: not an expert profile (general.type is not \"%s\")", path.c_str(), k_type);
    ExpertProfile p;
    try {
        p.arch = std::string(f->get("strata.profile.architecture").as_string("strata.profile.architecture"));
        p.n_layer = f->get("strata.profile.block_count").as_int("strata.profile.block_count");
        p.n_expert = f->get("strata.profile.expert_count").as_int("strata.profile.expert_count");
    } catch (const Error &e) {
        fail("%s: %s", path.c_str(), e.what());
    }
    if (p.n_layer < 1 || p.n_layer > 4096 || p.n_expert < 1 || p.n_expert > 65536)
        fail("%s: expert profile of %lld layers of %lld experts: expected 1-4096 layers of 1-65536 experts",
             path.c_str(), (long long)p.n_layer, (long long)p.n_expert);
    const GgufTensor *t = f->find_tensor(k_tensor);
    if (!t || t->type != DType::F32 || t->n_dims != 2 || t->ne[0] != p.n_expert || t->ne[1] != p.n_layer)
        fail("%s: expected an F32 tensor %s of [%lld, %lld]", path.c_str(), k_tensor, (long long)p.n_expert,
             (long long)p.n_layer);
    p.scores.resize(size_t(p.n_layer));
    for (int64_t il = 0; il < p.n_layer; il++) {
        std::vector<float> row(size_t(p.n_expert));
        std::memcpy(row.data(), t->data + size_t(il * p.n_expert) * 4, row.size() * 4);
        bool any = false;
        for (const float v : row) {
            if (!std::isfinite(v) || v < 0.0f)
                fail("%s: layer %lld has a score of %g: expected finite scores of 0 or more", path.c_str(),
                     (long long)il, double(v));
            any = any || v > 0.0f;
        }
        if (any) p.scores[size_t(il)].assign(row.begin(), row.end());
    }
    return p;
}

void write_expert_profile(const std::string &path, const ExpertProfile &p) {
    STRATA_ASSERT(p.n_layer > 0 && p.n_expert > 0 && p.scores.size() <= size_t(p.n_layer));
    std::vector<float> data(size_t(p.n_layer * p.n_expert), 0.0f);
    for (size_t il = 0; il < p.scores.size(); il++) {
        if (p.scores[il].empty()) continue;
        STRATA_ASSERT(p.scores[il].size() == size_t(p.n_expert));
        for (size_t e = 0; e < p.scores[il].size(); e++) data[il * size_t(p.n_expert) + e] = float(p.scores[il][e]);
    }
    GgufWriter w;
    w.add_string("general.type", k_type);
    w.add_string("strata.profile.architecture", p.arch);
    w.add_u32("strata.profile.block_count", uint32_t(p.n_layer));
    w.add_u32("strata.profile.expert_count", uint32_t(p.n_expert));
    w.add_f64("strata.profile.half_life_tokens", ExpertSlotTable::k_favourite_half_tokens);
    w.add_tensor(k_tensor, DType::F32, {p.n_expert, p.n_layer}, data.data(), data.size() * 4);
    w.write(path);
}

namespace {

// Whether some participant keeps only part of the experts in slots (the cache a profile is for).
bool partial_expert_cache(const Engine &eng) {
    for (size_t i = 0; i < eng.n_parts(); i++)
        if (const ExpertSlotTable *t = eng.part_slots(i); t && !t->all_resident()) return true;
    return false;
}

}  // namespace

std::string start_expert_profile(const std::string &path, Engine &eng) {
    if (path.empty()) return "";
    if (!partial_expert_cache(eng))
        return strfmt("--expert-profile %s: no partial expert cache here (every expert in a slot or read in place): "
                      "nothing to keep",
                      path.c_str());
    if (!std::filesystem::exists(path)) {
        // written at the end: a folder that cannot take it is said now, not after the run
        const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
        if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
            fail("--expert-profile %s: cannot write there (%s is not a writable folder)", path.c_str(), dir.c_str());
        return strfmt("expert profile %s: none yet (written at the end)", path.c_str());
    }
    const ExpertProfile p = read_expert_profile(path);
    try {
        eng.seed_expert_profile(p);
    } catch (const Error &e) {
        fail("%s: %s", path.c_str(), e.what());
    }
    int64_t n = 0;
    for (const std::vector<double> &l : p.scores) n += !l.empty();
    return strfmt("expert profile %s: scores of %lld layers", path.c_str(), (long long)n);
}

std::string end_expert_profile(const std::string &path, const Engine &eng) {
    if (path.empty() || !partial_expert_cache(eng)) return "";
    const ExpertProfile p = eng.expert_profile();
    if (p.empty()) return "";  // no prompt scored: the file stays as it was
    write_expert_profile(path, p);
    return strfmt("expert profile written to %s", path.c_str());
}

}  // namespace strata
