// Subcommands of the strata executable. Each adds itself to the CLI11 app and returns the function that runs it
// once the command line has been parsed; the function returns the process exit code.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace strata::cli {

using Run = std::function<int()>;

Run add_inspect(CLI::App &app);
Run add_synth(CLI::App &app);
Run add_tokenize(CLI::App &app);
Run add_template(CLI::App &app);
Run add_quantize(CLI::App &app);
Run add_run(CLI::App &app);
Run add_serve(CLI::App &app);
Run add_bench(CLI::App &app);
Run add_perplexity(CLI::App &app);

}  // namespace strata::cli
