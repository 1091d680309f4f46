"""Tokenizer cross-checks: our ids against Hugging Face `tokenizers` built from the same GGUF vocabulary, on a
generated corpus of more than 1 MB, for every pre-tokenizer we serve; SentencePiece against the `sentencepiece`
library on a model trained here; round trips; throughput; and the `strata tokenize` command. Unit tests of the
pieces are in tests/cpp/test_tokenizer.cpp.
"""
import io
import json
import pathlib
import subprocess
import sys

import pytest

from tok_reference import PRE_PATTERNS, hf_byte_level_bpe, read_gguf_vocab

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
from tok_corpus import generate  # noqa: E402

CORPUS_BYTES = 1_200_000
MIN_MB_PER_S = 5.0


@pytest.fixture(scope="module")
def qwen2_gguf(shared_dir):
    p = shared_dir / "testdata" / "vocab" / "ggml-vocab-qwen2.gguf"
    if not p.exists():
        pytest.skip(f"{p} not found")
    return p


@pytest.fixture(scope="module")
def qwen2_vocab(qwen2_gguf):
    return read_gguf_vocab(qwen2_gguf)


@pytest.fixture(scope="module")
def corpus():
    recs = generate(seed=1234, target_bytes=CORPUS_BYTES)
    assert sum(len(r.encode("utf-8")) for r in recs) >= 1_000_000
    return recs


def run_encoder(tool, args, records):
    """Our ids for each record, from the tok_encode test program."""
    stdin = "".join(json.dumps(r) + "\n" for r in records)
    res = subprocess.run([str(tool("tok_encode"))] + [str(a) for a in args], input=stdin, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.split("\n")
    assert len(lines) == len(records) + 1 and lines[-1] == ""
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def first_difference(records, ours, ref, tokens):
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            k = next(j for j in range(min(len(a), len(b)) + 1) if j == min(len(a), len(b)) or a[j] != b[j])
            return (f"record {i} differs at token {k}: ours {[tokens[t] for t in a[max(0, k - 3):k + 4]]}, "
                    f"reference {[tokens[t] for t in b[max(0, k - 3):k + 4]]}; record starts {records[i][:200]!r}")
    return None


@pytest.mark.parametrize("pre", sorted(PRE_PATTERNS))
def test_ids_match_hugging_face_on_the_corpus(pre, tool, qwen2_gguf, qwen2_vocab, corpus):
    # One real vocabulary, every pre-tokenizer: the merges do not care which regex cut the words.
    _, _, tokens, types, merges = qwen2_vocab
    ref_tok = hf_byte_level_bpe(tokens, types, merges, pre)
    ref = [e.ids for e in ref_tok.encode_batch(corpus, add_special_tokens=False)]
    ours = run_encoder(tool, ["-m", qwen2_gguf, "--pre", pre, "--check-roundtrip"], corpus)
    assert len(ours) == len(ref)
    diff = first_difference(corpus, ours, ref, tokens)
    assert diff is None, diff
    assert sum(map(len, ours)) > 300_000


def test_control_tokens_stay_text_without_parse_special(tool, qwen2_gguf, qwen2_vocab, corpus):
    _, _, tokens, types, merges = qwen2_vocab
    ref_tok = hf_byte_level_bpe(tokens, types, merges, "qwen2")
    ref_tok.encode_special_tokens = True  # added tokens marked special are not matched; the others still are
    ref = [e.ids for e in ref_tok.encode_batch(corpus, add_special_tokens=False)]
    ours = run_encoder(tool, ["-m", qwen2_gguf, "--no-parse-special"], corpus)
    diff = first_difference(corpus, ours, ref, tokens)
    assert diff is None, diff
    im_start = tokens.index("<|im_start|>")
    assert not any(im_start in ids for ids in ours)
    assert any("<|im_start|>" in r for r in corpus)


def test_throughput(tool, qwen2_gguf, corpus, build_dir):
    res = subprocess.run([str(tool("tok_encode")), "-m", str(qwen2_gguf), "--bench", "2"],
                         input="".join(json.dumps(r) + "\n" for r in corpus), capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    rate = float(res.stdout.split()[1])
    print(f"tokenizer throughput on one core: {res.stdout.strip()}")
    cache = build_dir / "CMakeCache.txt"
    build_type = next((line.split("=", 1)[1].strip() for line in cache.read_text().splitlines()
                       if line.startswith("CMAKE_BUILD_TYPE:")), "") if cache.exists() else ""
    if build_type != "Release":
        pytest.skip(f"{rate:.1f} MB/s measured; the {MIN_MB_PER_S} MB/s floor applies to Release builds only "
                    f"(this is {build_type or 'unknown'})")
    assert rate >= MIN_MB_PER_S, f"{rate:.2f} MB/s of mixed text on one core, below {MIN_MB_PER_S}"


# ---- SentencePiece ---------------------------------------------------------------------------------------------


def spm_gguf(tmp_path):
    """A SentencePiece BPE model trained here on the generated corpus, and the same vocabulary as a GGUF file."""
    spm = pytest.importorskip("sentencepiece", reason="the sentencepiece package (tools/requirements.txt) is needed")
    gguf = pytest.importorskip("gguf")
    model = io.BytesIO()
    train = [r for r in generate(seed=7, target_bytes=300_000) if "\x00" not in r]
    # Identity normalization and kept whitespace: the GGUF "llama" tokenizer does no normalization beyond the
    # space escaping, so the reference must not either.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_writer=model, model_type="bpe", vocab_size=3000, byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        character_coverage=0.995, user_defined_symbols=["<think>", "</think>", "ab cd"],
        control_symbols=["<|im_start|>", "<|im_end|>"], max_sentence_length=100000, minloglevel=2, num_threads=1)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    user = {"<think>", "</think>", "ab cd"}

    def token_type(i):
        if sp.is_unknown(i):
            return 2
        if sp.is_control(i):
            return 3
        if sp.is_unused(i):
            return 5
        if sp.is_byte(i):
            return 6
        return 4 if tokens[i] in user else 1

    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([token_type(i) for i in range(n)])
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sp, tokens, path


def test_sentencepiece_matches_the_reference_library(tool, tmp_path):
    sp, tokens, path = spm_gguf(tmp_path)
    records = generate(seed=99, target_bytes=400_000) + [
        "<think>hi", "<think> hi</think>", "ab cd", " <think>", "", " ", "  lead", "trail  ", "<|im_start|>x",
        "e\u0301\U0001F999 z \u00e9\u00e9", "\n\n\t x",
    ]
    ref = [sp.encode(r) for r in records]
    # Control tokens are not parsed: the library never matches them in text.
    ours = run_encoder(tool, ["-m", path, "--no-parse-special", "--check-roundtrip"], records)
    diff = first_difference(records, ours, ref, tokens)
    assert diff is None, diff
    byte_ids = {i for i, t in enumerate(tokens) if t.startswith("<0x")}
    assert any(t in byte_ids for ids in ours for t in ids), "the corpus should exercise byte fallback"


# ---- strata tokenize -------------------------------------------------------------------------------------------


def tokenize(strata_bin, model, text, *flags):
    data = text.encode("utf-8") if isinstance(text, str) else text
    return subprocess.run([str(strata_bin), "tokenize", "-m", str(model), *flags], input=data, capture_output=True,
                          timeout=120)


def test_cli_prints_the_reference_ids(strata_bin, qwen2_gguf):
    inp = qwen2_gguf.with_name(qwen2_gguf.name + ".inp").read_text(encoding="utf-8")
    out = qwen2_gguf.with_name(qwen2_gguf.name + ".out").read_text(encoding="utf-8").split("\n")
    cases = inp.split("\n__ggml_vocab_test__\n")[:-1]
    for i in (0, 12, 25, 45):  # a few: each run loads the vocabulary
        res = tokenize(strata_bin, qwen2_gguf, cases[i])
        assert res.returncode == 0, res.stderr
        assert res.stdout.decode().split() == out[i].split(), f"case {i}: {cases[i]!r}"


def test_cli_pieces_and_special_tokens(strata_bin, qwen2_gguf):
    res = tokenize(strata_bin, qwen2_gguf, "<|im_start|>user\n \U0001F601\\", "--pieces")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode("utf-8").split("\n")
    assert lines[0] == "151644\t<|im_start|>"
    assert lines[1] == "872\tuser"
    assert lines[2] == "198\t\\n"
    # The emoji's four bytes are split over two tokens: shown as escapes, never as broken characters.
    assert lines[3] == "26525\t \\xf0\\x9f\\x98" and lines[4] == "223\t\\x81"
    assert lines[5].endswith("\t\\\\")

    plain = tokenize(strata_bin, qwen2_gguf, "<|im_start|>", "--no-special")
    assert plain.returncode == 0
    assert "151644" not in plain.stdout.decode().split()
    assert len(plain.stdout.decode().split()) > 1


def test_cli_errors_are_clear(strata_bin, qwen2_gguf, tmp_path):
    missing = tokenize(strata_bin, tmp_path / "nope.gguf", "x")
    assert missing.returncode != 0
    assert b"nope.gguf" in missing.stderr

    gguf = pytest.importorskip("gguf")
    no_vocab = tmp_path / "novocab.gguf"
    w = gguf.GGUFWriter(str(no_vocab), "qwen3moe")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = tokenize(strata_bin, no_vocab, "x")
    assert res.returncode == 1
    assert b"tokenizer.ggml.model" in res.stderr

    bad_utf8 = tokenize(strata_bin, qwen2_gguf, b"a\xff\xfeb")
    assert bad_utf8.returncode == 0
    assert b"not valid UTF-8" in bad_utf8.stderr
    assert bad_utf8.stdout.decode().split()[0] == "64"
