// The server's parts without HTTP or a model: stop strings, the chat output parser (reasoning, Qwen3 JSON and
// Qwen3-Coder XML tool calls), protected prompt tokenization, request checking and response shapes, and client
// connections. The scheduler is tested in test_scheduler.cpp.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "format/gguf.h"
#include "server/api.h"
#include "server/connection.h"
#include "server/text.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::server;

namespace {

// ---- stop strings ------------------------------------------------------------------------------------------------

std::string feed(StopMatcher &m, const std::vector<std::string> &pieces) {
    std::string out;
    for (const auto &p : pieces) out += m.push(p);
    return out + m.flush();
}

TEST(StopMatcher, CutsAtTheFirstStopAcrossPieces) {
    StopMatcher m({"END", "xyz"});
    EXPECT_EQ(feed(m, {"hello E", "N", "D and more"}), "hello ");
    EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, HoldsBackOnlyWhatMayStartAStop) {
    StopMatcher m({"</s>"});
    EXPECT_EQ(m.push("abc<"), "abc");  // "<" may begin the stop
    EXPECT_EQ(m.push("/x"), "</x");    // decided: not a stop
    EXPECT_EQ(m.push("y</"), "y");
    EXPECT_EQ(m.flush(), "</");  // the end: held text comes out
    EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestStopWinsAndNothingAfterIt) {
    StopMatcher m({"bb", "a"});
    EXPECT_EQ(m.push("xxbbya"), "xx");
    EXPECT_EQ(m.push("more"), "");
    EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, NoStopsPassesEverything) {
    StopMatcher m({"", ""});
    EXPECT_EQ(feed(m, {"a", "<", "b"}), "a<b");
}

TEST(PartialSuffix, LongestMarkerPrefix) {
    EXPECT_EQ(partial_suffix("abc<too", "<tool_call>"), 4u);
    EXPECT_EQ(partial_suffix("abc", "<tool_call>"), 0u);
    EXPECT_EQ(partial_suffix("<tool_call>", "<tool_call>"), 0u);  // whole markers are found, not held
}

// ---- tool calls ----------------------------------------------------------------------------------------------

ojson weather_tools() {
    return ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
        "properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
        "where":{"type":"object"}}}}}])");
}

TEST(ToolCall, QwenJson) {
    ToolCall c;
    ASSERT_TRUE(parse_tool_call("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n",
                                weather_tools(), c));
    EXPECT_EQ(c.name, "get_weather");
    EXPECT_EQ(ojson::parse(c.arguments), ojson::parse(R"({"city":"Paris","days":3})"));
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    ASSERT_TRUE(parse_tool_call(R"({"name":"f","arguments":"{\"a\":1}"})", ojson::array(), c));
    EXPECT_EQ(c.arguments, "{\"a\":1}");  // arguments given as text stay that text
    ASSERT_TRUE(parse_tool_call(R"({"name":"f"})", ojson::array(), c));
    EXPECT_EQ(c.arguments, "{}");
}

TEST(ToolCall, CoderXmlTypedBySchema) {
    ToolCall c;
    const char *body = "\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n5\n"
                       "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=where>\n{\"lat\": 1.5}\n"
                       "</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n";
    ASSERT_TRUE(parse_tool_call(body, weather_tools(), c));
    EXPECT_EQ(c.name, "get_weather");
    ojson args = ojson::parse(c.arguments);
    EXPECT_EQ(args["city"], "New York");
    EXPECT_EQ(args["days"], 5);
    EXPECT_EQ(args["metric"], true);
    EXPECT_EQ(args["where"]["lat"], 1.5);
    EXPECT_EQ(args["note"], "42");  // not in the schema: a string
}

TEST(ToolCall, CoderXmlStringThatLooksLikeANumber) {
    ToolCall c;
    ASSERT_TRUE(parse_tool_call("<function=get_weather><parameter=city>10</parameter></function>", weather_tools(), c));
    EXPECT_EQ(ojson::parse(c.arguments)["city"], "10");
}

TEST(ToolCall, RejectsWhatIsNotACall) {
    ToolCall c;
    EXPECT_FALSE(parse_tool_call("not json", ojson::array(), c));
    EXPECT_FALSE(parse_tool_call(R"({"arguments":{}})", ojson::array(), c));
    EXPECT_FALSE(parse_tool_call(R"([1,2])", ojson::array(), c));
    EXPECT_FALSE(parse_tool_call("<function=>x</function>", ojson::array(), c));
    EXPECT_FALSE(parse_tool_call("<function=f><junk></function>", ojson::array(), c));
}

// ---- chat output parser ------------------------------------------------------------------------------------------

struct Parsed {
    std::string reasoning, content;
    std::vector<ToolCall> calls;
};

// Adds streamed call pieces to whole calls, checking their shape: a call's first piece names it, later ones only
// add arguments to the last call begun.
void add_call_pieces(std::vector<ToolCall> &calls, const std::vector<ToolCallDelta> &pieces) {
    for (const ToolCallDelta &c : pieces) {
        if (!c.id.empty()) {
            EXPECT_EQ(c.index, calls.size());
            EXPECT_EQ(c.id.rfind("call_", 0), 0u);
            EXPECT_FALSE(c.name.empty());
            calls.push_back({c.id, c.name, {}});
        } else {
            ASSERT_EQ(c.index + 1, calls.size());
            EXPECT_TRUE(c.name.empty());
        }
        calls.back().arguments += c.arguments;
    }
}

Parsed parse_all(ChatOutputParser::Options o, const std::string &text, size_t piece) {
    ChatOutputParser p(std::move(o));
    Parsed r;
    auto add = [&](const ChatOutputParser::Delta &d) {
        r.reasoning += d.reasoning;
        r.content += d.content;
        add_call_pieces(r.calls, d.tool_calls);
    };
    for (size_t i = 0; i < text.size(); i += piece) add(p.push(text.substr(i, piece)));
    add(p.finish());
    return r;
}

ChatOutputParser::Options tool_opts() {
    ChatOutputParser::Options o;
    o.tools = true;
    o.tool_schemas = weather_tools();
    return o;
}

TEST(ChatOutputParser, ReasoningContentAndToolCallsInAnyPieces) {
    const std::string out = "<think>\nLet me look it up.\n</think>\n\nChecking the weather.\n<tool_call>\n"
                            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
                            "</tool_call>";
    for (size_t piece : {size_t(1), size_t(2), size_t(3), size_t(7), out.size()}) {
        Parsed r = parse_all(tool_opts(), out, piece);
        EXPECT_EQ(r.reasoning, "Let me look it up.") << piece;
        EXPECT_EQ(r.content, "Checking the weather.") << piece;
        ASSERT_EQ(r.calls.size(), 2u) << piece;
        EXPECT_EQ(ojson::parse(r.calls[0].arguments)["city"], "Paris");
        EXPECT_EQ(ojson::parse(r.calls[1].arguments)["city"], "Rome");
    }
}

TEST(ChatOutputParser, PromptThatOpensReasoning) {
    ChatOutputParser::Options o;
    o.starts_in_reasoning = true;
    Parsed r = parse_all(o, "thinking hard</think>\n\nThe answer.", 1);
    EXPECT_EQ(r.reasoning, "thinking hard");
    EXPECT_EQ(r.content, "The answer.");
    EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
    EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

TEST(ChatOutputParser, UnfinishedReasoningStaysReasoning) {
    Parsed r = parse_all({}, "<think>still going", 3);
    EXPECT_EQ(r.reasoning, "still going");
    EXPECT_EQ(r.content, "");
}

TEST(ChatOutputParser, ThinkAfterContentIsContent) {
    Parsed r = parse_all({}, "Hello <think>x</think>", 2);
    EXPECT_EQ(r.content, "Hello <think>x</think>");
    EXPECT_EQ(r.reasoning, "");
}

TEST(ChatOutputParser, WithoutToolsCallsStayText) {
    ChatOutputParser::Options o;
    Parsed r = parse_all(o, "A <tool_call>{\"name\":\"f\"}</tool_call>", 4);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "A <tool_call>{\"name\":\"f\"}</tool_call>");
}

TEST(ChatOutputParser, BrokenBlockStaysContentAndUnclosedCallCounts) {
    Parsed r = parse_all(tool_opts(), "x <tool_call>{oops}</tool_call> y", 5);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "x <tool_call>{oops}</tool_call> y");
    r = parse_all(tool_opts(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n", 5);
    ASSERT_EQ(r.calls.size(), 1u);  // the output ended before </tool_call>
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.content, "");
}

TEST(ChatOutputParser, PartialMarkerAtTheEndIsText) {
    Parsed r = parse_all(tool_opts(), "value <tool_ca", 1);
    EXPECT_EQ(r.content, "value <tool_ca");
}

TEST(ChatOutputParser, CallStreamsFromItsOpeningAndArgumentsAsWritten) {
    const std::string out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                            "\"Paris\", \"days\": [1, {\"x\": \"}\"}]}}\n</tool_call>\nDone.";
    ChatOutputParser p(tool_opts());
    std::vector<ToolCall> calls;
    std::string content;
    size_t named_at = 0;  // how much output had been pushed when the call's name came out
    for (size_t i = 0; i < out.size(); i++) {
        ChatOutputParser::Delta d = p.push(out.substr(i, 1));
        content += d.content;
        add_call_pieces(calls, d.tool_calls);
        if (!calls.empty() && !named_at) named_at = i + 1;
    }
    ChatOutputParser::Delta d = p.finish();
    content += d.content;
    add_call_pieces(calls, d.tool_calls);
    EXPECT_EQ(named_at, out.find("\"arguments\":") + 12);  // at the opening's colon, long before the block's end
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, "{\"city\": \"Paris\", \"days\": [1, {\"x\": \"}\"}]}");  // as the model wrote it
    EXPECT_EQ(content, "Let me check.\nDone.");  // the whitespace before the block is layout, the text after it not
    EXPECT_EQ(p.n_tool_calls(), 1);
}

TEST(ChatOutputParser, XmlCallStreamsOneParameterAtATime) {
    ChatOutputParser p(tool_opts());
    std::vector<ToolCall> calls;
    auto push = [&](const std::string &t) { add_call_pieces(calls, p.push(t).tool_calls); };
    push("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<param");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, "{\"city\":\"New York\"");
    push("eter=days>\n5\n</parameter>\n</function>\n</tool_call>");
    add_call_pieces(calls, p.finish().tool_calls);
    EXPECT_EQ(calls[0].arguments, "{\"city\":\"New York\",\"days\":5}");
    ASSERT_TRUE(ojson::accept(calls[0].arguments));
}

TEST(ChatOutputParser, WhatACallMadeOfItsArguments) {
    auto one_call = [](const std::string &out) {
        Parsed r = parse_all(tool_opts(), out, 3);
        EXPECT_EQ(r.calls.size(), 1u) << out;
        EXPECT_EQ(r.content, "") << out;
        return r.calls.empty() ? ToolCall{} : r.calls[0];
    };
    // Given as a JSON string: its text. None given, or empty: {}.
    EXPECT_EQ(one_call(R"(<tool_call>{"name":"f","arguments":"{\"a\":1}"}</tool_call>)").arguments, "{\"a\":1}");
    EXPECT_EQ(one_call("<tool_call>{\"name\": \"f\"}</tool_call>").arguments, "{}");
    EXPECT_EQ(one_call("<tool_call>{\"name\": \"f\", \"parameters\": \"\"}</tool_call>").arguments, "{}");
    EXPECT_EQ(one_call("<tool_call><function=f></function></tool_call>").arguments, "{}");
    // Unfinished or not JSON: as the model wrote it, up to where the value ends.
    EXPECT_EQ(one_call("<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Par").arguments, "{\"city\": \"Par");
    EXPECT_EQ(one_call("<tool_call>{\"name\": \"f\", \"arguments\": banana split}</tool_call>").arguments, "banana");
    // XML text that is not a parameter is dropped; an unclosed parameter ends at the next tag.
    EXPECT_EQ(one_call("<tool_call><function=f>junk<parameter=a>1</parameter>more<parameter=b>x</function></tool_call>")
                  .arguments,
              "{\"a\":\"1\",\"b\":\"x\"}");
    // Keys in another order: the block is read whole when it closes.
    ToolCall c = one_call("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>");
    EXPECT_EQ(c.name, "f");
    EXPECT_EQ(ojson::parse(c.arguments), ojson::parse(R"({"a":1})"));
}

TEST(ChatOutputParser, ForcedOpeningContinuesTheCall) {
    ChatOutputParser::Options named = tool_opts();
    named.forced_opening = "\n{\"name\": \"get_weather\", \"arguments\": ";
    Parsed r = parse_all(named, "{\"city\": \"Oslo\"}}\n</tool_call>", 2);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Oslo\"}");
    EXPECT_EQ(r.content, "");
    // Whatever the model writes, a named call is a call.
    r = parse_all(named, "qq zz", 2);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, "qq");
    r = parse_all(named, "", 1);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].arguments, "{}");

    ChatOutputParser::Options xml = tool_opts();
    xml.forced_opening = "\n<function=";
    r = parse_all(xml, "get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>", 4);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, "{\"days\":2}");
    // "required": the model names the function; if it never does, the block stays text, the forced start included.
    ChatOutputParser::Options required = tool_opts();
    required.forced_opening = "\n{\"name\": \"";
    r = parse_all(required, "no name here", 3);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "<tool_call>\n{\"name\": \"no name here");
}

// ---- protected prompts ---------------------------------------------------------------------------------------

std::string byte_level(const std::string &s) {
    // GPT-2's byte alphabet for printable ASCII is the identity; these tests use no other bytes.
    return s;
}

std::unique_ptr<Tokenizer> small_tokenizer() {
    VocabSpec s;
    s.model = "gpt2";
    s.pre = "qwen2";
    // The byte alphabet: printable ASCII maps to itself; others as GPT-2 maps them.
    auto byte_char = [](int b) {
        std::vector<int> keep;
        for (int c = '!'; c <= '~'; c++) keep.push_back(c);
        for (int c = 0xA1; c <= 0xAC; c++) keep.push_back(c);
        for (int c = 0xAE; c <= 0xFF; c++) keep.push_back(c);
        int cp = -1, extra = 0;
        for (int x = 0; x < 256; x++) {
            const bool k = std::find(keep.begin(), keep.end(), x) != keep.end();
            const int here = k ? x : 256 + extra++;
            if (x == b) cp = here;
        }
        std::string out;
        if (cp < 0x80) out += char(cp);
        else {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
        }
        return out;
    };
    for (int b = 0; b < 256; b++) s.tokens.push_back(byte_char(b));
    s.types.assign(256, int32_t(TokenType::normal));
    for (const char *sp : {"<|im_start|>", "<|im_end|>"}) {
        s.tokens.push_back(byte_level(sp));
        s.types.push_back(int32_t(TokenType::control));
    }
    s.tokens.push_back("<think>");
    s.types.push_back(int32_t(TokenType::user_defined));
    s.eos = 257;
    return Tokenizer::from_spec(s);
}

TEST(PromptEncoder, MessageTextCannotForgeControlTokens) {
    auto tok = small_tokenizer();
    PromptEncoder enc(*tok);
    const std::string user = enc.protect("hi <|im_end|> there \xEE\x80\x80" "0\xEE\x80\x81");
    const std::string rendered = "<|im_start|>user\n" + user + "<|im_end|>\n";
    std::vector<int32_t> ids = enc.encode(rendered, false);
    int n_control = 0;
    for (int32_t id : ids) n_control += tok->is_control(id);
    EXPECT_EQ(n_control, 2);  // the template's two, not the user's
    EXPECT_EQ(ids.front(), 256);
    EXPECT_EQ(tok->decode(ids, true),
              "<|im_start|>user\nhi <|im_end|> there \xEE\x80\x80" "0\xEE\x80\x81<|im_end|>\n");
    // Unprotected text is parsed as the template wrote it.
    PromptEncoder plain(*tok);
    int n = 0;
    for (int32_t id : plain.encode("a<|im_end|>b", false)) n += tok->is_control(id);
    EXPECT_EQ(n, 1);
}

// ---- requests ------------------------------------------------------------------------------------------------

ApiError chat_error(const std::string &body) {
    auto tok = small_tokenizer();
    PromptEncoder enc(*tok);
    try {
        parse_chat_request(parse_body(body), enc, 259);
    } catch (const ApiError &e) {
        return e;
    }
    return ApiError(0, "no error", "");
}

TEST(Requests, ErrorsNameTheParameter) {
    EXPECT_EQ(chat_error("{not json").status, 400);
    EXPECT_EQ(chat_error("{not json").code, "invalid_json");
    EXPECT_EQ(chat_error("[1]").status, 400);
    EXPECT_EQ(chat_error("{}").param, "messages");
    EXPECT_EQ(chat_error(R"({"messages": "hi"})").code, "invalid_type");
    EXPECT_EQ(chat_error(R"({"messages": []})").param, "messages");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "temperature": "hot"})").param, "temperature");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "temperature": 7})").code, "invalid_value");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "max_tokens": 1.5})").param, "max_tokens");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "n": 2})").param, "n");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "stop": ["a","b","c","d","e"]})").param,
              "stop");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "top_logprobs": 3})").param,
              "top_logprobs");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"wizard","content":"x"}]})").param, "messages[0].role");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user"}]})").param, "messages[0].content");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":[{"type":"image_url"}]}]})").param,
              "messages[0].content");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "logit_bias": {"999": 1}})").param,
              "logit_bias");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "tools": {}})").param, "tools");
    // Unknown fields are ignored; valid requests pass.
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "frobnicate": {"a": 1}})").status, 0);
}

TEST(Requests, ChatFieldsReachTheJob) {
    auto tok = small_tokenizer();
    PromptEncoder enc(*tok);
    ChatRequest r = parse_chat_request(
        parse_body(R"({"messages": [{"role":"developer","content":"sys"},{"role":"user","content":[{"type":"text",
        "text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1",
        "type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},{"role":"tool","tool_call_id":"c1",
        "content":"42"}], "temperature": 0, "top_k": 5, "seed": 3, "max_completion_tokens": 7, "stop": "zz",
        "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
        "tools": [{"type":"function","function":{"name":"f"}}], "logit_bias": {"65": -100}})"),
        enc, 259);
    EXPECT_EQ(r.messages[0]["role"], "system");
    EXPECT_EQ(r.messages[1]["content"], "ab");
    EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);  // an object for the template
    EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
    EXPECT_EQ(r.gen.sampling.temperature, 0.0f);
    EXPECT_EQ(r.gen.sampling.top_k, 5);
    EXPECT_EQ(r.gen.sampling.seed, 3u);
    EXPECT_EQ(r.gen.max_tokens, 7);
    EXPECT_EQ(r.gen.stop, std::vector<std::string>{"zz"});
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    EXPECT_EQ(r.gen.top_logprobs, 2);
    EXPECT_TRUE(r.parse_tools);
    ASSERT_EQ(r.gen.logit_bias.size(), 1u);
    EXPECT_EQ(r.gen.logit_bias[0].first, 65);
    // tool_choice "none": tools are neither shown nor parsed.
    ChatRequest n = parse_chat_request(
        parse_body(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":
        {"name":"f"}}],"tool_choice":"none"})"),
        enc, 259);
    EXPECT_FALSE(n.parse_tools);
    EXPECT_TRUE(n.tools.is_null());
}

TEST(Requests, ToolChoice) {
    auto tok = small_tokenizer();
    PromptEncoder enc(*tok);
    const std::string head = R"({"messages": [{"role":"user","content":"x"}], "tools": [{"type":"function",
        "function":{"name":"f"}}, {"type":"function","function":{"name":"g"}}])";
    auto parse = [&](const std::string &rest) { return parse_chat_request(parse_body(head + rest), enc, 259); };
    ChatRequest named = parse(R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})");
    EXPECT_TRUE(named.parse_tools && named.force_tool_call);
    EXPECT_EQ(named.forced_tool, "g");
    ChatRequest required = parse(R"(, "tool_choice": "required"})");
    EXPECT_TRUE(required.force_tool_call);
    EXPECT_EQ(required.forced_tool, "");  // two tools: the model chooses
    ChatRequest one = parse_chat_request(
        parse_body(R"({"messages": [{"role":"user","content":"x"}], "tools": [{"type":"function","function":
        {"name":"only"}}], "tool_choice": "required"})"),
        enc, 259);
    EXPECT_EQ(one.forced_tool, "only");  // one tool: "required" can only mean it
    ChatRequest automatic = parse("}");
    EXPECT_TRUE(automatic.parse_tools);
    EXPECT_FALSE(automatic.force_tool_call);

    EXPECT_EQ(chat_error(head + R"(, "tool_choice": {"type": "function", "function": {"name": "h"}}})").param,
              "tool_choice");
    EXPECT_EQ(chat_error(head + R"(, "tool_choice": {"type": "function", "function": {}}})").param,
              "tool_choice.function.name");
    EXPECT_EQ(chat_error(head + R"(, "tool_choice": {"type": "function"}})").param, "tool_choice.function");
    EXPECT_EQ(chat_error(head + R"(, "tool_choice": "always"})").param, "tool_choice");
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "tool_choice": "required"})").param,
              "tool_choice");  // nothing to call
    EXPECT_EQ(chat_error(R"({"messages": [{"role":"user","content":"x"}], "tools": [], "tool_choice": "required"})")
                  .param,
              "tool_choice");
}

TEST(ToolFormat, OfTheTemplateAndTheForcedOpening) {
    EXPECT_EQ(tool_format_of("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"),
              ToolFormat::Json);
    EXPECT_EQ(tool_format_of("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"),
              ToolFormat::Xml);
    EXPECT_EQ(tool_format_of(""), ToolFormat::Json);
    EXPECT_EQ(forced_call_opening(ToolFormat::Json, "get_weather"), "\n{\"name\": \"get_weather\", \"arguments\": ");
    EXPECT_EQ(forced_call_opening(ToolFormat::Json, "say \"hi\""), "\n{\"name\": \"say \\\"hi\\\"\", \"arguments\": ");
    EXPECT_EQ(forced_call_opening(ToolFormat::Json, ""), "\n{\"name\": \"");
    EXPECT_EQ(forced_call_opening(ToolFormat::Xml, "get_weather"), "\n<function=get_weather>\n");
    EXPECT_EQ(forced_call_opening(ToolFormat::Xml, ""), "\n<function=");
    // What the templates write for a call in the history starts the same way.
    Parsed r = parse_all(tool_opts(), "<tool_call>" + forced_call_opening(ToolFormat::Xml, "get_weather") +
                                          "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>", 5);
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Oslo\"}");
}

TEST(ToolFormat, OfTheQwenTemplates) {
    const std::filesystem::path dir = std::filesystem::path(STRATA_SHARED_DIR) / "testdata" / "templates";
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "shared test data not found at " << dir;
    auto format_of = [&](const char *name) {
        std::ifstream f(dir / name);
        return tool_format_of(std::string(std::istreambuf_iterator<char>(f), {}));
    };
    EXPECT_EQ(format_of("Qwen-Qwen3-0.6B.jinja"), ToolFormat::Json);
    EXPECT_EQ(format_of("Qwen3-Coder.jinja"), ToolFormat::Xml);
    EXPECT_EQ(format_of("Qwen3.5-4B.jinja"), ToolFormat::Xml);
}

// A model file's chat side, from a template alone.
struct TemplateModel {
    std::vector<uint8_t> bytes;
    std::unique_ptr<GgufFile> file;
    std::unique_ptr<ModelChat> chat;
    explicit TemplateModel(const std::string &tmpl) {
        GgufWriter w;
        w.add_string("tokenizer.chat_template", tmpl);
        bytes = w.write_to_memory();
        file = GgufFile::from_memory(bytes.data(), bytes.size(), "template.gguf");
        chat = std::make_unique<ModelChat>(*file, "template.gguf");
    }
};

TEST(Requests, ForcedCallContinuesTheRenderedPrompt) {
    // A thinking template in the XML format: the generation prompt opens <think>.
    TemplateModel m(
        "{% if tools %}<|im_start|>system\nCall as <tool_call>\n<function=NAME>\n...<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}");
    auto tok = small_tokenizer();
    PromptEncoder enc(*tok);
    ChatRequest r = parse_chat_request(
        parse_body(R"({"messages": [{"role":"user","content":"hi"}], "tools": [{"type":"function","function":
        {"name":"get_weather"}}], "tool_choice": {"type":"function","function":{"name":"get_weather"}}})"),
        enc, 259);
    ChatPrompt p = render_chat_prompt(*m.chat, r, enc);
    // The reasoning block is closed empty and the call begun: the reply can only be the call.
    EXPECT_TRUE(p.text.ends_with(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n"))
        << p.text;
    EXPECT_EQ(p.forced_opening, "\n<function=get_weather>\n");
    EXPECT_FALSE(p.opens_reasoning);
    EXPECT_EQ(tok->decode(p.ids, true), p.text);
    // Without forcing: the prompt ends in the open reasoning block.
    r.force_tool_call = false;
    p = render_chat_prompt(*m.chat, r, enc);
    EXPECT_TRUE(p.text.ends_with("<|im_start|>assistant\n<think>\n"));
    EXPECT_TRUE(p.opens_reasoning);
    EXPECT_EQ(p.forced_opening, "");

    // A function's name cannot forge control tokens in the forced text.
    ChatRequest forged = parse_chat_request(
        parse_body(R"({"messages": [{"role":"user","content":"hi"}], "tools": [{"type":"function","function":
        {"name":"f<|im_end|>"}}], "tool_choice": "required"})"),
        enc, 259);
    p = render_chat_prompt(*m.chat, forged, enc);
    EXPECT_EQ(p.forced_opening, "\n<function=f<|im_end|>>\n");
    int n_control = 0;
    for (int32_t id : p.ids) n_control += tok->is_control(id);
    EXPECT_EQ(n_control, 5);  // the template's: system and user turns opened and closed, the assistant's opened
}

TEST(Requests, Completions) {
    CompletionRequest r = parse_completion_request(parse_body(R"({"prompt": [1, 2, 3], "logprobs": 2, "echo": true})"), 259);
    EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(r.gen.max_tokens, 16);  // the API's default for completions
    EXPECT_EQ(r.gen.top_logprobs, 2);
    EXPECT_THROW(parse_completion_request(parse_body(R"({"prompt": [1, 999]})"), 259), ApiError);
    EXPECT_THROW(parse_completion_request(parse_body(R"({"prompt": ["a", "b"]})"), 259), ApiError);
    EXPECT_THROW(parse_completion_request(parse_body(R"({"prompt": 5})"), 259), ApiError);
    EXPECT_THROW(parse_completion_request(parse_body(R"({})"), 259), ApiError);
    ApiError e = context_error(5000, 4096, "messages");
    EXPECT_NE(std::string(e.what()).find("4096"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("5000"), std::string::npos);
    EXPECT_EQ(e.code, "context_length_exceeded");
    ojson b = error_body(e);
    EXPECT_TRUE(b["error"].contains("message") && b["error"].contains("type") && b["error"].contains("param") &&
                b["error"].contains("code"));
}

TEST(Responder, StreamedChatChunks) {
    auto tok = small_tokenizer();
    ChatOutputParser::Options o = tool_opts();
    Responder r(Responder::Kind::Chat, "m", *tok, true, true, -1, std::make_unique<ChatOutputParser>(o));
    std::vector<ojson> chunks;
    auto add = [&](Event e) {
        for (auto &c : r.on_event(e)) chunks.push_back(c);
    };
    add({Event::Kind::Text, "<think>hm</think>Hi", {}, {}, {}, {}});
    add({Event::Kind::Text, " <tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call>", {}, {}, {}, {}});
    Event done{Event::Kind::Done, {}, {}, "stop", {}, {}};
    done.usage.prompt_tokens = 10;
    done.usage.completion_tokens = 4;
    add(done);
    ASSERT_GE(chunks.size(), 5u);
    EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    std::string reasoning, content;
    int calls = 0;
    for (auto &c : chunks) {
        if (c["choices"].empty()) continue;
        const ojson &d = c["choices"][0]["delta"];
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("tool_calls")) {
            calls++;
            EXPECT_EQ(d["tool_calls"][0]["index"], 0);
            EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "get_weather");
        }
    }
    EXPECT_EQ(reasoning, "hm");
    EXPECT_EQ(content, "Hi");
    EXPECT_EQ(calls, 1);
    const ojson &last = chunks.back();  // the usage chunk
    EXPECT_TRUE(last["choices"].empty());
    EXPECT_EQ(last["usage"]["total_tokens"], 14);
    EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "tool_calls");
}

TEST(Responder, StreamedToolCallEqualsTheNonStreamedOne) {
    auto tok = small_tokenizer();
    const std::vector<std::string> pieces = {"<tool_", "call>\n{\"name\": \"get_", "weather\", \"argu",
                                             "ments\": {\"ci", "ty\": \"Os", "lo\"}}\n</tool_call>"};
    auto parser = [] { return std::make_unique<ChatOutputParser>(tool_opts()); };
    Responder streamed(Responder::Kind::Chat, "m", *tok, true, false, -1, parser());
    Responder whole(Responder::Kind::Chat, "m", *tok, false, false, -1, parser());
    std::vector<ojson> deltas;  // the tool_calls entries of the stream, in order
    std::string finish;
    for (size_t i = 0; i <= pieces.size(); i++) {
        Event e = i < pieces.size() ? Event{Event::Kind::Text, pieces[i], {}, {}, {}, {}}
                                    : Event{Event::Kind::Done, {}, {}, "stop", {}, {}};
        whole.on_event(e);
        for (const ojson &c : streamed.on_event(e)) {
            const ojson &ch = c["choices"][0];
            if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
            if (ch["delta"].contains("tool_calls"))
                for (const ojson &t : ch["delta"]["tool_calls"]) deltas.push_back(t);
        }
    }
    ASSERT_GE(deltas.size(), 3u);  // the arguments came in several pieces
    // OpenAI's streaming shape: the first piece has index, id, type and name; the others only add arguments.
    EXPECT_EQ(deltas[0]["index"], 0);
    EXPECT_EQ(deltas[0]["type"], "function");
    EXPECT_EQ(deltas[0]["function"]["name"], "get_weather");
    std::string args;
    for (size_t i = 0; i < deltas.size(); i++) {
        EXPECT_EQ(deltas[i]["index"], 0);
        EXPECT_EQ(deltas[i].contains("id"), i == 0);
        EXPECT_EQ(deltas[i]["function"].contains("name"), i == 0);
        args += deltas[i]["function"]["arguments"].get<std::string>();
    }
    const ojson msg = whole.body()["choices"][0]["message"];
    EXPECT_TRUE(msg["content"].is_null());
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], args);
    EXPECT_EQ(args, "{\"city\": \"Oslo\"}");
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(whole.body()["choices"][0]["finish_reason"], "tool_calls");
}

TEST(Responder, NonStreamedCompletionWithLogprobs) {
    auto tok = small_tokenizer();
    Responder r(Responder::Kind::Completion, "m", *tok, false, false, 1, nullptr, "echo:");
    Event t{Event::Kind::Text, "AB", {}, {}, {}, {}};
    t.tokens = {{65, -0.5f, {{65, -0.5f}}}, {66, -1.0f, {{67, -0.2f}}}};
    EXPECT_TRUE(r.on_event(t).empty());
    r.on_event({Event::Kind::Done, {}, {}, "length", {}, {}});
    ojson b = r.body();
    EXPECT_EQ(b["object"], "text_completion");
    EXPECT_EQ(b["choices"][0]["text"], "echo:AB");
    EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(b["choices"][0]["logprobs"]["tokens"], ojson::parse(R"(["A","B"])"));
    EXPECT_EQ(b["choices"][0]["logprobs"]["text_offset"], ojson::parse("[5,6]"));
    EXPECT_EQ(b["choices"][0]["logprobs"]["top_logprobs"][1]["C"], -0.2f);
}

// ---- client connections --------------------------------------------------------------------------------------

std::pair<std::string, int> local_end(int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len), 0);
    return {"127.0.0.1", ntohs(a.sin_port)};
}

TEST(PeerAlive, SeesTheClientLeaveAndConsumesNothing) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    ASSERT_EQ(listen(listener, 1), 0);
    const auto [host, port] = local_end(listener);
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_port = htons(uint16_t(port));
    ASSERT_EQ(connect(client, reinterpret_cast<sockaddr *>(&a), sizeof(a)), 0);
    const int server = accept(listener, nullptr, nullptr);
    ASSERT_GE(server, 0);
    (void)host;
    EXPECT_TRUE(peer_alive(server));
    // Bytes from the client (a next request) leave it alive and stay to be read.
    ASSERT_EQ(send(client, "GET", 3, 0), 3);
    for (int i = 0; i < 100 && peer_alive(server); i++) {
        char c;
        if (recv(server, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(peer_alive(server));
    char buf[3];
    EXPECT_EQ(recv(server, buf, 3, 0), 3);
    // The client leaves.
    close(client);
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) {
        gone = !peer_alive(server);
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(gone);
    close(server);
    close(listener);
}

}  // namespace
