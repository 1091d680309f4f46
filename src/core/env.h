// Environment switches (STRATA_<NAME>=0 turns a schedule off, =1 turns an opt-in one on; PRODUCT's A/B switches).
#pragma once

#include <cstdlib>
#include <cstring>

namespace strata {

// The switch `name`: "0" is off, "1" is on, anything else (or unset) is `default_on`.
inline bool env_switch(const char *name, bool default_on) {
    const char *e = std::getenv(name);
    if (e && std::strcmp(e, "0") == 0) return false;
    if (e && std::strcmp(e, "1") == 0) return true;
    return default_on;
}

// The whole number in `name`, or `fallback` when it is unset; throws nothing: a value that is not a whole number
// >= 0 is taken as unset.
inline long env_count(const char *name, long fallback) {
    const char *e = std::getenv(name);
    if (!e || !*e) return fallback;
    char *end = nullptr;
    const long v = std::strtol(e, &end, 10);
    return *end == '\0' && v >= 0 ? v : fallback;
}

}  // namespace strata
