// A vocabulary of 256 one-byte tokens and an end token (256), for the grammar tests: matching against it is matching
// bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace strata::test {

inline std::shared_ptr<const grammar::Vocabulary> byte_vocab() {
    static auto v = [] {
        std::vector<std::string> t;
        for (int b = 0; b < 256; b++) t.push_back(std::string(1, char(b)));
        t.push_back("");
        return grammar::Vocabulary::from_tokens(std::move(t), {256});
    }();
    return v;
}

}  // namespace strata::test
