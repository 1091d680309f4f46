"""Reference chat-template renderer for the cross-checks: Python's jinja2 set up the way Hugging Face transformers
sets it up in `apply_chat_template`. It is not transformers (which cannot be installed here) and not our renderer.

What it mirrors (transformers' chat_template_utils `_compile_jinja_template` and `apply_chat_template`):
- the environment is jinja2's ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True and the
  loopcontrols extension (break/continue); the `{% generation %}` tag transformers adds renders its body unchanged;
- the `tojson` filter is replaced by json.dumps with ensure_ascii=False, indent=None, separators=None,
  sort_keys=False as defaults (no HTML escaping, unlike jinja2's own tojson);
- globals `raise_exception(message)` (raises jinja2's TemplateError) and `strftime_now(format)` (local time now);
- the template receives messages=..., tools=... (None when there are none), documents=None,
  add_generation_prompt=..., the tokenizer's special tokens (bos_token, eos_token) and any extra keyword arguments
  (enable_thinking, ...).

One deliberate addition: when SOURCE_DATE_EPOCH is set, strftime_now formats that instant instead of the current
time, so the cross-check does not race midnight. strata honours the same variable.

Used as a module (render) and as a command line mirroring `strata template --file`:
    python hf_render.py --file T.jinja --messages M.json [--tools T.json] [--add-generation-prompt]
                        [--bos S] [--eos S] [--context C.json]
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers uses it to track assistant spans; output unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _now():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return datetime.fromtimestamp(int(epoch)) if epoch else datetime.now()


def _strftime_now(fmt):
    return _now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def render(template_source, messages, tools=None, add_generation_prompt=False, bos_token="", eos_token="",
           **extra):
    template = environment().from_string(template_source)
    return template.render(messages=messages, tools=tools, documents=None,
                           add_generation_prompt=add_generation_prompt,
                           bos_token=bos_token, eos_token=eos_token, **extra)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", required=True)
    ap.add_argument("--messages", required=True)
    ap.add_argument("--tools")
    ap.add_argument("--context", help="JSON object of extra template variables")
    ap.add_argument("--add-generation-prompt", action="store_true")
    ap.add_argument("--bos", default="")
    ap.add_argument("--eos", default="")
    args = ap.parse_args(argv)
    with open(args.file, encoding="utf-8") as f:
        source = f.read()
    with open(args.messages, encoding="utf-8") as f:
        messages = json.load(f)
    tools = None
    if args.tools:
        with open(args.tools, encoding="utf-8") as f:
            tools = json.load(f)
    extra = {}
    if args.context:
        with open(args.context, encoding="utf-8") as f:
            extra = json.load(f)
    sys.stdout.write(render(source, messages, tools, args.add_generation_prompt, args.bos, args.eos, **extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
