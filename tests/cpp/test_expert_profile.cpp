// The expert-popularity profile file (runtime/expert_profile.h): written and read back to the same scores (as
// floats), layers without scores kept apart; anything else (another GGUF, a truncated file, a bad shape, a negative
// or non-finite score) refused with an error that names the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/gguf.h"
#include "runtime/expert_profile.h"

using namespace strata;

namespace {

std::string temp(const std::string &name) {
    return testing::TempDir() + "profile-" + std::to_string(::getpid()) + "-" + name;
}

ExpertProfile sample() {
    ExpertProfile p;
    p.arch = "qwen3next";
    p.n_layer = 3;
    p.n_expert = 4;
    p.scores = {{0.5, 7.25, 0, 1e-3}, {}, {3, 0, 0, 100.125}};
    return p;
}

// What the message of the Error f throws says ("" where it throws none).
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const Error &e) {
        return e.what();
    }
    return "";
}

// A profile file written by hand: the scores tensor as given.
void write_raw(const std::string &path, const std::string &type, std::vector<int64_t> ne, const std::vector<float> &v) {
    GgufWriter w;
    w.add_string("general.type", type);
    w.add_string("strata.profile.architecture", "qwen3moe");
    w.add_u32("strata.profile.block_count", uint32_t(ne[1]));
    w.add_u32("strata.profile.expert_count", uint32_t(ne[0]));
    w.add_tensor("favourite_scores", DType::F32, ne, v.data(), v.size() * 4);
    w.write(path);
}

}  // namespace

TEST(ExpertProfile, WrittenAndReadBack) {
    const std::string path = temp("rt.gguf");
    const ExpertProfile p = sample();
    write_expert_profile(path, p);
    const ExpertProfile q = read_expert_profile(path);
    EXPECT_EQ(q.arch, "qwen3next");
    EXPECT_EQ(q.n_layer, 3);
    EXPECT_EQ(q.n_expert, 4);
    ASSERT_EQ(q.scores.size(), 3u);
    EXPECT_TRUE(q.scores[1].empty());
    for (size_t il : {size_t(0), size_t(2)}) {
        ASSERT_EQ(q.scores[il].size(), 4u);
        for (size_t e = 0; e < 4; e++) EXPECT_EQ(q.scores[il][e], double(float(p.scores[il][e]))) << il << " " << e;
    }
    EXPECT_FALSE(q.empty());
    // written again over the first
    ExpertProfile r = p;
    r.scores = {{}, {1, 1, 1, 1}, {}};
    write_expert_profile(path, r);
    const ExpertProfile s = read_expert_profile(path);
    EXPECT_TRUE(s.scores[0].empty() && s.scores[2].empty());
    EXPECT_EQ(s.scores[1], (std::vector<double>{1, 1, 1, 1}));
    std::filesystem::remove(path);
}

TEST(ExpertProfile, RefusesWhatIsNotAProfile) {
    const std::string path = temp("bad.gguf");
    // another GGUF
    write_raw(path, "model", {4, 2}, std::vector<float>(8, 1.0f));
    EXPECT_NE(error_of([&] { read_expert_profile(path); }).find("not an expert profile"), std::string::npos);
    // a tensor of another shape than the keys say
    {
        GgufWriter w;
        w.add_string("general.type", "expert_profile");
        w.add_string("strata.profile.architecture", "qwen3moe");
        w.add_u32("strata.profile.block_count", 3);
        w.add_u32("strata.profile.expert_count", 4);
        const std::vector<float> v(8, 1.0f);
        w.add_tensor("favourite_scores", DType::F32, {4, 2}, v.data(), v.size() * 4);
        w.write(path);
    }
    EXPECT_NE(error_of([&] { read_expert_profile(path); }).find("favourite_scores"), std::string::npos);
    // a key missing: named, with the file
    {
        GgufWriter w;
        w.add_string("general.type", "expert_profile");
        w.add_string("strata.profile.architecture", "qwen3moe");
        w.write(path);
    }
    const std::string missing = error_of([&] { read_expert_profile(path); });
    EXPECT_NE(missing.find(path), std::string::npos) << missing;
    EXPECT_NE(missing.find("strata.profile.block_count"), std::string::npos) << missing;
    // scores that are not finite or are negative
    for (float bad : {-1.0f, NAN, INFINITY}) {
        std::vector<float> v(8, 1.0f);
        v[5] = bad;
        write_raw(path, "expert_profile", {4, 2}, v);
        const std::string e = error_of([&] { read_expert_profile(path); });
        EXPECT_NE(e.find("layer 1 has a score"), std::string::npos) << bad << ": " << e;
    }
    // truncated: the GGUF reader names the file
    write_expert_profile(path, sample());
    const auto size = std::filesystem::file_size(path);
    std::filesystem::resize_file(path, size - 20);
    const std::string cut = error_of([&] { read_expert_profile(path); });
    EXPECT_NE(cut.find(path), std::string::npos) << cut;
    std::filesystem::remove(path);
    // no file
    EXPECT_NE(error_of([&] { read_expert_profile(path); }), "");
}
