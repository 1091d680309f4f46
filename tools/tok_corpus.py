#!/usr/bin/env python3
"""Deterministic test corpus for the tokenizer cross-checks: code, prose in many scripts, emoji, whitespace and
number runs, recombined by a seeded generator into records. Nothing is downloaded and nothing large is committed:
the same seed always gives the same records.

    tools/tok_corpus.py [--seed N] [--bytes N] [-o records.jsonl]   (one JSON string per line)

Not a benchmark of language coverage: it aims at the places where pre-tokenizers and merges go wrong (case
changes, contractions, marks, digits, whitespace before newlines, astral characters), not at realistic text.
"""
import argparse
import json
import random
import sys

CODE = [
    # C++
    '#include <iostream>\n#include <vector>\n\nint main(int argc, char **argv) {\n    std::vector<int> v{1, 2, 3};\n'
    '    for (auto &x : v) x <<= 2;\n    std::cout << "sum=" << v[0] + v[1] << \'\\n\';\n'
    '    return argc > 1 ? 0 : -1;\n}\n',
    'template <typename T, size_t N>\n'
    'constexpr T dot(const std::array<T, N> &a, const std::array<T, N> &b) noexcept {\n'
    '    T acc{};  // accumulate in T\n    for (size_t i = 0; i < N; ++i) acc += a[i] * b[i];\n    return acc;\n}\n',
    'struct Node { Node *next = nullptr; int32_t value = 0x7fffffff; };\nstatic_assert(sizeof(Node) == 16, "layout");\n'
    'auto p = std::make_unique<Node>(); p->next = nullptr; if (p && !p->next) { /* empty */ }\n',
    # Python
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n'
    '        a, b = b, a + b\n    return a\n\n\nprint(f"{fib(90):,}", {k: v**2 for k, v in enumerate(range(5))})\n',
    'class Cache(dict):\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n'
    '        self._hits = 0\n\n    @property\n    def hits(self):\n        return self._hits\n\n'
    'x = lambda s: s.strip().lower() if isinstance(s, str) else None\n',
    # Rust: lifetimes look like contractions ('a, 's, 'static)
    "fn longest<'a>(x: &'a str, y: &'a str) -> &'a str {\n    if x.len() > y.len() { x } else { y }\n}\n"
    "impl<'s> Parser<'s> {\n    pub fn new(src: &'s str) -> Self { Self { src, pos: 0 } }\n}\n"
    "static GREETING: &'static str = \"hi\";\nlet v: Vec<u8> = b\"bytes\\x00\".to_vec();\n",
    'fn main() -> Result<(), Box<dyn std::error::Error>> {\n    let mut map = HashMap::new();\n'
    '    map.insert("k", 1u64);\n    println!("{:?} {:#x}", map, 255);\n    Ok(())\n}\n',
    # JavaScript / TypeScript
    'const add = (a, b) => a + b;\nexport async function load(url: string): Promise<Response> {\n'
    '  const res = await fetch(`${BASE_URL}/api/v2?id=${encodeURIComponent(url)}`);\n'
    '  if (res.status !== 200 && res.status !== 304) throw new Error(`HTTP ${res.status}`);\n  return res;\n}\n',
    'document.querySelectorAll("div.item > a[href^=\'http\']").forEach((el, i) => { el.dataset.idx = i; });\n',
    # Go
    'func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {\n'
    '\tctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)\n'
    '\tdefer cancel()\n\tif err := s.handle(ctx, w, r); err != nil {\n'
    '\t\thttp.Error(w, err.Error(), http.StatusInternalServerError)\n\t}\n}\n',
    # SQL, shell, Makefile
    'SELECT u.id, COUNT(*) AS n_orders, SUM(o.total_cents) / 100.0 AS total\n'
    'FROM users u LEFT JOIN orders o ON o.user_id = u.id\n'
    "WHERE u.created_at >= '2024-01-01' AND u.email LIKE '%@example.com'\n"
    "GROUP BY u.id HAVING COUNT(*) > 3 ORDER BY total DESC;\n",
    'for f in ./*.txt; do\n  [ -s "$f" ] || continue\n  echo "${f%.txt}: $(wc -l < "$f")" 2>/dev/null\n'
    'done | sort -u >> out.log\n'
    'export PATH="$HOME/.local/bin:$PATH"; cd ~ && ls -la | grep -v \'^d\' | awk \'{print $9}\'\n',
    'CFLAGS ?= -O2 -Wall\n\nall: main.o util.o\n\t$(CC) $(CFLAGS) -o app $^\n\n%.o: %.c\n'
    '\t$(CC) $(CFLAGS) -c $< -o $@\n',
    # markup and data
    '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>Test &amp; more</title></head>\n'
    '<body>\n  <p class="x">Hello&nbsp;<b>world</b>!</p>\n  <!-- comment -->\n</body>\n</html>\n',
    '{\n  "name": "strata",\n  "version": "0.1.0",\n  "tags": ["moe", "gguf", "cuda"],\n  "ratio": 0.875,\n'
    '  "nested": {"a": null, "b": [true, false], "c": "\\u00e9\\n"}\n}\n',
    'server:\n  port: 8080\n  hosts:\n    - alpha.local\n    - beta.local\n'
    '  tls: {enabled: true, cert: /etc/ssl/cert.pem}\n',
    '| col A | col B | col C |\n|:------|:-----:|------:|\n| 1     | two   | 3.0   |\n| `x`   | **y** | _z_   |\n',
    '\\begin{equation}\n  \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n',
    '--- a/src/main.c\n+++ b/src/main.c\n@@ -10,7 +10,8 @@ int main(void)\n-    return 0;\n+    int rc = run();\n'
    '+    return rc;\n }\n',
    'id,name,price,qty\n1,"Widget, large",19.99,3\n2,Gadget,5,100\n3,"Quote ""inside""",0.5,7\n',
    'C:\\Users\\Admin\\AppData\\Local\\Temp\\file_01.tmp and '
    '/usr/local/lib/python3.11/site-packages/numpy/__init__.py\n',
    'https://example.com/search?q=tokenizer+test&lang=en#results mailto:someone@example.org ftp://10.0.0.1:21/pub\n',
    'uuid 123e4567-e89b-12d3-a456-426614174000 sha256 '
    '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n',
    'aGVsbG8gd29ybGQhIFRoaXMgaXMgYmFzZTY0IGVuY29kZWQgdGV4dC4uLg==\n0000000 6865 6c6c 6f20 776f 726c 640a\n',
    'XMLHttpRequest getElementById HTTPServerError parseJSONToHTML iPhone eBay McDonald ABCdef aBCDef\n'
    'snake_case_name SCREAMING_SNAKE_CASE kebab-case-name camelCaseName PascalCaseName __dunder__\n',
]

ENGLISH = [
    "I'm sure you're right, but it's late and they've already left; we'll see if she'd agree.",
    "DON'T SHOUT! I'M NOT DEAF, YOU'RE the one who'S loud. We'Ve been there, they'LL know, he'D say.",
    "'Tis the season: rock 'n' roll, the '90s, Jack's and Jill's buckets, the cats' toys.",
    "She said, \u201cIt\u2019s fine\u201d \u2014 but it wasn\u2019t; \u2018maybe\u2019 later\u2026 (or never).",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!",
    "On 2024-03-15 at 14:30:05 UTC, 1,234,567.89 USD moved; that's 3.5% of $35,273,368.29.",
    "Call +1 (555) 010-9999 ext. 42 or write to P.O. Box 7, Springfield, IL 62701.",
    "Dr. Smith (Ph.D.) et al. found e.g. i.e. vs. etc. -- see pp. 12-15, fig. 3(b), and eq. (7).",
    "A well-known, state-of-the-art, end-to-end pipeline; co-operate, re-enter, naïve café, résumé.",
]

PROSE = {
    "de": ["Über den Wolken muss die Freiheit wohl grenzenlos sein.", "Die Straße ist nass, weil es regnet.",
           "Größe, Maß, Äpfel, Öl und Übermut: ÄÖÜ äöü ß ẞ.", "Ich hätt' gern 'nen Kaffee, bitte."],
    "fr": ["L'été dernier, nous sommes allés à la plage ; c'était magnifique !", "Où est l'hôpital ? Ça coûte 12,50 €.",
           "Qu'est-ce que c'est ? « Je n'en sais rien », répondit-il.", "Œuvre, cœur, naïve, Noël, déjà-vu."],
    "es": ["¿Dónde está la biblioteca? ¡Qué sorpresa!", "El niño comió piña y jalapeños en el año 1999.",
           "Mañana será otro día; señor, señora y pingüino."],
    "pt": ["Não sei se ele já chegou à estação.", "Ações, corações, pão e maçã: é isso aí!"],
    "it": ["Perché non l'hai detto prima? È già tardi, però.", "Un po' di caffè, per favore."],
    "pl": ["Zażółć gęślą jaźń.", "Chrząszcz brzmi w trzcinie w Szczebrzeszynie."],
    "cs": ["Příliš žluťoučký kůň úpěl ďábelské ódy."],
    "tr": ["İstanbul'da ılık bir akşam; Iğdır'a gidiyorum.", "ŞİŞLİ ve şişli, IĞDIR ve ığdır aynı değil."],
    "vi": ["Tiếng Việt có nhiều dấu: ả, ạ, ẫ, ặ, ỡ, ữ.", "Cửa Việt, Hà Nội, Đà Nẵng và Thành phố Hồ Chí Minh."],
    "el": ["Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.", "Ελλάδα, ΑΘΗΝΑ, ς σ Σ, ΐ ΰ."],
    "ru": ["Съешь же ещё этих мягких французских булок, да выпей чаю.", "Ёлка, ЁЖ и ещё 100 рублей."],
    "uk": ["Їжак ґаваґаґа; Європа, ґанок і їжа.", "Слава Україні — це гасло."],
    "bg": ["Жълтата дюля беше щастлива, че пухът, който цъфна, замръзна като гьон.", "нещо на Български"],
    "sr": ["Љубав, њива, џеп, ђак, ћуприја.", "Ljubav, njiva, džep, đak, ćuprija."],
    "ar": ["مرحبا بالعالم. كيف حالك اليوم؟", "اللغة العربية جميلة، أليس كذلك؟ ١٢٣٤٥٦٧٨٩٠",
           "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ"],
    "fa": ["سلام دنیا؛ امروز هوا خیلی خوب است. ۱۲۳۴", "می‌خواهم به خانه بروم."],
    "he": ["שלום עולם! מה שלומך היום?", "עִבְרִית עם ניקוד, ו־123 מספרים."],
    "hi": ["नमस्ते दुनिया! आज मौसम बहुत अच्छा है।", "क्या आप हिंदी बोलते हैं? १२३४५ रुपये।"],
    "bn": ["আমি বাংলায় গান গাই। ধন্যবাদ।", "১২৩ টাকা"],
    "ta": ["வணக்கம் உலகம். தமிழ் ஒரு பழமையான மொழி."],
    "te": ["తెలుగు భాష చాలా మధురమైనది."],
    "th": ["สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ขอบคุณครับ", "๑๒๓ บาท"],
    "km": ["សួស្តី\u200bពិភពលោក", "កាន់តែពិសេសអាចខលចេញ"],
    "lo": ["ສະບາຍດີ ໂລກ"],
    "my": ["မင်္ဂလာပါ ကမ္ဘာလောက"],
    "ka": ["გამარჯობა მსოფლიო"],
    "hy": ["Բարեւ աշխարհ, ինչպե՞ս ես"],
    "am": ["ሰላም ለዓለም። እንዴት ነህ?"],
    "zh": ["我想在苹果公司工作。今天天气很好，我们去公园散步吧！", "人工智能正在改变世界，2024年是关键的一年。",
           "繁體中文與簡體中文有所不同。臺灣、香港。"],
    "ja": ["私は東京に住んでいます。", "ひらがな、カタカナ、漢字を混ぜて書きます。ｶﾀｶﾅ半角もあります。",
           "コンピューターで「日本語」を入力する。"],
    "ko": ["안녕하세요, 세계! 한국어는 한글로 씁니다.", "감사합니다. 123개의 사과."],
    "mn": ["Сайн байна уу, дэлхий"],
    "yo": ["Ẹ kú àárọ̀, ṣé dáadáa ni?"],
}

EMOJI = [
    "🚀", "😀", "😂", "🥲", "🦙", "🤖", "✅", "❤️", "❤", "☺️", "✈️", "⭐", "🔥", "👍", "👍🏻", "👍🏽", "👍🏿",
    "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀", "🏳️‍🌈", "😶‍🌫️", "❤️‍🔥", "🇯🇵", "🇺🇸", "🇩🇪", "🇧🇷", "1️⃣", "#️⃣", "©️",
    "🙏🏾", "🤷‍♀️", "💁🏼‍♂️", "🫠", "🐈‍⬛", "👁️‍🗨️",
]

SYMBOLS = [
    "→", "⇒", "∀x∈ℝ: x²≥0", "∑ᵢ aᵢ", "∫", "≠", "≤", "≥", "±", "√2", "∞", "℃", "№", "™", "®", "§", "¶", "•",
    "½", "¼", "¾", "Ⅻ", "ⅷ", "①", "⑳", "²", "³", "𝐀𝐁𝐂", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚", "𝄞", "♪", "♫",
    "┌─┬─┐", "│ │", "└─┴─┘", "░▒▓█", "€", "£", "¥", "₹", "₩", "₿", "¢", "‰", "′", "″", "‹›", "«»", "„“",
    "〈〉", "【】", "「」", "『』", "、", "。", "・", "〜", "～", "！", "？", "（）",
]

# Characters that look suspicious but are valid UTF-8: C1 controls, noncharacters, private use, the edges of
# the surrogate gap and of the code space, format characters, the BOM, a lone combining mark.
ODD = [
    "\u0080", "\u0085", "\u009f", "\u00a0", "\u00ad", "\ufdd0", "\ufffe", "\uffff", "\ue000", "\uf8ff", "\ud7ff",
    "\U0010ffff", "\U000fffff", "\U0001fffe", "\ufeff", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060",
    "\u2028", "\u2029", "\u3000", "\u1680", "\u202f", "\u205f", "\u0301", "\u0300\u0301\u0302", "\ufffd", "\x00",
    "\x01", "\x1b[0m", "\x1c\x1d\x1e\x1f", "\x7f", "\u034f", "\u061c", "\u180e", "\U000e0001", "\U000e0041",
]

WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n",
              "  \n", "\t\n", " \t ", "\u00a0", "\u3000", "\u2003", "\u2009", " \u00a0 ", "\n \n", "\u0085"]

# Ranges of code points to draw random characters from, all assigned since long before Unicode 14, so that the
# Unicode tables of PCRE2 and of the reference's regex library agree on them.
RANGES = [
    (0x20, 0x7E), (0xA1, 0x24F), (0x250, 0x2AF), (0x300, 0x36F), (0x391, 0x3C9), (0x400, 0x4FF), (0x531, 0x556),
    (0x5D0, 0x5EA), (0x621, 0x64A), (0x660, 0x669), (0x905, 0x939), (0x966, 0x96F), (0x985, 0x9B9), (0xE01, 0xE3A),
    (0xE50, 0xE59), (0x10D0, 0x10FA), (0x1100, 0x1112), (0x1E00, 0x1EFF), (0x2010, 0x2027), (0x2190, 0x21FF),
    (0x2200, 0x22FF), (0x2500, 0x257F), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3),
    (0xFF01, 0xFF5E), (0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x1D400, 0x1D44E), (0x20000, 0x2A6D6),
]

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "im_end|>", "<|im_start|><|im_end|>",
            "[PAD151650]", "[PAD151999]", "<think>", "</think>"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'vE", "'M",
                "'LL", "'lL", "'D", "'x", "'", "''", "'ſ", "'K"]


def _rand_case(rng: random.Random, s: str) -> str:
    mode = rng.random()
    if mode < 0.6:
        return s
    if mode < 0.75:
        return s.upper()
    if mode < 0.85:
        return s.lower()
    if mode < 0.95:
        return s.title()
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in s)


def _number(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 40)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(10**9):,}"
    if kind == 3:
        return f"{rng.random():.3e}"
    if kind == 4:
        return f"0x{rng.getrandbits(64):x}"
    if kind == 5:  # other digit systems
        base = rng.choice([0x660, 0x6F0, 0x966, 0x9E6, 0xE50, 0xFF10, 0x1D7CE])
        return "".join(chr(base + rng.randrange(10)) for _ in range(rng.randrange(1, 12)))
    if kind == 6:
        return ".".join(str(rng.randrange(256)) for _ in range(4))
    return f"{rng.randrange(1, 13)}/{rng.randrange(1, 29)}/{rng.randrange(1900, 2100)}"


def _random_chars(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _prose(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(2, 12)):
        r = rng.random()
        if r < 0.35:
            parts.append(_rand_case(rng, rng.choice(ENGLISH)))
        elif r < 0.8:
            parts.append(rng.choice(PROSE[rng.choice(list(PROSE))]))
        elif r < 0.9:
            parts.append(_number(rng))
        else:
            parts.append(rng.choice(EMOJI) + rng.choice(EMOJI))
        parts.append(rng.choice([" ", " ", " ", "\n", "  ", "\n\n", "\t", " \n"]))
    return "".join(parts)


def _soup(rng: random.Random) -> str:
    """Short pieces of everything, glued without regard for word boundaries."""
    pools = [EMOJI, SYMBOLS, ODD, WHITESPACE, CONTRACTIONS, [w for v in PROSE.values() for w in v]]
    out = []
    for _ in range(rng.randrange(20, 120)):
        r = rng.random()
        if r < 0.15:
            out.append(_number(rng))
        elif r < 0.3:
            out.append(_random_chars(rng, rng.randrange(1, 12)))
        elif r < 0.4:
            word = rng.choice(["it", "they", "WE", "You", "she", "Don", "can", "I", "a", "x"])
            out.append(word + rng.choice(CONTRACTIONS))
        else:
            pool = rng.choice(pools)
            s = rng.choice(pool)
            if len(s) > 24:
                start = rng.randrange(len(s) - 8)
                s = s[start:start + rng.randrange(4, 24)]
            out.append(s)
    return "".join(out)


def _whitespace_runs(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(5, 40)):
        out.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randrange(1, 12))))
        out.append(rng.choice(["word", "Wörd", "词", "٣", "7", "!", "'s", "🦙", "x", "", "-", "\u0301"]))
    return "".join(out)


def _code(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(1, 4)):
        s = rng.choice(CODE)
        if rng.random() < 0.3:
            s = s.replace("\n", "\r\n")
        if rng.random() < 0.3:
            s = s.replace("    ", "\t")
        if rng.random() < 0.2:
            s = s.replace("    ", "        ")
        out.append(s)
    return "\n".join(out)


def _chat(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(1, 5)):
        role = rng.choice(["system", "user", "assistant", "tool"])
        body = _prose(rng) if rng.random() < 0.7 else _code(rng)
        sp = rng.choice(SPECIALS)
        out.append(f"<|im_start|>{role}\n{body}{sp}<|im_end|>\n")
    return "".join(out)


def _long_run(rng: random.Random) -> str:
    """One very long word or gap: exercises the merge loop on long inputs and the regex on long runs."""
    unit = rng.choice(["a", "ab", "Ab", "é", "ё", "中", "7", "!", " ", "\t", "\n", " \n", "🦙", "-=", "x1"])
    return unit * rng.randrange(200, 4000)


KINDS = [(_prose, 30), (_code, 20), (_soup, 25), (_whitespace_runs, 8), (_chat, 10), (_long_run, 2)]


def generate(seed: int = 1234, target_bytes: int = 1_200_000) -> list:
    """Records (str) adding up to at least target_bytes of UTF-8; the same arguments give the same records."""
    rng = random.Random(seed)
    funcs = [f for f, _ in KINDS]
    weights = [w for _, w in KINDS]
    records, total = [], 0
    while total < target_bytes:
        text = rng.choices(funcs, weights)[0](rng)
        records.append(text)
        total += len(text.encode("utf-8"))
    return records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bytes", type=int, default=1_200_000)
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args()
    recs = generate(args.seed, args.bytes)
    f = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    for r in recs:
        f.write(json.dumps(r, ensure_ascii=True) + "\n")
    if f is not sys.stdout:
        f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
