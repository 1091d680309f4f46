// Text-side pieces of the server that need no model: stop strings over streamed text, the split of a chat model's
// output into reasoning, content and tool calls (Qwen3 `<tool_call>` JSON and Qwen3-Coder XML functions), and the
// tokenization of a rendered chat prompt that keeps message text from forging control tokens.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace strata {
class Tokenizer;
}

namespace strata::server {

// Finds stop strings in text that arrives in pieces. push() returns the text that is safe to emit: text that could
// still turn out to be the start of a stop string is held back until it is decided. Once a stop string appears, the
// text before it is returned, the rest is dropped and stopped() is true.
class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops);
    std::string push(std::string_view text);
    std::string flush();  // the end of the text: whatever is held back
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool stopped_ = false;
};

// The length of the longest suffix of `text` that is a proper prefix of `marker` (a marker that may be completed by
// text still to come).
size_t partial_suffix(std::string_view text, std::string_view marker);

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // a JSON text, as OpenAI returns it
};

// Parses one tool call block's body (the text between <tool_call> and </tool_call>): a JSON object with "name" and
// "arguments" (Qwen3, Qwen3.5), or <function=NAME><parameter=P>value</parameter>...</function> (Qwen3-Coder), whose
// values are typed by the tool's JSON schema in `tools` (an OpenAI tools array; strings when it says nothing).
// Returns false when the body is neither.
bool parse_tool_call(std::string_view body, const nlohmann::ordered_json &tools, ToolCall &out);

// Splits a chat model's streamed output into reasoning (<think>...</think>), content and tool calls
// (<tool_call>...</tool_call>). Whitespace around the parts is trimmed, as the Qwen templates write it. Text that may
// be the start of a marker is held back until it is decided; a tool call comes out whole when its block closes. A
// block that does not parse stays in the content as written.
class ChatOutputParser {
public:
    struct Options {
        bool reasoning = true;           // split out <think> blocks (else they stay in the content)
        bool starts_in_reasoning = false;  // the prompt opened <think>: the output begins inside it
        bool tools = false;              // parse tool calls (else they stay in the content)
        nlohmann::ordered_json tool_schemas = nlohmann::ordered_json::array();  // the request's tools, for typing XML parameters
    };
    struct Delta {
        std::string reasoning, content;
        std::vector<ToolCall> tool_calls;
        bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
    };

    explicit ChatOutputParser(Options o);
    Delta push(std::string_view text);
    Delta finish();  // the end of the output
    int n_tool_calls() const { return n_calls_; }

private:
    enum class State { Start, Reasoning, Content, Tool };
    void run(Delta &d, bool final);
    void emit_text(Delta &d, std::string_view text, bool reasoning);
    bool finish_tool(Delta &d, std::string_view body);

    Options opt_;
    State state_;
    std::string buf_;                 // undecided text
    std::string ws_held_;             // whitespace held back at the end of the reasoning or content so far
    std::string ws_before_tool_;      // the whitespace before an open tool block: kept if the block is not a call
    bool reasoning_started_ = false;  // leading whitespace is dropped until the first visible character
    bool content_started_ = false;
    int n_calls_ = 0;
};

// Whether a rendered chat prompt leaves the model inside a reasoning block (it ends with an unclosed <think>).
bool prompt_opens_reasoning(std::string_view rendered);

// Tokenization of a rendered chat prompt where the control tokens the template wrote become control tokens but
// control-token text inside messages stays plain text. Callers mark message text with protect() before rendering
// and tokenize the rendered text with encode(); protect() replaces every control token's spelling (and the marker
// character itself) with a placeholder that encode() tokenizes back as plain text.
class PromptEncoder {
public:
    explicit PromptEncoder(const Tokenizer &tok);
    std::string protect(std::string_view text);
    std::vector<int32_t> encode(std::string_view rendered, bool add_special) const;

private:
    const Tokenizer &tok_;
    std::vector<std::string> controls_;   // spellings of the control tokens, longest first
    std::vector<std::string> originals_;  // placeholder index -> the text it stands for
};

}  // namespace strata::server
