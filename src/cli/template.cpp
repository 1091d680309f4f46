// strata template: placeholder until its implementation lands.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"

namespace strata::cli {

Run add_template(CLI::App &app) {
    CLI::App *sub = app.add_subcommand("template", "(not implemented yet)");
    sub->allow_extras();
    return [] {
        std::fprintf(stderr, "strata: template is not implemented yet\n");
        return 2;
    };
}

}  // namespace strata::cli
