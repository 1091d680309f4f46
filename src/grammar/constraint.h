// What a request asks generation to follow, and the sampler constraint that enforces it: a grammar over the whole
// output, or one that starts where the output writes a trigger (a tool call's `<tool_call>`) and holds until the
// grammar is complete, after which the output is free again. Text inside a reasoning block (<think>...</think>)
// never triggers.
#pragma once

#include <memory>
#include <string>

#include "grammar/matcher.h"

namespace strata::grammar {

struct ConstraintSpec {
    std::shared_ptr<const Grammar> grammar;
    // Empty: the grammar holds from the first token to the end. Else: free text until this text appears, then the
    // grammar until it is complete (as many times as the output writes the trigger).
    std::string trigger;
    bool starts_in_reasoning = false;  // with a trigger: the output begins inside a reasoning block
    std::string what;                  // what the grammar came from ("response_format", "grammar", "tools"), for errors
};

std::unique_ptr<TokenConstraint> make_constraint(const ConstraintSpec &spec, std::shared_ptr<const Vocabulary> vocab,
                                                 const MatchLimits &limits = {});

}  // namespace strata::grammar
