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

// How a chat template's model writes a call inside <tool_call>: Qwen3-Coder's and Qwen3.5's XML functions when the
// template writes "<function=", Qwen3's JSON object otherwise.
enum class ToolFormat { Json, Xml };
ToolFormat tool_format_of(std::string_view chat_template);

// The start of a call's body (the text after <tool_call>) that the prompt writes when tool_choice forces a call: up
// to where the function's name goes when the model is to choose it (`name` empty), else through the name to where
// the arguments begin.
std::string forced_call_opening(ToolFormat format, const std::string &name);

// A piece of a tool call as it streams, in OpenAI's streaming shape: a call's first piece carries its id and name,
// later pieces only text to append to its arguments.
struct ToolCallDelta {
    size_t index = 0;       // the call's place among the reply's calls
    std::string id, name;   // the first piece only
    std::string arguments;  // appended to the call's arguments
};

// Splits a chat model's streamed output into reasoning (<think>...</think>), content and tool calls
// (<tool_call>...</tool_call>). Whitespace around the parts is trimmed, as the Qwen templates write it. Text that may
// be the start of a marker is held back until it is decided.
//
// A tool call block streams as a call as soon as its opening names the function: `{"name": "NAME", "arguments": `
// (or "parameters", Qwen3) or `<function=NAME>` (Qwen3-Coder, Qwen3.5). The arguments then follow as written: the JSON
// value after "arguments" (up to where it ends; a string value stands for its text), or the XML parameters as a JSON
// object, one parameter at a time (typed by the tool's schema). Once the call has begun it stays a call, whatever
// follows: arguments the model left unfinished are returned as it wrote them (not necessarily valid JSON, as OpenAI
// warns of its own models), empty arguments as {}, and text in the block that is not a parameter is dropped. A block
// that opens some other way is parsed whole when it closes (parse_tool_call); if that fails it stays in the content
// as written.
class ChatOutputParser {
public:
    struct Options {
        bool reasoning = true;           // split out <think> blocks (else they stay in the content)
        bool starts_in_reasoning = false;  // the prompt opened <think>: the output begins inside it
        bool tools = false;              // parse tool calls (else they stay in the content)
        nlohmann::ordered_json tool_schemas = nlohmann::ordered_json::array();  // the request's tools, for typing XML parameters
        // The prompt already wrote `<tool_call>` and this start of its body (tool_choice forcing a call): the output
        // continues that block. Empty: none.
        std::string forced_opening;
    };
    struct Delta {
        std::string reasoning, content;
        std::vector<ToolCallDelta> tool_calls;
        bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
    };

    explicit ChatOutputParser(Options o);
    Delta push(std::string_view text);
    Delta finish();  // the end of the output
    int n_tool_calls() const { return n_calls_; }

private:
    enum class State { Reasoning, Content, Tool };
    // How far the current tool block has been read: its opening, the arguments of a call it began, the rest of it
    // (ignored), or all of it at once when it did not open as a call.
    enum class Block { Opening, JsonArgs, XmlParams, Rest, Whole };
    void run(Delta &d, bool final);
    void emit_text(Delta &d, std::string_view text, bool reasoning);
    void read_block(Delta &d, bool complete);
    void end_block(Delta &d, bool closed);
    void start_call(Delta &d, const std::string &name, const std::string &arguments);
    void add_arguments(Delta &d, std::string_view text);
    void read_json_args(Delta &d, bool complete);
    void read_xml_params(Delta &d, bool complete);

    Options opt_;
    State state_;
    std::string buf_;                 // undecided text
    std::string ws_held_;             // whitespace held back at the end of the reasoning or content so far
    std::string ws_before_tool_;      // the whitespace before an open tool block: kept if the block is not a call
    bool reasoning_started_ = false;  // leading whitespace is dropped until the first visible character
    bool content_started_ = false;
    int n_calls_ = 0;

    // The open tool block.
    Block block_ = Block::Opening;
    std::string body_;           // its text so far (after <tool_call>)
    size_t body_pos_ = 0;        // how much of body_ the call has taken
    size_t args_size_ = 0;       // bytes of arguments the call has sent
    std::string call_name_;      // the function the block calls (for typing XML parameters)
    size_t n_params_ = 0;        // XML parameters sent
    // The JSON arguments value being read: not begun, an object or array (open brackets, inside a string of it,
    // after a backslash there), or a scalar.
    enum class JsonValue { NotBegun, Nested, Scalar };
    JsonValue json_value_ = JsonValue::NotBegun;
    int json_depth_ = 0;
    bool json_in_string_ = false, json_escape_ = false;
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
    // The rendered text with the placeholders put back as the text they stand for (what the template wrote, as text).
    std::string unprotect(std::string_view rendered) const;

private:
    const Tokenizer &tok_;
    std::vector<std::string> controls_;   // spellings of the control tokens, longest first
    std::vector<std::string> originals_;  // placeholder index -> the text it stands for
};

}  // namespace strata::server
