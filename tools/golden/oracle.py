"""The golden oracles: logits that Hugging Face transformers computes for the exact weights a GGUF file encodes.

    python -m tools.golden.oracle run --gguf-dir DIR --out DIR      # needs torch + transformers (the GPU machine)
    python -m tools.golden.oracle record DIR                        # copy a run's oracles into tools/golden (no torch)

`run` reads each GGUF file with the gguf package, dequantizes every tensor, undoes the converter's transforms
(tools/golden/convert.py: gguf_to_hf_state), loads the result into the transformers model built from the recorded
config, and computes in float32 on the CPU with deterministic algorithms and one thread:
- the 64-token prompt, logits at every position (prefill with the model's cache);
- 16 greedy decode steps through that cache (KV and recurrent state), the logits of each step and the fed tokens;
- the second prompt, left-padded in a batch of two with the first (its logits at its own positions);
and checks along the way: the loaded parameters equal the file's values, the numpy reference (npref.py) agrees,
a no-cache forward over prompt + decoded tokens agrees with the cached decode, and the batch agrees with single runs.
One .npz per (model, oracle) and a report.json with the checks and the software versions.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from . import convert, generate, manifest, models, npref

PAD_ID = 505  # <|endoftext|>, Qwen's padding token

# oracle name -> the file it is computed from; F16/BF16 files hold the same values as F32 and share its oracle
ORACLE_SOURCES = {"float": "F32", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K_M", "LOWBIT": "LOWBIT"}


def oracle_file_name(model_id: str, oracle: str) -> str:
    return f"tiny-{model_id}-{oracle}.npz"


# ---- building the transformers model -----------------------------------------------------------------------------

_DROPPABLE = {"sliding_window", "use_sliding_window", "max_window_layers", "torch_dtype", "dtype",
              "mtp_num_hidden_layers", "full_attention_interval", "architectures", "model_type"}


def _config_kwargs(model_id: str) -> dict:
    cfg = models.hf_config(model_id)
    kw = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    if "rope_parameters" not in kw:
        rp = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
        if "partial_rotary_factor" in kw:
            rp["partial_rotary_factor"] = kw.pop("partial_rotary_factor")
        kw.pop("rope_scaling", None)
        kw["rope_parameters"] = rp
    if "linear_num_key_heads" in kw:
        kw["layer_types"] = models.layer_types(cfg)
        kw.pop("full_attention_interval", None)
    kw.pop("mtp_num_hidden_layers", None)
    return kw


def build_model(model_id: str, log):
    import torch
    import transformers

    names = {"qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
             "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
             "qwen35moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM")}[model_id]
    config_cls, model_cls = getattr(transformers, names[0]), getattr(transformers, names[1])
    kw = _config_kwargs(model_id)
    dropped = []
    while True:
        try:
            config = config_cls(**kw)
            break
        except TypeError as e:
            m = re.search(r"'(\w+)'", str(e))
            if not m or m.group(1) not in kw or m.group(1) not in _DROPPABLE:
                raise
            dropped.append(m.group(1))
            kw.pop(m.group(1))
    if dropped:
        log(f"  {model_id}: config ignores {dropped}")
    torch.manual_seed(0)
    try:
        model = model_cls._from_config(config, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - older/newer signatures: fall back to the plain constructor
        log(f"  {model_id}: _from_config failed ({e}); constructing directly")
        config._attn_implementation = "eager"
        model = model_cls(config)
    model = model.to(torch.float32).eval()
    for setter, value in (("set_experts_implementation", "eager"),):
        if hasattr(model, setter):
            try:
                getattr(model, setter)(value)
            except Exception as e:  # noqa: BLE001 - report and go on with the default
                log(f"  {model_id}: {setter}({value!r}) failed: {e}")
    impl = {"attn": getattr(model.config, "_attn_implementation", None),
            "experts": getattr(model.config, "_experts_implementation", None)}
    return model, config, impl, dropped


def check_config(model_id: str, config) -> dict:
    """The transformers config must say what our config says (fail loudly otherwise)."""
    cfg = models.hf_config(model_id)
    got = {}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size", "vocab_size", "rms_norm_eps",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim", "shared_expert_intermediate_size", "norm_topk_prob",
                "tie_word_embeddings"):
        if key in cfg:
            val = getattr(config, key)
            if val != cfg[key]:
                raise RuntimeError(f"{model_id}: transformers config {key}={val!r}, ours {cfg[key]!r}")
            got[key] = val
    if "linear_num_key_heads" in cfg and list(config.layer_types) != models.layer_types(cfg):
        raise RuntimeError(f"{model_id}: layer_types {config.layer_types} != {models.layer_types(cfg)}")
    rp = dict(getattr(config, "rope_parameters", None) or {})
    got["rope_parameters"] = {k: v for k, v in rp.items() if isinstance(v, (int, float, str, list, bool))}
    return got


def _expert_tensor(key: str, ckpt: dict[str, np.ndarray]) -> np.ndarray | None:
    m = re.match(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", key)
    if not m:
        return None
    base, which = m.group(1), m.group(2)
    if key in ckpt:
        return ckpt[key]
    n = 0
    while f"{base}.{n}.down_proj.weight" in ckpt:
        n += 1
    if n == 0:
        return None
    if which == "down_proj":
        return np.stack([ckpt[f"{base}.{e}.down_proj.weight"] for e in range(n)])
    return np.stack([np.concatenate([ckpt[f"{base}.{e}.gate_proj.weight"], ckpt[f"{base}.{e}.up_proj.weight"]])
                     for e in range(n)])


def load_weights(model, ckpt: dict[str, np.ndarray], log) -> dict:
    """Load HF checkpoint-form arrays into the module (experts fused or per expert, as the module wants)."""
    import torch

    ref = model.state_dict()
    new = {}
    notes = []
    for key, t in ref.items():
        arr = ckpt.get(key)
        if arr is None:
            arr = _expert_tensor(key, ckpt)
        if arr is None:
            m = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", key)
            if m and f"{m.group(1)}.gate_up_proj" in ckpt:
                base, e, proj = m.group(1), int(m.group(2)), m.group(3)
                if proj == "down":
                    arr = ckpt[f"{base}.down_proj"][e]
                else:
                    gu = ckpt[f"{base}.gate_up_proj"][e]
                    half = gu.shape[0] // 2
                    arr = gu[:half] if proj == "gate" else gu[half:]
        if arr is None:
            raise KeyError(f"no weights for module parameter {key} {tuple(t.shape)}")
        x = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
        if tuple(x.shape) != tuple(t.shape):
            if x.ndim == 3 and tuple(x.shape) == (t.shape[0], t.shape[2], t.shape[1]):
                x = x.transpose(1, 2).contiguous()
                notes.append(f"{key}: transposed to {tuple(t.shape)}")
            else:
                raise ValueError(f"{key}: module wants {tuple(t.shape)}, file gives {tuple(x.shape)}")
        new[key] = x
    model.load_state_dict(new, strict=True)
    # the module now holds exactly these values
    for key, t in model.state_dict().items():
        if not torch.equal(t, new[key]):
            raise RuntimeError(f"{key}: loaded values differ")
    return {"n_params": len(new), "notes": sorted(set(re.sub(r"layers\.\d+", "layers.N", n) for n in notes))}


def refine_a_log(model, tensors: dict[str, np.ndarray], model_id: str) -> float:
    """Pick each A_log (float32) so that torch's own exp gives exactly the file's -ssm_a; return the worst residual."""
    import torch

    if models.ARCH_OF[model_id] == "qwen3moe":
        return 0.0
    cfg = models.CONFIGS[model_id]
    g = convert.gdn_dims(cfg)
    worst = 0.0
    for il, kind in enumerate(models.layer_types(cfg)):
        if kind != "linear_attention":
            continue
        target = -tensors[f"blk.{il}.ssm_a"].astype(np.float32)
        if models.ARCH_OF[model_id] == "qwen35moe" and g.n_k != g.n_v:
            target = convert.tiled_to_grouped(target, 0, g.n_k, g.r, 1)
        target_t = torch.from_numpy(np.ascontiguousarray(target))
        p = model.model.layers[il].linear_attn.A_log
        x = p.data.clone()
        for i in range(x.numel()):
            best, best_err = x[i].clone(), None
            cand = x[i].clone()
            down = torch.tensor(float("-inf"), dtype=torch.float32)
            up = torch.tensor(float("inf"), dtype=torch.float32)
            for _ in range(8):
                cand = torch.nextafter(cand, down)
            for _ in range(17):
                y = x.clone()
                y[i] = cand
                err = abs(float(torch.exp(y)[i]) - float(target_t[i]))
                if best_err is None or err < best_err:
                    best, best_err = cand.clone(), err
                cand = torch.nextafter(cand, up)
            x[i] = best
        p.data.copy_(x)
        worst = max(worst, float(torch.max(torch.abs(torch.exp(x) - target_t) / target_t)))
    return worst


# ---- running -----------------------------------------------------------------------------------------------------


def run_oracle(model, ids1: list[int], ids2: list[int], steps: int) -> tuple[dict, dict]:
    import torch

    checks: dict = {}
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids1]), use_cache=True)
        prompt_logits = out.logits[0].float().numpy().copy()
        cache = out.past_key_values
        tok = int(np.argmax(prompt_logits[-1]))
        fed, dec = [], []
        for _ in range(steps):
            fed.append(tok)
            o = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            step = o.logits[0, -1].float().numpy().copy()
            dec.append(step)
            tok = int(np.argmax(step))
        decode_logits = np.stack(dec)

        full = model(input_ids=torch.tensor([ids1 + fed]), use_cache=False).logits[0].float().numpy()
        scale = float(np.abs(prompt_logits).max())
        checks["nocache_prompt_maxabs"] = float(np.abs(full[: len(ids1)] - prompt_logits).max())
        checks["nocache_decode_maxabs"] = float(np.abs(full[len(ids1):] - decode_logits).max())

        single2 = model(input_ids=torch.tensor([ids2]), use_cache=False).logits[0].float().numpy()
        T = len(ids1)
        pad = T - len(ids2)
        ids = torch.tensor([ids1, [PAD_ID] * pad + ids2])
        mask = torch.tensor([[1] * T, [0] * pad + [1] * len(ids2)])
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        batch = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float().numpy()
        checks["batch_row0_maxabs"] = float(np.abs(batch[0] - prompt_logits).max())
        checks["batch_row1_maxabs"] = float(np.abs(batch[1, pad:] - single2).max())
        batch_exact = max(checks["batch_row0_maxabs"], checks["batch_row1_maxabs"]) <= 1e-4 * scale
        checks["prompt2_source"] = "batch" if batch_exact else "single"
        prompt2_logits = batch[1, pad:].copy() if batch_exact else single2
    arrays = {
        "prompt_ids": np.asarray(ids1, dtype=np.int32),
        "prompt_logits": prompt_logits.astype(np.float32),
        "decode_tokens": np.asarray(fed, dtype=np.int32),
        "decode_logits": decode_logits.astype(np.float32),
        "prompt2_ids": np.asarray(ids2, dtype=np.int32),
        "prompt2_logits": np.ascontiguousarray(prompt2_logits, dtype=np.float32),
    }
    return arrays, checks


def diagnostics(model_id: str, tensors: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> dict:
    """numpy reference over the same file: agreement with the oracle, routing spread, top-1 spread, top-1 gaps."""
    ref = npref.NumpyModel(model_id, tensors)
    trace: dict = {}
    seq = list(arrays["prompt_ids"]) + list(arrays["decode_tokens"])
    full = ref.forward(seq, trace)
    n = len(arrays["prompt_ids"])
    ora = np.concatenate([arrays["prompt_logits"], arrays["decode_logits"]])
    scale = float(np.abs(ora).max())
    p2 = ref.forward(list(arrays["prompt2_ids"]))
    s = np.sort(ora, axis=-1)
    gap = s[:, -1] - s[:, -2]
    return {
        "npref_maxabs_rel": float(np.abs(full - ora).max() / scale),
        "npref_prompt2_maxabs_rel": float(np.abs(p2 - arrays["prompt2_logits"]).max() / scale),
        "npref_top1_agree": float(np.mean(full.argmax(-1) == ora.argmax(-1))),
        "max_abs_logit": scale,
        "top1_distinct": int(len(set(ora.argmax(-1).tolist()))),
        "positions": int(ora.shape[0]),
        "top1_gap_min": float(gap.min()),
        "top1_gap_p10": float(np.percentile(gap, 10)),
        "experts_used_per_layer": [int(len(np.unique(sel))) for sel in trace["experts"]],
        "expert_sets_per_layer": [int(len({tuple(sorted(r)) for r in sel.tolist()})) for sel in trace["experts"]],
        "prefix_len": n,
    }


def env_info() -> dict:
    import torch
    import transformers

    cpu = ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import importlib.metadata as md
    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
            "gguf": md.version("gguf"), "python": platform.python_version(), "cpu": cpu,
            "torch_threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "device": "cpu", "dtype": "float32"}


def cmd_run(args) -> int:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    log = print
    data = manifest.load()
    seq = data["sequences"]
    ids1, ids2, steps = seq["prompt"]["ids"], seq["prompt2"]["ids"], seq["decode_steps"]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"env": env_info(), "models": {}}
    log(f"oracle: {report['env']}")
    for mid in args.model or list(models.CONFIGS):
        entry = report["models"].setdefault(mid, {})
        model, config, impl, dropped = build_model(mid, log)
        entry["config_checked"] = check_config(mid, config)
        entry["implementation"] = impl
        entry["config_dropped"] = dropped
        f32 = convert.read_gguf_f32(Path(args.gguf_dir) / generate.file_name(mid, "F32"))
        same = {}
        for var in ("F16", "BF16"):
            p = Path(args.gguf_dir) / generate.file_name(mid, var)
            if p.exists():
                other = convert.read_gguf_f32(p)
                same[var] = all(np.array_equal(other[k], f32[k]) for k in f32)
        entry["float_files_identical"] = same
        for oracle in args.oracle or ["float", "Q8_0"]:
            path = Path(args.gguf_dir) / generate.file_name(mid, ORACLE_SOURCES[oracle])
            if not path.exists():
                log(f"  {mid}/{oracle}: {path.name} missing, skipped")
                continue
            t0 = time.time()
            tensors = convert.read_gguf_f32(path)
            ckpt = convert.gguf_to_hf_state(mid, models.CONFIGS[mid], tensors)
            ckpt = {k: v for k, v in ckpt.items() if not k.startswith("mtp.")}  # transformers has no MTP module
            load_info = load_weights(model, ckpt, log)
            a_log_residual = refine_a_log(model, tensors, mid)
            arrays, checks = run_oracle(model, ids1, ids2, steps)
            checks.update(diagnostics(mid, tensors, arrays))
            checks["load"] = load_info
            checks["a_log_exp_residual_rel"] = a_log_residual
            checks["source"] = path.name
            checks["source_sha256"] = manifest.sha256_file(path)
            checks["seconds"] = round(time.time() - t0, 2)
            name = oracle_file_name(mid, oracle)
            manifest.save_npz(out_dir / name, arrays)
            checks["digest"] = manifest.arrays_digest(arrays)
            checks["sha256"] = manifest.sha256_file(out_dir / name)
            entry.setdefault("oracles", {})[oracle] = checks
            log(f"  {mid}/{oracle}: {json.dumps({k: v for k, v in checks.items() if k != 'load'})}")
            committed = data["models"][mid].get("oracles", {}).get(oracle)
            if committed:  # regenerating must reproduce the committed oracle byte for byte
                same = committed["sha256"] == checks["sha256"]
                log(f"  {mid}/{oracle}: {'reproduces' if same else 'DIFFERS FROM'} the committed oracle "
                    f"{committed['file']}")
                report.setdefault("reproduced", {})[f"{mid}/{oracle}"] = same
    with open(out_dir / "report.json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    rep = report.get("reproduced", {})
    if rep:
        log(f"oracle: {sum(rep.values())} of {len(rep)} committed oracles reproduced exactly")
    return 0 if all(rep.values()) else 1


def cmd_record(args) -> int:
    """Copy a run's .npz files into tools/golden/oracles and record them in the manifest."""
    run = Path(args.run_dir)
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    data = manifest.load()
    manifest.ORACLE_DIR.mkdir(parents=True, exist_ok=True)
    for mid, entry in report["models"].items():
        for oracle, checks in entry.get("oracles", {}).items():
            name = oracle_file_name(mid, oracle)
            src = run / name
            if manifest.sha256_file(src) != checks["sha256"]:
                raise RuntimeError(f"{src}: hash differs from its report")
            shutil.copyfile(src, manifest.ORACLE_DIR / name)
            arrays = manifest.load_npz(src)
            data["models"][mid].setdefault("oracles", {})[oracle] = {
                "file": f"oracles/{name}",
                "sha256": checks["sha256"],
                "digest": checks["digest"],
                "source": checks["source"],
                "source_sha256": checks["source_sha256"],
                "decode_tokens": arrays["decode_tokens"].tolist(),
                "prompt2_source": checks["prompt2_source"],
                "checks": {k: v for k, v in checks.items()
                           if k not in ("sha256", "digest", "source", "source_sha256", "prompt2_source")},
            }
        data["models"][mid]["transformers"] = {k: entry[k] for k in
                                               ("config_checked", "implementation", "config_dropped",
                                                "float_files_identical") if k in entry}
    data["oracle_env"] = report["env"]
    manifest.save(data)
    print(f"oracle: recorded {sum(len(e.get('oracles', {})) for e in report['models'].values())} oracles")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="compute oracles (torch + transformers)")
    r.add_argument("--gguf-dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--model", action="append", choices=list(models.CONFIGS))
    r.add_argument("--oracle", action="append", choices=list(ORACLE_SOURCES))
    rec = sub.add_parser("record", help="copy a run's oracles into tools/golden and the manifest")
    rec.add_argument("run_dir")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return cmd_run(args) if args.cmd == "run" else cmd_record(args)


if __name__ == "__main__":
    sys.exit(main())
