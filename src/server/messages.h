// Anthropic's Messages API (/v1/messages) over the chat machinery: a request body becomes the equivalent chat
// completions body (system, content blocks, tool_use and tool_result blocks, tools with input_schema, thinking), and
// a job's events become a message with thinking, text and tool_use blocks, or Anthropic's stream of events
// (message_start, content_block_start/delta/stop, message_delta, message_stop). Errors in Anthropic's shape.
#pragma once

#include <memory>
#include <string>

#include "server/endpoints.h"

namespace strata::server {

ojson messages_to_chat(const ojson &body);
std::unique_ptr<Reply> make_messages_reply(const std::string &model, const ChatRequest &req,
                                           std::unique_ptr<ChatOutputParser> parser, int64_t n_prompt);
// {"type": "error", "error": {"type", "message"}}, the type chosen by the status as Anthropic's API does.
ojson anthropic_error_body(const ApiError &e);

}  // namespace strata::server
