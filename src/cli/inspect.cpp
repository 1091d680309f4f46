// strata inspect FILE.gguf [--json]: what a GGUF file holds, read without loading any tensor data. The facts come
// from inspect_facts(); this file only lays them out as text.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "cli/commands.h"
#include "cli/inspect_facts.h"
#include "core/error.h"
#include "format/gguf.h"

namespace strata::cli {

namespace {

using json = nlohmann::ordered_json;

std::string commas(uint64_t n) {
    std::string digits = std::to_string(n), s;
    for (size_t k = 0; k < digits.size(); k++) {
        if (k > 0 && (digits.size() - k) % 3 == 0) s += ',';
        s += digits[k];
    }
    return s;
}

std::string human_bytes(uint64_t n) {
    const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (n < 1024) return std::to_string(n) + " B";
    double v = double(n);
    int u = -1;
    while (v >= 1024 && u < 3) v /= 1024, u++;
    return strfmt("%.2f %s", v, units[u]);
}

// A string for a terminal: quoted, control characters escaped, cut at `max` bytes (on a UTF-8 boundary).
std::string quoted(const std::string &s, size_t max = 60) {
    std::string out = "\"";
    size_t n = 0;
    for (; n < s.size() && n < max; n++) {
        unsigned char c = static_cast<unsigned char>(s[n]);
        if (c == '"' || c == '\\')
            out += '\\', out += char(c);
        else if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20 || c == 0x7f)
            out += strfmt("\\x%02x", c);
        else
            out += char(c);
    }
    while (n < s.size() && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) out += s[n++];
    return out + (n < s.size() ? "\"..." : "\"");
}

std::string show(const json &v) {
    if (v.is_string()) return quoted(v.get<std::string>());
    if (v.is_null()) return "(not set)";
    if (v.is_array()) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + show(v[i]);
        return s + "]";
    }
    return v.dump();
}

// A metadata value from value_summary(): arrays as "[N x type] first, elements, ...".
std::string show_summary(const json &m) {
    if (m["type"] != "array") return show(m["value"]);
    std::string s =
        strfmt("[%s x %s]", commas(m["count"].get<uint64_t>()).c_str(), m["elem_type"].get<std::string>().c_str());
    const json &items = m["value"];
    for (size_t i = 0; i < items.size(); i++) s += (i ? ", " : " ") + show(items[i]);
    return s + (m.contains("truncated") ? ", ..." : "");
}

void print_header(const json &j) {
    const json &f = j["file"];
    std::printf("File           %s\n", f["path"].get<std::string>().c_str());
    std::printf("               %s bytes (%s); GGUF v%u, alignment %u, data section at byte %s\n",
                commas(f["size_bytes"]).c_str(), human_bytes(f["size_bytes"]).c_str(), f["version"].get<unsigned>(),
                f["alignment"].get<unsigned>(), commas(f["data_offset"]).c_str());
    std::printf("               %s metadata keys; %s tensors, %s of tensor data\n", commas(f["n_kv"]).c_str(),
                commas(f["n_tensors"]).c_str(), human_bytes(f["tensor_bytes"]).c_str());
    std::printf("Architecture   %s", j["architecture"].is_null() ? "(none: no general.architecture)"
                                                                 : j["architecture"].get<std::string>().c_str());
    if (!j["name"].is_null()) std::printf("  (%s)", quoted(j["name"].get<std::string>()).c_str());
    std::printf("\n");
}

void print_hyperparameters(const json &j) {
    if (j["hyperparameters"].empty()) return;
    std::printf("\nHyperparameters (%s.*)\n", j["architecture"].get<std::string>().c_str());
    for (auto &[k, v] : j["hyperparameters"].items())
        std::printf("  %-40s %s\n", k.c_str(), v.is_object() ? show_summary(v).c_str() : show(v).c_str());
}

void print_tokenizer(const json &t) {
    if (t["model"].is_null() && t["vocab_size"].is_null()) return;
    std::printf("\nTokenizer\n");
    std::printf("  %-14s %s\n", "model", show(t["model"]).c_str());
    std::printf("  %-14s %s\n", "pre", show(t["pre"]).c_str());
    std::string vocab = t["vocab_size"].is_null() ? "(no tokens)" : commas(t["vocab_size"]) + " tokens";
    if (!t["n_merges"].is_null()) vocab += ", " + commas(t["n_merges"]) + " merges";
    std::printf("  %-14s %s\n", "vocabulary", vocab.c_str());
    for (auto &[which, tok] : t["special_tokens"].items())
        std::printf("  %-14s %-8s %s\n", which.c_str(), std::to_string(tok["id"].get<uint64_t>()).c_str(),
                    tok["text"].is_null() ? "(id past the vocabulary)" : quoted(tok["text"]).c_str());
    std::printf("  %-14s %s\n", "add_bos", show(t["add_bos"]).c_str());
    std::printf("  %-14s %s\n", "add_eos", show(t["add_eos"]).c_str());
    const json &ct = t["chat_template"];
    std::string tmpl = ct["present"] ? "present (" + commas(ct["bytes"]) + " bytes)" : "absent";
    for (const json &n : ct["named"]) tmpl += ", named " + quoted(n.get<std::string>());
    std::printf("  %-14s %s\n", "chat template", tmpl.c_str());
}

// Keys not already shown above.
void print_other_metadata(const json &j) {
    std::set<std::string> shown = {"general.architecture",         "general.name",
                                   "tokenizer.ggml.model",         "tokenizer.ggml.pre",
                                   "tokenizer.ggml.tokens",        "tokenizer.ggml.merges",
                                   "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                   "tokenizer.chat_template"};
    for (auto &[which, tok] : j["tokenizer"]["special_tokens"].items())
        shown.insert("tokenizer.ggml." + which + "_token_id");
    std::string prefix = j["architecture"].is_null() ? "" : j["architecture"].get<std::string>() + ".";
    bool header = false;
    for (const json &m : j["metadata"]) {
        std::string key = m["key"];
        if (shown.count(key) || (!prefix.empty() && key.compare(0, prefix.size(), prefix) == 0)) continue;
        if (!header) std::printf("\nOther metadata\n");
        header = true;
        std::printf("  %-40s %-7s %s\n", key.c_str(), m["type"].get<std::string>().c_str(), show_summary(m).c_str());
    }
}

void print_tensors(const json &j) {
    const json &ts = j["tensors"];
    if (ts.empty()) return;
    size_t wname = 4, wshape = 5;
    for (const json &t : ts) {
        wname = std::max(wname, t["name"].get<std::string>().size());
        wshape = std::max(wshape, show(t["shape"]).size());
    }
    std::printf("\nTensors (%s, %s)\n", commas(ts.size()).c_str(), human_bytes(j["file"]["tensor_bytes"]).c_str());
    std::printf("  %-*s  %-7s  %-*s  %15s  %s\n", int(wname), "name", "type", int(wshape), "shape", "bytes", "role");
    for (const json &t : ts)
        std::printf("  %-*s  %-7s  %-*s  %15s  %s\n", int(wname), t["name"].get<std::string>().c_str(),
                    t["type"].get<std::string>().c_str(), int(wshape), show(t["shape"]).c_str(),
                    commas(t["bytes"]).c_str(), t["role"].get<std::string>().c_str());
}

void print_totals(const json &j) {
    if (j["tensors"].empty()) return;
    double all = std::max(1.0, double(j["file"]["tensor_bytes"].get<uint64_t>()));
    for (const char *what : {"by_type", "by_role"}) {
        std::printf("\nTotals %s\n", what[3] == 't' ? "by type" : "by role");
        for (auto &[k, v] : j["totals"][what].items())
            std::printf("  %-14s %6s tensors  %12s  %5.1f%%\n", k.c_str(), commas(v["tensors"]).c_str(),
                        human_bytes(v["bytes"]).c_str(), 100.0 * double(v["bytes"].get<uint64_t>()) / all);
    }
}

void print_experts(const json &e) {
    if (e.is_null()) return;
    std::printf("\nRouted experts\n");
    std::printf("  %s experts (from %s), %s used per token; %s layers, %s in all\n", commas(e["n_expert"]).c_str(),
                e["n_expert_source"].get<std::string>().c_str(),
                e["n_expert_used"].is_null() ? "(unknown)" : commas(e["n_expert_used"]).c_str(),
                commas(e["n_layers"]).c_str(), human_bytes(e["bytes"]).c_str());
    uint64_t lo = e["bytes_per_expert_min"], hi = e["bytes_per_expert_max"];
    std::printf("  one expert of one layer: %s\n",
                lo == hi ? human_bytes(lo).c_str() : (human_bytes(lo) + " to " + human_bytes(hi)).c_str());
    std::printf("  %-7s %14s %14s  %s\n", "layer", "bytes", "per expert", "tensors");
    for (const json &l : e["layers"]) {
        std::string names;
        for (const json &n : l["tensors"]) {
            std::string s = n;
            names += (names.empty() ? "" : " ") + s.substr(s.find('.', 4) + 1);
        }
        std::printf("  %-7s %14s %14s  %s%s%s\n", ("blk." + std::to_string(l["layer"].get<int>())).c_str(),
                    commas(l["bytes"]).c_str(), commas(l["bytes_per_expert"]).c_str(), names.c_str(),
                    l["mtp"] ? " (MTP)" : "", l.contains("uneven") ? " (not divisible by the expert count)" : "");
    }
}

}  // namespace

Run add_inspect(CLI::App &app) {
    struct Options {
        std::string path;
        bool json = false;
    };
    auto opt = std::make_shared<Options>();
    CLI::App *sub = app.add_subcommand(
        "inspect", "Show what a GGUF file holds: architecture, hyperparameters, tokenizer, tensors, expert sizes");
    sub->add_option("file", opt->path, "GGUF file")->required();
    sub->add_flag("--json", opt->json, "Print one JSON document with the same facts");
    return [opt] {
        std::unique_ptr<GgufFile> f = GgufFile::open(opt->path);
        json facts = inspect_facts(*f);
        if (opt->json) {
            std::printf("%s\n", facts.dump(2).c_str());
            return 0;
        }
        print_header(facts);
        print_hyperparameters(facts);
        print_tokenizer(facts["tokenizer"]);
        print_other_metadata(facts);
        print_tensors(facts);
        print_totals(facts);
        print_experts(facts["experts"]);
        return 0;
    };
}

}  // namespace strata::cli
