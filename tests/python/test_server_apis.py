"""The other APIs of `strata serve`, each through its official client or as llama-server's clients call it: OpenAI
Responses (`openai`), Anthropic Messages (`anthropic`), and the utility routes (/tokenize, /detokenize,
/apply-template, /props, /slots, /infill), on script models whose output is known (tests/python/script_model.py)."""
from __future__ import annotations

import json

import anthropic
import openai
import pytest
import requests

from script_model import EXPECTED, write_script_model
from serve_util import Server, wait_for

WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module", params=["json", "xml"])
def script(request, strata_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("apis")
    model = write_script_model(d / f"script-{request.param}.gguf", request.param)
    s = Server(strata_bin, model, d / "server.log", "--parallel", "2", "--ctx-size", "2048")
    s.kind = request.param
    yield s
    s.stop()


# ---- OpenAI Responses ----------------------------------------------------------------------------------------------

def test_responses_tool_call_round_trip_and_stream(script):
    c = openai.OpenAI(base_url=script.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    want = EXPECTED[script.kind]
    tool = {"type": "function", **WEATHER}
    r = c.responses.create(model="m", input="What is the weather in Paris?", tools=[tool],
                           instructions="Be brief.")
    assert r.status == "completed" and r.object == "response"
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "function_call"], kinds
    assert r.output[0].content[0].text == want["reasoning"]
    call = r.output[1]
    assert call.name == want["name"] and json.loads(call.arguments) == want["arguments"]
    assert call.call_id.startswith("call_")
    assert r.usage.input_tokens > 10 and r.usage.output_tokens > 5

    # Streaming through the client's own accumulator: the same items, and the events in order.
    seen = []
    with c.responses.stream(model="m", input="What is the weather in Paris?", tools=[tool]) as stream:
        for event in stream:
            seen.append(event.type)
        final = stream.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert "response.reasoning_text.delta" in seen and "response.function_call_arguments.delta" in seen
    assert [o.type for o in final.output] == kinds
    assert final.output[1].arguments == call.arguments
    numbers = []
    for ev in c.responses.create(model="m", input="What is the weather in Paris?", tools=[tool], stream=True):
        numbers.append(ev.sequence_number)
    assert numbers == list(range(len(numbers)))

    # The tool's result goes back as input items: the conversation continues (the script model calls again).
    r2 = c.responses.create(model="m", tools=[tool], input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"}])
    assert r2.usage.input_tokens > r.usage.input_tokens
    # Without tools the block stays text.
    r3 = c.responses.create(model="m", input="What is the weather in Paris?")
    assert r3.output[-1].type == "message" and "<tool_call>" in r3.output_text

    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input="hi", previous_response_id="resp_x")
    assert e.value.body["param"] == "previous_response_id"


# ---- Anthropic Messages --------------------------------------------------------------------------------------------

def test_messages_tool_use_thinking_and_stream(script):
    c = anthropic.Anthropic(base_url=script.url, api_key="unused", max_retries=0, timeout=60)
    want = EXPECTED[script.kind]
    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
    msg = c.messages.create(model="m", max_tokens=200, tools=[tool], system="Be brief.",
                            messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    assert msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    assert msg.content[0].thinking == want["reasoning"]
    use = msg.content[1]
    assert use.name == want["name"] and use.input == want["arguments"] and use.id.startswith("toolu_")
    assert msg.stop_reason == "tool_use"
    assert msg.usage.input_tokens > 10 and msg.usage.output_tokens > 5

    with c.messages.stream(model="m", max_tokens=200, tools=[tool],
                           messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as stream:
        types = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == want["arguments"] and final.stop_reason == "tool_use"

    # The result goes back as a tool_result block, with the thinking and tool_use blocks of the history.
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": "sunny, 21 degrees"}]}]
    again = c.messages.create(model="m", max_tokens=200, tools=[tool], messages=history)
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens > msg.usage.input_tokens
    assert c.messages.count_tokens(model="m", tools=[tool], system="Be brief.", messages=history[:1]).input_tokens == \
        msg.usage.input_tokens + msg.usage.cache_read_input_tokens

    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=10, messages=[{"role": "robot", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"


def test_messages_api_key_in_anthropic_header(strata_bin, golden_dir, tmp_path):
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path / "key.log", "--parallel", "1",
               "--api-key", "sesame")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["error"]["type"] == "authentication_error"
        m = anthropic.Anthropic(base_url=s.url, api_key="sesame", max_retries=0).messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert m.usage.output_tokens >= 1
    finally:
        s.stop()


# ---- llama-server's utility routes ---------------------------------------------------------------------------------

def test_tokenize_detokenize_apply_template_props_and_slots(strata_bin, golden_dir, tmp_path):
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path / "util.log", "--parallel", "2",
               "--ctx-size", "1024")
    try:
        post = lambda path, body: requests.post(s.url + path, json=body, timeout=30)  # noqa: E731
        text = "Hello world<|im_end|>"
        ids = post("/tokenize", {"content": text}).json()["tokens"]
        assert ids[-1] == 507  # <|im_end|> parsed as the control token by default
        plain = post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
        assert 507 not in plain and len(plain) > len(ids)
        pieces = post("/tokenize", {"content": "Hello", "with_pieces": True}).json()["tokens"]
        assert "".join(p["piece"] for p in pieces) == "Hello" and all("id" in p for p in pieces)
        assert post("/detokenize", {"tokens": ids}).json()["content"] == text
        r = post("/detokenize", {"tokens": [1, 10 ** 9]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"

        msgs = [{"role": "user", "content": "What is <|im_start|> for?"}]
        prompt = post("/apply-template", {"messages": msgs}).json()["prompt"]
        assert prompt == "<|im_start|>user\nWhat is <|im_start|> for?<|im_end|>\n<|im_start|>assistant\n"
        # What the chat route counts is that rendering, with the user's text kept as text.
        chat = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1}).json()
        direct = post("/tokenize", {"content": prompt}).json()["tokens"]
        as_text = post("/tokenize", {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]
        assert len(as_text) > 1
        # The user's <|im_start|> is counted as its text's tokens, not as the one control token.
        assert chat["usage"]["prompt_tokens"] == len(direct) - 1 + len(as_text)

        props = requests.get(s.url + "/props", timeout=10).json()
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024
        assert props["chat_template"] and props["infill"] is False

        slots = requests.get(s.url + "/slots", timeout=10).json()
        assert [sl["id"] for sl in slots] == [0, 1] and not any(sl["is_processing"] for sl in slots)
        assert max(sl["n_cached_tokens"] for sl in slots) >= chat["usage"]["prompt_tokens"]
        # While a request runs, its slot says so; afterwards it keeps the request's counts.
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 1000, "stream": True,
                "stream_options": {"include_usage": True}, "logit_bias": {"505": -100, "507": -100}}
        states = []
        with requests.post(s.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as resp:
            assert resp.status_code == 200
            lines = []
            for line in resp.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                lines.append(line)
                if len(lines) == 20:  # a few tokens in
                    states = requests.get(s.url + "/slots", timeout=10).json()
        usage = json.loads(lines[-2][6:])["usage"]  # before [DONE]
        if states and any(sl["is_processing"] for sl in states):
            assert sum(sl["is_processing"] for sl in states) == 1
        after = requests.get(s.url + "/slots", timeout=10).json()
        assert not any(sl["is_processing"] for sl in after)
        assert sorted(sl["n_decoded"] for sl in after)[-1] == usage["completion_tokens"]
        assert any(sl["n_prompt_tokens"] == usage["prompt_tokens"] and
                   sl["n_cached_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1 for sl in after)
        # No FIM tokens in this vocabulary: /infill says so.
        r = post("/infill", {"input_prefix": "def f(", "input_suffix": ")"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "fim_not_supported"
    finally:
        s.stop()


def test_infill_uses_the_fim_tokens(strata_bin, tmp_path):
    model = write_script_model(tmp_path / "fim.gguf", "fim")
    s = Server(strata_bin, model, tmp_path / "fim.log", "--parallel", "1")
    try:
        body = {"input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n",
                "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "n_predict": 16}
        r = requests.post(s.url + "/infill", json=body, timeout=30).json()
        assert r["content"] == "    return a + b\n"  # the script after <|fim_middle|>
        assert r["stop"] is True and r["tokens_predicted"] == 4  # three pieces and the end
        assert requests.get(s.url + "/props", timeout=10).json()["infill"] is True
        with requests.post(s.url + "/infill", json={**body, "stream": True}, stream=True, timeout=30) as resp:
            chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith(b"data: ")]
        assert "".join(ch["content"] for ch in chunks) == r["content"] and chunks[-1]["stop"] is True
    finally:
        s.stop()
