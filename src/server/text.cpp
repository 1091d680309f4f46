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

// Compact JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string json_text(const nlohmann::ordered_json &j) {
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
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

// An XML parameter's value as JSON: typed by the tool's schema (a string where the schema says nothing or allows
// strings, or where the text is not JSON). One newline on each side is layout.
nlohmann::ordered_json xml_param_value(const nlohmann::ordered_json &tools, const std::string &fn,
                                       const std::string &param, std::string_view raw) {
    if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
    if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
    const std::vector<std::string> types = param_types(tools, fn, param);
    if (types.empty() || std::find(types.begin(), types.end(), "string") != types.end()) return std::string(raw);
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(raw, nullptr, false);
    return v.is_discarded() ? nlohmann::ordered_json(std::string(raw)) : v;
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
        args[pname] = xml_param_value(tools, name, pname, s.substr(0, end));
        s.remove_prefix(end + skip);
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

ToolFormat tool_format_of(std::string_view chat_template) {
    return chat_template.find("<function=") != std::string_view::npos ? ToolFormat::Xml : ToolFormat::Json;
}

std::string forced_call_opening(ToolFormat format, const std::string &name) {
    if (format == ToolFormat::Xml) return "\n<function=" + (name.empty() ? std::string() : name + ">\n");
    // As the Qwen3 template writes calls: {"name": "NAME", "arguments": {...}}
    if (name.empty()) return "\n{\"name\": \"";
    return "\n{\"name\": " + json_text(name) + ", \"arguments\": ";
}

// ---- ChatOutputParser --------------------------------------------------------------------------------------------

namespace {

constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>", kFunctionEnd = "</function>";

enum class Match { yes, more, no };  // `more`: the text ends before it is decided

// A tool block's opening that names the function.
struct Opening {
    std::string name;
    size_t end = 0;              // where the arguments begin
    bool xml = false;            // <function=NAME> (else the JSON object)
    bool has_arguments = true;   // JSON: false for {"name": "f"}
};

// Text read against an expected form, one piece after another.
struct Cursor {
    std::string_view s;
    size_t i = 0;
    void skip_ws() {
        while (i < s.size() && is_ws(s[i])) i++;
    }
    bool at_end() const { return i >= s.size(); }
    Match lit(std::string_view t) {
        const size_t n = std::min(t.size(), s.size() - i);
        if (s.substr(i, n) != t.substr(0, n)) return Match::no;
        if (n < t.size()) return Match::more;
        i += n;
        return Match::yes;
    }
};

// The end (past the closing quote) of the JSON string literal that s starts with; npos while it is unfinished.
size_t string_end(std::string_view s) {
    for (size_t i = 1; i < s.size(); i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return std::string_view::npos;
}

// {"name": "NAME", "arguments": (or "parameters") — or {"name": "NAME"} with no arguments.
Match match_json_opening(std::string_view s, Opening &o) {
    Cursor c{s};
    for (std::string_view t : {"{", "\"name\"", ":"}) {
        c.skip_ws();
        if (const Match m = c.lit(t); m != Match::yes) return m;
    }
    c.skip_ws();
    if (c.at_end()) return Match::more;
    if (s[c.i] != '"') return Match::no;
    const size_t end = string_end(s.substr(c.i));
    if (end == std::string_view::npos) return Match::more;
    const nlohmann::ordered_json name = nlohmann::ordered_json::parse(s.substr(c.i, end), nullptr, false);
    if (name.is_discarded() || !name.is_string() || name.get<std::string>().empty()) return Match::no;
    o.name = name.get<std::string>();
    c.i += end;
    c.skip_ws();
    if (c.at_end()) return Match::more;
    if (s[c.i] == '}') {
        o.has_arguments = false;
        o.end = c.i + 1;
        return Match::yes;
    }
    if (s[c.i] != ',') return Match::no;
    c.i++;
    c.skip_ws();
    Match key = c.lit("\"arguments\"");
    if (key == Match::no) key = c.lit("\"parameters\"");
    if (key != Match::yes) return key;
    c.skip_ws();
    if (const Match m = c.lit(":"); m != Match::yes) return m;
    o.end = c.i;
    return Match::yes;
}

// <function=NAME>, the name on one line.
Match match_xml_opening(std::string_view s, Opening &o) {
    Cursor c{s};
    c.skip_ws();
    if (const Match m = c.lit("<function="); m != Match::yes) return m;
    const size_t gt = s.find('>', c.i), stray = s.find_first_of("<\n", c.i);
    if (stray < gt) return Match::no;
    if (gt == std::string_view::npos) return Match::more;
    o.name = std::string(trim(s.substr(c.i, gt - c.i)));
    if (o.name.empty()) return Match::no;
    o.xml = true;
    o.end = gt + 1;
    return Match::yes;
}

Match match_opening(std::string_view s, Opening &o) {
    const Match json = match_json_opening(s, o);
    return json != Match::no ? json : match_xml_opening(s, o);
}

}  // namespace

ChatOutputParser::ChatOutputParser(Options o) : opt_(std::move(o)) {
    state_ = opt_.reasoning && opt_.starts_in_reasoning ? State::Reasoning : State::Content;
    if (!opt_.forced_opening.empty()) {  // read as if the model had written it
        state_ = State::Tool;
        body_ = opt_.forced_opening;
    }
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

void ChatOutputParser::start_call(Delta &d, const std::string &name, const std::string &arguments) {
    ToolCallDelta c;
    c.index = size_t(n_calls_++);
    c.id = random_call_id();
    c.name = name;
    c.arguments = arguments;
    args_size_ = arguments.size();
    d.tool_calls.push_back(std::move(c));
}

void ChatOutputParser::add_arguments(Delta &d, std::string_view text) {
    if (text.empty()) return;
    args_size_ += text.size();
    const size_t index = size_t(n_calls_ - 1);
    if (d.tool_calls.empty() || d.tool_calls.back().index != index) d.tool_calls.push_back({index, {}, {}, {}});
    d.tool_calls.back().arguments.append(text);
}

void ChatOutputParser::read_json_args(Delta &d, bool complete) {
    std::string_view s = std::string_view(body_).substr(body_pos_);
    if (json_value_ == JsonValue::NotBegun) {
        const size_t lead = s.find_first_not_of(" \t\r\n");
        if (lead == std::string_view::npos) {
            body_pos_ = body_.size();
            return;
        }
        body_pos_ += lead;
        s.remove_prefix(lead);
        if (s.front() == '"') {  // arguments given as a JSON string: its text, once the string is whole
            const size_t end = string_end(s);
            if (end == std::string_view::npos && !complete) return;
            const std::string_view lit = s.substr(0, end);
            const nlohmann::ordered_json v = nlohmann::ordered_json::parse(lit, nullptr, false);
            add_arguments(d, v.is_string() ? v.get<std::string>() : std::string(lit));
            block_ = Block::Rest;
            return;
        }
        json_value_ = s.front() == '{' || s.front() == '[' ? JsonValue::Nested : JsonValue::Scalar;
    }
    // Send the value as it comes, up to where it ends: the bracket closing it, or for a scalar (or text that is
    // not JSON) the first whitespace, comma or closing bracket.
    size_t n = 0;
    bool ended = false;
    for (; n < s.size() && !ended; n++) {
        const char c = s[n];
        if (json_value_ == JsonValue::Scalar) {
            if (is_ws(c) || c == ',' || c == '}' || c == ']') {
                ended = true;
                break;
            }
        } else if (json_in_string_) {
            if (json_escape_) json_escape_ = false;
            else if (c == '\\') json_escape_ = true;
            else if (c == '"') json_in_string_ = false;
        } else if (c == '"') {
            json_in_string_ = true;
        } else if (c == '{' || c == '[') {
            json_depth_++;
        } else if ((c == '}' || c == ']') && --json_depth_ == 0) {
            ended = true;
        }
    }
    add_arguments(d, s.substr(0, n));
    body_pos_ += n;
    if (ended) block_ = Block::Rest;
}

void ChatOutputParser::read_xml_params(Delta &d, bool complete) {
    for (;;) {
        std::string_view s = std::string_view(body_).substr(body_pos_);
        const size_t lead = std::min(s.find_first_not_of(" \t\r\n"), s.size());  // layout between parameters
        body_pos_ += lead;
        s.remove_prefix(lead);
        if (s.empty()) return;
        if (starts_with(s, kFunctionEnd)) {
            block_ = Block::Rest;
            return;
        }
        if (starts_with(s, kParam)) {
            const size_t gt = s.find('>');
            if (gt == std::string_view::npos) {
                if (complete) block_ = Block::Rest;
                return;
            }
            const std::string pname(trim(s.substr(kParam.size(), gt - kParam.size())));
            const std::string_view rest = s.substr(gt + 1);
            size_t end = rest.find(kParamEnd), skip = kParamEnd.size();
            if (end == std::string_view::npos) {  // tolerate a missing close tag once the block is whole
                if (!complete) return;
                end = std::min({rest.find(kParam), rest.find(kFunctionEnd), rest.size()});
                skip = 0;
            }
            if (!pname.empty()) {
                const nlohmann::ordered_json v = xml_param_value(opt_.tool_schemas, call_name_, pname,
                                                                 rest.substr(0, end));
                add_arguments(d, (n_params_++ == 0 ? "{" : ",") + json_text(pname) + ":" + json_text(v));
            }
            body_pos_ += gt + 1 + end + skip;
            continue;
        }
        if (!complete && (starts_with(kParam, s) || starts_with(kFunctionEnd, s))) return;  // may become a tag
        const size_t next = s.find('<', 1);  // text that is not a parameter: dropped
        body_pos_ += next == std::string_view::npos ? s.size() : next;
    }
}

void ChatOutputParser::read_block(Delta &d, bool complete) {
    if (block_ == Block::Opening) {
        Opening o;
        const Match m = match_opening(body_, o);
        if (m == Match::more && !complete) return;
        if (m != Match::yes) {
            block_ = Block::Whole;
            return;
        }
        body_pos_ = o.end;
        call_name_ = o.name;
        start_call(d, o.name, {});
        block_ = o.xml ? Block::XmlParams : o.has_arguments ? Block::JsonArgs : Block::Rest;
    }
    if (block_ == Block::JsonArgs) read_json_args(d, complete);
    else if (block_ == Block::XmlParams) read_xml_params(d, complete);
}

void ChatOutputParser::end_block(Delta &d, bool closed) {
    if (block_ == Block::Whole) {
        ToolCall c;
        if (parse_tool_call(body_, opt_.tool_schemas, c)) {
            start_call(d, c.name, c.arguments);
        } else {
            ws_held_ = ws_before_tool_;
            emit_text(d, std::string(kToolOpen) + body_ + (closed ? std::string(kToolClose) : std::string()), false);
        }
    } else if (args_size_ == 0) {
        add_arguments(d, "{}");
    } else if (n_params_ > 0) {
        add_arguments(d, "}");  // the XML parameters' object
    }
    block_ = Block::Opening;
    body_.clear();
    body_pos_ = args_size_ = n_params_ = 0;
    call_name_.clear();
    json_value_ = JsonValue::NotBegun;
    json_depth_ = 0;
    json_in_string_ = json_escape_ = false;
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
        // State::Tool: the block's text goes to the call as it comes, less what may be the start of its close marker.
        const size_t i = buf_.find(kToolClose);
        const bool closed = i != std::string::npos;
        const size_t take = closed ? i : buf_.size() - (final ? 0 : partial_suffix(buf_, kToolClose));
        body_.append(buf_, 0, take);
        buf_.erase(0, closed ? i + kToolClose.size() : take);
        read_block(d, closed || final);
        if (!closed && !final) return;
        end_block(d, closed);  // an output that ends inside a block ends the block: a call is still a call
        state_ = State::Content;
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

std::string PromptEncoder::unprotect(std::string_view rendered) const {
    std::string out;
    size_t i = 0;
    while (i < rendered.size()) {
        const size_t m = originals_.empty() ? std::string_view::npos : rendered.find(kMark, i);
        if (m == std::string_view::npos) {
            out.append(rendered.substr(i));
            break;
        }
        const size_t e = rendered.find(kMarkEnd, m + kMark.size());
        size_t idx = originals_.size();
        if (e != std::string_view::npos) {
            std::string_view num = rendered.substr(m + kMark.size(), e - m - kMark.size());
            if (!num.empty() && num.size() < 10 && std::all_of(num.begin(), num.end(), ::isdigit))
                idx = size_t(std::stoul(std::string(num)));
        }
        if (idx >= originals_.size()) {
            out.append(rendered.substr(i, m + kMark.size() - i));
            i = m + kMark.size();
            continue;
        }
        out.append(rendered.substr(i, m - i));
        out += originals_[idx];
        i = e + kMarkEnd.size();
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
