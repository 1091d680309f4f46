"""Chat templates: each real template in ../shared/testdata/templates renders byte-identical under
`strata template --file` and under the reference renderer (hf_render.py: jinja2 set up as transformers does) for a
set of conversations: system prompt, multi-turn, tool definitions, tool calls with results (arguments as dicts and
as JSON strings), reasoning content, add_generation_prompt on and off, and the templates' own switches
(enable_thinking, reasoning_effort, ...). Where the reference raises (a template refusing a conversation), strata
must fail too, with the template's message. Not a test of the language in isolation (tests/cpp/test_jinja.cpp).
"""
import copy
import json
import os
import subprocess

import jinja2
import pytest

import hf_render

EPOCH = "1718000000"  # pins strftime_now (gpt-oss prints the current date) on both sides

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.\n  Returns JSON.  ",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
                    "days": {"type": "integer", "description": "Forecast days", "default": 1},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation — returns snippets <b>with</b> markup & quotes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "queries": {"type": "array", "items": {"type": "string"}, "description": "Queries"},
                    "filters": {
                        "type": "object",
                        "properties": {"lang": {"type": "string"}, "max_results": {"type": "number"}},
                        "description": "Optional filters",
                    },
                    "exact": {"type": "boolean", "description": "Exact match", "nullable": True},
                },
                "required": ["queries"],
            },
        },
    },
]

WEATHER_ARGS = {"city": "Paris", "unit": "celsius", "days": 3}
SEARCH_ARGS = {"queries": ["moe routing", "gguf \"v3\""], "filters": {"lang": "en", "max_results": 2.5},
               "exact": None}


def call(name, args, as_string=False):
    return {"type": "function", "function": {"name": name,
                                             "arguments": json.dumps(args) if as_string else args}}


def conversations():
    """(id, messages, tools) triples."""
    sys_msg = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    convs = {
        "single_user": ([{"role": "user", "content": "Hello!"}], None),
        "system_user": ([sys_msg, {"role": "user", "content": "What is a mixture of experts?"}], None),
        "multi_turn": ([
            sys_msg,
            {"role": "user", "content": "Hi, who are you?"},
            {"role": "assistant", "content": "I am an assistant."},
            {"role": "user", "content": "Tell me a joke about GPUs.\nKeep it short."},
        ], None),
        "unicode": ([
            {"role": "user", "content": "Traduis « café » en 中文, s'il te plaît 🙂"},
            {"role": "assistant", "content": "咖啡 ☕ — \"kāfēi\""},
            {"role": "user", "content": "Merci\t!  "},
        ], None),
        "tools_defined": ([sys_msg, {"role": "user", "content": "Weather in Paris?"}], TOOLS),
        "tools_no_system": ([{"role": "user", "content": "Weather in Paris?"}], TOOLS),
        "tool_call_dict_args": ([
            sys_msg,
            {"role": "user", "content": "Weather in Paris for 3 days?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", WEATHER_ARGS)]},
            {"role": "tool", "content": "{\"temp_c\": 18, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 18 °C and clear."},
            {"role": "user", "content": "Thanks"},
        ], TOOLS),
        "tool_call_string_args": ([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", WEATHER_ARGS, as_string=True)]},
            {"role": "tool", "content": "18 degrees"},
        ], TOOLS),
        "parallel_tool_calls": ([
            {"role": "user", "content": "Weather and docs please"},
            {"role": "assistant", "content": "Let me check both.",
             "tool_calls": [call("get_weather", WEATHER_ARGS), call("search_docs", SEARCH_ARGS)]},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "[\"snippet 1\", \"snippet <2>\"]"},
        ], TOOLS),
        "reasoning_field": ([
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "\nSimple arithmetic: 2+2=4.\n"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "3+3 is 6."},
        ], None),
        "reasoning_inline": ([
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."},
        ], None),
        "reasoning_with_tool": ([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.",
             "tool_calls": [call("get_weather", {"city": "Oslo"})]},
            {"role": "tool", "content": "-3 C"},
        ], TOOLS),
        "list_content": ([
            {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
        ], None),
        "empty_tools_list": ([{"role": "user", "content": "Hi"}], []),
    }
    return convs


# gpt-oss wants reasoning in `thinking` (and refuses content + thinking on tool-call messages); give it the shapes it
# documents, alongside the generic ones.
GPT_OSS_EXTRA = {
    "gptoss_thinking": ([
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "Easy sum."},
    ], None),
    "gptoss_tool_thinking": ([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "thinking": "Call the tool.", "tool_calls": [call("get_weather", WEATHER_ARGS)]},
        {"role": "tool", "content": "{\"temp_c\": 18}"},
        {"role": "assistant", "content": "18 °C."},
    ], TOOLS),
}

TEMPLATES = {
    "Qwen-Qwen3-0.6B.jinja": [{}, {"enable_thinking": False}, {"enable_thinking": True}],
    "Qwen3-Coder.jinja": [{}],
    "Qwen3.5-4B.jinja": [{}, {"enable_thinking": False}],
    "deepseek-ai-DeepSeek-V3.1.jinja": [{}, {"thinking": True}, {"enable_thinking": False}],
    "GLM-4.6.jinja": [{}, {"enable_thinking": False}],
    "openai-gpt-oss-120b.jinja": [{}, {"reasoning_effort": "high", "builtin_tools": ["browser", "python"],
                                        "model_identity": "You are a test model."}],
}


def cases():
    out = []
    for tname, variants in TEMPLATES.items():
        convs = dict(conversations())
        if tname.startswith("openai-gpt-oss"):
            convs.update(GPT_OSS_EXTRA)
        for cid, (messages, tools) in convs.items():
            for vi, extra in enumerate(variants):
                for agp in (False, True):
                    out.append(pytest.param(tname, messages, tools, extra, agp,
                                            id=f"{tname.removesuffix('.jinja')}-{cid}-v{vi}-{'agp' if agp else 'noagp'}"))
    return out


def reference(source, messages, tools, extra, agp):
    os.environ["SOURCE_DATE_EPOCH"] = EPOCH
    try:
        return hf_render.render(source, copy.deepcopy(messages), copy.deepcopy(tools), agp,
                                bos_token="<s>", eos_token="</s>", **extra), None
    except jinja2.exceptions.TemplateError as e:
        return None, e
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        return None, e


def run_strata(strata_bin, tmp_path, template, messages, tools, extra, agp):
    mpath = tmp_path / "messages.json"
    mpath.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    cmd = [str(strata_bin), "template", "--file", str(template), "--messages", str(mpath), "--bos", "<s>",
           "--eos", "</s>"]
    if tools is not None:
        tpath = tmp_path / "tools.json"
        tpath.write_text(json.dumps(tools), encoding="utf-8")
        cmd += ["--tools", str(tpath)]
    if extra:
        cpath = tmp_path / "context.json"
        cpath.write_text(json.dumps(extra), encoding="utf-8")
        cmd += ["--context", str(cpath)]
    if agp:
        cmd.append("--add-generation-prompt")
    env = dict(os.environ, SOURCE_DATE_EPOCH=EPOCH)
    return subprocess.run(cmd, capture_output=True, env=env, timeout=60)


@pytest.mark.parametrize("tname,messages,tools,extra,agp", cases())
def test_template_matches_reference(shared_dir, strata_bin, tmp_path, tname, messages, tools, extra, agp):
    template = shared_dir / "testdata" / "templates" / tname
    if not template.exists():
        pytest.skip(f"{template} is absent")
    source = template.read_text(encoding="utf-8")
    want, err = reference(source, messages, tools, extra, agp)
    got = run_strata(strata_bin, tmp_path, template, messages, tools, extra, agp)
    if err is not None:
        assert got.returncode != 0, f"reference failed ({type(err).__name__}: {err}) but strata printed:\n" \
                                    f"{got.stdout.decode(errors='replace')}"
        # The same message: the template's own for raise_exception, Python's or jinja2's for a failing operation.
        assert str(err) in got.stderr.decode(errors="replace")
        return
    assert got.returncode == 0, got.stderr.decode(errors="replace")
    assert got.stdout.decode("utf-8") == want


def test_every_shared_template_is_covered(shared_dir):
    present = {p.name for p in (shared_dir / "testdata" / "templates").glob("*.jinja")}
    assert present <= set(TEMPLATES), f"templates without conversations: {sorted(present - set(TEMPLATES))}"


def test_bos_eos_default_to_empty_with_file(strata_bin, tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("[{{ bos_token }}|{{ eos_token }}]{% for m in messages %}{{ m.content }}{% endfor %}")
    m = tmp_path / "m.json"
    m.write_text(json.dumps([{"role": "user", "content": "x"}]))
    got = subprocess.run([str(strata_bin), "template", "--file", str(t), "--messages", str(m)], capture_output=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"[|]x"


def test_error_names_template_line(strata_bin, tmp_path):
    t = tmp_path / "bad.jinja"
    t.write_text("line one\n{% if x %}\n{{ raise_exception('no ' ~ 'way') }}\n{% endif %}")
    m = tmp_path / "m.json"
    m.write_text("[]")
    got = subprocess.run([str(strata_bin), "template", "--file", str(t), "--messages", str(m), "--var", "x=true"],
                         capture_output=True)
    assert got.returncode != 0
    assert f"{t}:3:" in got.stderr.decode() and "no way" in got.stderr.decode()


def _gguf_metadata(path):
    """GGUF v3 metadata as a dict: a small sequential reader (the gguf package's reader takes half a minute on a
    150k-token vocabulary). Arrays of strings become lists of str, other arrays are skipped."""
    import struct
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fmts = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    data = path.read_bytes()
    pos = 0

    def take(n):
        nonlocal pos
        pos += n
        return data[pos - n:pos]

    def string():
        (n,) = struct.unpack("<Q", take(8))
        return take(n).decode("utf-8")

    assert take(4) == b"GGUF"
    _version, _n_tensors, n_kv = struct.unpack("<IQQ", take(20))
    out = {}
    for _ in range(n_kv):
        key = string()
        (vt,) = struct.unpack("<I", take(4))
        if vt == 8:
            out[key] = string()
        elif vt == 9:
            et, n = struct.unpack("<IQ", take(12))
            if et == 8:
                out[key] = [string() for _ in range(n)]
            else:
                take(sizes[et] * n)
        else:
            (out[key],) = struct.unpack(fmts[vt], take(sizes[vt]))
    return out


def test_model_file_template_and_tokens(shared_dir, strata_bin, tmp_path):
    """`strata template -m` renders the file's tokenizer.chat_template with its bos/eos token texts."""
    path = shared_dir / "testdata" / "vocab" / "ggml-vocab-qwen2.gguf"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    meta = _gguf_metadata(path)
    source = meta["tokenizer.chat_template"]
    bos = meta["tokenizer.ggml.tokens"][meta["tokenizer.ggml.bos_token_id"]]
    eos = meta["tokenizer.ggml.tokens"][meta["tokenizer.ggml.eos_token_id"]]
    messages, tools = conversations()["multi_turn"]
    m = tmp_path / "m.json"
    m.write_text(json.dumps(messages))
    for agp in (False, True):
        want = hf_render.render(source, messages, tools, agp, bos_token=bos, eos_token=eos)
        cmd = [str(strata_bin), "template", "-m", str(path), "--messages", str(m)]
        got = subprocess.run(cmd + (["--add-generation-prompt"] if agp else []), capture_output=True)
        assert got.returncode == 0, got.stderr
        assert got.stdout.decode("utf-8") == want


def test_model_file_without_template_falls_back(strata_bin, tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "plain.gguf"
    w = gguf.GGUFWriter(str(path), "test")
    w.add_token_list(["<s>", "</s>", "x"])
    w.add_bos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = tmp_path / "m.json"
    m.write_text(json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]))
    got = subprocess.run([str(strata_bin), "template", "-m", str(path), "--messages", str(m),
                          "--add-generation-prompt"], capture_output=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"<s>System: S\n\nUser: hi\n\nAssistant:"
    assert b"no chat template" in got.stderr
