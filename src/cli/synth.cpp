// strata synth: placeholder until its implementation lands.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"

namespace strata::cli {

Run add_synth(CLI::App &app) {
    CLI::App *sub = app.add_subcommand("synth", "(not implemented yet)");
    sub->allow_extras();
    return [] {
        std::fprintf(stderr, "strata: synth is not implemented yet\n");
        return 2;
    };
}

}  // namespace strata::cli
