// Errors and invariants: bad input (files, flags, requests) throws strata::Error with a message that names the thing
// and what was expected; a broken internal invariant is a bug and aborts with file:line.
#pragma once

#include <cstdarg>
#include <stdexcept>
#include <string>

namespace strata {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// printf-style formatting into a std::string (g++ 12 has no std::format).
std::string strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrfmt(const char *fmt, va_list ap);

[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void assert_failed(const char *expr, const char *file, int line);

}  // namespace strata

#define STRATA_ASSERT(cond) \
    ((cond) ? (void)0 : ::strata::assert_failed(#cond, __FILE__, __LINE__))
