// Usage errors: exit code 2, the flag or command named, the nearest known name suggested.
#include "cli/usage.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "core/threads.h"

namespace strata::cli {

void usage_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vstrfmt(fmt, ap);
    va_end(ap);
    throw UsageError(msg);
}

namespace {

size_t edit_distance(const std::string &a, const std::string &b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); j++) prev[j] = j;
    for (size_t i = 1; i <= a.size(); i++) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); j++)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

// The deepest subcommand the parse reached (the app itself when none).
CLI::App *deepest(CLI::App &app) {
    CLI::App *at = &app;
    for (;;) {
        std::vector<CLI::App *> subs = at->get_subcommands();
        if (subs.empty()) return at;
        at = subs.front();
    }
}

std::vector<std::string> command_names(CLI::App &app) {
    std::vector<std::string> names;
    for (CLI::App *s : app.get_subcommands({})) names.push_back(s->get_name());
    return names;
}

std::vector<std::string> flag_names(CLI::App &sub) {
    std::vector<std::string> names;
    for (const CLI::Option *o : sub.get_options()) {
        for (const std::string &l : o->get_lnames()) names.push_back("--" + l);
        for (const std::string &s : o->get_snames()) names.push_back("-" + s);
    }
    return names;
}

std::string command_label(CLI::App &app, CLI::App *sub) {
    return sub == &app ? std::string("strata") : "strata " + sub->get_name();
}

int report(const std::string &msg, const std::string &help_of) {
    std::fprintf(stderr, "strata: error: %s\n(see '%s --help')\n", msg.c_str(), help_of.c_str());
    return 2;
}

}  // namespace

std::string nearest_name(const std::string &name, const std::vector<std::string> &candidates) {
    std::string best;
    size_t best_d = std::string::npos;
    for (const std::string &c : candidates) {
        const size_t d = edit_distance(name, c);
        if (d < best_d) best_d = d, best = c;
    }
    // A typo: at most a third of the letters wrong (and at least one letter right).
    const size_t limit = std::max<size_t>(1, name.size() / 3);
    return best_d <= limit && best_d < name.size() ? best : std::string();
}

CLI::Validator threads_range() {
    return CLI::Validator(
        [](std::string &s) -> std::string {
            const int hw = hardware_threads();
            long long v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return "expected a number of threads, got '" + s + "'";
            if (v < 0 || v > hw)
                return strfmt("%lld threads: give 0 (one per hardware thread) to %d (the hardware threads here)", v,
                              hw);
            return "";
        },
        "0..hardware threads");
}

CLI::Validator at_least(long long min) {
    return CLI::Validator(
        [min](std::string &s) -> std::string {
            long long v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return "expected a whole number, got '" + s + "'";
            if (v < min) return strfmt("must be at least %lld (got %lld)", min, v);
            return "";
        },
        strfmt(">= %lld", min));
}

int parse_command_line(CLI::App &app, int argc, char **argv) {
    // A first word that is not a flag must be a command: name the nearest one when it is not.
    if (argc > 1 && argv[1][0] != '-') {
        const std::vector<std::string> names = command_names(app);
        const std::string word = argv[1];
        if (std::find(names.begin(), names.end(), word) == names.end()) {
            const std::string near = nearest_name(word, names);
            std::string list;
            for (const std::string &n : names) list += (list.empty() ? "" : ", ") + n;
            return report("unknown command '" + word + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
                              " (commands: " + list + ")",
                          "strata");
        }
    }
    try {
        app.parse(argc, argv);
        return -1;
    } catch (const CLI::CallForHelp &e) {
        app.exit(e);
        return 0;
    } catch (const CLI::CallForAllHelp &e) {
        app.exit(e);
        return 0;
    } catch (const CLI::CallForVersion &e) {
        app.exit(e);
        return 0;
    } catch (const CLI::RequiredError &e) {
        CLI::App *sub = deepest(app);
        if (sub == &app) return report("give a command (inspect, run, serve, bench, ...)", "strata");
        return report(e.what(), command_label(app, sub));
    } catch (const CLI::ExtrasError &e) {
        // Unknown flags or extra words: suggest the nearest flag of the command for each unknown one.
        CLI::App *sub = deepest(app);
        std::string msg = e.what();
        const std::vector<std::string> flags = flag_names(*sub);
        for (const std::string &extra : sub->remaining()) {
            if (extra.empty() || extra[0] != '-') continue;
            const std::string name = extra.substr(0, extra.find('='));
            const std::string near = nearest_name(name, flags);
            if (!near.empty()) msg += "; for '" + name + "', did you mean '" + near + "'?";
        }
        return report(msg, command_label(app, sub));
    } catch (const CLI::ParseError &e) {
        return report(e.what(), command_label(app, deepest(app)));
    }
}

}  // namespace strata::cli
