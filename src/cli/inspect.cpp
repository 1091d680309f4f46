// strata inspect: placeholder until its implementation lands.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"

namespace strata::cli {

Run add_inspect(CLI::App &app) {
    CLI::App *sub = app.add_subcommand("inspect", "(not implemented yet)");
    sub->allow_extras();
    return [] {
        std::fprintf(stderr, "strata: inspect is not implemented yet\n");
        return 2;
    };
}

}  // namespace strata::cli
