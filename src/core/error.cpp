// Formatting helpers and the invariant-failure path.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace strata {

std::string vstrfmt(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap2);
    va_end(ap2);
    if (n <= 0) return {};
    std::string s(size_t(n), '\0');
    std::vsnprintf(s.data(), size_t(n) + 1, fmt, ap);
    return s;
}

std::string strfmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    return s;
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    throw Error(s);
}

void assert_failed(const char *expr, const char *file, int line) {
    std::fprintf(stderr, "strata: internal error: %s:%d: assertion failed: %s\n", file, line, expr);
    std::fflush(stderr);
    std::abort();
}

}  // namespace strata
