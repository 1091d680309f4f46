// The OpenAI-compatible API without the transport: request bodies checked and turned into jobs, errors in OpenAI's
// shape, scheduler events turned into response bodies and streamed chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/constraint_fields.h"
#include "server/scheduler.h"
#include "server/text.h"

namespace strata {
class Tokenizer;
class ModelChat;
}  // namespace strata

namespace strata::server {

using ojson = nlohmann::ordered_json;

// A request that fails: HTTP status and OpenAI's error object {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
    int status;
    std::string type, param, code;
    ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {})
        : std::runtime_error(std::move(message)), status(status), type(std::move(type)), param(std::move(param)),
          code(std::move(code)) {}
};
ApiError invalid_request(std::string message, std::string param = {}, std::string code = {});
ojson error_body(const ApiError &e);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const ojson &j);

// The request body as a JSON object (400 when it is not JSON or not an object).
ojson parse_body(const std::string &body);

// What the two endpoints share.
struct CommonRequest {
    GenParams gen;
    bool stream = false;
    bool include_usage = false;
};

struct ChatRequest : CommonRequest {
    ojson messages = ojson::array();  // as the template sees them
    ojson tools;                      // null when there are none (or tool_choice is "none")
    bool parse_tools = false;
    // tool_choice "required" or a named function: the reply must be a call, to `forced_tool` when that is set (a
    // named function, or "required" with a single tool), else to a function the model chooses.
    bool force_tool_call = false;
    std::string forced_tool;
    bool logprobs = false;
    ojson template_kwargs = ojson::object();
    OutputFormat output_format;  // response_format / grammar: made a constraint by render_chat_prompt
};

struct CompletionRequest : CommonRequest {
    std::string prompt;              // text, when not given as token ids
    std::vector<int32_t> prompt_ids;  // token ids, when given so
    bool echo = false;
    int32_t logprobs = -1;            // -1: none
};

// Parse and check request bodies (unknown fields are ignored). Message text of system, developer, user and tool
// messages goes through `enc.protect` so it cannot forge control tokens. n_vocab bounds token ids (logit_bias,
// prompts given as ids).
ChatRequest parse_chat_request(const ojson &body, PromptEncoder &enc, int64_t n_vocab);
CompletionRequest parse_completion_request(const ojson &body, int64_t n_vocab);

// The 400 for a prompt that does not fit: names both lengths.
ApiError context_error(int64_t n_prompt, int64_t n_ctx, const char *param);

// Turns a job's events into the response: chunks for a stream, one body otherwise.
class Responder {
public:
    enum class Kind { Chat, Completion };
    Responder(Kind kind, std::string model, const Tokenizer &tok, bool stream, bool include_usage,
              int32_t top_logprobs, std::unique_ptr<ChatOutputParser> parser, std::string echo_prefix = {});

    // Streaming: the chunks this event adds (each one "data: ...\n\n" line's JSON); after Done, the usage chunk when
    // asked. Non-streaming: accumulates and returns nothing.
    std::vector<ojson> on_event(const Event &e);
    // Non-streaming: the whole response (after Done).
    ojson body() const;
    bool done() const { return done_; }

private:
    ojson chunk(ojson choice) const;
    void add_logprobs(const std::vector<TokenLogprob> &lp, size_t text_offset);
    ojson logprob_entry(const TokenLogprob &t) const;

    Kind kind_;
    std::string id_, model_;
    int64_t created_;
    const Tokenizer &tok_;
    bool stream_, include_usage_;
    int32_t top_logprobs_;
    std::unique_ptr<ChatOutputParser> parser_;
    bool sent_role_ = false, done_ = false;
    std::string text_, reasoning_;
    std::vector<ToolCall> calls_;
    ojson logprobs_;  // chat: array of entries; completion: {tokens, token_logprobs, top_logprobs, text_offset}
    std::string finish_;
    Usage usage_;
};

// The chat template's rendering of a request and the prompt's token ids. A forced tool call goes on after the
// generation prompt with the start of the call (closing a reasoning block the template opened: a forced call skips
// the reasoning), so the reply can only be that call; `forced_opening` is that start for the output parser.
// It also sets req.gen.constraint (response_format, grammar, strict tools), which depends on the template's
// tool-call format; a constraint over the whole reply closes a reasoning block the template opened, as a forced call
// does.
struct ChatPrompt {
    std::string text;
    std::vector<int32_t> ids;
    bool opens_reasoning = false;
    std::string forced_opening;  // the call's body so far (after <tool_call>); empty when no call is forced
};
ChatPrompt render_chat_prompt(const ModelChat &chat, ChatRequest &req, PromptEncoder &enc);

}  // namespace strata::server
