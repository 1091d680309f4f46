// Usage errors of the command line: a flag, a value or a command the user got wrong. They end the process with exit
// code 2 and a message that names the flag or command (and the nearest known one where the name is unknown); other
// failures (a bad file, a model that does not fit) exit 1.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace strata::cli {

struct UsageError : Error {
    using Error::Error;
};

[[noreturn]] void usage_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// The candidate closest to `name` by edit distance, or "" when none is close enough to be a likely typo.
std::string nearest_name(const std::string &name, const std::vector<std::string> &candidates);

// -t/--threads: 0 (one per hardware thread) up to the hardware threads of this machine.
CLI::Validator threads_range();
// A count of at least `min`.
CLI::Validator at_least(long long min);

// Parses argv into app. Returns -1 when the command is to run, else the exit code: 0 after --help or --version,
// 2 after a usage error (printed to stderr, with the nearest command or flag where one was misspelt).
int parse_command_line(CLI::App &app, int argc, char **argv);

}  // namespace strata::cli
