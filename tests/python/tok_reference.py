"""Reference tokenizers for the cross-checks: Hugging Face `tokenizers` built from a GGUF vocabulary (read with
the gguf package), configured as the models' tokenizer.json files configure it. Test support only.

The pre-tokenizer patterns below are copied from the models' published tokenizer.json files; the engine holds its
own copy. Both follow the same source, so the qwen2 one is also pinned by the ids in the shared test data.
"""
import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

PRE_PATTERNS = {
    "qwen2": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
        r"\s+(?!\S)|\s+",
    ],
    "qwen35": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "deepseek-v3": [
        r"\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
        "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ],
    "gpt-4o": [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
        r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
}

CONTROL, USER_DEFINED = 3, 4


def read_gguf_vocab(path):
    """(model, pre, tokens, types, merges) from a GGUF file's tokenizer.ggml.* keys."""
    f = gguf.GGUFReader(str(path)).fields

    def get(key, default=None):
        return f[key].contents() if key in f else default

    return (get("tokenizer.ggml.model"), get("tokenizer.ggml.pre"), get("tokenizer.ggml.tokens"),
            get("tokenizer.ggml.token_type"), get("tokenizer.ggml.merges", []))


def hf_byte_level_bpe(tokens, types, merges, pre):
    """A `tokenizers.Tokenizer` equivalent to a gpt2-model GGUF vocabulary with pre-tokenizer `pre`."""
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False, ignore_merges=False))
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in PRE_PATTERNS[pre]]
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    # Control tokens are the file's special added tokens, user-defined ones its plain added tokens.
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i, t in enumerate(types) if t == CONTROL])
    tk.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                   for i, t in enumerate(types) if t == USER_DEFINED])
    return tk
