"""The template language feature by feature: many small templates rendered by `strata template --file` and by
the reference renderer (hf_render.py) must agree byte for byte, and where the reference fails strata must fail with
the same message (syntax errors only need to fail: jinja2's parser words them its own way). Needs no shared data.
Not the real-template cross-check (test_chat_templates.py).
"""
import json
import os
import subprocess

import jinja2
import pytest

import hf_render

CONTEXT = {
    "s": "Héllo, World  ",
    "n": 7,
    "f": 2.5,
    "t": True,
    "z": None,
    "l": [3, 1, 2],
    "words": ["banana", "Apple", "cherry", "apple"],
    "d": {"b": 1, "a": [1, 2.0, "x"], "items": "shadowed", "c": {"deep": "yes"}},
    "users": [{"name": "ann", "age": 31, "admin": True}, {"name": "Bob", "age": 25},
              {"name": "cy", "age": 31, "admin": False}],
    "tree": [{"name": "a", "children": [{"name": "a1", "children": []}, {"name": "a2", "children": []}]},
             {"name": "b", "children": []}],
    "quote": "it's \"quoted\"\n\ttab\\",
    "uni": "中文 ☕ é\u00a0\u200b",
}

SNIPPETS = [
    # printing values the way Python's str() does
    "{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ -3 }}|{{ 1.0 }}|{{ 0.1 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}",
    "{{ 0.0001 }}|{{ 0.00001 }}|{{ 2.5e-10 }}|{{ 123456789.123456789 }}|{{ -0.0 }}|{{ 1/3 }}|{{ 10/4 }}",
    "{{ [1, 'a', none, true, 2.5] }}|{{ {'k': 'v', 'n': [1]} }}|{{ (1,) }}|{{ () }}|{{ (1, 'b') }}",
    "{{ [quote] }}|{{ [uni] }}|{{ ['a\\'b'] }}|{{ [\"a'b\\\"c\"] }}|{{ d }}",
    "{{ z }}{{ undefined_name }}|{{ d.missing }}|{{ users[0] }}",
    # whitespace control with trim_blocks and lstrip_blocks
    "a\n  {% if t %}\n  b\n  {% endif %}\nc\n",
    "a\n  {%+ if t %}\n  b\n  {% endif +%}\nc",
    "a  {%- if t -%}  b  {%- endif -%}  c",
    "x {{- ' y ' -}} z\n  {{ 'v' }}\n",
    "  {# comment #}\nline\n  {#- trimmed -#}  \nend",
    "{% raw %}{{ not parsed }} {% if %}{% endraw %}|\n  {%- raw -%}  keep {{x}}  {%- endraw %}",
    "line1\r\nline2\r\n{% if t %}\r\nyes\r\n{% endif %}\r\n",
    "{% for i in l %}\n  {{ i }}\n{% endfor %}\n",
    "{%- for i in l -%}\n{{ i }},\n{%- endfor %}",
    "trailing newline kept?\n\n",
    # operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
    "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2, 3] }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }}",
    "{{ 'a' in 'cat' }} {{ 2 in l }} {{ 'b' in d }} {{ 'x' not in d }} {{ 'q' in undefined_thing }}",
    "{{ 1 ~ 2 ~ none ~ undefined_v ~ 'x' }}|{{ t and 'yes' }}|{{ z or 'fallback' }}|{{ 0 or '' }}|{{ not z }}",
    "{{ 'a' if t }}|{{ 'a' if z }}|{{ 'a' if z else 'b' if n > 5 else 'c' }}",
    "{{ n + f }} {{ n * f }} {{ n - 10 }} {{ 3 / 2 }} {{ 4 / 2 }}",
    "{{ 'a' + 1 }}",
    "{{ 1 + 'a' }}",
    "{{ 1 < 'a' }}",
    "{{ undefined_v + 1 }}",
    "{{ d.missing.deeper }}",
    "{{ users[9].name }}",
    # subscripts and slices
    "{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ s[1] }} {{ s[::-1] }} {{ s[2:5] }}",
    "{{ uni[0] }}{{ uni[-2:] }}|{{ uni|length }}|{{ uni[::2] }}|{{ l[5:] }}|{{ l[-10:2] }}",
    "{{ d['a'][2] }} {{ d.a.1 }} {{ d['c']['deep'] }} {{ d.c.deep }} {{ d['items'] }} {{ d.items()|list }}",
    "{{ users.0.name }}|{{ users[1]['age'] }}",
    # filters
    "{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello world-foo bar_x (y)'|title }}|{{ 'hELLO'|capitalize }}",
    "{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ words|sort }}|{{ words|sort(case_sensitive=true) }}",
    "{{ words|unique|list }}|{{ words|first }}|{{ words|last }}|{{ words|min }}|{{ words|max }}|{{ l|sum }}",
    "{{ words|join(', ') }}|{{ l|join }}|{{ users|map(attribute='name')|join('/') }}|{{ l|reverse|list }}",
    "{{ users|selectattr('admin')|map(attribute='name')|list }}|{{ users|rejectattr('admin')|list|length }}",
    "{{ users|selectattr('age', 'equalto', 31)|map(attribute='name')|join }}|{{ l|select('odd')|list }}",
    "{{ l|reject('even')|list }}|{{ users|map(attribute='missing', default='?')|list }}|{{ l|map('string')|join('-') }}",
    "{{ users|sort(attribute='age')|map(attribute='name')|join }}|{{ users|sort(attribute='age,name')|map(attribute='name')|join }}",
    "{{ users|groupby('age')|list }}|{{ users|sum(attribute='age') }}|{{ users|max(attribute='age') }}",
    "{{ d|dictsort }}|{{ d|items|list }}|{{ d|list }}|{{ d|length }}|{{ undefined_v|items|list }}",
    "{{ undefined_v|default('dflt') }}|{{ ''|default('e', true) }}|{{ z|default('n') }}|{{ undefined_v|d('x') }}",
    "{{ '42'|int }}|{{ ' 0x1F '|int(base=16) }}|{{ '3.9'|int }}|{{ 'abc'|int(5) }}|{{ 2.7|int }}|{{ '1_000'|int }}",
    "{{ '3.5'|float }}|{{ 'x'|float }}|{{ 4|float }}|{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ 3.5|round }}",
    "{{ 2.567|round(1, 'floor') }}|{{ 2.561|round(1, 'ceil') }}|{{ -3|abs }}|{{ -2.5|abs }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('--', blank=true) }}",
    "{{ 'x'|center(7) }}|{{ 'ab'|center(7) }}|{{ 'hello world foo'|truncate(9) }}|{{ 'hello world'|truncate(5, true) }}",
    "{{ 'hello world foo bar'|wordcount }}|{{ 'a,b'|replace(',', ';') }}|{{ 'aaa'|replace('a', 'b', 2) }}",
    "{{ '<b>x</b>'|escape }}|{{ '<b>'|e }}|{{ '<i>y</i>'|safe }}|{{ '<a>'|forceescape }}|{{ '<p>a  <b>b</b></p>'|striptags }}",
    "{{ '%s-%05.1f-%d%%'|format('a', 3.14159, 7) }}|{{ '%(x)s!'|format(x=1) }}|{{ '%r'|format('q') }}",
    "{{ l|batch(2)|list }}|{{ l|batch(2, 0)|list }}|{{ range(7)|slice(3)|list }}|{{ l|list|count }}",
    "{{ users|attr('missing') }}|{{ d|attr('b') }}|{{ 42|string + '!' }}|{{ [1]|string }}|{{ 'abc'|list }}",
    # tojson as transformers overrides it
    "{{ d|tojson }}|{{ uni|tojson }}|{{ quote|tojson }}|{{ [1.0, 2.5e-7, 1e22, none, true]|tojson }}",
    "{{ d|tojson(indent=2) }}|{{ {'b': 1, 'a': {}}|tojson(sort_keys=true) }}|{{ l|tojson(separators=(',', ':')) }}",
    "{{ uni|tojson(ensure_ascii=true) }}|{{ '😀'|tojson(ensure_ascii=true) }}|{{ {'x': []}|tojson(indent=0) }}|{{ d|tojson(indent='\\t') }}",
    "{{ {1: 'int key', none: 'n', true: 'b'}|tojson }}",
    "{{ undefined_v|tojson }}",
    # tests
    "{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ n is divisibleby(2) }} {{ z is none }} {{ z is not none }}",
    "{{ s is string }} {{ n is number }} {{ t is number }} {{ t is boolean }} {{ n is integer }} {{ f is float }}",
    "{{ d is mapping }} {{ l is sequence }} {{ d is sequence }} {{ s is iterable }} {{ n is iterable }} {{ l is mapping }}",
    "{{ undefined_v is defined }} {{ undefined_v is undefined }} {{ s is lower }} {{ 'ABC' is upper }} {{ 3 is in l }}",
    "{{ n is eq 7 }} {{ n is ne 7 }} {{ n is gt 5 }} {{ n is lt 5 }} {{ n is ge 7 }} {{ n is le 6 }} {{ z is sameas none }}",
    "{{ t is true }} {{ t is false }} {{ 1 is true }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ range is callable }}",
    "{{ '<x>'|safe is escaped }} {{ 'x' is escaped }} {{ undefined_v is sequence }} {{ undefined_v is iterable }}",
    # string methods
    "{{ s.strip() }}|{{ s.lstrip('H') }}|{{ s.rstrip() }}|{{ s.split(',') }}|{{ s.split() }}|{{ 'a  b c'.split(' ') }}",
    "{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' a b  c '.rsplit(None, 1) }}|{{ 'x\\ny\\r\\nz'.splitlines() }}",
    "{{ s.startswith('Hé') }} {{ s.endswith(('x', '  ')) }} {{ s.upper() }} {{ s.lower() }} {{ 'ab cd'.title() }} {{ 'aBc'.capitalize() }}",
    "{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ 'ab'.replace('', '-') }}|{{ s.find('l') }}|{{ s.rfind('l') }}|{{ s.count('l') }}",
    "{{ '-'.join(words) }}|{{ 'x'.center(5, '*') }}|{{ '7'.zfill(3) }}|{{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}",
    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'ab1'.isalnum() }} {{ 'abc'.islower() }} {{ 'AB'.isupper() }}",
    "{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'x.txt'.removesuffix('.txt') }}|{{ 'k=v=w'.partition('=') }}|{{ 'k=v=w'.rpartition('=') }}",
    "{{ '{} and {}'.format(1, 'b') }}|{{ '{0}{0}{1}'.format('a', 'b') }}|{{ '{x}:{y!r}'.format(x=1, y='s') }}|{{ '{:>5}|{:<4}|{:^5}|{:.2f}'.format('a', 'b', 'c', 3.14159) }}",
    "{{ 'x'.index('y') }}",
    "{{ d.keys()|list }}|{{ d.values()|list|length }}|{{ d.get('b') }}|{{ d.get('nope') }}|{{ d.get('nope', 5) }}|{{ l.index(2) }}|{{ l.count(3) }}",
    "{{ l.append }}|{{ d.update }}",
    "{{ l.append(4) }}",
    "{{ d.pop('b') }}",
    # loops
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in l %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }}|{% endfor %}",
    "{% for x in l %}{{ loop.cycle('a', 'b') }}{% endfor %}|{% for x in [1, 1, 2] %}{{ loop.changed(x) }}{% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'abc' %}{{ c }}.{% endfor %}",
    "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}|{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% if x == 3 %}{% break %}{% endif %}{% endfor %}",
    "{% for x in l %}{% for y in l %}{{ loop.index }}{{ x }}{{ y }}{% if loop.last %},{% endif %}{% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for n in tree recursive %}{{ n.name }}[{{ loop.depth }}]{% if n.children %}({{ loop(n.children) }}){% endif %}{% endfor %}",
    "{% for x in undefined_v %}x{% else %}none{% endfor %}",
    "{% for x in n %}x{% endfor %}",
    "{% for a, b in l %}{% endfor %}",
    # scoping
    "{% set x = 1 %}{% for i in l %}{{ x }}{% set x = i %}{{ x }},{% endfor %}{{ x }}",
    "{% set ns = namespace(total=0, seen=[]) %}{% for i in l %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }}{{ ns.seen }}",
    "{% if t %}{% set y = 5 %}{% endif %}{{ y }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set tup = 1, 2 %}{{ tup }}",
    "{% set block %}inside {{ n }}{% endset %}[{{ block }}]|{% set up | upper %}shout{% endset %}{{ up }}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}|{% filter upper %}filtered {{ s }}{% endfilter %}",
    "{% set x = 5 %}{% set q = x if x > 3 %}{{ q }}",
    "{% set ns = [] %}{% set ns.attr = 1 %}",
    # macros
    "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}|{{ m() }}",
    "{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, x=3) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}",
    "{% macro m() %}<{{ caller() }}>{% endmacro %}{% call m() %}body {{ n }}{% endcall %}",
    "{% macro m(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) m(l) %}[{{ x }}]{% endcall %}",
    "{% macro m() %}{{ z2 }}{% endmacro %}{% set z2 = 1 %}{{ m() }}{% set z2 = 2 %}{{ m() }}",
    "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
    "{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(4) }}|{% set r = m(1) %}{{ r ~ r }}|{{ m(3)|length }}",
    "{%- macro m(x) -%}\n  [{{ x }}]\n{%- endmacro -%}\n{{ m(1) }}{{ m(2) }}",
    # globals
    "{{ range(3)|list }}|{{ range(1, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ dict(a=1, b=2) }}|{{ dict([('x', 1)]) }}",
    "{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}|{% set j = joiner('+') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}",
    "{{ namespace(a=1).a }}|{{ namespace({'k': 2}).k }}|{{ namespace(a=1).b }}",
    "{{ raise_exception('custom failure: ' ~ n) }}",
    "{{ range(200000)|length }}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %j') }}",
    # markup safety, literals, odds and ends
    "{{ ('<a>'|safe) + '<b>' }}|{{ '<b>' + ('<a>'|safe) }}|{{ 'x' ~ ('<a>'|safe) }}|{{ ('<a>'|safe) ~ '<b>' }}",
    "{{ '\\x41\\u00e9\\n\\t|\\101|\\q' }}|{{ 'a' 'b' \"c\" }}|{{ 1_000 }} {{ 0x10 }} {{ 0b11 }} {{ 0o17 }} {{ 1e3 }} {{ 2.5E-3 }}",
    "{{ [1, 2,] }}|{{ {'a': 1,} }}|{{ {'a': 1}.a }}|{{ (1, 2) == (1, 2) }}|{{ [1, 2][1:] }}|{{ -1|abs }}|{{ not 1 == 2 }}",
    "{{ none.x }}|{{ z.attr }}|{{ loop }}|{% for i in l %}{% endfor %}{{ i }}|{{ d.c.deep is defined }}|{{ d.zz is defined }}",
    "{{ none.x.y }}",
    "{{ d.x.y is defined }}",
    "{{ '%.3f|%5s|%-5s|%x'|format(1, 'r', 'l', 255) }}|{% for x in l %}{{ loop.depth0 }}{% endfor %}",
    "{% generation %}gen {{ n }}{% endgeneration %}|{{ messages }}|{{ users[0]|tojson }}",
    "{% for u in users %}{% set u = u.name %}{{ u }}{% endfor %}|{{ users|map(attribute='name')|map('upper')|join }}",
    "{{ '  x  '|trim('x ') }}|{{ 'xxaxx'|trim('x') }}|{{ words|join(attribute='0') if false else 'j' }}",
    "{{ l|first is number }}|{{ []|first is defined }}|{{ []|last }}|{{ ''|list }}|{{ 5 in range(10) }}",
    "{% set d2 = {'k': {'n': 1}} %}{{ d2.k.n }}{{ d2['k'].n + 1 }}|{% set e = [] %}{{ e|length }}{{ e is sequence }}",
    "{% if messages %}has{% elif t %}elif{% else %}else{% endif %}|{% if z %}a{% elif z is none %}b{% endif %}",
    "{{ users|selectattr('name', 'in', ['ann', 'cy'])|list|length }}|{{ users|selectattr('age', 'gt', 26)|map(attribute='name')|list }}",
    "{{ (users|selectattr('admin', 'defined')|list)|length }}|{{ users|rejectattr('admin', 'undefined')|map(attribute='name')|join(',') }}",
    "{{ words|map('lower')|unique|list }}|{{ words|unique(case_sensitive=true)|list }}|{{ words|sort|reverse|join }}",
    "{{ 10 // 3 * 3 + 10 % 3 }}|{{ 2 ** 3 ** 2 }}|{{ (2 ** 3) ** 2 }}|{{ 7 / 7 }}|{{ 1e300 * 1e10 }}|{{ -1e300 * 1e10 }}",
    # generators (select, map, reverse, ...): always true, no len(), not subscriptable, not JSON
    "{% if [1]|select('even') %}T{% else %}F{% endif %}{% if []|reverse %}T{% endif %}{{ [1]|select is sequence }}|{{ ([1]|map('int'))[0] }}|{{ [1]|map('int') is iterable }}",
    "{{ [1]|select|length }}",
    "{{ [1]|select|tojson }}",
    "{{ namespace(a=1) }}|{% for x in [1, 2] %}{{ loop }}{% endfor %}|{{ (users|selectattr('admin')|list)[0].name }}",
    # unknown filters and tests: an error where jinja2 compiles them, only when applied inside if / conditionals
    "{% if false %}{{ x|no_such_filter }}{% endif %}{% if z %}{{ 1 is no_such_test }}{% endif %}ok",
    "{{ 1|no_such_filter if false else 'b' }}|{{ 'a' if t else (1 is no_such_test) }}",
    "{% if t %}{{ 1|no_such_filter }}{% endif %}",
    "{{ 'x' if (1 is no_such_test) }}",
    "{% if false %}{% for i in l %}{{ i|no_such_filter }}{% endfor %}{% endif %}",
    "{% if false %}{% macro m() %}{{ 1|no_such_filter }}{% endmacro %}{% endif %}",
    "{% if false %}{% with a = 1 %}{{ a is no_such_test }}{% endwith %}{% endif %}",
    "{% for i in ([] if false else l|no_such_filter) %}{% endfor %}",
    # syntax errors (must fail; wording is jinja2's own)
    "{% if t %}unclosed",
    "{% for x in l %}{% endif %}",
    "{{ x|no_such_filter }}",
    "{{ x is no_such_test }}",
    "{% do l.append(1) %}",
    "{{ 'unterminated }}",
    "{{ (1 + }}",
    "{% endfor %}",
    "{% break %}",
    "{# never closed",
]

SYNTAX_ERRORS = {i for i, s in enumerate(SNIPPETS) if i >= SNIPPETS.index("{% if t %}unclosed")}


def reference(source):
    os.environ["SOURCE_DATE_EPOCH"] = "1718000000"
    try:
        tmpl = hf_render.environment().from_string(source)
        return tmpl.render(messages=[], **CONTEXT), None
    except Exception as e:  # noqa: BLE001 (the reference's failure is part of what is compared)
        return None, e


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # '\\q' is tested on purpose
@pytest.mark.parametrize("idx", range(len(SNIPPETS)), ids=[f"s{i:03d}" for i in range(len(SNIPPETS))])
def test_snippet(strata_bin, tmp_path, idx):
    source = SNIPPETS[idx]
    want, err = reference(source)
    t = tmp_path / "t.jinja"
    t.write_bytes(source.encode("utf-8"))
    m = tmp_path / "m.json"
    m.write_text("[]")
    c = tmp_path / "c.json"
    c.write_text(json.dumps(CONTEXT, ensure_ascii=False), encoding="utf-8")
    got = subprocess.run([str(strata_bin), "template", "--file", str(t), "--messages", str(m), "--context", str(c)],
                         capture_output=True, env=dict(os.environ, SOURCE_DATE_EPOCH="1718000000"), timeout=60)
    stderr = got.stderr.decode(errors="replace")
    if err is not None:
        assert got.returncode != 0, f"reference failed ({type(err).__name__}: {err}); strata printed " \
                                    f"{got.stdout.decode(errors='replace')!r}"
        if idx not in SYNTAX_ERRORS and not isinstance(err, jinja2.TemplateSyntaxError):
            assert str(err) in stderr, f"want {err!r}"
        assert "t.jinja:" in stderr  # the template and line are named
        return
    assert got.returncode == 0, stderr
    assert got.stdout.decode("utf-8") == want
