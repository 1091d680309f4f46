"""Trains the demo model's MTP block (Qwen3-Next's one-block head for the token after next) on the frozen trunk of a
finished demo GGUF, and writes the GGUF again with the block appended.

    python -m tools.demo.mtp --gguf models/demo/demo.gguf --dir models/demo --out DIR [--minutes 4] [--steps N]
                             [--device cuda|cpu] [--max-mb 48] [--batch 32] [--ctx 1024] [--seed 0] [--card CARD]
    python -m tools.demo.mtp --card models/demo/MODEL_CARD.md --result DIR/mtp.json    # the card's MTP section only

The block, as Qwen3-Next's released checkpoints (`mtp.*`) and llama.cpp's draft graph for qwen3next define it: for
position t, the token embedding of x[t+1] and the trunk's last hidden state h[t] (after the trunk's output norm) are
each RMS-normed (nextn.enorm, nextn.hnorm), joined as [embedding, hidden] and projected back to the hidden size
(nextn.eh_proj); then one decoder layer of the trunk's attention-layer shape (gated attention over the block's own
earlier positions, routed experts with top-k and the gated shared expert); the block's output norm
(nextn.shared_head_norm); the trunk's LM head. Its logits at t are for x[t+2].

The trunk is the file's dequantized weights, frozen, so every tensor of the trunk in the new file is the input file's
bytes (checked). Training reads windows of the training split that tools/demo/data.py gathers (the first --max-mb MiB
of its seeded order; held-out files never): AdamW, warmup then cosine over --minutes of training time (or --steps),
bf16 autocast on CUDA, the cross-entropy of x[t+2] plus the block router's load-balancing loss x 0.01 as the trunk was
trained.

Evaluated on held-out windows, every position with a token two ahead:
- `accuracy`: the block's top-1 against the text's x[t+2] (the trunk's own top-1 against x[t+1] beside it);
- `agreement`: the block's top-1 against the trunk's top-1 at t+1 (a greedy speculative decoder that drafts one
  token with the block accepts it exactly when they agree);
- `acceptance`: that agreement over the positions where the trunk's own top-1 at t is the text's x[t+1], i.e. where
  the block's input is the token a greedy decoder would have fed it (the rest of the context is the text's).

A run saves the trained block as OUT/mtp_block.pt (float32 state, loss rows, figures); --from-block FILE exports
such a block again without training (on any machine: the export needs no GPU).

Writes DIR/demo.gguf (the input's metadata with block_count + 1 and nextn_predict_layers 1, its tensors, the block's
as the converter types them: matrices Q8_0, norms and the routers F32), checked by loading the block's dequantized
weights back and comparing its logits with the trained block's; DIR/mtp.json (recipe, steps, losses, figures) and
DIR/mtp_loss.csv, DIR/mtp_loss.png.
"""
from __future__ import annotations

import argparse
import copy
import csv
import importlib.metadata as md
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from tools.golden import convert, models, oracle
from tools.golden.manifest import sha256_file

from . import card, data, plot, tokenizer, train

AUX_COEF = 0.01


class Mtp(torch.nn.Module):
    """Qwen3-Next's MTP block over transformers' own decoder layer (layer index n_layer, a full-attention layer)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRMSNorm

        n = config.num_hidden_layers
        c = copy.deepcopy(config)
        c.num_hidden_layers = n + 1
        c.layer_types = list(config.layer_types) + ["full_attention"]
        c._attn_implementation = "sdpa"  # causal from is_causal with no mask (eager would need one)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(h, eps=eps)
        self.layers = torch.nn.ModuleList([Qwen3NextDecoderLayer(c, n)])
        self.norm = Qwen3NextRMSNorm(h, eps=eps)
        self.std = config.initializer_range

    def init_weights(self, seed: int) -> None:
        """Matrices and experts N(0, initializer_range), norms zero (Qwen3-Next's norms scale by 1 + w)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or "norm_" in name:
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * self.std)

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)
        x = out[0] if isinstance(out, tuple) else out
        return self.norm(x)


class RouterLogits:
    """The block router's logits of the last forward (a hook on the layer's router)."""

    def __init__(self, mtp: Mtp):
        self.value = None
        mtp.layers[0].mlp.gate.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        self.value = out[0] if isinstance(out, tuple) else out


def load_balancing(router_logits: torch.Tensor, n_experts: int, top_k: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss for one layer: n_experts * sum_e (share of picks of e) * (mean prob of e)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top = torch.topk(probs, top_k, dim=-1).indices
    picks = torch.nn.functional.one_hot(top, n_experts).float().sum(dim=1).mean(dim=0) / top_k
    return n_experts * (picks * probs.mean(dim=0)).sum()


class Heads:
    """The frozen trunk: its last hidden states, logits, embeddings and rotary embeddings."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def trunk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.model.model(input_ids=x, use_cache=False).last_hidden_state
        return h, self.model.lm_head(h)

    def rope(self, like: torch.Tensor, positions: torch.Tensor):
        return self.model.model.rotary_emb(like, positions)

    def mtp_logits(self, mtp: Mtp, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The block's logits at t = 0 .. T-2 (for x[t+2]), from x[t+1] and h[t]; positions 1 .. T-1."""
        emb = self.model.model.embed_tokens(x[:, 1:])
        pos = torch.arange(1, x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        return self.model.lm_head(mtp(emb, h[:, :-1], self.rope(emb, pos)))


def load_trunk(gguf_path: Path, summary: dict, tok, device: str):
    from transformers import Qwen3NextForCausalLM

    cfg = summary["model"]["config"]
    model = Qwen3NextForCausalLM(train.hf_config(cfg, tok, summary["training"]["aux_loss_coef"]))
    tensors = {k: v for k, v in convert.read_gguf_f32(gguf_path).items()
               if not k.startswith(f"blk.{cfg['num_hidden_layers']}.")}
    oracle.load_weights(model, {k: np.array(v) for k, v in convert.gguf_to_hf_state(train.MODEL_ID, cfg, tensors)
                                .items()}, lambda *a: None)
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, cfg


@torch.no_grad()
def evaluate(heads: Heads, mtp: Mtp, windows: np.ndarray, device: str) -> dict:
    mtp.eval()
    n = hit_text = hit_trunk = trunk_ok = fed = accepted = 0
    nll = 0.0
    for i in range(0, len(windows), 8):
        x = torch.from_numpy(windows[i: i + 8].astype(np.int64)).to(device)
        with train.autocast(device):
            h, logits = heads.trunk(x)
            m = heads.mtp_logits(mtp, x, h)
        m, logits = m.float(), logits.float()
        target = x[:, 2:]
        draft = m[:, :-1].argmax(-1)  # positions 0 .. T-3: for x[2 .. T-1]
        greedy = logits[:, 1:-1].argmax(-1)  # the trunk's top-1 at t+1 = 1 .. T-2
        ok = greedy == target
        input_ok = logits[:, :-2].argmax(-1) == x[:, 1:-1]  # its top-1 at t is the block's input x[t+1]
        nll += float(torch.nn.functional.cross_entropy(m[:, :-1].reshape(-1, m.shape[-1]), target.reshape(-1),
                                                       reduction="sum"))
        n += target.numel()
        hit_text += int((draft == target).sum())
        hit_trunk += int((draft == greedy).sum())
        trunk_ok += int(ok.sum())
        fed += int(input_ok.sum())
        accepted += int(((draft == greedy) & input_ok).sum())
    mtp.train()
    return {"positions": n, "loss": nll / n, "accuracy": hit_text / n, "trunk_accuracy": trunk_ok / n,
            "agreement": hit_trunk / n, "acceptance": accepted / max(fed, 1), "acceptance_positions": fed}


def hf_state(mtp: Mtp) -> dict[str, np.ndarray]:
    """The block's tensors under the released checkpoints' names (mtp.*), float32."""
    return {f"mtp.{k}": v.detach().float().cpu().numpy() for k, v in mtp.state_dict().items()}


def copy_metadata(reader, writer, block_count: int) -> None:
    """Every key of the input but the writer's own and block_count, then block_count and nextn_predict_layers."""
    import gguf

    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    skip = {"general.architecture", f"{arch}.block_count", f"{arch}.nextn_predict_layers"}
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in skip:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, f.contents(), vtype, sub_type=sub)
    writer.add_block_count(block_count)
    writer.add_nextn_predict_layers(1)


def write_gguf(src: Path, dst: Path, cfg: dict, mtp: Mtp) -> dict:
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = models.ARCH_OF[train.MODEL_ID]
    writer = gguf.GGUFWriter(str(dst), arch)
    copy_metadata(reader, writer, cfg["num_hidden_layers"] + 1)
    block = convert.hf_to_gguf_tensors(train.MODEL_ID, cfg, hf_state(mtp))
    old = {t.name: t for t in reader.tensors}
    clash = sorted(set(old) & set(block))
    if clash:
        raise SystemExit(f"{src}: already has {clash[0]} (an MTP block?)")
    for name in convert.tensor_order(list(old) + list(block)):
        if name in old:
            t = old[name]
            writer.add_tensor(name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        convert.add_typed_tensor(writer, name, block[name], train.FILE_TYPE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    back = gguf.GGUFReader(str(dst))
    got = {t.name: t for t in back.tensors}
    for name, t in old.items():  # the trunk, byte for byte
        if name not in got or got[name].tensor_type != t.tensor_type or not np.array_equal(
                np.asarray(got[name].data).view(np.uint8), np.asarray(t.data).view(np.uint8)):
            raise SystemExit(f"{dst}: {name} differs from {src}")
    return {"block_tensors": sorted(block), "bytes": dst.stat().st_size}


def reload_block(dst: Path, cfg: dict, config) -> Mtp:
    """The block from the written file's dequantized tensors."""
    n = cfg["num_hidden_layers"]
    tensors = {k: v for k, v in convert.read_gguf_f32(dst).items() if k.startswith(f"blk.{n}.")}
    hf = convert.gguf_to_hf_state(train.MODEL_ID, cfg, tensors, fused_experts=None)
    mtp = Mtp(config)
    oracle.load_weights(mtp, {k[len("mtp."):]: np.array(v) for k, v in hf.items()}, lambda *a: None)
    return mtp


def train_block(args, heads: Heads, mtp: Mtp, cfg: dict, batches, eval_windows: np.ndarray, device: str, log) -> dict:
    """Trains the block in place; the loss rows, the step count and the held-out figures before and after."""
    routers = RouterLogits(mtp)
    decay = [q for q in mtp.parameters() if q.ndim >= 2]
    other = [q for q in mtp.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")
    before = evaluate(heads, mtp, eval_windows, device)
    log(f"untrained block: held-out loss {before['loss']:.3f}")
    budget = args.minutes * 60.0
    rows: list[dict] = []
    step, seconds = 0, 0.0
    bar = tqdm(total=args.steps or int(budget), unit="step" if args.steps else "s",
               mininterval=1 if sys.stderr.isatty() else 30, dynamic_ncols=True)
    n_exp, top_k = cfg["num_experts"], cfg["num_experts_per_tok"]
    while (args.steps is None or step < args.steps) and seconds < budget:
        t = time.perf_counter()
        progress = step / args.steps if args.steps else seconds / budget
        cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * cos)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = torch.from_numpy(batches.get(step)).to(device, non_blocking=True)
        with train.autocast(device):
            h, _ = heads.trunk(x)
            m = heads.mtp_logits(mtp, x, h)
            ce = torch.nn.functional.cross_entropy(m[:, :-1].float().reshape(-1, m.shape[-1]), x[:, 2:].reshape(-1))
            aux = load_balancing(routers.value, n_exp, top_k)
            loss = ce + AUX_COEF * aux
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        dt = time.perf_counter() - t
        seconds += dt
        if step % 10 == 0 or step == 1:
            rows.append({"step": step, "lr": f"{lr:.6g}", "loss": f"{float(ce.detach()):.5f}",
                         "aux_loss": f"{float(aux.detach()):.5f}", "grad_norm": f"{float(gn):.4f}",
                         "seconds": f"{seconds:.2f}"})
            bar.set_postfix(loss=rows[-1]["loss"], refresh=False)
        bar.update(1 if args.steps else dt)
    bar.close()
    after = evaluate(heads, mtp, eval_windows, device)
    log(f"trained {step} steps in {seconds / 60:.1f} min: held-out loss {after['loss']:.3f}, accuracy "
        f"{after['accuracy']:.3f}, agreement with the trunk {after['agreement']:.3f}")
    return {"rows": rows, "untrained": before, "trained": after,
            "training": {"steps": step, "batch": args.batch, "ctx": args.ctx, "tokens": step * args.batch * args.ctx,
                         "seconds": seconds, "lr": args.lr, "warmup": args.warmup, "aux_loss_coef": AUX_COEF,
                         "seed": args.seed, "device": torch.cuda.get_device_name() if device == "cuda" else "CPU",
                         "final_loss": float(np.mean([float(r["loss"]) for r in rows[-5:]])),
                         "software": {n: md.version(n) for n in ("torch", "transformers", "tokenizers")}}}


def fill_card(path: Path, result: dict) -> None:
    path.write_text(card.fill_section(path.read_text(encoding="utf-8"), "mtp", card.mtp_section(result)),
                    encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, help="the trained demo GGUF (no MTP block)")
    ap.add_argument("--dir", type=Path, help="its summary.json and tokenizer.json")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--card", type=Path, help="a model card whose MTP section the result fills")
    ap.add_argument("--result", type=Path, help="with --card and nothing else: fill it from this mtp.json")
    ap.add_argument("--from-block", type=Path, help="a trained block (OUT/mtp_block.pt of a run): export only")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--device")
    ap.add_argument("--max-mb", type=float, default=48.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args(argv)
    if args.result:
        if not args.card:
            ap.error("--result fills a card: give --card")
        fill_card(args.card, json.loads(args.result.read_text(encoding="utf-8")))
        return 0
    if not (args.gguf and args.dir and args.out):
        ap.error("--gguf, --dir and --out are needed to train or export a block")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    log = tqdm.write
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    summary = json.loads((args.dir / "summary.json").read_text(encoding="utf-8"))
    tok = tokenizer.load(args.dir / "tokenizer.json")
    t0 = time.time()
    corpus = data.gather(args.max_mb, int(summary["data"].get("seed", 0)))
    train_ids = np.concatenate(train.encode_documents(tok, [d.text for d in corpus.train]))
    held = np.asarray(train.encode_text(tok, corpus.heldout_text()), np.uint16)
    n_eval = min(args.eval_windows, len(held) // args.ctx)
    if n_eval == 0:
        raise SystemExit("no held-out window: raise --max-mb")
    eval_windows = held[: n_eval * args.ctx].reshape(n_eval, args.ctx)
    log(f"data: {len(corpus.train)} training files, {len(train_ids):,} tokens; {n_eval} held-out windows "
        f"({time.time() - t0:.0f} s)")

    model, cfg = load_trunk(args.gguf, summary, tok, device)
    heads = Heads(model)
    mtp = Mtp(model.config)
    n_params = sum(p.numel() for p in mtp.parameters())
    log(f"MTP block: {n_params:,} parameters")
    torch.set_float32_matmul_precision("high")
    if args.from_block:
        run = torch.load(args.from_block, map_location="cpu", weights_only=True)
        mtp.load_state_dict(run.pop("state"))
        mtp.to(device)
        run["trained"] = {**evaluate(heads, mtp, eval_windows, device), "device": device}
        log(f"the block: held-out loss {run['trained']['loss']:.3f}, acceptance {run['trained']['acceptance']:.3f}")
    else:
        mtp.init_weights(args.seed)
        mtp.to(device).train()
        batches = train.Windows(train_ids, args.ctx, args.batch, args.seed)
        run = train_block(args, heads, mtp, cfg, batches, eval_windows, device, log)
        run["data"] = {"max_mb": args.max_mb, "train_files": len(corpus.train), "train_tokens": int(len(train_ids)),
                       "eval_windows": n_eval, "ctx": args.ctx, "python": sys.version.split()[0]}
        torch.save({"state": {k: v.detach().float().cpu() for k, v in mtp.state_dict().items()}, **run},
                   args.out / "mtp_block.pt")
    rows = run["rows"]
    with open(args.out / "mtp_loss.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    renderer = plot.plot(args.out / "mtp_loss.png",
                         [plot.Series("MTP cross-entropy (x[t+2])", [r["step"] for r in rows],
                                      [float(r["loss"]) for r in rows], (31, 119, 180))], "step", "loss")

    dst = args.out / "demo.gguf"
    written = write_gguf(args.gguf, dst, cfg, copy.deepcopy(mtp).float().cpu())
    if written["bytes"] > train.MAX_GGUF_BYTES:
        raise SystemExit(f"{dst}: {written['bytes']} bytes, over the {train.MAX_GGUF_BYTES} allowed")
    back = reload_block(dst, cfg, model.config).to(device)
    with torch.no_grad():
        x = torch.from_numpy(eval_windows[:1].astype(np.int64)).to(device)
        h, _ = heads.trunk(x)
        a = heads.mtp_logits(mtp.eval(), x, h).float()[0]
        b = heads.mtp_logits(back.eval(), x, h).float()[0]
    nmse = float(((a - b) ** 2).sum() / (a ** 2).sum())
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    reloaded = evaluate(heads, back, eval_windows, device)
    log(f"{dst}: {written['bytes']:,} bytes; the block from the file: logits NMSE {nmse:.2e}, top-1 {top1:.4f}; "
        f"agreement {reloaded['agreement']:.3f} on {device}")

    here = {"max_mb": args.max_mb, "train_files": len(corpus.train), "train_tokens": int(len(train_ids)),
            "eval_windows": n_eval, "ctx": args.ctx, "python": sys.version.split()[0]}
    result = {
        "source": {"gguf": str(args.gguf), "sha256": sha256_file(args.gguf)},
        "block": {"params": n_params, "layer": cfg["num_hidden_layers"], "tensors": written["block_tensors"]},
        # the text the block was trained on; with --from-block the held-out windows of this machine's installation
        "data": run.get("data", here), "eval_data": here,
        "training": run["training"], "untrained": run["untrained"], "trained": run["trained"],
        "from_file": {**reloaded, "device": device},
        "gguf": {"file": dst.name, "bytes": written["bytes"], "sha256": sha256_file(dst), "nmse": nmse, "top1": top1,
                 "gguf_package": md.version("gguf")},
        "plot": {"file": "mtp_loss.png", "renderer": renderer},
    }
    (args.out / "mtp.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    log(f"wrote {args.out / 'mtp.json'}")
    if args.card:
        fill_card(args.card, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
