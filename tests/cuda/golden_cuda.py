"""The golden models (tools/golden) through the CUDA engine: every model and file variant against its oracle with
the engine issue's tolerances, again with the work packed differently and with other KV cache types, against the CPU
engine, and with a small expert cache, which must give the very same bits as all experts resident.

    python tests/cuda/golden_cuda.py --bin build-gpu/bin --golden DIR [--out DIR]

DIR holds tiny-<model>-<variant>.gguf (python -m tools.golden.generate --out DIR --strata build-gpu/bin/strata).
Exit status 0 when every check passes."""
import argparse
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tools.golden import compare  # noqa: E402

ORACLES = ROOT / "tools" / "golden" / "oracles"
MODELS = ["qwen3moe", "qwen3next", "qwen35moe"]
VARIANTS = {"F32": ("float", "float"), "F16": ("float", "float"), "BF16": ("float", "float"),
            "Q8_0": ("Q8_0", "quant"), "Q4_K_M": ("Q4_K_M", "quant"), "LOWBIT": ("LOWBIT", "quant")}
KEYS = ["prompt_logits", "decode_logits", "prompt2_logits"]
PACKINGS = {
    "float": [["--kv", "f32"], ["--kv", "f32", "--batch", "7"], ["--kv", "f32", "--tokenwise"]],
    "quant": [["--kv", "f16"], ["--kv", "f16", "--batch", "7"], ["--kv", "f16", "--tokenwise"], ["--kv", "q8_0"]],
}


def run(bin_dir, gguf, oracle, out, extra):
    ids = lambda a: ",".join(str(int(x)) for x in a)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(bin_dir / "golden_run"), str(gguf), "--prompt", ids(oracle["prompt_ids"]),
           "--decode", ids(oracle["decode_tokens"]), "--prompt2", ids(oracle["prompt2_ids"]), "--out", str(out)]
    t0 = time.time()
    r = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=600)
    print(f"  {gguf.name} {' '.join(extra)}: {time.time() - t0:.2f} s", flush=True)
    if r.returncode != 0:
        raise RuntimeError(f"golden_run {' '.join(extra)} failed: {r.stderr}")
    vocab = oracle["prompt_logits"].shape[-1]
    return {k: np.fromfile(out / f"{k}.f32", dtype=np.float32).reshape(-1, vocab) for k in KEYS}


def judge(ref, ours, mode, label):
    ok, worst = True, []
    for k in KEYS:
        if ours[k].shape != ref[k].shape:
            return False, [f"{label} {k}: shape {ours[k].shape} vs {ref[k].shape}"]
        v = compare.judge(compare.compare(ref[k], ours[k]), mode, f"{label} {k}")
        ok &= v.ok
        if not v.ok:
            worst += v.lines
    return ok, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=pathlib.Path, required=True)
    ap.add_argument("--golden", type=pathlib.Path, required=True)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/golden-cuda"))
    ap.add_argument("--quick", action="store_true", help="default packing only")
    ap.add_argument("--variant", action="append", help="only these file variants")
    args = ap.parse_args()
    failures, checks = [], 0
    for model in MODELS:
        for variant, (oracle_name, mode) in VARIANTS.items():
            if args.variant and variant not in args.variant:
                continue
            gguf = args.golden / f"tiny-{model}-{variant}.gguf"
            if not gguf.exists():
                failures.append(f"{gguf.name}: missing")
                continue
            oracle = dict(np.load(ORACLES / f"tiny-{model}-{oracle_name}.npz"))
            tag = f"{model}-{variant}"
            packings = PACKINGS[mode][:1] if args.quick else PACKINGS[mode]
            base = None
            for i, extra in enumerate(packings):
                ours = run(args.bin, gguf, oracle, args.out / tag / f"cuda{i}", ["--device", "cuda"] + extra)
                ok, lines = judge(oracle, ours, mode, f"{tag} cuda [{' '.join(extra)}]")
                checks += 1
                if not ok:
                    failures += lines
                if i == 0:
                    base = ours
            # the CPU engine on the same file, same packing: both within the tolerances of each other
            cpu = run(args.bin, gguf, oracle, args.out / tag / "cpu", ["--device", "cpu"] + packings[0])
            ok, lines = judge(cpu, base, mode, f"{tag} cuda vs cpu")
            checks += 1
            if not ok:
                failures += lines
            # two expert slots instead of all experts resident: the same bits
            small = run(args.bin, gguf, oracle, args.out / tag / "slots", ["--device", "cuda", "--expert-slots", "2"]
                        + packings[0])
            checks += 1
            same = all(np.array_equal(small[k].view(np.uint32), base[k].view(np.uint32)) for k in KEYS)
            if not same:
                failures.append(f"{tag}: 2 expert slots changed the logits")
            print(f"{tag}: {'ok' if not failures or not any(f.startswith(tag) for f in failures) else 'FAIL'}",
                  flush=True)
    print(f"{checks} checks, {len(failures)} failures")
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
