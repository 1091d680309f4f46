"""`strata perplexity` against an independent computation: the float64 numpy reference (tools/golden/npref.py) run
over the same windows of the same tokens, scored the way llama.cpp scores (second half of each window); and the
command's refusals."""
import json
import subprocess

import numpy as np
import pytest

from tools.golden import convert, npref

TEXT = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
        "Perplexity is exp of the mean negative log-likelihood; café, naïve, 数据.\n") * 6


def _ids(strata_bin, model, path):
    out = subprocess.run([str(strata_bin), "tokenize", "-m", str(model), "--no-special", "--no-bos"],
                         input=path.read_bytes(), capture_output=True, check=True)
    return [int(x) for x in out.stdout.split()]


@pytest.mark.parametrize("model_id", ["qwen3moe", "qwen3next"])
def test_matches_the_numpy_reference(strata_bin, golden_dir, tmp_path, model_id):
    model = golden_dir / f"tiny-{model_id}-F32.gguf"
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    ctx = 32
    r = subprocess.run([str(strata_bin), "perplexity", "-m", str(model), "-f", str(text), "--ctx", str(ctx),
                        "--chunks", "3", "--json", "--device", "cpu", "-t", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert not got["bos_replaced"]  # the golden vocabulary adds no BOS
    ids = _ids(strata_bin, model, text)
    assert got["tokens"] == len(ids)
    ref = npref.NumpyModel(model_id, convert.read_gguf_f32(model))
    nll = []
    for w in range(3):
        window = ids[w * ctx:(w + 1) * ctx]
        logits = ref.forward(window)
        for j in range(ctx // 2, ctx - 1):
            row = logits[j].astype(np.float64)
            m = row.max()
            nll.append(m + np.log(np.exp(row - m).sum()) - row[window[j + 1]])
    assert got["scored"] == len(nll) == 3 * (ctx - 1 - ctx // 2)
    want = float(np.exp(np.mean(nll)))
    assert abs(got["ppl"] - want) <= 1e-4 * want, (got["ppl"], want)
    assert len(got["running"]) == 3 and got["running"][-1] == pytest.approx(got["ppl"], rel=1e-12)


def test_refusals(strata_bin, golden_dir, tmp_path):
    model = golden_dir / "tiny-qwen3moe-F32.gguf"
    short = tmp_path / "short.txt"
    short.write_text("just a few words", encoding="utf-8")

    def run(*args):
        return subprocess.run([str(strata_bin), "perplexity", "-m", str(model), "--device", "cpu", *args],
                              capture_output=True, text=True)

    r = run("-f", str(short), "--ctx", "64")
    assert r.returncode == 1 and "fewer than one window of 64" in r.stderr
    r = run("-f", str(tmp_path / "missing.txt"))
    assert r.returncode == 1 and "cannot read" in r.stderr
    r = run("-f", str(short), "--ctx", "8", "--stride", "8")
    assert r.returncode == 1 and "stride" in r.stderr
    r = run("-f", str(short), "--ctx", "1")
    assert r.returncode == 2 and "--ctx" in r.stderr
