"""The demo model's tooling that needs no torch: the data split, the vocabulary, the PNG writer, the card and the GGUF
tokenizer metadata written for an external vocabulary."""
import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from tools.demo import card, data, plot

SAMPLE = """\
def fibonacci(n: int) -> int:
    '''Return the n-th Fibonacci number; fibonacci(0) == 0.'''
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


class Counter(dict):
    def __missing__(self, key):
        return 0

    def most_common(self, n=None):
        return sorted(self.items(), key=lambda kv: kv[1], reverse=True)[:n]


for i in range(10):
    print(i, fibonacci(i), Counter(a=i).most_common(1))
"""

NON_ASCII = "naïve café — “quotes”, 世界, emoji 🙂, tabs\tand\r\nCRLF, nbsp\u00a0here, x² ≤ y\n"


# ---- data ---------------------------------------------------------------------------------------------------------


def _tree(root: Path) -> None:
    (root / "lib" / "pkg").mkdir(parents=True)
    for i in range(300):
        (root / "lib" / "pkg" / f"mod{i:03d}.py").write_text(f"# module {i}\nVALUE = {i}\n" * (i % 7 + 1))
    (root / "lib" / "README.md").write_text("# readme\n")
    (root / "lib" / "copy.py").write_text("# module 0\nVALUE = 0\n")  # the same bytes as pkg/mod000.py
    (root / "lib" / "empty.py").write_text("\n")
    (root / "lib" / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / "lib" / "data.json").write_text("{}")
    for skipped in ("__pycache__", ".hidden", "pkg-1.0.dist-info"):
        (root / "lib" / skipped).mkdir()
        (root / "lib" / skipped / "skipped.py").write_text("skipped = True\n")
    (root / "site").mkdir()
    (root / "site" / "other.rst").write_text("Other\n=====\n")


def test_heldout_rule_is_a_fixed_hash_of_the_name():
    names = [f"site-packages/pkg/mod{i}.py" for i in range(20000)]
    frac = sum(map(data.is_heldout, names)) / len(names)
    assert 0.017 < frac < 0.023
    for name in names[:200]:
        h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
        assert data.is_heldout(name) == (h % 10000 < 200)


def test_gather_is_deterministic_and_the_split_ignores_seed_and_cap(tmp_path):
    _tree(tmp_path)
    roots = [("stdlib", tmp_path / "lib"), ("site-packages", tmp_path / "site")]
    full = data.gather(100, seed=0, roots=roots)
    names = {d.name for d in full.train} | {d.name for d in full.heldout}
    assert "stdlib/pkg/mod007.py" in names and "site-packages/other.rst" in names and "stdlib/README.md" in names
    assert not any("skipped" in n or n.endswith((".json", "empty.py", "latin1.txt")) for n in names)
    assert ("stdlib/copy.py" in names) != ("stdlib/pkg/mod000.py" in names)  # exact duplicates are taken once
    assert full.recipe["skipped"] == {"duplicate": 1, "empty": 1, "not_utf8": 1}
    assert {d.name for d in full.heldout} == {n for n in names if data.is_heldout(n)}
    assert full.heldout and [d.name for d in full.heldout] == sorted(d.name for d in full.heldout)

    again = data.gather(100, seed=0, roots=roots)
    assert [d.name for d in again.train] == [d.name for d in full.train]
    other = data.gather(100, seed=1, roots=roots)
    assert [d.name for d in other.train] != [d.name for d in full.train]  # the seed orders the training files
    assert [d.name for d in other.heldout] == [d.name for d in full.heldout]  # ... and leaves the split alone
    capped = data.gather(2 / 1024, seed=0, roots=roots)
    assert capped.recipe["capped"]
    assert {d.name for d in capped.heldout} <= {d.name for d in full.heldout}
    assert not {d.name for d in capped.train} & {d.name for d in full.heldout}


def test_recipe_and_heldout_file(tmp_path):
    _tree(tmp_path / "src")
    corpus = data.gather(100, seed=0, roots=[("stdlib", tmp_path / "src" / "lib")])
    data.write(corpus, tmp_path / "out")
    text = (tmp_path / "out" / "heldout.txt").read_bytes()
    assert text == data.SEPARATOR.join(d.text for d in corpus.heldout).encode()
    assert hashlib.sha256(text).hexdigest() == corpus.recipe["sha256"]["heldout"]
    assert corpus.recipe["bytes"]["heldout"] == sum(len(d.text.encode()) for d in corpus.heldout)
    assert corpus.recipe["files"] == {"train": len(corpus.train), "heldout": len(corpus.heldout)}
    assert (tmp_path / "out" / "data.json").exists()


# ---- tokenizer ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("tokenizers")
    from tools.demo import tokenizer
    return tokenizer.train([SAMPLE * 3, NON_ASCII], vocab_size=256 + 7 + 120)


def test_tokenizer_layout(tok):
    from tools.demo import tokenizer
    from tools.golden.vocab import SPECIAL_TOKENS, bytes_to_unicode

    v = tokenizer.gguf_vocab(tok)
    assert len(v.tokens) == tok.get_vocab_size() == 383
    assert v.tokens[:256] == list(bytes_to_unicode().values())
    assert v.tokens[-7:] == [t for t, _ in SPECIAL_TOKENS] and v.token_types[-7:] == [t for _, t in SPECIAL_TOKENS]
    assert all(t == 1 for t in v.token_types[:-7]) and len(v.merges) == 120
    for i, m in enumerate(v.merges):
        a, b = m.split(" ")
        assert v.tokens[256 + i] == a + b
    again = tokenizer.train([SAMPLE * 3, NON_ASCII], vocab_size=256 + 7 + 120)
    assert tokenizer.gguf_vocab(again).merges == v.merges  # deterministic


def test_tokenizer_round_trip(tok, tmp_path):
    from tools.demo import tokenizer

    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = tokenizer.load(tmp_path / "tokenizer.json")
    for text in (SAMPLE, NON_ASCII, "\x00\x01\x7f bytes", "<|im_start|>user\nhi<|im_end|>\n"):
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
        assert loaded.encode(text, add_special_tokens=False).ids == ids
    assert len(tok.encode(SAMPLE).ids) < len(SAMPLE.encode()) / 2  # the merges do merge
    chat = "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok.encode(chat, add_special_tokens=False).ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and tok.token_to_id("<|im_end|>") in ids
    tok.encode_special_tokens = True  # document text: the spelling is plain text
    try:
        plain = tok.encode(chat, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = False
    assert tok.token_to_id("<|im_start|>") not in plain and tok.decode(plain) == chat


def test_tokenizer_matches_the_golden_reference_on_ascii():
    pytest.importorskip("tokenizers")
    from tools.demo import tokenizer
    from tools.golden import vocab

    golden = vocab.build_vocab()
    tok = tokenizer.build([tuple(m.split(" ")) for m in golden.merges])
    assert tokenizer.gguf_vocab(tok).tokens == golden.tokens
    for text in (vocab.TRAINING_TEXT, SAMPLE, "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>"):
        assert tok.encode(text, add_special_tokens=False).ids == vocab.encode(golden, text)


def test_gguf_with_the_demo_vocabulary(tmp_path):
    pytest.importorskip("tokenizers")
    import gguf

    from tools.demo import tokenizer
    from tools.golden import convert, models, vocab

    tok = tokenizer.train([SAMPLE, NON_ASCII, vocab.TRAINING_TEXT], vocab_size=models.VOCAB)  # the golden's 512 rows
    v = tokenizer.gguf_vocab(tok)
    cfg = models.hf_config("qwen3next")
    path = tmp_path / "demo.gguf"
    convert.write_gguf(path, "qwen3next", cfg, models.generate_state("qwen3next"), "Q8_0", vocab=v,
                       general_name="demo-test")
    r = gguf.GGUFReader(str(path))

    def field(key):
        f = r.fields[key]
        return f.contents()

    assert field("general.name") == "demo-test"
    assert field("tokenizer.ggml.tokens") == v.tokens and field("tokenizer.ggml.merges") == v.merges
    assert field("tokenizer.ggml.token_type") == v.token_types
    assert field("tokenizer.ggml.pre") == "qwen2" and field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.eos_token_id") == tok.token_to_id("<|im_end|>")
    assert field("tokenizer.ggml.bos_token_id") == tok.token_to_id("<|endoftext|>")


# ---- PNG ----------------------------------------------------------------------------------------------------------


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out, pos = [], 8
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos: pos + 4])
        kind, body = png[pos + 4: pos + 8], png[pos + 8: pos + 8 + n]
        (crc,) = struct.unpack(">I", png[pos + 8 + n: pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        out.append((kind, body))
        pos += 12 + n
    return out


def test_png_writer(tmp_path):
    img = np.zeros((3, 5, 3), np.uint8)
    img[1, 2] = (255, 0, 7)
    plot.write_png(tmp_path / "t.png", img)
    chunks = _chunks((tmp_path / "t.png").read_bytes())
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"] and chunks[2][1] == b""
    assert struct.unpack(">IIBBBBB", chunks[0][1]) == (5, 3, 8, 2, 0, 0, 0)
    raw = zlib.decompress(chunks[1][1])
    rows = np.frombuffer(raw, np.uint8).reshape(3, 1 + 5 * 3)
    assert (rows[:, 0] == 0).all() and np.array_equal(rows[:, 1:].reshape(3, 5, 3), img)


def test_builtin_loss_plot(tmp_path):
    steps = list(range(1, 201))
    series = [plot.Series("train", steps, [8.0 / (1 + s / 20) + 1.5 for s in steps], (31, 119, 180)),
              plot.Series("held-out", [50, 100, 150, 200], [3.9, 3.1, 2.8, 2.7], (255, 127, 14))]
    img = plot.draw(series, 400, 240)
    assert img.shape == (240, 400, 3)
    assert (img == (31, 119, 180)).all(axis=-1).sum() > 200 and (img == (255, 127, 14)).all(axis=-1).sum() > 50
    plot.write_png(tmp_path / "loss.png", img)
    assert [k for k, _ in _chunks((tmp_path / "loss.png").read_bytes())] == [b"IHDR", b"IDAT", b"IEND"]
    assert plot.nice_ticks(1.7, 10.4) == [2, 4, 6, 8, 10] and plot.nice_ticks(0, 300) == [0, 100, 200, 300]


# ---- card ---------------------------------------------------------------------------------------------------------


def _summary() -> dict:
    from tools.golden import models

    cfg = models.hf_config("qwen3next")
    return {
        "name": "demo",
        "model": {"params": 1000, "params_active": 500, "config": cfg, "layer_pattern": ["GDN"] * 3 + ["attention"]},
        "data": {"what": "text", "python": "3.12", "roots": [{"label": "stdlib", "path": "/x", "files": 2,
                                                              "bytes": 10}],
                 "extensions": [".py"], "max_file_bytes": 524288, "skipped": {}, "max_mb": 5, "capped": True,
                 "heldout_rule": "rule", "files": {"train": 1, "heldout": 1}, "bytes": {"train": 5, "heldout": 5},
                 "sha256": {"train": "a", "heldout": "b"}, "tokens": {"train": 3, "heldout": 2}},
        "tokenizer": {"merges": 249, "special": 7, "trained_on_mib": 5},
        "training": {"steps": 20, "batch": 4, "ctx": 64, "tokens_seen": 5120, "epochs": 0.1, "train_seconds": 6.0,
                     "device": "CPU", "final_loss": 7.0, "final_loss_steps": 20, "final_aux_loss": 2.0,
                     "weight_decay": 0.1, "lr": 3e-3, "warmup_steps": 5, "min_lr_ratio": 0.1, "schedule": "20 steps",
                     "grad_clip": 1.0, "precision": "float32", "aux_loss_coef": 0.01, "seed": 0,
                     "eval_windows": 4, "eval_every": 10},
        "perplexity": {"ppl": 1000.0, "scored": 310, "chunks": 10, "ctx": 64, "tokens": 700},
        "routing": {"tokens": 256, "experts_used_min": 7, "experts_used_max": 8, "max_share": 0.3},
        "gguf": {"type": "Q8_0", "bytes": 100, "sha256": "c", "nmse": 1e-5, "top1": 1.0, "positions": 64},
        "plot": {"file": "loss.png", "window": 5},
        "software": "none",
    }


def test_card_placeholders_and_filling():
    text = card.render(_summary())
    assert "## Strata perplexity (CPU/CUDA)" in text and "## Routing-trace cache figures" in text
    assert "positions 32..62 against the tokens at 33..63" in text and "moving average over 5 steps" in text
    filled = card.fill_section(text, "strata-perplexity", "| device | ppl |\n|---|---|\n| cpu | 1000.1 |\n")
    assert "| cpu | 1000.1 |\n<!-- END strata-perplexity -->" in filled
    assert filled.count("Not measured yet") == len(card.PLACEHOLDERS) - 1  # the other placeholders are untouched
    before, after = text.split("<!-- BEGIN strata-perplexity -->")
    assert filled.startswith(before) and filled.endswith(after.split("<!-- END strata-perplexity -->")[1])
    with pytest.raises(KeyError):
        card.fill_section(text, "no-such-section", "x")


def test_evaluate_fills_the_card(strata_bin, golden_dir, tmp_path):
    """tools.demo.evaluate on a run folder whose "demo model" is a golden file: the engine's perplexity beside the
    summary's, the routing traces summarised, both card sections filled."""
    import json
    import shutil

    from tools.demo import evaluate

    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(golden_dir / "tiny-qwen3next-Q8_0.gguf", d / "demo.gguf")
    (d / "heldout.txt").write_text(("def f(x):\n    return x * 2  # doubled\n" * 40), encoding="utf-8")
    s = _summary()
    s["perplexity"] = {"ppl": 1000.0, "scored": 0, "chunks": 0, "ctx": 32, "tokens": 0}
    (d / "summary.json").write_text(json.dumps(s))
    (d / "MODEL_CARD.md").write_text(card.render(s))
    assert evaluate.main(["--dir", str(d), "--strata", str(strata_bin), "--decode", "12"]) == 0
    ev = json.loads((d / "evaluation.json").read_text())
    row = ev["perplexity"][0]
    assert row["backend"].startswith("CPU") and row["scored"] > 0
    assert row["rel_diff"] == pytest.approx(row["ppl"] / 1000.0 - 1.0)
    assert set(ev["traces"]) == {"demo model, held-out text", "strata synth tiny-qwen3next, --route-skew 0",
                                 "strata synth tiny-qwen3next, --route-skew 1.2"}
    text = (d / "MODEL_CARD.md").read_text()
    assert text.count("Not measured yet") == 1 and "Not measured yet: the next-next-token block" in text  # MTP's
    assert "| demo model, held-out text | 50% |" in text and "vs transformers" in text


def test_the_cards_mtp_section_is_the_one_its_result_renders():
    """models/demo's MTP section is what card.mtp_section makes of mtp.json (no hand edits inside the markers), and it
    names the file's sha256 and the figures a speculative decoder cares about."""
    demo = Path(__file__).resolve().parents[2] / "models" / "demo"
    result = json.loads((demo / "mtp.json").read_text())
    body = card.mtp_section(result)
    text = (demo / "MODEL_CARD.md").read_text()
    assert f"<!-- BEGIN mtp -->\n{body}<!-- END mtp -->" in text
    assert result["gguf"]["sha256"] in body
    assert f"**{100 * result['trained']['agreement']:.1f}%**" in body
    assert f"{result['training']['steps']:,} steps" in body
