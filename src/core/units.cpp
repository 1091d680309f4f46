// Byte sizes for flags and messages.
#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace strata {

uint64_t parse_size(const std::string &s, const char *what) {
    const char *p = s.c_str();
    char *end = nullptr;
    const double v = std::strtod(p, &end);
    if (end == p || !std::isfinite(v) || v < 0)
        fail("%s: '%s' is not a size (expected e.g. 24G, 1536M or a number of bytes)", what, s.c_str());
    std::string unit(end);
    for (char &c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
    double mul = 1;
    if (unit.empty() || unit == "B")
        mul = 1;
    else if (unit == "K" || unit == "KB" || unit == "KIB")
        mul = 1024.0;
    else if (unit == "M" || unit == "MB" || unit == "MIB")
        mul = 1024.0 * 1024;
    else if (unit == "G" || unit == "GB" || unit == "GIB")
        mul = 1024.0 * 1024 * 1024;
    else if (unit == "T" || unit == "TB" || unit == "TIB")
        mul = 1024.0 * 1024 * 1024 * 1024;
    else
        fail("%s: unknown unit in '%s' (use K, M, G or T)", what, s.c_str());
    const double bytes = v * mul;
    if (bytes >= 1.8e19) fail("%s: '%s' is too large", what, s.c_str());
    return uint64_t(bytes);
}

std::string format_bytes(uint64_t bytes) {
    const double gib = double(bytes) / double(uint64_t(1) << 30);
    if (gib >= 1.0) return strfmt("%.2f GiB", gib);
    return strfmt("%.1f MiB", double(bytes) / double(1u << 20));
}

}  // namespace strata
