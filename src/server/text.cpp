// Stop strings, chat output parsing (reasoning, tool calls) and protected prompt tokenization.
#include "server/text.h"

#include <algorithm>
#include <random>

#include "tokenizer/tokenizer.h"

namespace strata::server {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
    return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string random_call_id() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id = "call_";
    for (int i = 0; i < 24; i++) id += alphabet[rng() % (sizeof(alphabet) - 1)];
    return id;
}

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>", kToolClose = "</tool_call>";

}  // namespace

size_t partial_suffix(std::string_view text, std::string_view marker) {
    const size_t max = std::min(text.size(), marker.size() - (marker.empty() ? 0 : 1));
    for (size_t n = max; n > 0; n--)
        if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
    return 0;
}

// ---- StopMatcher ---------------------------------------------------------------------------------------------

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (std::string &s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
    if (stopped_) return {};
    held_.append(text);
    size_t first = std::string::npos;
    for (const std::string &s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    size_t keep = 0;
    for (const std::string &s : stops_) keep = std::max(keep, partial_suffix(held_, s));
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopMatcher::flush() {
    if (stopped_) return {};
    return std::exchange(held_, {});
}

// ---- tool calls --------------------------------------------------------------------------------------------------

namespace {

// The JSON-schema type(s) of a tool's parameter: empty when the tools say nothing about it.
std::vector<std::string> param_types(const nlohmann::ordered_json &tools, const std::string &fn, const std::string &param) {
    std::vector<std::string> out;
    if (!tools.is_array()) return out;
    for (const auto &t : tools) {
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
        const auto &f = t["function"];
        if (!f.contains("name") || f["name"] != fn) continue;
        if (!f.contains("parameters") || !f["parameters"].is_object()) return out;
        const auto &p = f["parameters"];
        if (!p.contains("properties") || !p["properties"].is_object() || !p["properties"].contains(param)) return out;
        const auto &prop = p["properties"][param];
        if (!prop.is_object() || !prop.contains("type")) return out;
        const auto &ty = prop["type"];
        if (ty.is_string()) out.push_back(ty.get<std::string>());
        else if (ty.is_array())
            for (const auto &x : ty)
                if (x.is_string()) out.push_back(x.get<std::string>());
        return out;
    }
    return out;
}

bool parse_xml_function(std::string_view s, const nlohmann::ordered_json &tools, ToolCall &out) {
    constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kP = "<parameter=", kPEnd = "</parameter>";
    if (!starts_with(s, kFn)) return false;
    s.remove_prefix(kFn.size());
    const size_t gt = s.find('>');
    if (gt == std::string_view::npos) return false;
    std::string name(trim(s.substr(0, gt)));
    if (name.empty()) return false;
    s.remove_prefix(gt + 1);
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    for (;;) {
        s = trim(s);
        if (s.empty() || starts_with(s, kFnEnd)) break;
        if (!starts_with(s, kP)) return false;
        s.remove_prefix(kP.size());
        const size_t pgt = s.find('>');
        if (pgt == std::string_view::npos) return false;
        std::string pname(trim(s.substr(0, pgt)));
        if (pname.empty()) return false;
        s.remove_prefix(pgt + 1);
        size_t end = s.find(kPEnd), skip = kPEnd.size();
        if (end == std::string_view::npos) {  // tolerate a missing close tag: up to the next tag
            end = std::min({s.find(kP), s.find(kFnEnd), s.size()});
            skip = 0;
        }
        std::string_view raw = s.substr(0, end);
        s.remove_prefix(end + skip);
        if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
        if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
        std::vector<std::string> types = param_types(tools, name, pname);
        const bool as_string = types.empty() || std::find(types.begin(), types.end(), "string") != types.end();
        nlohmann::ordered_json v;
        if (!as_string) v = nlohmann::ordered_json::parse(raw, nullptr, false);
        if (as_string || v.is_discarded()) v = std::string(raw);
        args[pname] = std::move(v);
    }
    out.name = std::move(name);
    out.arguments = args.dump();
    return true;
}

}  // namespace

bool parse_tool_call(std::string_view body, const nlohmann::ordered_json &tools, ToolCall &out) {
    body = trim(body);
    if (starts_with(body, "<function=")) {
        if (!parse_xml_function(body, tools, out)) return false;
    } else {
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
        out.name = j["name"].get<std::string>();
        if (out.name.empty()) return false;
        const char *key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
        if (!key || j[key].is_null()) out.arguments = "{}";
        else if (j[key].is_string()) out.arguments = j[key].get<std::string>();
        else out.arguments = j[key].dump();
    }
    out.id = random_call_id();
    return true;
}

// ---- ChatOutputParser --------------------------------------------------------------------------------------------

ChatOutputParser::ChatOutputParser(Options o) : opt_(std::move(o)) {
    state_ = opt_.reasoning && opt_.starts_in_reasoning ? State::Reasoning : State::Content;
}

ChatOutputParser::Delta ChatOutputParser::push(std::string_view text) {
    Delta d;
    buf_.append(text);
    run(d, false);
    return d;
}

ChatOutputParser::Delta ChatOutputParser::finish() {
    Delta d;
    run(d, true);
    ws_held_.clear();  // trailing whitespace of the output is trimmed
    return d;
}

void ChatOutputParser::emit_text(Delta &d, std::string_view text, bool reasoning) {
    bool &started = reasoning ? reasoning_started_ : content_started_;
    if (!started) {
        while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
        if (text.empty()) return;
        started = true;
    }
    std::string all = ws_held_;
    all.append(text);
    size_t end = all.size();
    while (end > 0 && is_ws(all[end - 1])) end--;
    ws_held_ = all.substr(end);
    (reasoning ? d.reasoning : d.content).append(all, 0, end);
}

bool ChatOutputParser::finish_tool(Delta &d, std::string_view body) {
    ToolCall c;
    if (!parse_tool_call(body, opt_.tool_schemas, c)) return false;
    d.tool_calls.push_back(std::move(c));
    n_calls_++;
    return true;
}

void ChatOutputParser::run(Delta &d, bool final) {
    for (;;) {
        if (state_ == State::Reasoning) {
            const size_t i = buf_.find(kThinkClose);
            if (i != std::string::npos) {
                emit_text(d, std::string_view(buf_).substr(0, i), true);
                ws_held_.clear();
                buf_.erase(0, i + kThinkClose.size());
                state_ = State::Content;
                continue;
            }
            const size_t keep = final ? 0 : partial_suffix(buf_, kThinkClose);
            emit_text(d, std::string_view(buf_).substr(0, buf_.size() - keep), true);
            buf_.erase(0, buf_.size() - keep);
            return;
        }
        if (state_ == State::Content) {
            const bool think_ok = opt_.reasoning && !content_started_ && !reasoning_started_ && n_calls_ == 0;
            size_t i_think = think_ok ? buf_.find(kThinkOpen) : std::string::npos;
            size_t i_tool = opt_.tools ? buf_.find(kToolOpen) : std::string::npos;
            // <think> counts only at the start of the output (nothing visible before it).
            if (i_think != std::string::npos && !trim(std::string_view(buf_).substr(0, i_think)).empty())
                i_think = std::string::npos;
            if (i_think != std::string::npos && i_think < i_tool) {
                buf_.erase(0, i_think + kThinkOpen.size());
                ws_held_.clear();
                state_ = State::Reasoning;
                continue;
            }
            if (i_tool != std::string::npos) {
                emit_text(d, std::string_view(buf_).substr(0, i_tool), false);
                ws_before_tool_ = std::exchange(ws_held_, {});  // whitespace before a tool call is layout
                buf_.erase(0, i_tool + kToolOpen.size());
                state_ = State::Tool;
                continue;
            }
            size_t keep = 0;
            if (!final) {
                if (think_ok) keep = std::max(keep, partial_suffix(buf_, kThinkOpen));
                if (opt_.tools) keep = std::max(keep, partial_suffix(buf_, kToolOpen));
            }
            emit_text(d, std::string_view(buf_).substr(0, buf_.size() - keep), false);
            buf_.erase(0, buf_.size() - keep);
            return;
        }
        // State::Tool
        const size_t i = buf_.find(kToolClose);
        if (i != std::string::npos) {
            std::string body = buf_.substr(0, i);
            buf_.erase(0, i + kToolClose.size());
            state_ = State::Content;
            if (!finish_tool(d, body)) {
                ws_held_ = ws_before_tool_;
                emit_text(d, std::string(kToolOpen) + body + std::string(kToolClose), false);
            }
            continue;
        }
        if (final) {  // the output ended inside a block: a complete call is still a call
            std::string body = std::exchange(buf_, {});
            state_ = State::Content;
            if (!finish_tool(d, body)) {
                ws_held_ = ws_before_tool_;
                emit_text(d, std::string(kToolOpen) + body, false);
            }
        }
        return;
    }
}

bool prompt_opens_reasoning(std::string_view rendered) {
    const size_t open = rendered.rfind(kThinkOpen);
    if (open == std::string_view::npos) return false;
    return rendered.find(kThinkClose, open) == std::string_view::npos;
}

// ---- PromptEncoder -----------------------------------------------------------------------------------------------

namespace {
constexpr std::string_view kMark = "\xEE\x80\x80", kMarkEnd = "\xEE\x80\x81";  // U+E000, U+E001
}

PromptEncoder::PromptEncoder(const Tokenizer &tok) : tok_(tok) {
    for (int32_t id = 0; id < tok.n_vocab(); id++)
        if (tok.is_control(id)) {
            std::string s = tok.token_text(id);
            if (!s.empty()) controls_.push_back(std::move(s));
        }
    controls_.push_back(std::string(kMark));
    std::sort(controls_.begin(), controls_.end(),
              [](const std::string &a, const std::string &b) { return a.size() > b.size(); });
}

std::string PromptEncoder::protect(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
        const std::string *hit = nullptr;
        for (const std::string &c : controls_)
            if (text[i] == c[0] && text.compare(i, c.size(), c) == 0) {
                hit = &c;
                break;
            }
        if (!hit) {
            out += text[i++];
            continue;
        }
        out.append(kMark);
        out += std::to_string(originals_.size());
        out.append(kMarkEnd);
        originals_.push_back(*hit);
        i += hit->size();
    }
    return out;
}

std::vector<int32_t> PromptEncoder::encode(std::string_view rendered, bool add_special) const {
    std::vector<int32_t> ids;
    bool first = true;
    auto text_piece = [&](std::string_view piece) {
        if (piece.empty()) return;
        tok_.encode(piece, add_special && first, /*parse_special=*/true, ids);
        first = false;
    };
    size_t i = 0;
    while (i < rendered.size()) {
        const size_t m = originals_.empty() ? std::string_view::npos : rendered.find(kMark, i);
        if (m == std::string_view::npos) {
            text_piece(rendered.substr(i));
            break;
        }
        const size_t e = rendered.find(kMarkEnd, m + kMark.size());
        size_t idx = originals_.size();
        if (e != std::string_view::npos) {
            std::string_view num = rendered.substr(m + kMark.size(), e - m - kMark.size());
            if (!num.empty() && num.size() < 10 && std::all_of(num.begin(), num.end(), ::isdigit))
                idx = size_t(std::stoul(std::string(num)));
        }
        if (idx >= originals_.size()) {  // not ours (cannot happen for protected text): keep it as text
            text_piece(rendered.substr(i, m + kMark.size() - i));
            i = m + kMark.size();
            continue;
        }
        text_piece(rendered.substr(i, m - i));
        tok_.encode(originals_[idx], add_special && first, /*parse_special=*/false, ids);
        first = false;
        i = e + kMarkEnd.size();
    }
    return ids;
}

}  // namespace strata::server
