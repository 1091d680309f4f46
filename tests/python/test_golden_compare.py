"""The golden comparison helper (tools/golden/compare.py): metrics, tolerances and its command line."""
import subprocess
import sys

import numpy as np
import pytest

from tools.golden import compare, manifest

ROOT = manifest.GOLDEN_DIR.parents[1]


def _logits(n=20, v=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, v)) * 3.0
    x[np.arange(n), rng.integers(0, v, n)] += 15.0  # a clear top-1 per position
    return x.astype(np.float32)


def test_identical_logits():
    x = _logits()
    m = compare.compare(x, x)
    assert m.max_abs.max() == 0 and m.nmse_total == 0 and m.top1.all()
    assert np.allclose(m.kl, 0.0, atol=1e-12)
    assert compare.judge(m, "float").ok and compare.judge(m, "quant").ok


def test_metrics_by_hand():
    ref = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]])
    ours = np.array([[1.0, 2.5, 3.0], [0.0, -1.0, 3.0]])
    m = compare.compare(ref, ours)
    assert m.max_abs.tolist() == [0.5, 1.0]
    assert m.ref_max_abs.tolist() == [3.0, 4.0]
    np.testing.assert_allclose(m.nmse, [0.25 / 14.0, 1.0 / 17.0])
    np.testing.assert_allclose(m.nmse_total, 1.25 / 31.0)
    assert m.top1.tolist() == [True, True]
    p = np.exp(ref[0]) / np.exp(ref[0]).sum()
    q = np.exp(ours[0]) / np.exp(ours[0]).sum()
    np.testing.assert_allclose(m.kl[0], np.sum(p * np.log(p / q)))
    np.testing.assert_allclose(m.top1_gap, [1.0, 4.0])


def test_float_tolerance_is_per_position():
    ref = _logits()
    ours = ref.copy()
    pos_scale = np.abs(ref).max(axis=1)
    ours[3, 5] += 0.9e-3 * pos_scale[3]
    assert compare.judge(compare.compare(ref, ours), "float").ok
    ours[7, 1] += 1.1e-3 * pos_scale[7]
    v = compare.judge(compare.compare(ref, ours), "float")
    assert not v.ok and any("FAIL at 1 positions, first [7]" in line for line in v.lines)


def test_quant_tolerances():
    ref = _logits(n=200, seed=1)
    rng = np.random.default_rng(2)
    noise = rng.standard_normal(ref.shape).astype(np.float32)
    small = ref + noise * np.sqrt(0.5e-3 * np.mean(ref.astype(np.float64) ** 2))
    assert compare.judge(compare.compare(ref, small), "quant").ok
    big = ref + noise * np.sqrt(2e-3 * np.mean(ref.astype(np.float64) ** 2))
    assert not compare.judge(compare.compare(ref, big), "quant").ok
    flipped = ref.copy()
    for i in range(3):  # 3 of 200 positions with another top-1: 98.5% < 99%
        j = int(np.argsort(ref[i])[-2])
        flipped[i, j] = ref[i].max() + 0.01
    m = compare.compare(ref, flipped)
    assert m.nmse_total < 1e-3 and np.mean(m.top1) == 0.985
    assert not compare.judge(m, "quant").ok


def test_min_gap_ignores_near_ties():
    ref = _logits(n=50, seed=3)
    ref[0, :2] = [50.0, 50.001]  # a near tie the oracle itself can't decide
    ours = ref.copy()
    ours[0, :2] = [50.001, 50.0]
    assert not compare.judge(compare.compare(ref, ours), "quant").ok
    assert compare.judge(compare.compare(ref, ours), "quant", min_gap=0.01).ok


def test_bad_input():
    with pytest.raises(ValueError):
        compare.compare(np.zeros((2, 3)), np.zeros((3, 3)))
    with pytest.raises(ValueError):
        compare.compare(np.zeros((2, 3)), np.array([[0, np.nan, 0], [0, 0, 0]]))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tools.golden.compare", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


def test_cli_formats_and_exit_codes(tmp_path):
    ref = {"prompt_logits": _logits(8, 32, 4), "decode_logits": _logits(4, 32, 5), "prompt_ids": np.arange(8)}
    oracle = tmp_path / "oracle.npz"
    manifest.save_npz(oracle, ref)
    same = tmp_path / "same.npz"
    manifest.save_npz(same, ref)
    r = _cli(oracle, same, "--mode", "float")
    assert r.returncode == 0 and "RESULT: PASS" in r.stdout and "decode_logits" in r.stdout, r.stdout + r.stderr

    ours = ref["decode_logits"].copy()
    ours[2, 0] += 1.0
    npy = tmp_path / "ours.npy"
    np.save(npy, ours)
    r = _cli(oracle, npy, "--mode", "float", "--key", "decode_logits")
    assert r.returncode == 1 and "RESULT: FAIL" in r.stdout and "first [2]" in r.stdout, r.stdout

    raw = tmp_path / "ours.f32"
    ref["prompt_logits"][2:5].astype("<f4").tofile(raw)
    r = _cli(oracle, raw, "--mode", "quant", "--key", "prompt_logits", "--positions", "2:5")
    assert r.returncode == 0 and "3 positions" in r.stdout, r.stdout

    r = _cli(oracle, npy, "--mode", "float")  # one array, no key
    assert r.returncode == 2 and "--key" in r.stderr


def test_cli_on_a_committed_oracle(tmp_path):
    data = manifest.load()
    entry = data["models"]["qwen3moe"]["oracles"]["float"]
    oracle = manifest.GOLDEN_DIR / entry["file"]
    arrays = manifest.load_npz(oracle)
    ours = tmp_path / "ours.npz"
    arrays = {k: (v + np.float32(1e-4) if k.endswith("_logits") else v) for k, v in arrays.items()}
    manifest.save_npz(ours, arrays)
    r = _cli(oracle, ours, "--mode", "float")
    assert r.returncode == 0 and r.stdout.count("PASS") == 4, r.stdout
