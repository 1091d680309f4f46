// strata: one executable, one subcommand per job. Errors from bad input end the process with a message and a
// non-zero exit code, never a crash: 2 for usage errors (cli/usage.h), 1 for the rest.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "cli/usage.h"
#include "core/error.h"

int main(int argc, char **argv) {
    CLI::App app{"strata: Mixture-of-Experts inference on GPUs that hold only part of the model"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "strata 0.1.0");

    std::map<CLI::App *, strata::cli::Run> runs;
    auto add = [&](strata::cli::Run (*f)(CLI::App &)) {
        size_t before = app.get_subcommands({}).size();
        strata::cli::Run run = f(app);
        auto subs = app.get_subcommands({});
        if (subs.size() > before) runs[subs.back()] = std::move(run);
    };
    add(strata::cli::add_inspect);
    add(strata::cli::add_synth);
    add(strata::cli::add_tokenize);
    add(strata::cli::add_template);
    add(strata::cli::add_run);
    add(strata::cli::add_serve);
    add(strata::cli::add_bench);
    add(strata::cli::add_perplexity);
    add(strata::cli::add_quantize);

    if (const int rc = strata::cli::parse_command_line(app, argc, argv); rc >= 0) return rc;
    try {
        for (auto &[sub, run] : runs)
            if (sub->parsed()) return run();
    } catch (const strata::cli::UsageError &e) {
        std::fprintf(stderr, "strata: error: %s\n", e.what());
        return 2;
    } catch (const strata::Error &e) {
        std::fprintf(stderr, "strata: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "strata: error: out of memory\n");
        return 1;
    }
    return 1;
}
