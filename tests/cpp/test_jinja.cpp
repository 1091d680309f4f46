// The chat-template language on its own: expressions, filters, loops, macros, whitespace control, Python-style
// printing and JSON, and error messages that name the line. Expected outputs are what jinja2 (set up as
// transformers sets it up) prints; tests/python cross-checks the same ground against jinja2 itself.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/chat_template.h"
#include "jinja/jinja.h"
#include "jinja/value.h"

using namespace strata;
using json = nlohmann::ordered_json;

namespace {

std::string R(const std::string &src, const std::string &ctx = "{}") {
    return jinja::Template::parse(src, "t").render(json::parse(ctx));
}

// The strata::Error message a template produces (parse or render), or "" when it renders.
std::string err(const std::string &src, const std::string &ctx = "{}") {
    try {
        R(src, ctx);
    } catch (const Error &e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(JinjaPrint, PythonStr) {
    EXPECT_EQ(R("{{ none }}|{{ true }}|{{ false }}|{{ 1.0 }}|{{ 0.1 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}"),
              "None|True|False|1.0|0.1|1e+20|1e+16|1000000000000000.0");
    EXPECT_EQ(R("{{ 0.0001 }}|{{ 0.00001 }}|{{ -0.0 }}|{{ 1/3 }}"), "0.0001|1e-05|-0.0|0.3333333333333333");
    EXPECT_EQ(R("{{ [1, 'a', none, true] }}|{{ {'k': [1.5]} }}|{{ (1,) }}|{{ () }}"),
              "[1, 'a', None, True]|{'k': [1.5]}|(1,)|()");
    EXPECT_EQ(R("{{ [\"it's\", 'a\"b', 'x\\ny\\\\'] }}"), R"(["it's", 'a"b', 'x\ny\\'])");
    EXPECT_EQ(R("{{ undefined_thing }}[{{ d.missing }}]", R"({"d": {}})"), "[]");
}

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
    EXPECT_EQ(R("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");  // one trailing newline dropped
    EXPECT_EQ(R("a\n  {%+ if true %}\n  b\n  {% endif +%}\nc"), "a\n    b\n\nc");
    EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
    EXPECT_EQ(R("x {{- ' y ' -}} z\n  {{ 'v' }}"), "x y z\n  v");  // lstrip_blocks leaves {{ }} alone
    EXPECT_EQ(R("  {# c #}\nline\n  {#- t -#}  \nend"), "lineend");
    EXPECT_EQ(R("{% raw %}{{ x }}{% if %}{% endraw %}"), "{{ x }}{% if %}");
    EXPECT_EQ(R("l1\r\nl2\r\n{% if true %}\r\nyes\r\n{% endif %}\r\n"), "l1\nl2\nyes\n");
}

TEST(JinjaExpr, Operators) {
    EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 4 / 2 }}"),
              "3 -4 2 -2 1024 2.5 2.0");
    EXPECT_EQ(R("{{ 1 + 2 * 3 }} {{ -2 ** 2 }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 1 ~ none ~ 'x' }}"),
              "7 4 abab [1, 2] 1Nonex");
    EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' in 'cat' }} {{ 2 not in [1] }}"),
              "True False True True True True");
    EXPECT_EQ(R("{{ none or 'f' }}|{{ 0 and 'x' }}|{{ 'a' if false }}|{{ 'a' if 0 else 'b' }}"), "f|0||b");
    EXPECT_EQ(R("{{ s[1] }} {{ s[::-1] }} {{ s[-2:] }} {{ s|length }} {{ l[1:] }}", R"({"s": "héllo", "l": [1,2,3]})"),
              "é olléh lo 5 [2, 3]");
}

TEST(JinjaExpr, AttributeLookupLikePython) {
    const char *ctx = R"({"d": {"items": "val", "a": {"b": 1}}})";
    EXPECT_EQ(R("{{ d['items'] }}|{{ d.a.b }}|{{ d['a']['b'] }}|{{ d.items()|length }}", ctx), "val|1|1|2");
    EXPECT_EQ(R("{{ none.x }}|{{ d.nope is defined }}", ctx), "|False");
}

TEST(JinjaFilters, Common) {
    EXPECT_EQ(R("{{ '  a b '|trim }}|{{ 'ab'|upper }}|{{ 'hello world-x'|title }}|{{ 'x,y'|replace(',', ';') }}"),
              "a b|AB|Hello World-X|x;y");
    EXPECT_EQ(R("{{ [3, 1, 2]|sort }}|{{ ['b', 'A', 'a']|sort }}|{{ [1, 2]|join('-') }}|{{ [1, 2]|reverse|list }}"),
              "[1, 2, 3]|['A', 'a', 'b']|1-2|[2, 1]");
    const char *users = R"({"u": [{"n": "a", "x": true}, {"n": "b"}, {"n": "c", "x": false}]})";
    EXPECT_EQ(R("{{ u|selectattr('x')|map(attribute='n')|join }}|{{ u|rejectattr('x', 'defined')|map(attribute='n')|join }}",
                users),
              "a|b");
    EXPECT_EQ(R("{{ x|default('d') }}|{{ ''|default('e', true) }}|{{ '42'|int + 1 }}|{{ '2.5'|float }}|{{ 'z'|int }}"),
              "d|e|43|2.5|0");
    EXPECT_EQ(R("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
    EXPECT_EQ(R("{{ {'b': 1, 'a': 2}|items|list }}|{{ {'b': 1, 'a': 2}|dictsort }}"),
              "[('b', 1), ('a', 2)]|[('a', 2), ('b', 1)]");
    EXPECT_EQ(R("{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ '%s=%03d'|format('k', 7) }}"),
              "2.57|2.0|4.0|k=007");
}

TEST(JinjaFilters, TojsonAsTransformers) {
    const char *ctx = R"({"d": {"b": 1, "a": [1.0, "é\n\"<>"], "e": {}}})";
    EXPECT_EQ(R("{{ d|tojson }}", ctx), R"({"b": 1, "a": [1.0, "é\n\"<>"], "e": {}})");
    EXPECT_EQ(R("{{ d|tojson(indent=2) }}", ctx),
              "{\n  \"b\": 1,\n  \"a\": [\n    1.0,\n    \"é\\n\\\"<>\"\n  ],\n  \"e\": {}\n}");
    EXPECT_EQ(R("{{ d|tojson(sort_keys=true, separators=(',', ':')) }}", ctx), R"({"a":[1.0,"é\n\"<>"],"b":1,"e":{}})");
    EXPECT_EQ(R("{{ 'é😀'|tojson(ensure_ascii=true) }}"), R"("\u00e9\ud83d\ude00")");
    EXPECT_NE(err("{{ nope|tojson }}").find("Object of type Undefined is not JSON serializable"), std::string::npos);
}

TEST(JinjaTests, Builtins) {
    EXPECT_EQ(R("{{ 3 is odd }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is sequence }}{{ {} is sequence }}"),
              "TrueTrueTrueTrueTrue");
    EXPECT_EQ(R("{{ x is defined }}{{ none is none }}{{ 1 is not none }}{{ true is number }}{{ 1 is integer }}"),
              "FalseTrueTrueTrueTrue");
    EXPECT_EQ(R("{{ 6 is divisibleby 3 }}{{ 2 is in [1, 2] }}{{ 5 is gt 3 }}{{ 'ab' is lower }}{{ 5 is iterable }}"),
              "TrueTrueTrueTrueFalse");
}

TEST(JinjaMethods, Strings) {
    EXPECT_EQ(R("{{ 'a,b,c'.split(',', 1) }}|{{ ' a  b '.split() }}|{{ 'x</t>y'.split('</t>')[-1] }}"),
              "['a', 'b,c']|['a', 'b']|y");
    EXPECT_EQ(R("{{ '\nx\n'.strip('\n') }}|{{ 'xxa'.lstrip('x') }}|{{ 'ab'.startswith('a') }}|{{ 'ab'.endswith(('x', 'b')) }}"),
              "x|a|True|True");
    EXPECT_EQ(R("{{ 'aXb'.lower() }}|{{ 'ab cd'.title() }}|{{ 'abcb'.rfind('b') }}|{{ '-'.join(['a', 'b']) }}"),
              "axb|Ab Cd|3|a-b");
    EXPECT_EQ(R("{{ '{} {x}'.format(1, x='y') }}|{{ 'é'.upper() }}"), "1 y|É");
}

TEST(JinjaLoops, LoopVariable) {
    EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                "{{ loop.last }}{{ loop.length }};{% endfor %}"),
              "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
    EXPECT_EQ(R("{% for x in [1, 2] %}{{ loop.previtem is defined }}{{ loop.nextitem }}|{% endfor %}"), "False2|True|");
    EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}{% endfor %}"),
              "empty|12");
    EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}|{% for c in 'ab' %}{{ c }}.{% endfor %}"),
              "a1b2|a.b.");
    EXPECT_EQ(R("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
                "{{ x }}{% endfor %}"),
              "13");
    EXPECT_EQ(R("{% for n in t recursive %}{{ n.v }}{% if n.c %}({{ loop(n.c) }}){% endif %}{% endfor %}",
                R"({"t": [{"v": 1, "c": [{"v": 2, "c": []}]}, {"v": 3}]})"),
              "1(2)3");
}

TEST(JinjaScopes, LikeJinja2) {
    // A loop iteration has its own scope (each starts from the outer value); if-blocks do not.
    EXPECT_EQ(R("{% set x = 1 %}{% for i in [5, 6] %}{{ x }}{% set x = i %}{{ x }},{% endfor %}{{ x }}"), "15,16,1");
    EXPECT_EQ(R("{% if true %}{% set y = 2 %}{% endif %}{{ y }}"), "2");
    EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
    // Macros see their defining scope as it is when they are called.
    EXPECT_EQ(R("{% macro m() %}{{ z }}{% endmacro %}{% set z = 1 %}{{ m() }}{% set z = 2 %}{{ m() }}"), "12");
    EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a + b }}|{% set blk %}x{{ 1 }}{% endset %}{{ blk }}|{% with q = 3 %}{{ q }}{% endwith %}{{ q }}"),
              "3|x1|3");
}

TEST(JinjaMacros, ArgumentsAndCaller) {
    EXPECT_EQ(R("{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, c=3) }}|{{ m() }}"),
              "1BNone|1B3|BNone");
    EXPECT_EQ(R("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, x=2) }}"), "(1,){'x': 2}");
    EXPECT_EQ(R("{% macro m(l) %}{% for i in l %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) m([1, 2]) %}[{{ x }}]{% endcall %}"),
              "[1][2]");
    EXPECT_EQ(R("{% macro f(k) %}{% if k <= 1 %}1{% else %}{{ k * f(k - 1)|int }}{% endif %}{% endmacro %}{{ f(5) }}"), "120");
    EXPECT_NE(err("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("takes not more than 1 argument"), std::string::npos);
}

TEST(JinjaMarkup, SafeStringsEscapeTheOtherSideOfPlus) {
    EXPECT_EQ(R("{{ ('<a>'|safe) + '<b>' }}|{{ '<b>' ~ ('<a>'|safe) }}|{{ '<x>'|e }}"), "<a>&lt;b&gt;|<b><a>|&lt;x&gt;");
}

TEST(JinjaErrors, NameTheLine) {
    EXPECT_EQ(err("a\nb\n{{ raise_exception('bad input') }}"), "t:3: the template raised an error: bad input");
    EXPECT_EQ(err("{% if x %}\n{{ 1 }}\n"),  // the final newline is dropped, so the end is on line 2
              "t:2: syntax error: Unexpected end of template. Jinja was looking for the following tags: 'elif' or "
              "'else' or 'endif'. The innermost block that needs to be closed is 'if'.");
    EXPECT_EQ(err("\n\n{{ x|nope }}"), "t:3: syntax error: No filter named 'nope'.");
    EXPECT_EQ(err("{{ x is nope }}"), "t:1: syntax error: No test named 'nope'.");
    EXPECT_EQ(err("{% do x %}"), "t:1: syntax error: Encountered unknown tag 'do'.");
    EXPECT_EQ(err("{% break %}"), "t:1: syntax error: 'break' outside of a loop");
    EXPECT_EQ(err("line\n{{ 'a' + 1 }}"), "t:2: can only concatenate str (not \"int\") to str");
    EXPECT_EQ(err("{{ foo.bar }}"), "t:1: 'foo' is undefined");
    EXPECT_EQ(err("{{ d.x.y }}", R"({"d": {}})"), "t:1: 'dict object' has no attribute 'x'");
    EXPECT_EQ(err("{{ [].append(1) }}"), "t:1: access to attribute 'append' of 'list' object is unsafe.");
    // An error inside a macro names the macro's line.
    EXPECT_EQ(err("{% macro m() %}\n{{ 1 < 'a' }}\n{% endmacro %}\n\n{{ m() }}"),
              "t:2: '<' not supported between instances of 'int' and 'str'");
    EXPECT_EQ(err("{# open"), "t:1: syntax error: Missing end of comment tag");
}

// jinja2 resolves a filter or test name that no builtin has when it compiles the template, except inside an `if` or a
// conditional expression, where only applying it fails: a released template may use a filter of its own serving
// framework in a branch that our conversations never take.
TEST(JinjaErrors, UnknownNamesInBranchesFailOnlyWhenApplied) {
    EXPECT_EQ(R("{% if false %}{{ x|framework_only }}{% endif %}ok"), "ok");
    EXPECT_EQ(R("{% if false %}{% elif false %}{{ 1 is framework_test }}{% else %}e{% endif %}"), "e");
    EXPECT_EQ(R("{{ 1|framework_only if false else 'b' }}|{{ 'a' if true else (1 is framework_test) }}"), "b|a");
    EXPECT_EQ(err("{% if true %}\n{{ 1|framework_only }}{% endif %}"), "t:2: No filter named 'framework_only' found.");
    EXPECT_EQ(err("{{ (1 is framework_test) if true else 2 }}"), "t:1: No test named 'framework_test' found.");
    // Loops, macros and blocks inside a branch are checked when parsed again, as jinja2's inner frames are.
    EXPECT_EQ(err("{% if false %}{% for i in [1] %}{{ i|nope }}{% endfor %}{% endif %}"),
              "t:1: syntax error: No filter named 'nope'.");
    EXPECT_EQ(err("{% if false %}{% macro m() %}{{ 1|nope }}{% endmacro %}{% endif %}"),
              "t:1: syntax error: No filter named 'nope'.");
    EXPECT_EQ(err("{% set x %}{{ 1 is nope }}{% endset %}"), "t:1: syntax error: No test named 'nope'.");
    // Applied through select/map, a name is looked up when the filter runs, with jinja2's runtime wording.
    EXPECT_EQ(err("{{ [1]|select('nope')|list }}"), "t:1: No test named 'nope'.");
}

// from_json, the JSON-parsing filter serving frameworks define for templates that normalise tool-call arguments.
TEST(JinjaFilters, FromJson) {
    EXPECT_EQ(R(R"({{ ('{"a": [1, 2.5, null], "b": "x"}'|from_json).a }}|{{ ('[1]'|fromjson)[0] + 1 }})"),
              "[1, 2.5, None]|2");
    EXPECT_EQ(R("{{ (args|from_json).k }}", R"({"args": {"k": "already an object"}})"), "already an object");
    EXPECT_EQ(err("{{ 'not json'|from_json }}"), "t:1: from_json: the string is not JSON");
    EXPECT_EQ(err("{{ undefined_thing|from_json }}"), "t:1: 'undefined_thing' is undefined");
}

TEST(JinjaErrors, HostileNestingIsAnErrorNotACrash) {
    std::string deep_parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
    EXPECT_NE(err(deep_parens).find("nested too deeply"), std::string::npos);
    std::string long_chain = "{{ 1";
    for (int i = 0; i < 100000; i++) long_chain += "+1";
    EXPECT_NE(err(long_chain + " }}").find("nested too deeply"), std::string::npos);
    std::string deep_ifs;
    for (int i = 0; i < 3000; i++) deep_ifs += "{% if true %}";
    EXPECT_NE(err(deep_ifs).find("nested too deeply"), std::string::npos);
    EXPECT_NE(err("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}").find("maximum recursion depth"),
              std::string::npos);
    std::string deep_json = std::string(1000, '[') + std::string(1000, ']');
    EXPECT_NE(err("{{ x }}", "{\"x\": " + deep_json + "}").find("nested more than 512"), std::string::npos);
    // Sandbox limits, as jinja2's sandbox has them.
    EXPECT_NE(err("{{ range(200000)|length }}").find("Range too big"), std::string::npos);
}

TEST(JinjaValue, FloatReprAndJson) {
    using jinja::float_repr;
    EXPECT_EQ(float_repr(1e22), "1e+22");
    EXPECT_EQ(float_repr(123456789012345678.0), "1.2345678901234568e+17");
    EXPECT_EQ(float_repr(2.5e-7), "2.5e-07");
    EXPECT_EQ(float_repr(1.5), "1.5");
    EXPECT_EQ(float_repr(NAN), "nan");
    jinja::JsonStyle st;
    EXPECT_EQ(jinja::dumps(jinja::Value::number(INFINITY), st), "Infinity");
    EXPECT_EQ(jinja::python_str_repr("\x01\xc2\xa0"), "'\\x01\\xa0'");
}

TEST(ChatTemplate, RenderChatContext) {
    ChatTemplate t = ChatTemplate::parse(
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if tools is none %}[no tools]{% else %}[{{ tools|length }} tools]{% endif %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{{ documents }}{{ eos_token }}{{ flag }}",
        "chat");
    json msgs = json::parse(R"([{"role": "user", "content": "hi"}])");
    EXPECT_EQ(render_chat(t, msgs, nullptr, true, "<s>", "</s>"), "<s><user>hi[no tools]<assistant>None</s>");
    EXPECT_EQ(render_chat(t, msgs, json::array(), false, "", "", json{{"flag", 7}}), "<user>hi[0 tools]None7");
}

TEST(ChatTemplate, PlainFallback) {
    json msgs = json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
    EXPECT_EQ(render_plain_fallback(msgs, true, "<s>"), "<s>System: S\n\nUser: ab\n\nAssistant:");
    EXPECT_EQ(render_plain_fallback(msgs, false, ""), "System: S\n\nUser: ab\n\n");
}

TEST(ChatTemplate, FromGguf) {
    GgufWriter w;
    w.add_string("general.architecture", "test");
    w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "hi"});
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_string("tokenizer.chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}");
    std::vector<uint8_t> bytes = w.write_to_memory();
    auto f = GgufFile::from_memory(bytes.data(), bytes.size());
    ModelChat chat(*f, "mem");
    ASSERT_TRUE(chat.has_template());
    EXPECT_TRUE(chat.notice().empty());
    EXPECT_EQ(chat.render(json::parse(R"([{"role": "user", "content": "x"}])"), nullptr, true), "<s>x</s>");

    GgufWriter plain;
    plain.add_string("general.architecture", "test");
    std::vector<uint8_t> b2 = plain.write_to_memory();
    auto f2 = GgufFile::from_memory(b2.data(), b2.size());
    ModelChat fallback(*f2, "mem2");
    EXPECT_FALSE(fallback.has_template());
    EXPECT_NE(fallback.notice().find("no chat template"), std::string::npos);
    EXPECT_EQ(fallback.render(json::parse(R"([{"role": "user", "content": "x"}])"), nullptr, true), "User: x\n\nAssistant:");
}

// The six shared templates parse (the Python cross-check renders them); skipped without ../shared.
TEST(ChatTemplate, SharedTemplatesParse) {
    std::filesystem::path dir = std::filesystem::path(STRATA_SHARED_DIR) / "testdata" / "templates";
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "shared test data not found at " << dir;
    int n = 0;
    for (const auto &e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() != ".jinja") continue;
        std::ifstream in(e.path());
        std::stringstream ss;
        ss << in.rdbuf();
        EXPECT_NO_THROW(ChatTemplate::parse(ss.str(), e.path().filename().string())) << e.path();
        n++;
    }
    EXPECT_GE(n, 6);
}
