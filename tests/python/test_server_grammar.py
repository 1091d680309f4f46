"""Constrained decoding through `strata serve`: response_format json_schema / json_object, `grammar`, strict tool
calls. On script models (tests/python/script_model.py): a reply that fits the constraint comes out unchanged, one that
does not is steered into a valid one; and a property test: random schemas of bounded size, sampled replies (the
script model draws uniformly among the tokens a constraint allows, which makes random documents), every reply parsed
and validated by `jsonschema`."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest
import requests

from script_model import write_script_model
from serve_util import Server

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def servers(strata_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("grammar")
    out = {}
    for kind in ("answer", "json", "xml"):
        model = write_script_model(d / f"script-{kind}.gguf", kind)
        out[kind] = Server(strata_bin, model, d / f"{kind}.log", "--parallel", "2", "--ctx-size", "4096")
    yield out
    for s in out.values():
        s.stop()


def chat(server: Server, **body) -> requests.Response:
    body.setdefault("messages", [{"role": "user", "content": "Weather in Paris for 3 days?"}])
    return requests.post(server.url + CHAT, json=body, timeout=120)


def content(r: requests.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


CITY_DAYS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
             "required": ["city", "days"], "additionalProperties": False}


def json_schema_format(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": strict}}


# ---- replies the constraint leaves alone, replies it steers --------------------------------------------------------

def test_a_reply_that_fits_the_schema_is_unchanged(servers):
    plain = content(chat(servers["answer"], temperature=0, max_tokens=50))
    assert plain == '{"city": "Paris", "days": 3}'
    assert content(chat(servers["answer"], temperature=0, max_tokens=50,
                        response_format=json_schema_format(CITY_DAYS))) == plain
    assert content(chat(servers["answer"], temperature=0, max_tokens=50,
                        response_format={"type": "json_object"})) == plain


def test_a_reply_that_does_not_fit_is_steered_into_the_schema(servers):
    schema = {"type": "object", "properties": {"city": {"enum": ["Rome", "Oslo"]},
                                               "days": {"type": "integer", "minimum": 5, "maximum": 9}},
              "required": ["city", "days"], "additionalProperties": False}
    for temperature in (0, 1):
        r = chat(servers["answer"], temperature=temperature, seed=4, max_tokens=200,
                 response_format=json_schema_format(schema))
        text = content(r)
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        validator(schema).validate(json.loads(text))


def test_streamed_constrained_reply(servers):
    schema = {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 2, "maxItems": 2}
    r = requests.post(servers["answer"].url + CHAT, stream=True, timeout=120, json={
        "messages": [{"role": "user", "content": "x"}], "temperature": 1, "seed": 9, "max_tokens": 300,
        "stream": True, "response_format": json_schema_format(schema)})
    assert r.status_code == 200
    text, finish = "", None
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ch = json.loads(line[6:])
        for c in ch.get("choices", []):
            text += c["delta"].get("content") or ""
            finish = c.get("finish_reason") or finish
    assert finish == "stop"
    validator(schema).validate(json.loads(text))


def test_grammar_field_on_both_endpoints(servers):
    g = 'root ::= ("yes" | "no") "!"'
    assert content(chat(servers["answer"], temperature=0, max_tokens=10, grammar=g)) in ("yes!", "no!")
    r = requests.post(servers["answer"].url + "/v1/completions", timeout=60,
                      json={"prompt": "Is it?", "grammar": g, "max_tokens": 10, "temperature": 1, "seed": 1})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes!", "no!")
    # llama.cpp's top-level json_schema field.
    r = requests.post(servers["answer"].url + "/v1/completions", timeout=60,
                      json={"prompt": "n?", "json_schema": {"type": "integer", "minimum": 10, "maximum": 12},
                            "max_tokens": 10, "temperature": 0})
    assert r.json()["choices"][0]["text"] in ("10", "11", "12")


@pytest.mark.parametrize("body,param,needle", [
    ({"response_format": json_schema_format({"type": "array", "uniqueItems": True})},
     "response_format.json_schema.schema", "'uniqueItems'"),
    ({"response_format": json_schema_format({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}})},
     "response_format.json_schema.schema", "JSON schema at '/properties/a': 'format'"),
    ({"response_format": json_schema_format({"$ref": "https://example.com/x.json"})},
     "response_format.json_schema.schema", "'$ref'"),
    ({"grammar": "root ::= \"a\"\nx ::= (\"b\""}, "grammar", "line 2"),
    ({"grammar": "root ::= root \"a\" | \"b\""}, "grammar", "left-recursive"),
    ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}, "grammar", "one of"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "'yaml'"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "Missing"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                  "parameters": {"type": "object", "not": {}}}}]},
     "tools[0].function.parameters", "'not'"),
])
def test_unsupported_constraints_are_400_naming_what(servers, body, param, needle):
    r = chat(servers["answer"], max_tokens=5, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert needle in err["message"], err["message"]


# ---- strict tool calls ---------------------------------------------------------------------------------------------

def weather_tool(parameters: dict, strict: bool = True) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "description": "Weather", "strict": strict,
                                             "parameters": parameters}}


def only_call(r: requests.Response) -> tuple[dict, dict]:
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert len(msg["tool_calls"]) == 1, msg
    return msg, json.loads(msg["tool_calls"][0]["function"]["arguments"])


def test_strict_call_that_fits_is_unchanged_json_format(servers):
    params = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    msg, args = only_call(chat(servers["json"], temperature=0, max_tokens=200, tools=[weather_tool(params)]))
    assert args == {"city": "Paris"}
    assert msg["reasoning_content"] == "I should call the tool."  # reasoning stays free


def test_strict_call_arguments_follow_the_schema_json_format(servers):
    params = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
              "required": ["city", "days"], "additionalProperties": False}
    for tool_choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = chat(servers["json"], temperature=0, max_tokens=300, tools=[weather_tool(params)], tool_choice=tool_choice)
        _, args = only_call(r)
        validator(params).validate(args)
    # Not strict: the model's own arguments, which miss "days".
    _, args = only_call(chat(servers["json"], temperature=0, max_tokens=300, tools=[weather_tool(params, strict=False)]))
    assert args == {"city": "Paris"}


def test_strict_call_xml_format_with_reasoning_first(servers):
    params = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                               "days": {"type": "integer", "maximum": 5}},
              "required": ["city"], "additionalProperties": False}
    msg, args = only_call(chat(servers["xml"], temperature=0, max_tokens=200, tools=[weather_tool(params)]))
    assert args == {"city": "Paris", "days": 3}
    assert msg["reasoning_content"] == "I will use the tool."
    strict = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo"]},
                                               "days": {"type": "integer", "minimum": 6, "maximum": 9}},
              "required": ["city", "days"], "additionalProperties": False}
    _, args = only_call(chat(servers["xml"], temperature=0, max_tokens=300, tools=[weather_tool(strict)]))
    validator(strict).validate(args)


# ---- the property test ---------------------------------------------------------------------------------------------

NAMES = ["a", "b c", "ünï", "q\"uote", "back\\slash", "emoji😀", "id"]
PATTERNS = ["^[a-z]{1,4}$", "^(ab|cd){1,3}$", "^\\d{2}-\\d{2}$", "^.{0,3}$", "^[^a-z\\s]{1,3}$", "^x?[0-9a-f]{2}$"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema whose documents are of bounded length (every string, array and object bounded), so a reply drawn at
    random always ends."""
    kinds = ["string", "string", "integer", "number", "boolean", "null", "enum", "const", "format", "pattern"]
    if depth < 2:
        kinds += ["object", "object", "array", "anyOf", "oneOf"]
    k = rng.choice(kinds)
    if k == "string":
        hi = rng.randint(0, 6)
        return {"type": "string", "minLength": rng.randint(0, hi), "maxLength": hi}
    if k == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.7:
            lo = rng.randint(-500, 500)
            s["minimum" if rng.random() < 0.5 else "exclusiveMinimum"] = lo
            s["maximum" if rng.random() < 0.5 else "exclusiveMaximum"] = lo + rng.randint(2, 3000)
        return s
    if k == "number":
        s = {"type": "number"}
        if rng.random() < 0.5:
            s["minimum"] = rng.randint(-5, 5)
        if rng.random() < 0.5:
            s["exclusiveMaximum"] = 6 + rng.randint(0, 5)
        return s
    if k in ("boolean", "null"):
        return {"type": k}
    if k == "enum":
        return {"enum": rng.sample(["x", 3, None, True, [1, "two"], {"k": -2.5}, "é\"\\"], 3)}
    if k == "const":
        return {"const": rng.choice(["fixed", 42, {"nested": [True]}])}
    if k == "format":
        return {"type": "string", "format": rng.choice(["date", "time", "date-time", "uuid", "ipv4"])}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if k == "object":
        props = {n: random_schema(rng, depth + 1) for n in rng.sample(NAMES, rng.randint(0, 3))}
        s = {"type": "object", "properties": props, "additionalProperties": False}
        req = [n for n in props if rng.random() < 0.5]
        if req:
            s["required"] = req
        return s
    if k == "array":
        hi = rng.randint(0, 3)
        s = {"type": "array", "items": random_schema(rng, 2), "minItems": rng.randint(0, hi), "maxItems": hi}
        if rng.random() < 0.3:
            s = {"type": "array", "prefixItems": [random_schema(rng, 2), random_schema(rng, 2)], "items": False}
        return s
    if k == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1), random_schema(rng, depth + 1)]}
    return {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}, {"type": "boolean"}]}


def test_random_schemas_replies_always_parse_and_validate(servers):
    rng = random.Random(19)
    checked = 0
    for i in range(40):
        schema = random_schema(rng)
        if rng.random() < 0.25:  # through a reference
            schema = {"$defs": {"thing": schema}, "type": "object", "properties": {"v": {"$ref": "#/$defs/thing"}},
                      "required": ["v"], "additionalProperties": False}
        r = chat(servers["answer"], temperature=1.0, seed=i, max_tokens=3500,
                 response_format=json_schema_format(schema))
        text = content(r)
        assert r.json()["choices"][0]["finish_reason"] == "stop", (schema, text)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            pytest.fail(f"not JSON: {text!r} ({e}) for {schema}")
        errors = list(validator(schema).iter_errors(doc))
        assert not errors, (schema, text, [e.message for e in errors])
        checked += 1
    assert checked == 40
