"""`strata serve` end to end, through the official `openai` client and plain HTTP, on the golden models (random
weights: gibberish, but deterministic under greedy decoding) and on script models whose output is a fixed text with
reasoning and tool calls (tests/python/script_model.py)."""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import threading
import time

import requests
import openai
import pytest

from script_model import EXPECTED, write_script_model
from serve_util import Server, wait_for

EOG_BIAS = {"505": -100, "507": -100}  # <|endoftext|>, <|im_end|> of the golden vocabulary: keep generating
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def qwen3moe(strata_bin, golden_dir, tmp_path_factory):
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path_factory.mktemp("srv") / "qwen3moe.log",
               "--parallel", "4", "--ctx-size", "1024", "--batch", "64", "--queue", "64")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen3next(strata_bin, golden_dir, tmp_path_factory):
    s = Server(strata_bin, golden_dir / "tiny-qwen3next-F32.gguf", tmp_path_factory.mktemp("srv") / "qwen3next.log",
               "--parallel", "4", "--ctx-size", "1024", "--batch", "32", "--queue", "64")
    yield s
    s.stop()


def client(server: Server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0,
                         timeout=kw.pop("timeout", 120), **kw)


def chat_greedy(c: openai.OpenAI, text: str, max_tokens: int = 12, **kw):
    return c.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], temperature=0,
                                     max_tokens=max_tokens, **kw)


def stream_chat(c: openai.OpenAI, **kw):
    parts = {"content": "", "reasoning": "", "tool_calls": {}, "finish": None, "usage": None, "chunks": 0}
    for ch in c.chat.completions.create(stream=True, **kw):
        parts["chunks"] += 1
        if ch.usage is not None:
            parts["usage"] = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        parts["content"] += d.content or ""
        parts["reasoning"] += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            slot = parts["tool_calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
            # OpenAI's streaming shape: the first piece of a call has its id, type and name, later ones add arguments.
            assert (tc.id is not None) == (slot["pieces"] == 0), tc
            assert (tc.type == "function") == (slot["pieces"] == 0), tc
            slot["pieces"] += 1
            slot["id"] = tc.id or slot["id"]
            if tc.function:
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
        if ch.choices[0].finish_reason:
            parts["finish"] = ch.choices[0].finish_reason
    return parts


# ---- basics --------------------------------------------------------------------------------------------------------

def test_health_models_and_metrics(qwen3moe):
    assert requests.get(qwen3moe.url + "/health").json() == {"status": "ok"}
    models = client(qwen3moe).models.list()
    assert [m.id for m in models.data] == ["tiny-qwen3moe-F32.gguf"]
    m = qwen3moe.metrics()
    for name in ("strata_generated_tokens_total", "strata_queue_depth", "strata_kv_cache_usage_ratio",
                 "strata_generation_tokens_per_second", "strata_expert_cache_hits_total",
                 "strata_expert_cache_misses_total", "strata_bytes_streamed_total", "strata_requests_running",
                 "strata_prefetch_picks_total", "strata_prefetch_predicted_total", "strata_prefetch_filled_total",
                 "strata_expert_cache_hit_ratio", "strata_expert_cpu_share", "strata_streamed_gigabytes_per_second",
                 "strata_expert_misses_mapped_total", "strata_expert_misses_admitted_total",
                 "strata_decode_passes_alone_total", "strata_decode_passes_split_total"):
        assert name in m, name
    # nothing mapped and no split on the CPU engine
    assert m["strata_expert_misses_mapped_total"] == m["strata_decode_passes_alone_total"] == 0
    assert m["strata_expert_misses_admitted_total"] == 0
    assert m["strata_decode_passes_split_total"] == 0
    # the CPU engine reads every expert in place: no lookups, so no ratio to report, and nothing streamed
    assert math.isnan(m["strata_expert_cache_hit_ratio"]) and math.isnan(m["strata_expert_cpu_share"])
    assert m["strata_streamed_gigabytes_per_second"] == 0


def test_chat_streaming_equals_non_streaming_and_usage_counts(qwen3moe):
    c = client(qwen3moe)
    text = "Tell me about the weather."
    r = chat_greedy(c, text, max_tokens=16, logprobs=True, top_logprobs=3, logit_bias=EOG_BIAS)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 16
    assert len(choice.logprobs.content) == 16  # one entry per generated token
    for e in choice.logprobs.content:
        assert len(e.top_logprobs) == 3
        assert e.logprob <= 0
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert e.token == e.top_logprobs[0].token  # greedy: the chosen token is the most likely one
    # The chat template's rendering is what was counted: the same text as a raw completion prompt has as many tokens.
    rendered = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    raw = c.completions.create(model="m", prompt=rendered, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == raw.usage.prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16

    s = stream_chat(c, model="m", messages=[{"role": "user", "content": text}], temperature=0, max_tokens=16,
                    logit_bias=EOG_BIAS, stream_options={"include_usage": True})
    assert s["content"] == (choice.message.content or "")
    assert s["reasoning"] == ((choice.message.model_extra or {}).get("reasoning_content") or "")
    assert s["finish"] == "length"
    assert s["usage"].completion_tokens == 16 and s["usage"].prompt_tokens == r.usage.prompt_tokens
    assert s["chunks"] >= 3


def test_completions_stream_echo_logprobs_and_stop(qwen3moe):
    c = client(qwen3moe)
    prompt = "The quick brown fox"
    r = c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0, logprobs=2,
                             logit_bias=EOG_BIAS)
    text = r.choices[0].text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 10
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 10 and len(lp.token_logprobs) == 10 and all(len(t) <= 2 for t in lp.top_logprobs)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="m", prompt=prompt, max_tokens=10, temperature=0, stream=True, logit_bias=EOG_BIAS) if ch.choices)
    assert streamed == text
    echo = c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0, echo=True,
                                logit_bias=EOG_BIAS)
    assert echo.choices[0].text == prompt + text
    # A stop string from the middle of the text cuts it there.
    visible = text.strip()
    assert len(visible) >= 4, text
    stop = visible[len(visible) // 2:len(visible) // 2 + 2]
    cut = c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0, stop=[stop],
                               logit_bias=EOG_BIAS)
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    # Prompts as token ids.
    ids = c.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 4


def test_sampling_with_a_seed_is_reproducible(qwen3moe):
    c = client(qwen3moe)
    kw = dict(model="m", prompt="Numbers, names", max_tokens=12, temperature=1.0, top_p=0.9, seed=1234,
              presence_penalty=0.5, frequency_penalty=0.5, logit_bias=EOG_BIAS,
              extra_body={"top_k": 40, "min_p": 0.01})
    a = c.completions.create(**kw).choices[0].text
    b = c.completions.create(**kw).choices[0].text
    assert a == b
    # Sampling does sample: hot and untruncated, seeds give different texts.
    hot = {**kw, "temperature": 2.0, "top_p": 1.0, "extra_body": {"top_k": 0, "min_p": 0}}
    texts = {c.completions.create(**{**hot, "seed": s}).choices[0].text for s in range(4)}
    assert len(texts) > 1


@pytest.mark.parametrize("which", ["qwen3moe", "qwen3next"])
def test_32_concurrent_clients_equal_one_at_a_time(which, request):
    server = request.getfixturevalue(which)
    c = client(server)
    prompts = [f"Request {i}: " + "the river and the market " * (i % 5) for i in range(32)]

    def run(p):
        r = chat_greedy(c, p, max_tokens=8, logit_bias=EOG_BIAS)
        return r.choices[0].message.content, r.usage.completion_tokens

    alone = [run(p) for p in prompts]
    steps0 = server.metrics()["strata_steps_total"]
    with cf.ThreadPoolExecutor(32) as ex:
        together = list(ex.map(run, prompts))
    steps = server.metrics()["strata_steps_total"] - steps0
    assert together == alone
    assert all(n == 8 for _, n in together)
    assert steps < 32 * 8  # the requests shared engine steps


def test_prefix_reuse_on_a_recurrent_model(qwen3next):
    c = client(qwen3next)
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    first = [system, {"role": "user", "content": "What is a mixture of experts?"}]
    r1 = c.chat.completions.create(model="m", messages=first, temperature=0, max_tokens=6)
    before = qwen3next.metrics()
    r2 = c.chat.completions.create(model="m", messages=first, temperature=0, max_tokens=6)
    after = qwen3next.metrics()
    assert r2.choices[0].message.content == r1.choices[0].message.content
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= 32, cached  # up to a checkpoint at a chunk boundary at least
    assert after["strata_state_checkpoints_restored_total"] > before["strata_state_checkpoints_restored_total"]
    # The same system prompt in another conversation reuses it too.
    other = [system, {"role": "user", "content": "And what is a router?"}]
    r3 = c.chat.completions.create(model="m", messages=other, temperature=0, max_tokens=6)
    assert r3.usage.prompt_tokens_details.cached_tokens >= 32


# ---- tool calls and reasoning (script models) -------------------------------------------------------------------

@pytest.fixture(scope="module", params=["json", "xml"])
def script_server(request, strata_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("script")
    model = write_script_model(d / f"script-{request.param}.gguf", request.param)
    s = Server(strata_bin, model, d / "server.log", "--parallel", "2", "--ctx-size", "2048")
    s.kind = request.param
    yield s
    s.stop()


def test_tool_call_round_trip(script_server):
    c = client(script_server)
    want = EXPECTED[script_server.kind]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL], temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content in (None, "")
    assert (ch.message.model_extra or {}).get("reasoning_content") == want["reasoning"]
    assert len(ch.message.tool_calls) == 1
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == want["name"]
    assert json.loads(call.function.arguments) == want["arguments"]

    # Streaming gives the same parts.
    s = stream_chat(c, model="m", messages=messages, tools=[WEATHER_TOOL], temperature=0,
                    stream_options={"include_usage": True})
    assert s["finish"] == "tool_calls"
    assert s["reasoning"] == want["reasoning"]
    assert s["content"] == ""
    assert [(t["name"], t["arguments"]) for t in s["tool_calls"].values()] == [(call.function.name,
                                                                                 call.function.arguments)]
    assert s["tool_calls"][0]["pieces"] >= 3  # the arguments streamed as they were written, not whole at the end
    assert s["usage"].completion_tokens == r.usage.completion_tokens

    # The result goes back: the template renders the call and the tool's answer; the shared prefix is reused.
    messages += [ch.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    r2 = c.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL], temperature=0)
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 10
    # Shared: the first prompt, less the generation prompt's "<think>\n" (xml) that the history does not repeat.
    suffix = 2 if script_server.kind == "xml" else 0
    assert r2.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - suffix
    assert r2.choices[0].finish_reason == "tool_calls"  # the script model always calls

    # Without tools (tool_choice none), the block stays text; the reasoning is still split off.
    r3 = c.chat.completions.create(model="m", messages=messages[:1], tools=[WEATHER_TOOL], tool_choice="none",
                                   temperature=0)
    # The tools were not offered: the template rendered the prompt it renders without them.
    bare = c.chat.completions.create(model="m", messages=messages[:1], temperature=0)
    assert r3.usage.prompt_tokens == bare.usage.prompt_tokens < r.usage.prompt_tokens
    assert r3.choices[0].finish_reason == "stop"
    assert not r3.choices[0].message.tool_calls
    assert "<tool_call>" in r3.choices[0].message.content
    assert (r3.choices[0].message.model_extra or {}).get("reasoning_content") == want["reasoning"]


def test_forced_tool_calls_on_a_random_model(qwen3moe):
    """tool_choice "required" or a named function: the prompt goes on with the start of the call, so the reply is
    that call whatever a model with random weights writes; its arguments are the model's text as written."""
    c = client(qwen3moe)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    rendered = f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"  # shows no tools
    named = dict(model="m", messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], temperature=0, max_tokens=12,
                 tool_choice={"type": "function", "function": {"name": "get_time"}})
    r = c.chat.completions.create(**named)
    ch = r.choices[0]
    assert ch.finish_reason in ("tool_calls", "length")
    assert ch.message.content is None
    assert [t.function.name for t in ch.message.tool_calls] == ["get_time"]
    call = ch.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.arguments
    # The model continued a prompt that ends inside the call (JSON: the golden template names no format).
    raw = c.completions.create(model="m", prompt=rendered + '<tool_call>\n{"name": "get_time", "arguments": ',
                               max_tokens=12, temperature=0)
    assert raw.usage.prompt_tokens == r.usage.prompt_tokens
    assert raw.choices[0].text.lstrip().startswith(call.function.arguments)  # as written, up to where it ends

    # Streamed: the same call, assembled from its pieces.
    s = stream_chat(c, **named)
    assert [(t["name"], t["arguments"]) for t in s["tool_calls"].values()] == [("get_time", call.function.arguments)]
    assert s["finish"] == ch.finish_reason and s["content"] == ""

    # "required" with one tool names it.
    one = c.chat.completions.create(**{**named, "tools": [WEATHER_TOOL], "tool_choice": "required"})
    assert [t.function.name for t in one.choices[0].message.tool_calls] == ["get_weather"]
    # "required" with several: the model writes the name, constrained to one of the tools' names. Unconstrained, this
    # model writes none of them (the raw completion), so the constraint is what makes the call.
    several = c.chat.completions.create(**{**named, "tool_choice": "required"})
    raw = c.completions.create(model="m", prompt=rendered + '<tool_call>\n{"name": "', max_tokens=12, temperature=0)
    assert several.usage.prompt_tokens == raw.usage.prompt_tokens
    assert not any(raw.choices[0].text.startswith(n) for n in ("get_weather", "get_time"))
    # Twelve tokens of this byte-sized vocabulary end the reply inside the call's opening: no call is complete, and
    # the text so far is the constrained name.
    msg = several.choices[0].message
    assert any(msg.content.startswith('<tool_call>\n{"name": "' + n) for n in ("get_weather", "get_time")), msg

    # A named function must be one of the tools, and forcing needs tools.
    for bad in ({**named, "tools": [WEATHER_TOOL]}, {**named, "tools": None, "tool_choice": "required"}):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(**{k: v for k, v in bad.items() if v is not None})
        assert e.value.body["param"] == "tool_choice"


# ---- disconnects, errors, overload --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_server(strata_bin, golden_dir, tmp_path_factory):
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path_factory.mktemp("srv") / "small.log",
               "--parallel", "1", "--queue", "1", "--ctx-size", "4096", "--max-body", "100000")
    yield s
    s.stop()


def long_request(stream: bool) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Talk for a long time."}], "temperature": 0,
            "max_tokens": 4000, "stream": stream, "logit_bias": EOG_BIAS}


def test_disconnect_mid_stream_frees_the_slot(small_server):
    before = small_server.metrics()["strata_requests_cancelled_total"]
    with requests.post(small_server.url + "/v1/chat/completions", json=long_request(True), stream=True,
                       timeout=30) as resp:
        assert resp.status_code == 200
        n = 0
        for line in resp.iter_lines():
            if line.startswith(b"data: "):
                n += 1
            if n >= 5:
                break
    # The client is gone: the generation stops at its next step and the only slot serves the next request.
    assert wait_for(lambda: small_server.metrics()["strata_requests_cancelled_total"] == before + 1, 10)
    assert small_server.metrics()["strata_requests_running"] == 0
    r = client(small_server).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    # A non-streaming client that gives up is noticed too.
    before = small_server.metrics()["strata_requests_cancelled_total"]
    with requests.Session() as h:  # closing the session closes the connection
        with pytest.raises((requests.exceptions.Timeout, requests.exceptions.ConnectionError)):
            h.post(small_server.url + "/v1/chat/completions", json=long_request(False), timeout=0.5)
    assert wait_for(lambda: small_server.metrics()["strata_requests_cancelled_total"] == before + 1, 10)


def test_overloaded_server_answers_503_with_retry_after(small_server):
    stop = threading.Event()

    def hold(body):  # keeps the slot (or the queue place) busy until told to stop
        with requests.post(small_server.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as resp:
            for _ in resp.iter_lines():
                if stop.is_set():
                    break

    threads = [threading.Thread(target=hold, args=(long_request(True),)) for _ in range(2)]
    threads[0].start()
    assert wait_for(lambda: small_server.metrics()["strata_requests_running"] == 1, 10)
    threads[1].start()
    assert wait_for(lambda: small_server.metrics()["strata_queue_depth"] == 1, 10)
    r = requests.post(small_server.url + "/v1/chat/completions", json=long_request(False), timeout=10)
    assert r.status_code == 503
    assert r.headers.get("Retry-After") == "1"
    assert r.json()["error"]["code"] == "overloaded"
    with pytest.raises(openai.InternalServerError) as e:  # the client sees it as such (503)
        client(small_server).chat.completions.create(**long_request(False))
    assert e.value.status_code == 503
    stop.set()
    for t in threads:
        t.join(30)
    assert wait_for(lambda: small_server.metrics()["strata_requests_running"] == 0, 10)


def error_of(server, body, path="/v1/chat/completions", raw=None, headers=None):
    r = requests.post(server.url + path, data=raw if raw is not None else json.dumps(body),
                   headers=headers or {"Content-Type": "application/json"}, timeout=30)
    err = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
    return r.status_code, err


def test_malformed_requests_get_openai_errors_and_the_server_keeps_serving(small_server):
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(raw=b"{\"messages\": ["), 400, None),
        (dict(raw=b"[1, 2]"), 400, None),
        (dict(body={}), 400, "messages"),
        (dict(body={"messages": "hi"}), 400, "messages"),
        (dict(body={"messages": []}), 400, "messages"),
        (dict(body={"messages": [{"role": "user"}]}), 400, "messages[0].content"),
        (dict(body={"messages": [{"role": "robot", "content": "x"}]}), 400, "messages[0].role"),
        (dict(body={"messages": msgs, "temperature": "warm"}), 400, "temperature"),
        (dict(body={"messages": msgs, "max_tokens": "many"}), 400, "max_tokens"),
        (dict(body={"messages": msgs, "max_tokens": 0}), 400, "max_tokens"),
        (dict(body={"messages": msgs, "top_p": 3}), 400, "top_p"),
        (dict(body={"messages": msgs, "stream": "yes"}), 400, "stream"),
        (dict(body={"messages": msgs, "n": 3}), 400, "n"),
        (dict(body={"messages": msgs, "stop": 5}), 400, "stop"),
        (dict(body={"messages": msgs, "tools": "all"}), 400, "tools"),
        (dict(body={"messages": msgs, "logit_bias": {"x": 1}}), 400, "logit_bias"),
        (dict(body={"prompt": {"a": 1}}, path="/v1/completions"), 400, "prompt"),
        (dict(body={"max_tokens": 3}, path="/v1/completions"), 400, "prompt"),
    ]
    for kw, status, param in cases:
        code, err = error_of(small_server, **{"body": None, **kw})
        assert code == status, (kw, code, err)
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["type"] == "invalid_request_error"
        if param:
            assert err["param"] == param, (kw, err)
    # A prompt longer than the context: 400 naming both lengths.
    long_text = "the warm afternoon sun " * 1200
    code, err = error_of(small_server, {"messages": [{"role": "user", "content": long_text}]})
    assert code == 400 and err["code"] == "context_length_exceeded"
    assert "4096" in err["message"]
    n_prompt = int(err["message"].split("resulted in ")[1].split(" ")[0])
    assert n_prompt > 4096
    # Too large a body: 413 in the same shape.
    code, err = error_of(small_server, None, raw=b"{\"x\": \"" + b"a" * 200000 + b"\"}")
    assert code == 413 and set(err) == {"message", "type", "param", "code"}
    # Unknown URL.
    r = requests.get(small_server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    # The official client raises BadRequestError with the body.
    with pytest.raises(openai.BadRequestError) as e:
        client(small_server).chat.completions.create(model="m", messages=msgs, temperature=5)
    assert e.value.body["param"] == "temperature"
    # Unknown fields are ignored (unsupported ones that ask for nothing too), and the server still serves.
    r = client(small_server).chat.completions.create(model="m", messages=msgs, max_tokens=2,
                                                   extra_body={"not_a_field": {"x": [1]}, "mirostat": 0})
    assert r.choices[0].finish_reason in ("stop", "length")
    assert small_server.alive()


# A request that fails after it was queued. The CPU engine has no natural failure for a valid request, so the
# server's test hook ($STRATA_TEST_FAIL_TOKEN) makes the engine fail a request whose next input holds this token.
FAIL_TOKEN = 501  # "irds" of the golden vocabulary (no prompt here writes "birds")
FAIL_FIRST = {str(FAIL_TOKEN): 100}  # as a logit bias: the first generated token fails at the next step


@pytest.fixture(scope="module")
def failing_server(strata_bin, golden_dir, tmp_path_factory):
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path_factory.mktemp("srv") / "failing.log",
               "--parallel", "2", "--ctx-size", "1024", env={"STRATA_TEST_FAIL_TOKEN": str(FAIL_TOKEN)})
    yield s
    s.stop()


def server_error_of(r: requests.Response) -> dict:
    assert r.status_code == 500, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "server_error" and "test hook" in err["message"], err
    return err


def test_a_request_that_fails_in_the_engine_gets_its_status_and_the_server_keeps_serving(failing_server):
    s = failing_server
    chat = {"model": "m", "messages": [{"role": "user", "content": "Tell me about the weather."}],
            "temperature": 0, "max_tokens": 8}
    before = s.metrics()["strata_requests_failed_total"]
    # Not streaming: it fails after its first token was generated, and still gets 500 (no byte went out before).
    server_error_of(requests.post(s.url + "/v1/chat/completions", json={**chat, "logit_bias": FAIL_FIRST},
                                  timeout=30))
    # Failing while the prompt is read, streaming or not: 500 as well, as a JSON body.
    for stream in (False, True):
        server_error_of(requests.post(s.url + "/v1/completions", timeout=30,
                                      json={"model": "m", "prompt": [1, 2, FAIL_TOKEN], "stream": stream}))
    # Streaming, failing after the first token went out: the stream has begun (200), an error event ends it.
    with requests.post(s.url + "/v1/chat/completions", json={**chat, "stream": True, "logit_bias": FAIL_FIRST},
                       stream=True, timeout=30) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith(b"data: ")]
    assert data[-1] == b"[DONE]"
    assert json.loads(data[-2])["error"]["type"] == "server_error"
    assert json.loads(data[0])["choices"][0]["delta"]["role"] == "assistant"
    # The official client raises InternalServerError with the body.
    with pytest.raises(openai.InternalServerError) as e:
        client(s).chat.completions.create(**chat, logit_bias=FAIL_FIRST)
    assert e.value.status_code == 500 and e.value.body["type"] == "server_error"

    # A failing request beside a healthy one: the healthy one is answered as if it had been alone.
    c = client(s)
    alone = chat_greedy(c, "Name three rivers.", max_tokens=8, logit_bias=EOG_BIAS)
    with cf.ThreadPoolExecutor(2) as ex:
        bad = ex.submit(requests.post, s.url + "/v1/chat/completions", timeout=30,
                        json={**chat, "logit_bias": FAIL_FIRST})
        good = ex.submit(chat_greedy, c, "Name three rivers.", max_tokens=8, logit_bias=EOG_BIAS)
        server_error_of(bad.result())
        assert good.result().choices[0].message.content == alone.choices[0].message.content
    m = s.metrics()
    assert m["strata_requests_failed_total"] == before + 6
    assert m["strata_requests_running"] == 0
    assert m['strata_http_requests_total{endpoint="/v1/chat/completions",status="500"}'] >= 3
    assert s.alive()


def test_api_key(strata_bin, golden_dir, tmp_path):
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path / "key.log", "--api-key", "sesame",
               "--parallel", "1")
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            client(s, api_key="wrong").models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        assert requests.post(s.url + "/v1/chat/completions", json={}).status_code == 401
        assert requests.get(s.url + "/metrics").status_code == 401
        assert requests.get(s.url + "/health").status_code == 200
        r = chat_greedy(client(s, api_key="sesame"), "hello", max_tokens=2)
        assert r.usage.completion_tokens >= 1
    finally:
        s.stop()


# ---- load --------------------------------------------------------------------------------------------------------

def test_bounded_load_every_request_answered_and_memory_returns(strata_bin, golden_dir, tmp_path):
    """500 requests from 64 clients against 4 slots and a queue of 16: each completes or gets a 503, none is lost,
    and the server's memory comes back to where it was."""
    s = Server(strata_bin, golden_dir / "tiny-qwen3moe-F32.gguf", tmp_path / "load.log", "--parallel", "4",
               "--queue", "16", "--ctx-size", "512")
    try:
        def one(i, h):
            body = {"model": "m", "messages": [{"role": "user", "content": f"load {i} " + "x" * (i % 40)}],
                    "max_tokens": 4, "temperature": 0, "stream": i % 3 == 0}
            r = h.post(s.url + "/v1/chat/completions", json=body, timeout=60)
            if r.status_code == 200:
                if body["stream"]:
                    assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
                else:
                    assert r.json()["usage"]["completion_tokens"] >= 1
                return "ok"
            assert r.status_code == 503, (r.status_code, r.text)
            assert r.headers["Retry-After"] == "1"
            return "busy"

        def worker(ids):
            with requests.Session() as h:
                return [one(i, h) for i in ids]

        # Warm-up round, then the baseline.
        worker(range(40))
        time.sleep(0.5)
        base = s.rss_kib()
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(64) as ex:
            results = [r for rs in ex.map(worker, [range(k, 500, 64) for k in range(64)]) for r in rs]
        elapsed = time.monotonic() - t0
        ok, busy = results.count("ok"), results.count("busy")
        assert ok + busy == 500
        assert ok >= 20 and s.alive()
        m = s.metrics()
        assert m["strata_requests_rejected_total"] == busy
        # The gauges are published at the end of each scheduler step, which may come just after the last reply has
        # reached its client: they must be 0 once that step is done.
        deadline = time.monotonic() + 5
        while (m["strata_queue_depth"] or m["strata_requests_running"]) and time.monotonic() < deadline:
            time.sleep(0.05)
            m = s.metrics()
        assert m["strata_queue_depth"] == 0 and m["strata_requests_running"] == 0
        time.sleep(1.0)
        after = s.rss_kib()
        print(f"\nload: 500 requests, 64 clients: {ok} completed, {busy} got 503, {elapsed:.1f} s; "
              f"RSS {base} KiB before, {after} KiB after")
        assert after <= base * 1.10 + 16 * 1024, (base, after)
        assert elapsed < 120
    finally:
        s.stop()
