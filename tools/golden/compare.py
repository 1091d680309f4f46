"""Compare logits against a golden oracle, position by position, with the engine issues' tolerances.

    python -m tools.golden.compare ORACLE.npz OURS.npz --mode float     # every logits key the two files share
    python -m tools.golden.compare ORACLE.npz ours.npy --key decode_logits --mode quant
    python -m tools.golden.compare ORACLE.npz ours.f32 --key prompt_logits --mode quant   # raw float32, row-major

Metrics per position: max |ours - oracle|, NMSE = sum (ours - oracle)^2 / sum oracle^2, top-1 agreement, and
KL(softmax(oracle) || softmax(ours)). Tolerances:
- float (F32/F16/BF16 files): max |difference| <= 1e-3 * max |oracle logit| at every position;
- quant (quantized files, activations quantized too): NMSE over all positions <= 1e-3 and top-1 agreement >= 99%.
Exits 1 with a readable report when a tolerance is missed, 2 on unusable input.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FLOAT_REL_TOL = 1e-3
QUANT_NMSE_TOL = 1e-3
QUANT_TOP1_MIN = 0.99
LOGIT_KEYS = ("prompt_logits", "decode_logits", "prompt2_logits")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


@dataclass
class Metrics:
    """Per-position metrics of ours against the oracle (arrays of length n_positions)."""

    max_abs: np.ndarray
    ref_max_abs: np.ndarray
    nmse: np.ndarray
    top1: np.ndarray  # bool
    kl: np.ndarray
    top1_gap: np.ndarray  # the oracle's top-1 minus top-2 logit
    sq_err: float = 0.0
    sq_ref: float = 0.0

    @property
    def n(self) -> int:
        return int(self.max_abs.shape[0])

    @property
    def nmse_total(self) -> float:
        return self.sq_err / self.sq_ref if self.sq_ref > 0 else float("inf")


def compare(oracle: np.ndarray, ours: np.ndarray) -> Metrics:
    """Metrics for logits of shape [positions, vocab] (a 1-D array is one position)."""
    ref = np.atleast_2d(np.asarray(oracle, dtype=np.float64))
    got = np.atleast_2d(np.asarray(ours, dtype=np.float64))
    if ref.shape != got.shape:
        raise ValueError(f"shapes differ: oracle {ref.shape}, ours {got.shape}")
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))[0]
        raise ValueError(f"ours has a non-finite logit at position {bad[0]}, token {bad[1]}")
    d = got - ref
    lp_ref, lp_got = _log_softmax(ref), _log_softmax(got)
    s = np.sort(ref, axis=-1)
    return Metrics(
        max_abs=np.abs(d).max(axis=-1),
        ref_max_abs=np.abs(ref).max(axis=-1),
        nmse=np.sum(d * d, axis=-1) / np.maximum(np.sum(ref * ref, axis=-1), 1e-300),
        top1=ref.argmax(axis=-1) == got.argmax(axis=-1),
        kl=np.sum(np.exp(lp_ref) * (lp_ref - lp_got), axis=-1),
        top1_gap=s[:, -1] - s[:, -2],
        sq_err=float(np.sum(d * d)),
        sq_ref=float(np.sum(ref * ref)),
    )


@dataclass
class Verdict:
    ok: bool
    lines: list[str] = field(default_factory=list)


def judge(m: Metrics, mode: str, name: str = "logits", min_gap: float = 0.0) -> Verdict:
    """Apply the float or quant tolerance; the report names the worst position and the numbers behind the verdict."""
    worst = int(np.argmax(m.max_abs / np.maximum(m.ref_max_abs, 1e-30)))
    top1_rate = float(np.mean(m.top1))
    lines = [
        f"{name}: {m.n} positions",
        f"  max |diff| {m.max_abs.max():.3e} (worst relative at position {worst}: {m.max_abs[worst]:.3e} of "
        f"max |logit| {m.ref_max_abs[worst]:.3e} = {m.max_abs[worst] / max(m.ref_max_abs[worst], 1e-30):.2e})",
        f"  NMSE {m.nmse_total:.3e} overall, worst position {int(np.argmax(m.nmse))}: {m.nmse.max():.3e}",
        f"  top-1 agreement {top1_rate * 100:.2f}% ({int(np.sum(m.top1))}/{m.n})"
        + ("" if m.top1.all() else f", differing at positions {np.flatnonzero(~m.top1).tolist()[:12]}"),
        f"  KL(oracle || ours) mean {m.kl.mean():.3e}, max {m.kl.max():.3e} at position {int(np.argmax(m.kl))}",
    ]
    if min_gap > 0:
        clear = m.top1_gap >= min_gap
        rate = float(np.mean(m.top1[clear])) if clear.any() else 1.0
        lines.append(f"  top-1 agreement where the oracle's top-2 gap >= {min_gap}: {rate * 100:.2f}% "
                     f"({int(np.sum(m.top1 & clear))}/{int(np.sum(clear))})")
    if mode == "float":
        rel = m.max_abs / np.maximum(m.ref_max_abs, 1e-30)
        bad = np.flatnonzero(rel > FLOAT_REL_TOL)
        ok = bad.size == 0
        lines.append(f"  float tolerance: max |diff| <= {FLOAT_REL_TOL:g} x max |logit| at every position: "
                     + ("PASS" if ok else f"FAIL at {bad.size} positions, first {bad.tolist()[:12]}"))
    elif mode == "quant":
        if min_gap > 0:
            clear = m.top1_gap >= min_gap
            top1_used = float(np.mean(m.top1[clear])) if clear.any() else 1.0
        else:
            top1_used = top1_rate
        ok_nmse = m.nmse_total <= QUANT_NMSE_TOL
        ok_top1 = top1_used >= QUANT_TOP1_MIN
        ok = ok_nmse and ok_top1
        lines.append(f"  quant tolerance: NMSE <= {QUANT_NMSE_TOL:g}: {'PASS' if ok_nmse else 'FAIL'}; "
                     f"top-1 >= {QUANT_TOP1_MIN * 100:g}%: {'PASS' if ok_top1 else 'FAIL'}")
    else:
        raise ValueError(f"unknown mode {mode!r} (float or quant)")
    return Verdict(ok, lines)


def _load(path: Path, vocab: int | None) -> dict[str, np.ndarray]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    if suffix == ".npy":
        return {"": np.load(path, allow_pickle=False)}
    if suffix in (".f32", ".bin", ".raw"):
        data = np.fromfile(path, dtype="<f4")
        if not vocab or data.size % vocab:
            raise ValueError(f"{path}: {data.size} floats are not whole rows of {vocab} logits")
        return {"": data.reshape(-1, vocab)}
    raise ValueError(f"{path}: expected .npz, .npy or raw float32 (.f32/.bin/.raw)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("oracle", type=Path, help="oracle .npz (tools/golden/oracles/...)")
    ap.add_argument("ours", type=Path, help="our logits: .npz with the same keys, .npy, or raw float32 rows")
    ap.add_argument("--mode", choices=("float", "quant"), required=True)
    ap.add_argument("--key", action="append", help="oracle key(s) to compare (default: every logits key in both)")
    ap.add_argument("--positions", help="only rows A:B of the oracle key (when ours holds a part)")
    ap.add_argument("--min-gap", type=float, default=0.0,
                    help="quant mode: count top-1 only where the oracle's top-1/top-2 gap is at least this")
    args = ap.parse_args(argv)
    try:
        ref = _load(args.oracle, None)
        vocab = next((v.shape[-1] for k, v in ref.items() if k.endswith("_logits")), None)
        got = _load(args.ours, vocab)
        keys = args.key or [k for k in LOGIT_KEYS if k in ref and (k in got or "" in got)]
        if "" in got and len(keys) != 1:
            raise ValueError("ours holds one array: name the oracle key with --key")
        if not keys:
            raise ValueError("no logits key in common")
        ok = True
        out: list[str] = [f"compare {args.ours} against {args.oracle} ({args.mode} tolerances)"]
        for key in keys:
            r = ref[key]
            if args.positions:
                a, b = (int(x) if x else None for x in args.positions.split(":"))
                r = r[a:b]
            g = got[""] if "" in got else got[key]
            v = judge(compare(r, g), args.mode, key, args.min_gap)
            ok &= v.ok
            out += v.lines
        out.append("RESULT: " + ("PASS" if ok else "FAIL"))
        print("\n".join(out))
        return 0 if ok else 1
    except (ValueError, KeyError, OSError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
