// Synthetic test models written once per build tree (build/test-models/NAME.gguf) and reused by later runs.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "synth/synth.h"

namespace strata::test {

// The path of the model `o` describes, written first if it is not there yet. Test processes run in parallel: each
// writes its own temporary, and the atomic rename makes the first complete file win.
inline std::string cached_synth_model(const std::string &name, const SynthOptions &o) {
    const std::string path = std::string(STRATA_BINARY_DIR) + "/test-models/" + name + ".gguf";
    if (!std::filesystem::exists(path)) {
        std::filesystem::create_directories(std::filesystem::path(path).parent_path());
        const std::string tmp = path + ".tmp" + std::to_string(::getpid());
        write_synthetic_model(o, tmp);
        std::filesystem::rename(tmp, path);
    }
    return path;
}

}  // namespace strata::test
