"""The embedded default model (models/demo): the file is the one its card describes; `strata perplexity` on the CPU
agrees with transformers on text the model never saw; the quickstart's command writes printable Python."""
import hashlib
import json
import pathlib
import subprocess

import pytest

DEMO = pathlib.Path(__file__).resolve().parents[2] / "models" / "demo"

# transformers' Qwen3NextForCausalLM with demo.gguf's dequantized weights, float32, on models/demo/sample.txt with
# --ctx 512 (python -m tools.demo.reference --dir models/demo -f models/demo/sample.txt --ctx 512; 2026-12-01)
REFERENCE_PPL = 7.05075155798461
REFERENCE_SCORED = 1020


def test_the_file_is_the_one_the_card_describes():
    """demo.gguf is training's export (summary.json) with the MTP block appended (mtp.json), both in the card."""
    summary = json.loads((DEMO / "summary.json").read_text())
    mtp = json.loads((DEMO / "mtp.json").read_text())
    card = (DEMO / "MODEL_CARD.md").read_text()
    gguf = DEMO / "demo.gguf"
    assert mtp["source"]["sha256"] == summary["gguf"]["sha256"]
    assert gguf.stat().st_size == mtp["gguf"]["bytes"] <= 32 * 10**6
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == mtp["gguf"]["sha256"]
    assert summary["gguf"]["sha256"] in card and mtp["gguf"]["sha256"] in card


def test_perplexity_matches_transformers(strata_bin):
    r = subprocess.run([str(strata_bin), "perplexity", "-m", str(DEMO / "demo.gguf"), "-f", str(DEMO / "sample.txt"),
                        "--ctx", "512", "--json", "--device", "cpu", "-t", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["scored"] == REFERENCE_SCORED
    assert abs(got["ppl"] / REFERENCE_PPL - 1.0) <= 0.01, got["ppl"]


def test_the_quickstart_command_writes_python(strata_bin):
    script = (pathlib.Path(__file__).resolve().parents[2] / "scripts" / "quickstart.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("cmd=("))
    args = line[len("cmd=("):-1].split()
    assert args[:2] == ["build/bin/strata", "run"]
    root = DEMO.parents[1]
    r = subprocess.run([str(strata_bin), *args[1:], "--device", "cpu"], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    prompt = (DEMO / "prompt.txt").read_text()
    assert r.stdout.startswith(prompt)
    new = r.stdout[len(prompt):]
    assert len(new) > 200, new
    assert all(c.isprintable() or c in "\n\t" for c in new), new
    # Python-looking: indented lines, keywords, balanced brackets on most lines
    lines = [x for x in new.splitlines() if x.strip()]
    assert sum(x.startswith("    ") for x in lines) >= len(lines) // 2, new
    assert any(k in new for k in ("return ", "def ", "if ")), new
    balanced = sum(x.count("(") == x.count(")") for x in lines)
    assert balanced >= 0.8 * len(lines), new


@pytest.mark.parametrize("name", ["prompt.txt", "sample.txt", "tokenizer.json", "loss.png", "mtp_loss.png"])
def test_the_demo_folder_has(name):
    assert (DEMO / name).stat().st_size > 0
