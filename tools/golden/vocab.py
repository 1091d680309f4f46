"""The golden models' tokenizer: a small byte-level BPE vocabulary in the form Qwen's GGUF files carry.

256 byte symbols (GPT-2's byte-to-unicode alphabet) + merges learnt deterministically from a short built-in text +
the Qwen special tokens, 512 entries in all. The merges are learnt inside pre-tokens split the way the "qwen2"
pre-tokenizer splits ASCII text (letters with one leading non-letter, single digits, punctuation runs with an optional
leading space, whitespace), so the vocabulary looks like a real one to a tokenizer. Pure Python: no library version
can change it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

VOCAB_SIZE = 512

# Special tokens in Qwen3's order, with their GGUF token types as llama.cpp's converter assigns them: the three that
# Qwen marks special are CONTROL (3), the tool-call and thinking markers are USER_DEFINED (4).
SPECIAL_TOKENS: list[tuple[str, int]] = [
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<tool_call>", 4),
    ("</tool_call>", 4),
    ("<think>", 4),
    ("</think>", 4),
]

TOKEN_TYPE_NORMAL = 1

# Our own short chat template in the im_start/im_end format (an optional empty thinking block when thinking is off).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

# The text the merges are learnt from (written for this purpose).
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog, and the dog sleeps on in the warm afternoon sun.
A mixture of experts sends every token to a few of its many experts; the router decides which ones.
Each expert is a small feed forward network, and only the chosen experts are computed for a token.
The gated delta rule keeps a state for every head and updates it with each new key and value.
Attention layers read the whole context, while the recurrent layers carry a fixed size state forward.
When the model runs on a small machine, the experts that are not needed can stay in host memory.
We measure the error of every logit against the reference, position by position, and report the worst one.
The weather was cold in the morning, but by noon the river was bright and the market was full of people.
She counted 3 boats, 12 birds and 250 stones before the light began to fade over the water.
Numbers, names and short words: one, two, three, four, five, six, seven, eight, nine, ten.
"Where are you going?" he asked. "To the station," she said, "the train leaves at half past four."
def forward(x): return x + mixer(norm(x)) # a residual block in one line
<think>Let me check the answer first.</think> The answer is forty two.
"""

# ASCII approximation of the qwen2 pre-tokenizer split (contractions, letters with one optional leading non-letter,
# one digit, punctuation runs with an optional leading space and trailing newlines, newline runs, other whitespace).
_PRETOKEN = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\nA-Za-z0-9]?[A-Za-z]+"
    r"|[0-9]"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable Latin-1 bytes map to themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def _byte_order() -> list[int]:
    """Bytes in the order GPT-2 style vocabularies list them: printable ones first, then the remapped rest."""
    return list(bytes_to_unicode().keys())


def pretokenize(text: str) -> list[str]:
    return [m.group(0) for m in _PRETOKEN.finditer(text)]


def _learn_merges(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE: repeatedly merge the most frequent adjacent pair (ties: the lexicographically smallest pair)."""
    enc = bytes_to_unicode()
    counts: dict[tuple[str, ...], int] = {}
    for piece in pretokenize(text):
        word = tuple(enc[b] for b in piece.encode("utf-8"))
        counts[word] = counts.get(word, 0) + 1
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: dict[tuple[str, str], int] = {}
        for word, c in counts.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new_counts: dict[tuple[str, ...], int] = {}
        for word, c in counts.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            key = tuple(out)
            new_counts[key] = new_counts.get(key, 0) + c
        counts = new_counts
    return merges


@dataclass
class Vocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]  # "left right", in priority order

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)


def build_vocab() -> Vocab:
    enc = bytes_to_unicode()
    tokens = [enc[b] for b in _byte_order()]
    n_merges = VOCAB_SIZE - len(tokens) - len(SPECIAL_TOKENS)
    merges = _learn_merges(TRAINING_TEXT, n_merges)
    if len(merges) != n_merges:
        raise RuntimeError(f"the training text yields only {len(merges)} merges, {n_merges} needed")
    tokens += [a + b for a, b in merges]
    if len(set(tokens)) != len(tokens):
        raise RuntimeError("duplicate token in the learnt vocabulary")
    types = [TOKEN_TYPE_NORMAL] * len(tokens)
    for text, ttype in SPECIAL_TOKENS:
        tokens.append(text)
        types.append(ttype)
    return Vocab(tokens=tokens, token_types=types, merges=[f"{a} {b}" for a, b in merges])


def encode(vocab: Vocab, text: str) -> list[int]:
    """Tokenize text: special tokens matched literally, the rest pre-tokenized and merged by rank.

    A plain reference for ASCII text, enough to turn the golden prompts into ids; the tests check it against the
    `tokenizers` package's BPE with the qwen2 pre-tokenizer.
    """
    enc = bytes_to_unicode()
    ids_of = {t: i for i, t in enumerate(vocab.tokens)}
    rank = {tuple(m.split(" ")): r for r, m in enumerate(vocab.merges)}
    specials = [t for t, _ in SPECIAL_TOKENS]
    pattern = "(" + "|".join(re.escape(s) for s in specials) + ")"
    out: list[int] = []
    for chunk in re.split(pattern, text):
        if not chunk:
            continue
        if chunk in specials:
            out.append(ids_of[chunk])
            continue
        for piece in pretokenize(chunk):
            parts = [enc[b] for b in piece.encode("utf-8")]
            while len(parts) > 1:
                best = min(range(len(parts) - 1), key=lambda i: rank.get((parts[i], parts[i + 1]), 1 << 30))
                if (parts[best], parts[best + 1]) not in rank:
                    break
                parts[best : best + 2] = [parts[best] + parts[best + 1]]
            out.extend(ids_of[p] for p in parts)
    return out
