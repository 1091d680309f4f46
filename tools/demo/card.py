"""The demo model's card (MODEL_CARD.md), rendered from the run's summary.json, and the sections other tools fill in.

Sections that later tools fill sit between `<!-- BEGIN key -->` and `<!-- END key -->` lines; `fill_section`
replaces what is between them and leaves the rest of the card as it was.
"""
from __future__ import annotations

import re

PLACEHOLDERS = {
    "strata-perplexity": ("Strata perplexity (CPU/CUDA)",
                          "the engine's perplexity over heldout.txt with the same chunking as below, per device and "
                          "file type, beside the transformers figure."),
    "routing-trace": ("Routing-trace cache figures",
                      "expert-cache hit rates and bytes moved from a routing trace of the engine on heldout.txt."),
    "mtp": ("MTP block", "the next-next-token block trained on the frozen trunk (tools/demo/mtp.py), its held-out "
                         "figures, and the file with the block appended."),
}
# Sections written by hand once a run is done (filled with fill_section too).
BY_HAND = {
    "use": ("Using it", "what the model writes through `strata run`, and whether llama.cpp reads the file as Strata "
                        "does."),
}


def fill_section(card: str, key: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN {re.escape(key)} -->\n).*?(<!-- END {re.escape(key)} -->)", re.S)
    if not pattern.search(card):
        raise KeyError(f"the card has no section {key!r}")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), card, count=1)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def render(s: dict) -> str:
    m, d, t, e, g = s["model"], s["data"], s["training"], s["perplexity"], s["gguf"]
    r = s["routing"]
    cfg = m["config"]
    window = s["plot"]["window"]
    smoothing = f", moving average over {window} steps" if window > 1 else ""
    lines = [
        f"# {s['name']}",
        "",
        "A small model of the Qwen3-Next architecture (Gated DeltaNet and gated attention layers, 3:1, every layer a "
        "mixture of experts with a shared expert), trained from scratch on Python sources and documentation so that "
        "the engine has a real model to demonstrate with. It writes Python-looking text; it is not an assistant.",
        "",
        "## Model",
        "",
        "| | |",
        "|---|---|",
        f"| parameters | {m['params']:,} ({m['params_active']:,} active per token) |",
        f"| layers | {cfg['num_hidden_layers']}: {', '.join(m['layer_pattern'])} |",
        f"| hidden / vocabulary | {cfg['hidden_size']} / {cfg['vocab_size']} |",
        f"| gated attention | {cfg['num_attention_heads']} q / {cfg['num_key_value_heads']} kv heads x "
        f"{cfg['head_dim']}, partial rotary {cfg['partial_rotary_factor']} (theta {cfg['rope_theta']:g}) |",
        f"| Gated DeltaNet | {cfg['linear_num_key_heads']} k / {cfg['linear_num_value_heads']} v heads x "
        f"{cfg['linear_key_head_dim']}, conv {cfg['linear_conv_kernel_dim']} |",
        f"| experts | {cfg['num_experts']} routed x {cfg['moe_intermediate_size']}, top-{cfg['num_experts_per_tok']} "
        f"(renormalised), + shared expert {cfg['shared_expert_intermediate_size']} |",
        f"| training context | {t['ctx']} tokens (file context_length {cfg['max_position_embeddings']}) |",
        "",
        "## Data",
        "",
        f"{d['what']} of the Python {d['python']} that trained it (tools/demo/data.py; recipe in `data.json`):",
        "",
    ]
    for root in d["roots"]:
        lines.append(f"- `{root['label']}` ({root['path']}): {root.get('files', 0)} files, "
                     f"{_mib(root.get('bytes', 0))}")
    lines += [
        "",
        f"Extensions {', '.join(d['extensions'])}; files over {d['max_file_bytes'] // 1024} KiB, non-UTF-8, empty or "
        f"duplicate files skipped ({d['skipped']}); files taken in a seeded order up to {d['max_mb']:g} MiB"
        f"{' (the cap was reached)' if d['capped'] else ' (every file fitted)'}. Held out by name hash "
        f"({d['heldout_rule']}): {d['files']['heldout']} files, {_mib(d['bytes']['heldout'])}, sha256 "
        f"`{d['sha256']['heldout']}` (`heldout.txt`, files joined by a blank line). Training: {d['files']['train']} "
        f"files, {_mib(d['bytes']['train'])}, {d['tokens']['train']:,} tokens, sha256 `{d['sha256']['train']}`.",
        "",
        f"Tokenizer (`tokenizer.json`): byte-level BPE, {cfg['vocab_size']} tokens (256 bytes, "
        f"{s['tokenizer']['merges']} merges, {s['tokenizer']['special']} special tokens), learnt with the "
        f"`tokenizers` library from the first {s['tokenizer']['trained_on_mib']:g} MiB of the training files, "
        "qwen2 pre-tokenizer split. Document text is encoded without special-token parsing; `<|endoftext|>` "
        "separates the training files.",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| steps | {t['steps']:,} x {t['batch']} sequences x {t['ctx']} tokens |",
        f"| tokens seen | {t['tokens_seen']:,} ({t['epochs']:.2f} epochs) |",
        f"| time | {t['train_seconds'] / 60:.1f} min of training on {t['device']} |",
        f"| final train loss | {t['final_loss']:.4f} (cross-entropy, mean of the last {t['final_loss_steps']} steps; "
        f"router load-balancing loss {t['final_aux_loss']:.4f}) |",
        f"| optimiser | AdamW (betas 0.9/0.95, weight decay {t['weight_decay']} on matrices), peak lr {t['lr']:g}, "
        f"{t['warmup_steps']} warmup steps, cosine to {t['min_lr_ratio']:g} x peak over {t['schedule']}, "
        f"gradient clipping {t['grad_clip']} |",
        f"| precision | {t['precision']} |",
        f"| router | auxiliary load-balancing loss x {t['aux_loss_coef']} (transformers' output_router_logits) |",
        f"| seed | {t['seed']} |",
        f"| software | {s['software']} |",
        "",
        f"Loss per step: `loss.csv`; plot: `{s['plot']['file']}` (x: step, y: loss; blue: training cross-entropy"
        f"{smoothing}; orange: held-out cross-entropy on the first "
        f"{t['eval_windows']} held-out windows, every {t['eval_every']} steps).",
        "",
        "## Held-out perplexity (transformers)",
        "",
        f"**{e['ppl']:.3f}** over {e['scored']:,} scored tokens ({e['chunks']} chunks).",
        "",
        f"How: `heldout.txt` is tokenized as one text (no BOS, special tokens not parsed), {e['tokens']:,} tokens, "
        f"and cut into {e['chunks']} consecutive chunks of {e['ctx']} tokens (the remainder dropped). Each chunk is "
        f"one forward pass from an empty state; in every chunk the first {e['ctx'] // 2} predictions are not "
        f"scored and the next {e['ctx'] - 1 - e['ctx'] // 2} are (the logits at positions "
        f"{e['ctx'] // 2}..{e['ctx'] - 2} "
        f"against the tokens at {e['ctx'] // 2 + 1}..{e['ctx'] - 1}), as llama.cpp's perplexity tool does with "
        f"`-c {e['ctx']}`. Perplexity = exp(mean negative log-likelihood over the scored tokens), computed in float32 "
        "by transformers' Qwen3NextForCausalLM with the weights in `hf/`.",
        "",
        "## Routing",
        "",
        f"On {r['tokens']:,} held-out tokens every layer uses {r['experts_used_min']}-{r['experts_used_max']} of its "
        f"{cfg['num_experts']} experts; the busiest expert of any layer takes {100 * r['max_share']:.1f}% of that "
        f"layer's assignments (uniform: {100 / cfg['num_experts']:.1f}%).",
        "",
        "## Files",
        "",
        f"- `demo.gguf` as training wrote it (the trunk; the MTP section below says what the committed file adds): "
        f"{g['type']} (routers, norms, conv and SSM vectors F32), {g['bytes']:,} bytes, sha256 "
        f"`{g['sha256']}`; written by tools/golden/convert.py. Its dequantized weights loaded back into "
        f"transformers give logits with NMSE {g['nmse']:.2e} and top-1 agreement {100 * g['top1']:.1f}% against the "
        f"trained model ({g['positions']} held-out positions).",
        "- `data.json`, `tokenizer.json`, `loss.csv`, `loss.png`, `summary.json`.",
        "- In the training run's folder only (not kept with the model: large, or text of other projects): `hf/` (the "
        "transformers checkpoint), `checkpoint.pt` (model, optimiser, step and RNG state for `--resume`), "
        "`heldout.txt` (`python -m tools.demo.data` rebuilds it on a machine with the same Python installation; "
        "its sha256 is above).",
        "",
    ]
    for key, (title, what) in PLACEHOLDERS.items():
        lines += [f"## {title}", "", f"<!-- BEGIN {key} -->", f"_Not measured yet: {what}_", f"<!-- END {key} -->",
                  ""]
    for key, (title, what) in BY_HAND.items():
        lines += [f"## {title}", "", f"<!-- BEGIN {key} -->", f"_To be written by hand: {what}_",
                  f"<!-- END {key} -->", ""]
    return "\n".join(lines)


def mtp_section(r: dict) -> str:
    """The MTP section from tools/demo/mtp.py's mtp.json."""
    t, d, tr, u, g = r["training"], r["data"], r["trained"], r["untrained"], r["gguf"]
    lines = [
        f"A Qwen3-Next MTP block (block {r['block']['layer']} of the file, `qwen3next.nextn_predict_layers` 1; "
        f"{r['block']['params']:,} parameters) trained on the frozen trunk by tools/demo/mtp.py: for position t, the "
        "embedding of x[t+1] and the trunk's last hidden state at t (after its output norm), each RMS-normed, joined "
        "and projected back to the hidden size; one gated-attention layer with the trunk's routed experts (top-k) and "
        "shared expert; the block's own norm; the trunk's LM head: the logits for x[t+2] (llama.cpp's qwen3next draft "
        "graph reads the block this way).",
        "",
        f"Training: {t['steps']:,} steps x {t['batch']} windows x {t['ctx']} tokens ({t['tokens']:,} tokens) in "
        f"{t['seconds'] / 60:.1f} min on {t['device']}, AdamW (lr {t['lr']:g}, {t['warmup']} warmup steps, cosine to "
        f"0.1 x), bf16 autocast, the cross-entropy of x[t+2] plus the router's load-balancing loss x "
        f"{t['aux_loss_coef']:g}; text: the first {d['max_mb']:g} MiB of the training split's seeded order "
        f"({d['train_files']:,} files, {d['train_tokens']:,} tokens); final training loss {t['final_loss']:.3f} "
        "(`mtp_loss.csv`, `mtp_loss.png`).",
        "",
        f"Held-out ({d['eval_windows']} windows of {d['ctx']} tokens, {tr['positions']:,} positions, teacher-forced):",
        "",
        "| | untrained | trained |",
        "|---|---|---|",
        f"| cross-entropy of x[t+2] | {u['loss']:.3f} | {tr['loss']:.3f} |",
        f"| top-1 is the text's x[t+2] | {100 * u['accuracy']:.1f}% | {100 * tr['accuracy']:.1f}% "
        f"(the trunk's own top-1 one step later: {100 * tr['trunk_accuracy']:.1f}%) |",
        f"| top-1 is the trunk's top-1 at t+1 (a greedy one-token draft accepted) | {100 * u['agreement']:.1f}% | "
        f"**{100 * tr['agreement']:.1f}%** |",
    ]
    if "acceptance" in tr:
        lines.append(f"| the same where the trunk's top-1 at t is the text's x[t+1] (the block fed what greedy "
                     f"decoding feeds it) | - | **{100 * tr['acceptance']:.1f}%** |")
    if "agreement_where_trunk_right" in tr:
        lines.append(f"| the same where the trunk's top-1 at t+1 is the text's x[t+2] | - | "
                     f"{100 * tr['agreement_where_trunk_right']:.1f}% |")
    lines += [
        "",
        f"`demo.gguf` in this folder is training's export with the block appended (every trunk tensor byte for byte, "
        f"checked): {g['bytes']:,} bytes, sha256 `{g['sha256']}`. The block's dequantized weights loaded back give "
        f"logits with NMSE {g['nmse']:.2e} and top-1 agreement {100 * g['top1']:.1f}% against the trained block.",
    ]
    return "\n".join(lines) + "\n"

