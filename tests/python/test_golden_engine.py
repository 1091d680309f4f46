"""The CPU engine against the golden oracles (tools/golden): every model and every file variant, with the tolerances
of the engine issue, and again with the work packed differently (small prefill chunks, one token per pass, other
KV cache types): none of that may change the verdict."""
import pathlib
import subprocess

import numpy as np
import pytest

from tools.golden import compare

ORACLES = pathlib.Path(__file__).resolve().parents[2] / "tools" / "golden" / "oracles"
MODELS = ["qwen3moe", "qwen3next", "qwen35moe"]
# file variant -> (oracle, comparison mode). F16 and BF16 files hold the F32 file's values and share its oracle.
VARIANTS = {
    "F32": ("float", "float"),
    "F16": ("float", "float"),
    "BF16": ("float", "float"),
    "Q8_0": ("Q8_0", "quant"),
    "Q4_K_M": ("Q4_K_M", "quant"),
    "LOWBIT": ("LOWBIT", "quant"),
}
KEYS = ["prompt_logits", "decode_logits", "prompt2_logits"]


def run_engine(tool, gguf: pathlib.Path, oracle: dict, out: pathlib.Path, extra: list[str]) -> dict[str, np.ndarray]:
    ids = lambda a: ",".join(str(int(x)) for x in a)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(tool("golden_run")), str(gguf), "--prompt", ids(oracle["prompt_ids"]),
           "--decode", ids(oracle["decode_tokens"]), "--prompt2", ids(oracle["prompt2_ids"]), "--out", str(out)]
    r = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"golden_run failed: {r.stderr}"
    vocab = oracle["prompt_logits"].shape[-1]
    return {k: np.fromfile(out / f"{k}.f32", dtype=np.float32).reshape(-1, vocab) for k in KEYS}


def check(oracle: dict, ours: dict[str, np.ndarray], mode: str, label: str) -> None:
    reports, ok = [], True
    for k in KEYS:
        assert ours[k].shape == oracle[k].shape, f"{label} {k}: shape {ours[k].shape} vs {oracle[k].shape}"
        v = compare.judge(compare.compare(oracle[k], ours[k]), mode, f"{label} {k}")
        ok &= v.ok
        reports.append("\n".join(v.lines))
    assert ok, "\n".join(reports)


# Default packing: whole prompts in one pass (both sequences together), decode one token at a time.
# Variations: prefill chunks of 7 tokens; one token per pass; and the KV cache types users pick.
PACKINGS = {
    "float": [["--kv", "f32"], ["--kv", "f32", "--batch", "7"], ["--kv", "f32", "--tokenwise"]],
    "quant": [["--kv", "f16"], ["--kv", "f16", "--batch", "7"], ["--kv", "f16", "--tokenwise"], ["--kv", "q8_0"]],
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_engine_matches_oracle(golden_dir, tool, tmp_path, model, variant):
    oracle_name, mode = VARIANTS[variant]
    oracle_path = ORACLES / f"tiny-{model}-{oracle_name}.npz"
    gguf = golden_dir / f"tiny-{model}-{variant}.gguf"
    if not gguf.exists():
        pytest.fail(f"{gguf} was not generated (the quantized mixes need build/bin/strata)")
    oracle = dict(np.load(oracle_path))
    for i, extra in enumerate(PACKINGS[mode]):
        ours = run_engine(tool, gguf, oracle, tmp_path / str(i), extra)
        check(oracle, ours, mode, f"{model}-{variant} [{' '.join(extra)}]")
