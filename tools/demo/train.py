"""Trains the demo model, a small Qwen3-Next (transformers' Qwen3NextForCausalLM), and exports it for the engine.

    python -m tools.demo.train --out DIR [--minutes 15] [--steps N] [--preset demo|smoke] [--resume] [--seed 0]
                               [--device cuda|cpu] [--session-minutes M] [--max-mb MB] [--ckpt-every N] [--threads N]

A fresh run gathers the text (tools/demo/data.py: DIR/data.json, DIR/heldout.txt), learns the vocabulary
(tools/demo/tokenizer.py: DIR/tokenizer.json) and tokenizes both splits (DIR/train_tokens.npy, heldout_tokens.npy).
Training: AdamW, linear warmup then cosine decay, gradient clipping, bf16 autocast on CUDA, transformers' router
load-balancing loss added to the cross-entropy; DIR/checkpoint.pt (model, optimiser, step, RNG state) every
--ckpt-every steps and when the run stops; DIR/loss.csv (every step) and DIR/loss.png. The schedule runs over --steps
steps when given, else over --minutes of training time (accumulated across resumed sessions); the run ends at
whichever comes first. --session-minutes ends this invocation early (checkpoint written) so that a run longer than
one session continues with --resume; --resume with a larger --steps or --minutes extends a finished run.

At the end: held-out perplexity (llama.cpp's chunking, see MODEL_CARD.md), routing statistics, DIR/hf/ (safetensors,
config, tokenizer), DIR/demo.gguf (tools/golden/convert.py, Q8_0, tokenizer metadata) checked by loading its
dequantized weights back into transformers, DIR/summary.json and DIR/MODEL_CARD.md.
"""
from __future__ import annotations

import argparse
import csv
import importlib.metadata as md
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tools.golden import convert, models, oracle
from tools.golden.manifest import sha256_file
from tools.golden.vocab import CHAT_TEMPLATE

from . import card, data, plot, tokenizer

MODEL_ID = "qwen3next"  # the converter's model id: GGUF arch qwen3next, tokenizer pre qwen2
GGUF_NAME = "strata-demo-qwen3next"
FILE_TYPE = "Q8_0"
MAX_GGUF_BYTES = 32 * 10**6


@dataclass(frozen=True)
class Preset:
    layers: int
    experts: int
    top_k: int
    expert_ff: int
    vocab: int
    ctx: int
    batch: int
    lr: float
    warmup_steps: int
    max_mb: float
    tokenizer_mb: float
    eval_every: int
    eval_windows: int
    ckpt_every: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    aux_loss_coef: float = 0.01


PRESETS = {
    # 26.6 M parameters (10.1 M active per token), 28.8 MB as Q8_0
    "demo": Preset(layers=12, experts=32, top_k=4, expert_ff=64, vocab=4096, ctx=1024, batch=32, lr=2e-3,
                   warmup_steps=200, max_mb=256, tokenizer_mb=32, eval_every=250, eval_windows=32, ckpt_every=500),
    # the golden model's size with the real vocabulary: 20 steps in about 7 s on two CPU cores
    "smoke": Preset(layers=4, experts=8, top_k=2, expert_ff=64, vocab=4096, ctx=64, batch=4, lr=3e-3,
                    warmup_steps=5, max_mb=5, tokenizer_mb=5, eval_every=10, eval_windows=4, ckpt_every=10),
}


def model_config(p: Preset) -> dict:
    """The golden qwen3next config (attention, GDN and rope settings) at the preset's depth, experts and vocabulary."""
    cfg = models.hf_config(MODEL_ID)
    cfg.update(vocab_size=p.vocab, num_hidden_layers=p.layers, num_experts=p.experts, num_experts_per_tok=p.top_k,
               moe_intermediate_size=p.expert_ff, torch_dtype="float32")
    return cfg


def hf_config(cfg: dict, tok, aux_loss_coef: float):
    from transformers import Qwen3NextConfig

    skip = ("architectures", "model_type", "torch_dtype", "rope_theta", "partial_rotary_factor", "rope_scaling",
            "full_attention_interval")
    kw = {k: v for k, v in cfg.items() if k not in skip}
    kw.update(
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"],
                         "partial_rotary_factor": cfg["partial_rotary_factor"]},
        layer_types=models.layer_types(cfg),
        bos_token_id=tok.token_to_id(tokenizer.DOC_END),
        eos_token_id=tok.token_to_id(tokenizer.EOS),
        output_router_logits=True,
        router_aux_loss_coef=aux_loss_coef,
    )
    return Qwen3NextConfig(**kw)


def count_params(model, cfg: dict) -> tuple[int, int]:
    """(all parameters, those a token uses: the routed experts counted top_k / num_experts)."""
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    return total, total - routed + routed * cfg["num_experts_per_tok"] // cfg["num_experts"]


# ---- data ---------------------------------------------------------------------------------------------------------


def prepare(out: Path, p: Preset, max_mb: float, seed: int, log) -> None:
    """Text, vocabulary and token files of a fresh run."""
    t0 = time.time()
    corpus = data.gather(max_mb, seed)
    data.write(corpus, out)
    r = corpus.recipe
    log(f"data: {r['files']['train']} training files ({r['bytes']['train'] / 2**20:.1f} MiB), "
        f"{r['files']['heldout']} held out ({r['bytes']['heldout'] / 2**20:.2f} MiB) in {time.time() - t0:.0f} s")
    if not corpus.heldout:
        raise SystemExit("no held-out files: raise --max-mb")

    t0 = time.time()
    budget = int(p.tokenizer_mb * 2**20)

    def tokenizer_text():
        used = 0
        for d in corpus.train:
            if used >= budget:
                return
            used += len(d.text.encode("utf-8"))
            yield d.text

    tok = tokenizer.train(tokenizer_text(), p.vocab)
    tok.save(str(out / "tokenizer.json"))
    log(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time() - t0:.0f} s")

    t0 = time.time()
    train_ids = np.concatenate(encode_documents(tok, [d.text for d in corpus.train]))
    np.save(out / "train_tokens.npy", train_ids)
    heldout = np.asarray(encode_text(tok, corpus.heldout_text()), np.uint16)
    np.save(out / "heldout_tokens.npy", heldout)
    log(f"tokens: {len(train_ids):,} training, {len(heldout):,} held out in {time.time() - t0:.0f} s")


def encode_text(tok, text: str) -> list[int]:
    """Document text as plain text: a literal "<|im_end|>" in a file is not the special token (llama.cpp's
    parse_special = false)."""
    tok.encode_special_tokens = True
    return tok.encode(text, add_special_tokens=False).ids


def encode_documents(tok, texts: list[str], per_batch: int = 1024) -> list[np.ndarray]:
    """Each document's tokens followed by <|endoftext|>, as uint16 arrays."""
    tok.encode_special_tokens = True
    doc_end = tok.token_to_id(tokenizer.DOC_END)
    out = []
    for i in range(0, len(texts), per_batch):
        for e in tok.encode_batch_fast(texts[i: i + per_batch], add_special_tokens=False):
            out.append(np.asarray(e.ids + [doc_end], np.uint16))
    return out


class Windows:
    """The token stream cut into windows of ctx tokens, visited in a seeded permutation per epoch.

    Batch k is windows k*batch .. k*batch + batch - 1 of that sequence, so a resumed run reads what an uninterrupted
    one would have read.
    """

    def __init__(self, tokens: np.ndarray, ctx: int, batch: int, seed: int):
        self.n = len(tokens) // ctx
        if self.n < batch:
            raise SystemExit(f"only {self.n} windows of {ctx} tokens: more text needed")
        self.windows = tokens[: self.n * ctx].reshape(self.n, ctx)
        self.batch, self.seed = batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {e: v for e, v in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def get(self, step: int) -> np.ndarray:
        g = step * self.batch + np.arange(self.batch)
        rows = [self._perm(int(i // self.n))[i % self.n] for i in g]
        return self.windows[rows].astype(np.int64)


# ---- training -----------------------------------------------------------------------------------------------------


def lr_at(p: Preset, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / p.warmup_steps)
    cos = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return p.lr * warm * (p.min_lr_ratio + (1.0 - p.min_lr_ratio) * cos)


def make_optimizer(model, p: Preset, device: str):
    decay = [q for q in model.parameters() if q.ndim >= 2]
    other = [q for q in model.parameters() if q.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": p.weight_decay},
                              {"params": other, "weight_decay": 0.0}],
                             lr=p.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")


def autocast(device: str):
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda")


@torch.no_grad()
def eval_loss(model, windows: np.ndarray, device: str) -> float:
    """Mean cross-entropy over every prediction of the given held-out windows."""
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(windows), 8):
        x = torch.from_numpy(windows[i: i + 8].astype(np.int64)).to(device)
        with autocast(device):
            logits = model(input_ids=x, use_cache=False, output_router_logits=False).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                reduction="sum")
        total += float(nll)
        n += x[:, 1:].numel()
    model.train()
    return total / n


@torch.no_grad()
def perplexity(model, tokens: np.ndarray, ctx: int, device: str, batch: int = 16) -> dict:
    """llama.cpp's perplexity: consecutive chunks of ctx tokens, each from an empty state, the first half unscored.

    In each chunk the logits at positions ctx/2 .. ctx-2 are scored against the tokens at ctx/2+1 .. ctx-1;
    the result is exp(mean negative log-likelihood) over all scored tokens. float32, no autocast.
    """
    model.eval()
    n_chunks = len(tokens) // ctx
    if n_chunks == 0:
        raise SystemExit(f"held-out text has {len(tokens)} tokens, fewer than one chunk of {ctx}")
    chunks = tokens[: n_chunks * ctx].reshape(n_chunks, ctx).astype(np.int64)
    first = ctx // 2
    nll, scored = 0.0, 0
    for i in range(0, n_chunks, batch):
        x = torch.from_numpy(chunks[i: i + batch]).to(device)
        logits = model(input_ids=x, use_cache=False, output_router_logits=False).logits.float()
        pred = logits[:, first: ctx - 1].reshape(-1, logits.shape[-1])
        nll += float(torch.nn.functional.cross_entropy(pred, x[:, first + 1:].reshape(-1), reduction="sum"))
        scored += pred.shape[0]
    model.train()
    return {"ppl": math.exp(nll / scored), "nll": nll / scored, "scored": scored, "chunks": n_chunks, "ctx": ctx,
            "tokens": int(len(tokens))}


@torch.no_grad()
def routing_stats(model, windows: np.ndarray, cfg: dict, device: str) -> dict:
    """Which experts the held-out windows reach, per MoE layer."""
    model.eval()
    x = torch.from_numpy(windows.astype(np.int64)).to(device)
    router_logits = model(input_ids=x, use_cache=False, output_router_logits=True).router_logits
    model.train()
    used, share = [], []
    for layer in router_logits:
        top = torch.topk(layer.float(), cfg["num_experts_per_tok"], dim=-1).indices.reshape(-1)
        counts = torch.bincount(top, minlength=cfg["num_experts"]).cpu().numpy()
        used.append(int((counts > 0).sum()))
        share.append(float(counts.max() / counts.sum()))
    return {"tokens": int(x.numel()), "experts_used": used, "max_share_per_layer": share,
            "experts_used_min": min(used), "experts_used_max": max(used), "max_share": max(share)}


# ---- checkpoints and logs -----------------------------------------------------------------------------------------


def save_checkpoint(path: Path, model, opt, state: dict) -> None:
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "state": state, "rng": rng}, tmp)
    os.replace(tmp, path)


LOG_FIELDS = ["step", "tokens", "lr", "loss", "aux_loss", "grad_norm", "seconds"]


def read_log(path: Path, upto: int) -> list[dict]:
    """Rows of loss.csv with step <= upto (a resumed run rewrites the steps after its checkpoint)."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if int(r["step"]) <= upto]


def write_log(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=LOG_FIELDS)
        w.writeheader()
        w.writerows(rows)


def make_plot(out: Path, rows: list[dict], evals: list[list[float]]) -> dict:
    """loss.png: the training loss as a moving average over 1% of the steps, the held-out evaluations as points."""
    window = max(1, len(rows) // 100)
    loss = np.convolve([float(r["loss"]) for r in rows], np.ones(window) / window, mode="valid")
    series = [plot.Series("training cross-entropy", [int(r["step"]) for r in rows[window - 1:]], loss.tolist(),
                          (31, 119, 180))]
    if evals:
        series.append(plot.Series("held-out cross-entropy", [e[0] for e in evals], [e[1] for e in evals],
                                  (255, 127, 14)))
    renderer = plot.plot(out / "loss.png", series, "step", "loss")
    return {"file": "loss.png", "renderer": renderer, "window": window}


# ---- export -------------------------------------------------------------------------------------------------------


def export_hf(out: Path, model, tok) -> None:
    hf = out / "hf"
    model.save_pretrained(hf, safe_serialization=True)
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(
        json.dumps(tokenizer.hf_tokenizer_config(CHAT_TEMPLATE, model.config.max_position_embeddings), indent=1) + "\n",
        encoding="utf-8")


def export_gguf(out: Path, model, cfg: dict, tok, window: np.ndarray) -> dict:
    """demo.gguf, then its dequantized weights in a fresh model: logits against the trained model's on one window."""
    from transformers import Qwen3NextForCausalLM

    path = out / "demo.gguf"
    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    convert.write_gguf(path, MODEL_ID, cfg, state, FILE_TYPE, vocab=tokenizer.gguf_vocab(tok),
                       general_name=GGUF_NAME)
    size = path.stat().st_size
    if size > MAX_GGUF_BYTES:
        raise SystemExit(f"{path}: {size} bytes, over the {MAX_GGUF_BYTES} allowed for the embedded model")

    back = Qwen3NextForCausalLM(model.config)  # on the host, where load_weights builds its tensors
    weights = convert.gguf_to_hf_state(MODEL_ID, cfg, convert.read_gguf_f32(path))
    oracle.load_weights(back, {k: np.array(v) for k, v in weights.items()}, print)  # writable copies for torch
    back.to(next(model.parameters()).device)
    model.eval()
    back.eval()
    with torch.no_grad():
        x = torch.from_numpy(window[None].astype(np.int64)).to(next(model.parameters()).device)
        a = model(input_ids=x, use_cache=False, output_router_logits=False).logits.float()[0]
        b = back(input_ids=x, use_cache=False, output_router_logits=False).logits.float()[0]
    model.train()
    nmse = float(((a - b) ** 2).sum() / (a**2).sum())
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    return {"file": path.name, "type": FILE_TYPE, "bytes": size, "sha256": sha256_file(path), "nmse": nmse,
            "top1": top1, "positions": int(x.shape[1])}


# ---- the run ------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--preset", choices=list(PRESETS))
    ap.add_argument("--minutes", type=float, help="training time of the whole run (default 15)")
    ap.add_argument("--steps", type=int, help="schedule length in steps (default: the schedule follows --minutes)")
    ap.add_argument("--session-minutes", type=float, help="end this invocation after this long (resume later)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--device", choices=["cuda", "cpu"])
    ap.add_argument("--max-mb", type=float, help="training text cap in MiB (default: the preset's)")
    ap.add_argument("--ckpt-every", type=int, help="steps between checkpoints (default: the preset's)")
    ap.add_argument("--threads", type=int, help="CPU threads for torch")
    return ap.parse_args(argv)


def run_settings(args, saved: dict | None) -> dict:
    """This invocation's settings: the saved run's, where resuming, with --steps/--minutes/--ckpt-every overriding."""
    if saved is None:
        preset = args.preset or "demo"
        run = {"preset": preset, "seed": 0 if args.seed is None else args.seed, "minutes": 15.0, "steps": None,
               "max_mb": args.max_mb or PRESETS[preset].max_mb, "ckpt_every": PRESETS[preset].ckpt_every}
    else:
        run = dict(saved)
        for key in ("preset", "seed", "max_mb"):
            given = getattr(args, key)
            if given is not None and given != run[key]:
                raise SystemExit(f"--{key.replace('_', '-')} {given}: the run in {args.out} has {run[key]}")
    for key in ("minutes", "steps", "ckpt_every"):
        if getattr(args, key) is not None:
            run[key] = getattr(args, key)
    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    ckpt_path = out / "checkpoint.pt"
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    log = tqdm.write
    session_start = time.perf_counter()

    saved = None
    if args.resume:
        if not ckpt_path.exists():
            raise SystemExit(f"{ckpt_path}: no checkpoint to resume")
        saved = torch.load(ckpt_path, map_location=device, weights_only=True)
    elif ckpt_path.exists():
        raise SystemExit(f"{out} holds a run: pass --resume to continue it, or another --out")
    run = run_settings(args, saved["state"]["run"] if saved else None)
    p = PRESETS[run["preset"]]
    out.mkdir(parents=True, exist_ok=True)
    if saved is None:
        prepare(out, p, run["max_mb"], run["seed"], log)

    tok = tokenizer.load(out / "tokenizer.json")
    train_tokens = np.load(out / "train_tokens.npy")
    heldout_tokens = np.load(out / "heldout_tokens.npy")
    batches = Windows(train_tokens, p.ctx, p.batch, run["seed"])
    n_eval = min(p.eval_windows, len(heldout_tokens) // p.ctx)
    eval_windows = heldout_tokens[: n_eval * p.ctx].reshape(n_eval, p.ctx)

    from transformers import Qwen3NextForCausalLM

    cfg = model_config(p)
    torch.manual_seed(run["seed"])
    model = Qwen3NextForCausalLM(hf_config(cfg, tok, p.aux_loss_coef)).to(device)
    model.train()
    opt = make_optimizer(model, p, device)
    n_params, n_active = count_params(model, cfg)
    log(f"model: {n_params:,} parameters ({n_active:,} active per token), {device}, "
        f"experts {model.config._experts_implementation}, attention {model.config._attn_implementation}")

    state = {"step": 0, "tokens_seen": 0, "train_seconds": 0.0, "evals": [], "run": run}
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state = {**saved["state"], "run": run}
        torch.set_rng_state(saved["rng"]["torch"].cpu())
        if "cuda" in saved["rng"] and device == "cuda":
            torch.cuda.set_rng_state_all([s.cpu() for s in saved["rng"]["cuda"]])
        log(f"resumed at step {state['step']} ({state['train_seconds'] / 60:.1f} min trained)")
    rows = read_log(out / "loss.csv", state["step"])
    torch.set_float32_matmul_precision("high")  # TF32 where the GPU has it, while training

    budget = run["minutes"] * 60.0
    steps = run["steps"]

    def finished() -> bool:
        return (steps is not None and state["step"] >= steps) or state["train_seconds"] >= budget

    def progress() -> float:
        return state["step"] / steps if steps is not None else state["train_seconds"] / budget

    bar = tqdm(total=steps if steps is not None else int(budget), initial=state["step"] if steps else
               int(state["train_seconds"]), unit="step" if steps else "s", mininterval=1 if sys.stderr.isatty() else 30,
               dynamic_ncols=True)
    pending: list[tuple] = []
    stopped_early = False

    def flush() -> None:
        if not pending:
            return
        values = torch.stack([torch.stack([c, a, g]) for _, _, c, a, g, _ in pending]).float().cpu().tolist()
        for (step, lr, _, _, _, secs), (ce, aux, gn) in zip(pending, values):
            rows.append({"step": step, "tokens": step * p.batch * p.ctx, "lr": f"{lr:.6g}", "loss": f"{ce:.5f}",
                         "aux_loss": f"{aux:.5f}", "grad_norm": f"{gn:.4f}", "seconds": f"{secs:.2f}"})
        pending.clear()
        bar.set_postfix(loss=rows[-1]["loss"], lr=rows[-1]["lr"], refresh=False)

    while not finished():
        if args.session_minutes is not None and time.perf_counter() - session_start >= args.session_minutes * 60:
            stopped_early = True
            break
        t0 = time.perf_counter()
        lr = lr_at(p, state["step"], progress())
        for group in opt.param_groups:
            group["lr"] = lr
        x = torch.from_numpy(batches.get(state["step"])).to(device, non_blocking=True)
        with autocast(device):
            out_ = model(input_ids=x, labels=x, use_cache=False, output_router_logits=True)
        out_.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens_seen"] = state["step"] * p.batch * p.ctx
        aux = out_.aux_loss.detach().float()
        ce = out_.loss.detach().float() - p.aux_loss_coef * aux
        pending.append((state["step"], lr, ce, aux, grad_norm.detach().float(),
                        state["train_seconds"] + time.perf_counter() - t0))
        if len(pending) >= 10:
            flush()
        if state["step"] % p.eval_every == 0:
            flush()
            loss = eval_loss(model, eval_windows, device)
            state["evals"].append([state["step"], loss])
            log(f"step {state['step']}: training loss {rows[-1]['loss']}, held-out {loss:.4f}")
        if state["step"] % run["ckpt_every"] == 0:
            flush()
            save_checkpoint(ckpt_path, model, opt, state)
            write_log(out / "loss.csv", rows)
        dt = time.perf_counter() - t0  # evaluations and checkpoints count as training time
        state["train_seconds"] += dt
        bar.update(1 if steps else dt)
    flush()
    bar.close()
    if not stopped_early and rows and (not state["evals"] or state["evals"][-1][0] != state["step"]):
        state["evals"].append([state["step"], eval_loss(model, eval_windows, device)])  # the last step's
    save_checkpoint(ckpt_path, model, opt, state)
    write_log(out / "loss.csv", rows)
    plot_info = make_plot(out, rows, state["evals"]) if rows else {"file": None, "renderer": None, "window": 0}
    if stopped_early:
        log(f"session time up at step {state['step']}: continue with --resume")
        return 0

    log(f"training done: {state['step']} steps, {state['tokens_seen']:,} tokens, "
        f"{state['train_seconds'] / 60:.1f} min")
    torch.set_float32_matmul_precision("highest")
    ppl = perplexity(model, heldout_tokens, p.ctx, device)
    log(f"held-out perplexity {ppl['ppl']:.3f} over {ppl['scored']:,} tokens")
    routing = routing_stats(model, eval_windows[:8], cfg, device)
    export_hf(out, model, tok)
    gguf_info = export_gguf(out, model, cfg, tok, eval_windows[0])
    log(f"{gguf_info['file']}: {gguf_info['bytes']:,} bytes, logits NMSE {gguf_info['nmse']:.2e} against the model")

    recipe = json.loads((out / "data.json").read_text(encoding="utf-8"))
    recipe["tokens"] = {"train": int(len(train_tokens)), "heldout": int(len(heldout_tokens))}
    last = rows[-min(len(rows), 50):]
    summary = {
        "name": GGUF_NAME,
        "model": {"params": n_params, "params_active": n_active, "config": cfg,
                  "layer_pattern": ["GDN" if t == "linear_attention" else "attention"
                                    for t in models.layer_types(cfg)]},
        "data": recipe,
        "tokenizer": {"merges": len(tokenizer.gguf_vocab(tok).merges), "special": len(tokenizer.SPECIAL_TOKENS),
                      "trained_on_mib": p.tokenizer_mb},
        "training": {
            "preset": run["preset"], **asdict(p), "seed": run["seed"], "steps": state["step"],
            "tokens_seen": state["tokens_seen"], "epochs": state["tokens_seen"] / (batches.n * p.ctx),
            "train_seconds": state["train_seconds"],
            "device": torch.cuda.get_device_name() if device == "cuda" else "CPU",
            "final_loss": sum(float(r["loss"]) for r in last) / len(last), "final_loss_steps": len(last),
            "final_aux_loss": sum(float(r["aux_loss"]) for r in last) / len(last),
            "schedule": f"{steps} steps" if steps is not None else f"{run['minutes']:g} min of training time",
            "precision": "bf16 autocast, float32 weights and optimiser state" if device == "cuda" else "float32",
            "evals": state["evals"],
        },
        "perplexity": ppl,
        "routing": routing,
        "gguf": gguf_info,
        "plot": plot_info,
        "software": software(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "MODEL_CARD.md").write_text(card.render(summary), encoding="utf-8")
    log(f"wrote {out / 'MODEL_CARD.md'}")
    return 0


def software() -> str:
    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "(version unknown)"

    names = ("torch", "transformers", "tokenizers", "gguf")
    return ", ".join(f"{n} {version(n)}" for n in names) + f", python {sys.version.split()[0]}"


if __name__ == "__main__":
    sys.exit(main())
