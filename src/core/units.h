// Byte sizes for flags and messages: "24G" in, "23.50 GiB" out.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

// A size such as "24G", "24GiB", "24GB", "1536M", "0.5T", "4096K" (binary units either way; a bare number is
// bytes). Throws strata::Error naming `what` on anything else.
uint64_t parse_size(const std::string &s, const char *what);

// bytes in GiB with two decimals: "1.25 GiB"; small sizes in MiB.
std::string format_bytes(uint64_t bytes);

}  // namespace strata
