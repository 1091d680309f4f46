"""The demo model's vocabulary: byte-level BPE learnt from the training text with the `tokenizers` library.

Laid out as Qwen's vocabularies are (and as tools/golden/vocab.py lays out the golden one): the 256 byte symbols of
GPT-2's byte-to-unicode alphabet, then one token per learnt merge in merge order, then Qwen's special tokens
(`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, tool-call and thinking markers): 4096 entries by default. Text is
split by the "qwen2" pre-tokenizer regex (the one the engine applies for tokenizer.ggml.pre = qwen2) and mapped to
bytes, so any text encodes. `gguf_vocab` gives tools/golden/convert.py what it writes as tokenizer metadata.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from tools.golden.vocab import SPECIAL_TOKENS, TOKEN_TYPE_NORMAL, Vocab, bytes_to_unicode

# Qwen2's pre-tokenizer split, as its tokenizer.json and llama.cpp's "qwen2" pre-tokenizer have it.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
TOKENIZER_PRE = "qwen2"
EOS = "<|im_end|>"  # end of a chat turn: what generation stops at
DOC_END = "<|endoftext|>"  # between training documents; also bos and padding, as in Qwen's files
DEFAULT_VOCAB_SIZE = 4096


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def build(merges: list[tuple[str, str]]) -> Tokenizer:
    """The tokenizer with our layout: byte symbols, one token per merge, the special tokens last."""
    tokens = list(bytes_to_unicode().values()) + [a + b for a, b in merges]
    if len(set(tokens)) != len(tokens):
        raise ValueError("the merges repeat a token")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, _ in SPECIAL_TOKENS])
    return tok


def _merges(tok: Tokenizer) -> list[tuple[str, str]]:
    raw = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in raw]


def train(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Learn vocab_size - 256 - (number of special tokens) merges from texts (deterministic for the same texts)."""
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=256 + n_merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    learner.train_from_iterator(texts, trainer)
    merges = _merges(learner)
    if len(merges) != n_merges:
        raise ValueError(f"the text gives {len(merges)} merges, {n_merges} wanted: more text or a smaller vocabulary")
    return build(merges)


def load(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def gguf_vocab(tok: Tokenizer) -> Vocab:
    """Tokens, token types and merges as tools/golden/convert.py writes them (tokenizer.ggml.*)."""
    ids = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(ids, key=ids.get)
    if [ids[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError("token ids are not 0..n-1")
    special = dict(SPECIAL_TOKENS)
    types = [special.get(t, TOKEN_TYPE_NORMAL) for t in tokens]
    return Vocab(tokens=tokens, token_types=types, merges=[f"{a} {b}" for a, b in _merges(tok)])


def hf_tokenizer_config(chat_template: str, max_length: int) -> dict:
    """tokenizer_config.json beside tokenizer.json, so that transformers' AutoTokenizer loads the vocabulary."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": DOC_END,
        "add_bos_token": False,
        "model_max_length": max_length,
        "chat_template": chat_template,
    }
