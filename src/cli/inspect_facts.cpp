// Collects what `strata inspect` shows: file layout, architecture and hyperparameters, tokenizer summary, every
// metadata key (long values summarised), the tensor table, totals by type and role, and routed-expert sizes.
#include "cli/inspect_facts.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "core/error.h"
#include "format/gguf.h"
#include "model/tensor_role.h"

namespace strata {

using json = nlohmann::ordered_json;

namespace {

constexpr uint64_t k_full_array = 16;  // arrays up to this many elements are shown whole
constexpr uint64_t k_array_head = 8;   // longer ones: this many first elements
constexpr size_t k_full_string = 256;  // longer strings: their length and a prefix of this many bytes

// The shortest decimal that reads back as the same float, so 1e-06f shows as 1e-06 and not 9.99999997e-07.
double shortest_f32(double v) {
    if (!std::isfinite(v)) return v;
    for (int digits = 1; digits <= 9; digits++) {
        double d = std::strtod(strfmt("%.*g", digits, v).c_str(), nullptr);
        if (float(d) == float(v)) return d;
    }
    return v;
}

// A prefix of at most n bytes that does not cut a UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t n) {
    if (s.size() <= n) return s;
    while (n > 0 && (uint8_t(s[n]) & 0xc0) == 0x80) n--;
    return s.substr(0, n);
}

json scalar(const GgufValue &v) {
    switch (v.type) {
        case GgufType::U8:
        case GgufType::U16:
        case GgufType::U32:
        case GgufType::U64:
            return v.u;
        case GgufType::I8:
        case GgufType::I16:
        case GgufType::I32:
        case GgufType::I64:
            return v.i;
        case GgufType::F32:
            return shortest_f32(v.f);
        case GgufType::F64:
            return std::isfinite(v.f) ? json(v.f) : json(strfmt("%g", v.f));
        case GgufType::BOOL:
            return v.u != 0;
        case GgufType::STRING:
            return std::string(utf8_prefix(v.str, k_full_string));
        case GgufType::ARRAY:
            break;
    }
    STRATA_ASSERT(false);
    return nullptr;
}

json array_element(std::string_view key, const GgufValue &v, uint64_t i) {
    if (v.elem_type == GgufType::STRING) return std::string(utf8_prefix(v.array_strs[i], k_full_string));
    if (v.elem_type == GgufType::BOOL) return v.array_data[i] != 0;
    if (v.elem_type == GgufType::F32) return shortest_f32(v.float_at(key, i));
    if (v.elem_type == GgufType::F64) return v.float_at(key, i);
    if (v.elem_type == GgufType::U64) {
        uint64_t x;
        std::memcpy(&x, v.array_data + 8 * i, 8);
        return x;
    }
    return v.int_at(key, i);
}

// {"type", ["elem_type", "count"], "value", ["truncated"]}: whole when short, otherwise the first elements.
json value_summary(std::string_view key, const GgufValue &v) {
    json j;
    j["type"] = gguf_type_name(v.type);
    if (v.type == GgufType::STRING) {
        j["value"] = scalar(v);
        if (v.str.size() > k_full_string) {
            j["bytes"] = v.str.size();
            j["truncated"] = true;
        }
        return j;
    }
    if (v.type != GgufType::ARRAY) {
        j["value"] = scalar(v);
        return j;
    }
    j["elem_type"] = gguf_type_name(v.elem_type);
    j["count"] = v.count;
    uint64_t shown = v.count <= k_full_array ? v.count : k_array_head;
    json items = json::array();
    for (uint64_t i = 0; i < shown; i++) items.push_back(array_element(key, v, i));
    j["value"] = std::move(items);
    if (shown < v.count) j["truncated"] = true;
    return j;
}

json file_facts(const GgufFile &f) {
    uint64_t tensor_bytes = 0;
    for (const GgufTensor &t : f.tensors()) tensor_bytes += t.n_bytes;
    json j;
    j["path"] = f.path();
    j["size_bytes"] = f.file_size();
    j["version"] = f.version();
    j["alignment"] = f.alignment();
    j["data_offset"] = f.data_offset();
    j["n_kv"] = f.kvs().size();
    j["n_tensors"] = f.tensors().size();
    j["tensor_bytes"] = tensor_bytes;
    return j;
}

const char *gating_name(uint64_t v) {
    return v == 1 ? "softmax" : v == 2 ? "sigmoid" : nullptr;
}

// The {arch}.* keys, prefix removed; short arrays whole.
json hyperparameters(const GgufFile &f, const std::string &arch) {
    json j = json::object();
    if (arch.empty()) return j;
    std::string prefix = arch + ".";
    for (const GgufKV &kv : f.kvs()) {
        if (kv.key.substr(0, prefix.size()) != prefix) continue;
        std::string name(kv.key.substr(prefix.size()));
        json s = value_summary(kv.key, kv.value);
        if (kv.value.type == GgufType::ARRAY && !s.contains("truncated")) {
            j[name] = s["value"];
        } else if (kv.value.type == GgufType::ARRAY) {
            j[name] = s;
        } else {
            j[name] = s["value"];
        }
        if (name == "expert_gating_func" && kv.value.type != GgufType::ARRAY && kv.value.type != GgufType::STRING &&
            gating_name(kv.value.as_uint(kv.key)))
            j[name] = strfmt("%" PRIu64 " (%s)", kv.value.as_uint(kv.key), gating_name(kv.value.as_uint(kv.key)));
    }
    return j;
}

json tokenizer_facts(const GgufFile &f) {
    json j = json::object();
    auto str = [&](const char *key) -> json {
        const GgufValue *v = f.find(key);
        return v && v->type == GgufType::STRING ? json(std::string(v->str)) : json(nullptr);
    };
    j["model"] = str("tokenizer.ggml.model");
    j["pre"] = str("tokenizer.ggml.pre");
    const GgufValue *tokens = f.find("tokenizer.ggml.tokens");
    const std::vector<std::string_view> *toks = nullptr;
    if (tokens && tokens->type == GgufType::ARRAY && tokens->elem_type == GgufType::STRING) toks = &tokens->array_strs;
    j["vocab_size"] = toks ? json(toks->size()) : json(nullptr);
    const GgufValue *merges = f.find("tokenizer.ggml.merges");
    j["n_merges"] = merges && merges->type == GgufType::ARRAY ? json(merges->count) : json(nullptr);

    json special = json::object();
    for (const char *which : {"bos", "eos", "eot", "eom", "unknown", "padding"}) {
        std::string key = strfmt("tokenizer.ggml.%s_token_id", which);
        const GgufValue *v = f.find(key);
        if (v == nullptr || v->type == GgufType::ARRAY || v->type == GgufType::STRING) continue;
        json t;
        uint64_t id = v->as_uint(key);
        t["id"] = id;
        t["text"] =
            toks && id < toks->size() ? json(std::string(utf8_prefix((*toks)[id], k_full_string))) : json(nullptr);
        special[which] = std::move(t);
    }
    j["special_tokens"] = std::move(special);
    for (const char *which : {"add_bos_token", "add_eos_token"}) {
        const GgufValue *v = f.find(std::string("tokenizer.ggml.") + which);
        j[std::string(which).substr(0, 7)] = v && v->type == GgufType::BOOL ? json(v->u != 0) : json(nullptr);
    }
    const GgufValue *tmpl = f.find("tokenizer.chat_template");
    json ct;
    bool present = tmpl != nullptr && tmpl->type == GgufType::STRING;
    ct["present"] = present;
    if (present) ct["bytes"] = tmpl->str.size();
    json named = json::array();  // tokenizer.chat_template.<name>: extra templates (tool use, RAG)
    for (const GgufKV &kv : f.kvs())
        if (kv.key.substr(0, 24) == "tokenizer.chat_template.") named.push_back(std::string(kv.key.substr(24)));
    ct["named"] = std::move(named);
    j["chat_template"] = std::move(ct);
    return j;
}

// Per layer: every *_exps tensor (weights and biases: streaming one expert needs all of them), summed, and divided
// by the expert count.
json expert_facts(const GgufFile &f, const std::string &arch, const TensorRoleContext &ctx) {
    std::map<int, std::pair<uint64_t, json>> layers;  // il -> (bytes, tensor names)
    int64_t n_expert_from_shape = 0;
    for (const GgufTensor &t : f.tensors()) {
        std::string_view rest;
        int il = tensor_layer(t.name, &rest);
        std::string_view base = rest.substr(0, rest.find('.'));
        if (il < 0 || base.size() < 5 || base.substr(base.size() - 5) != "_exps") continue;
        auto &[bytes, names] = layers[il];
        bytes += t.n_bytes;
        names.push_back(std::string(t.name));
        if (n_expert_from_shape == 0) n_expert_from_shape = t.ne[t.n_dims - 1];
    }
    if (layers.empty()) return nullptr;
    json j;
    const GgufValue *count = arch.empty() ? nullptr : f.find(arch + ".expert_count");
    uint64_t n_expert = count && count->type != GgufType::ARRAY && count->type != GgufType::STRING
                            ? count->as_uint(arch + ".expert_count")
                            : uint64_t(n_expert_from_shape);
    j["n_expert"] = n_expert;
    j["n_expert_source"] = count ? arch + ".expert_count" : std::string("shape of the first *_exps tensor");
    const GgufValue *used = arch.empty() ? nullptr : f.find(arch + ".expert_used_count");
    j["n_expert_used"] = used && used->type != GgufType::ARRAY && used->type != GgufType::STRING
                             ? json(used->as_uint(arch + ".expert_used_count"))
                             : json(nullptr);
    json per_layer = json::array();
    uint64_t total = 0, per_expert_min = UINT64_MAX, per_expert_max = 0;
    for (auto &[il, entry] : layers) {
        json l;
        l["layer"] = il;
        l["mtp"] = ctx.n_trunk_layers >= 0 && il >= ctx.n_trunk_layers;
        l["bytes"] = entry.first;
        l["bytes_per_expert"] = n_expert ? entry.first / n_expert : 0;
        if (n_expert && entry.first % n_expert) l["uneven"] = true;  // slices of different sizes: worth a look
        l["tensors"] = std::move(entry.second);
        total += entry.first;
        per_expert_min = std::min(per_expert_min, l["bytes_per_expert"].get<uint64_t>());
        per_expert_max = std::max(per_expert_max, l["bytes_per_expert"].get<uint64_t>());
        per_layer.push_back(std::move(l));
    }
    j["n_layers"] = layers.size();
    j["bytes"] = total;
    j["bytes_per_expert_min"] = per_expert_min;  // over layers: quantization mixes can differ by layer
    j["bytes_per_expert_max"] = per_expert_max;
    j["layers"] = std::move(per_layer);
    return j;
}

json tensor_table_and_totals(const GgufFile &f, const TensorRoleContext &ctx, json &totals) {
    json table = json::array();
    std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (count, bytes)
    std::pair<uint64_t, uint64_t> by_role[k_tensor_role_count] = {};
    for (const GgufTensor &t : f.tensors()) {
        TensorClass c = classify_tensor(t.name, ctx);
        json row;
        row["name"] = std::string(t.name);
        row["type"] = dtype_name(t.type);
        row["shape"] = std::vector<int64_t>(t.ne, t.ne + t.n_dims);
        row["bytes"] = t.n_bytes;
        row["offset"] = t.offset;
        row["role"] = tensor_role_name(c.role);
        row["layer"] = c.layer >= 0 ? json(c.layer) : json(nullptr);
        table.push_back(std::move(row));
        auto &ty = by_type[dtype_name(t.type)];
        ty.first++;
        ty.second += t.n_bytes;
        by_role[int(c.role)].first++;
        by_role[int(c.role)].second += t.n_bytes;
    }
    json types = json::object(), roles = json::object();
    for (auto &[name, cb] : by_type) types[name] = {{"tensors", cb.first}, {"bytes", cb.second}};
    for (int r = 0; r < k_tensor_role_count; r++)
        if (by_role[r].first)
            roles[tensor_role_name(TensorRole(r))] = {{"tensors", by_role[r].first}, {"bytes", by_role[r].second}};
    totals["by_type"] = std::move(types);
    totals["by_role"] = std::move(roles);
    return table;
}

}  // namespace

json inspect_facts(const GgufFile &f) {
    std::string arch(f.architecture());
    json j;
    j["file"] = file_facts(f);
    j["architecture"] = arch.empty() ? json(nullptr) : json(arch);
    const GgufValue *name = f.find("general.name");
    j["name"] = name && name->type == GgufType::STRING ? json(std::string(name->str)) : json(nullptr);
    j["hyperparameters"] = hyperparameters(f, arch);
    j["tokenizer"] = tokenizer_facts(f);
    json meta = json::array();
    for (const GgufKV &kv : f.kvs()) {
        json m;
        m["key"] = std::string(kv.key);
        m.update(value_summary(kv.key, kv.value));
        meta.push_back(std::move(m));
    }
    j["metadata"] = std::move(meta);
    TensorRoleContext ctx = tensor_role_context(f);
    json totals;
    j["tensors"] = tensor_table_and_totals(f, ctx, totals);
    j["totals"] = std::move(totals);
    j["experts"] = expert_facts(f, arch, ctx);
    return j;
}

}  // namespace strata
