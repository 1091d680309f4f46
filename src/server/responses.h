// OpenAI's Responses API (/v1/responses) over the chat machinery: a request body becomes the equivalent chat
// completions body (instructions, input items, function tools), and a job's events become a response object, or
// the Responses stream of typed events (response.created ... response.completed). Nothing is stored:
// previous_response_id and store=true are refused.
#pragma once

#include <memory>
#include <string>

#include "server/endpoints.h"

namespace strata::server {

// The chat completions body for a Responses body; bad requests throw ApiError naming the Responses field.
ojson responses_to_chat(const ojson &body);
std::unique_ptr<Reply> make_responses_reply(const std::string &model, const ChatRequest &req,
                                            std::unique_ptr<ChatOutputParser> parser, int64_t n_prompt);

}  // namespace strata::server
