"""Regenerate the golden GGUF files from the seeded generator and check them against the manifest.

    python -m tools.golden.generate --out build/golden            # write every float/Q8_0 file, check hashes
    python -m tools.golden.generate --out build/golden --strata build/bin/strata   # ... and the quantized mixes
    python -m tools.golden.generate --out build/golden --update-manifest           # record new hashes (developers)

Float files (F32, F16, BF16) and Q8_0 are written directly with the gguf package, as llama.cpp's converter writes
them. The K-quant and i-quant mixes are made from the F32 file by `strata quantize` with the explicit per-tensor rules
recorded in the manifest (first matching rule wins). Needs numpy and gguf only.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import convert, manifest, models
from .vocab import CHAT_TEMPLATE, build_vocab, encode

FLOAT_VARIANTS = ["F32", "F16", "BF16", "Q8_0"]
QUANT_VARIANTS = ["Q4_K_M", "LOWBIT"]

# Tensors llama.cpp never quantizes, whatever the mix (routers and the conv kernel stay F32; vectors are kept by
# `strata quantize` itself).
_KEEP_F32 = [[r"ffn_gate_inp(_shexp)?\.weight$", "F32"], [r"ssm_conv1d\.weight$", "F32"]]


def _more_bits_layers(n_layer: int) -> list[int]:
    """llama.cpp's use_more_bits(i, n): the layers whose ffn_down gets Q6_K in a Q4_K_M file."""
    return [i for i in range(n_layer)
            if i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2]


def quant_mixes(model_id: str) -> dict[str, dict]:
    """The quantized variants of a model: `strata quantize` rules and default type (and why each rule is there)."""
    cfg = models.CONFIGS[model_id]
    n_blocks = cfg["num_hidden_layers"] + cfg.get("mtp_num_hidden_layers", 0)
    down = "|".join(str(i) for i in _more_bits_layers(n_blocks))
    return {
        # Like llama.cpp's Q4_K_M for an 8-expert model: Q4_K by default, output Q6_K, attn_k/attn_v Q8_0 (bumped for
        # n_expert == 8), fused GDN attn_qkv Q5_K, ffn_down (routed and shared) Q6_K in the use_more_bits layers.
        "Q4_K_M": {
            "default_type": "Q4_K",
            "rules": _KEEP_F32 + [
                [r"^output\.weight$", "Q6_K"],
                [r"\.attn_[kv]\.weight$", "Q8_0"],
                [r"\.attn_qkv\.weight$", "Q5_K"],
                [rf"^blk\.({down})\.ffn_down", "Q6_K"],
            ],
        },
        # A low-bit mix in the style of the 1-2 bit MoE releases: routed experts at 1.75-2.6 bits (IQ2_XXS gate/up in
        # even layers, IQ1_M in odd ones, Q2_K down), everything else IQ4_XS.
        "LOWBIT": {
            "default_type": "IQ4_XS",
            "rules": _KEEP_F32 + [
                [r"\.ffn_down_exps\.weight$", "Q2_K"],
                [r"^blk\.[0-9]*[02468]\.ffn_(gate|up)_exps\.weight$", "IQ2_XXS"],
                [r"\.ffn_(gate|up)_exps\.weight$", "IQ1_M"],
            ],
        },
    }


def file_name(model_id: str, variant: str) -> str:
    return f"tiny-{model_id}-{variant}.gguf"


def prompts() -> dict:
    v = build_vocab()
    p1, p2 = encode(v, models.PROMPT_TEXT), encode(v, models.PROMPT2_TEXT)
    if len(p1) != models.PROMPT_LEN or len(p2) != models.PROMPT2_LEN:
        raise RuntimeError(f"prompt lengths changed: {len(p1)}, {len(p2)}")
    return {"prompt": {"text": models.PROMPT_TEXT, "ids": p1},
            "prompt2": {"text": models.PROMPT2_TEXT, "ids": p2},
            "decode_steps": models.DECODE_STEPS}


def static_manifest() -> dict:
    """Everything the manifest records that follows from the code alone (no hashes)."""
    v = build_vocab()
    return {
        "format": 1,
        "seed": models.SEED,
        "generator": "tools/golden/hashrng.py: splitmix64 counter hash of (seed, '<model>/<hf name>', index); "
                     "Irwin-Hall(4) normals scaled per tensor role (tools/golden/models.py); bfloat16-rounded, "
                     "|x| < 2^-14 flushed to 0",
        "software": {"gguf": importlib.metadata.version("gguf"), "numpy": np.__version__},
        "vocab": {"size": len(v.tokens), "merges": len(v.merges), "chat_template": CHAT_TEMPLATE},
        "sequences": prompts(),
        "models": {
            mid: {
                "arch": models.ARCH_OF[mid],
                "hf_config": models.hf_config(mid),
                "quant_mixes": quant_mixes(mid),
            } for mid in models.CONFIGS
        },
    }


def run_strata_quantize(strata: Path, src: Path, dst: Path, mix: dict, threads: int) -> None:
    cmd = [str(strata), "quantize", str(src), str(dst), "--default-type", mix["default_type"], "-t", str(threads)]
    for pattern, qtype in mix["rules"]:
        cmd += ["--rule", f"{pattern}={qtype}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"strata quantize failed ({res.returncode}) for {dst.name}:\n{res.stdout}{res.stderr}")


def strata_can_quantize(strata: Path) -> bool:
    """Whether this strata binary has the `quantize` command (builds before it was merged do not)."""
    try:
        res = subprocess.run([str(strata), "--help"], capture_output=True, text=True)
    except OSError:
        return False
    return any(line.split()[:1] == ["quantize"] for line in res.stdout.splitlines())


def generate(out_dir: Path, model_ids: list[str], variants: list[str], strata: Path | None = None,
             threads: int = 2, log=print) -> dict[str, str]:
    """Write the requested files; return {file name: sha256}. The quantized mixes need `strata quantize`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if strata is not None and any(v in QUANT_VARIANTS for v in variants) and not strata_can_quantize(strata):
        log(f"golden: {strata} has no quantize command: the quantized mixes are not made")
        strata = None
    vocab = build_vocab()
    hashes: dict[str, str] = {}
    for mid in model_ids:
        t0 = time.time()
        cfg = models.hf_config(mid)
        state = models.generate_state(mid)
        tensors = convert.hf_to_gguf_tensors(mid, cfg, state)
        for var in variants:
            path = out_dir / file_name(mid, var)
            if var in FLOAT_VARIANTS:
                convert.write_gguf(path, mid, cfg, state, var, vocab=vocab, tensors=tensors)
            elif var in QUANT_VARIANTS:
                if strata is None:
                    continue
                src = out_dir / file_name(mid, "F32")
                if not src.exists():
                    convert.write_gguf(src, mid, cfg, state, "F32", vocab=vocab, tensors=tensors)
                run_strata_quantize(strata, src, path, quant_mixes(mid)[var], threads)
            else:
                raise ValueError(f"unknown variant {var!r}")
            hashes[path.name] = manifest.sha256_file(path)
        log(f"golden: {mid}: {', '.join(v for v in variants if (out_dir / file_name(mid, v)).exists())} "
            f"in {time.time() - t0:.1f} s")
    return hashes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the GGUF files")
    ap.add_argument("--model", action="append", choices=list(models.CONFIGS), help="only these models")
    ap.add_argument("--variant", action="append", choices=FLOAT_VARIANTS + QUANT_VARIANTS, help="only these files")
    ap.add_argument("--strata", type=Path, help="strata binary, to make the quantized mixes with `strata quantize`")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--update-manifest", action="store_true",
                    help="record configs, sequences, rules and these files' hashes in tools/golden/manifest.json")
    ap.add_argument("--no-check", action="store_true", help="do not compare the hashes with the manifest")
    args = ap.parse_args(argv)

    model_ids = args.model or list(models.CONFIGS)
    variants = args.variant or (FLOAT_VARIANTS + (QUANT_VARIANTS if args.strata else []))
    hashes = generate(args.out, model_ids, variants, args.strata, args.threads)

    if args.update_manifest:
        data = manifest.load() if manifest.MANIFEST_PATH.exists() else {}
        old_models = data.get("models", {})
        new = static_manifest()
        for mid, entry in new["models"].items():
            old = old_models.get(mid, {})
            for key, value in old.items():  # recorded parts (files, oracles, transformers) are kept
                entry.setdefault(key, value)
            entry["files"] = dict(old.get("files", {}))
            for var in FLOAT_VARIANTS + QUANT_VARIANTS:
                name = file_name(mid, var)
                if name in hashes:
                    path = args.out / name
                    entry["files"][var] = {"file": name, "sha256": hashes[name], "bytes": path.stat().st_size,
                                           "oracle": "float" if var in ("F32", "F16", "BF16") else var}
        for key, value in data.items():
            new.setdefault(key, value)
        manifest.save(new)
        print(f"golden: manifest updated ({len(hashes)} file hashes)")
        return 0

    if args.no_check:
        return 0
    data = manifest.load()
    bad = 0
    for mid in model_ids:
        files = data["models"][mid].get("files", {})
        for var in variants:
            name = file_name(mid, var)
            if name not in hashes:
                continue
            want = files.get(var, {}).get("sha256")
            if want is None:  # not an error: a mix whose quantizers are new has no recorded hash yet
                print(f"golden: {name}: no hash recorded in the manifest (sha256 {hashes[name]})")
            elif want != hashes[name]:
                print(f"golden: {name}: sha256 {hashes[name]} differs from the manifest's {want}")
                bad += 1
    if bad:
        return 1
    print(f"golden: the files with recorded hashes match the manifest ({len(hashes)} written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
