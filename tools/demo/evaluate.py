"""The demo model through the engine: fills the card's sections that need `strata` (MODEL_CARD.md of a training run).

    python -m tools.demo.evaluate --dir DIR --strata build/bin/strata [--devices cpu,cuda] [--decode 512]
                                  [--ppl FILE[@BUDGET] ...] [--threads N]

- Perplexity: `strata perplexity` over DIR/heldout.txt with the chunking of the training run's own figure
  (summary.json), on each device asked for, and on CUDA again at the smallest `--vram-budget` the plan accepts (the
  engine names it when refusing a smaller one): each beside the transformers figure, with the relative difference.
  --ppl adds figures measured elsewhere (the `--json` output of `strata perplexity` on another machine, with the
  budget it ran at after an @), so a CPU machine and the GPU machine can fill one table.
- Routing: `strata run` on the start of the held-out text, greedy, --decode tokens, with `--routing-trace`; the
  trace summarised (tools/trace/summary.py: popularity, reuse distance, LRU / LFU / Belady hit rates by cache size),
  beside the same for a `strata synth` file of the tiny-qwen3next shape with and without `--route-skew`.
Writes DIR/evaluation.json and the two card sections; needs no torch.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.trace import read_trace
from tools.trace.summary import summarize

from . import card


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


def smallest_budget(strata: Path, gguf: Path, ctx: int) -> str | None:
    """The budget the plan names when a 1 MiB one is refused ("give at least X"), or None without a GPU plan."""
    r = subprocess.run([str(strata), "perplexity", "-m", str(gguf), "-f", "/dev/null", "--ctx", str(ctx), "--device",
                        "cuda", "--vram-budget", "1M"], capture_output=True, text=True)
    m = re.search(r"give at least ([0-9.]+ ?[KMG]i?B)", r.stderr)
    if not m:
        return None
    value, unit = re.fullmatch(r"([0-9.]+) ?([KMG])i?B", m.group(1)).groups()
    return f"{float(value) * 1.01:.2f}{unit}"  # a hair above the named size, which is rounded for printing


def row(got: dict, device: str, budget: str | None, want: float) -> dict:
    return {"device": device, "budget": budget, "backend": got["backend"], "ppl": got["ppl"], "scored": got["scored"],
            "rel_diff": got["ppl"] / want - 1.0, "seconds": got["seconds"]}


def perplexities(strata: Path, d: Path, devices: list[str], ctx: int, want: float, threads: int | None) -> list[dict]:
    gguf, text = d / "demo.gguf", d / "heldout.txt"
    cases = [(dev, None) for dev in devices]
    if "cuda" in devices:
        budget = smallest_budget(strata, gguf, ctx)
        if budget:
            cases.append(("cuda", budget))
    rows = []
    for dev, budget in cases:
        cmd = [strata, "perplexity", "-m", gguf, "-f", text, "--ctx", ctx, "--json", "--device", dev]
        if budget:
            cmd += ["--vram-budget", budget]
        if threads and dev == "cpu":
            cmd += ["-t", threads]
        rows.append(row(json.loads(run(cmd).stdout), dev, budget, want))
    return rows


# The quickstart's decoding (greedy with a repetition penalty): plain greedy decoding of a model this small falls
# into loops, whose routing repeats too.
DECODE_ARGS = ["--temp", "0", "--repeat-penalty", "1.15"]


def trace_of(strata: Path, gguf: Path, prompt: Path, n: int, out: Path, device: str) -> dict:
    run([strata, "run", "-m", gguf, "-f", prompt, "-n", n, *DECODE_ARGS, "--ignore-eos", "--device", device,
         "--routing-trace", out])
    return summarize(read_trace(out))


def cache_table(name: str, s: dict) -> list[str]:
    c = s["cache"]
    rows = [f"| {name} | {x}% | " + " | ".join(f"{100 * c['decode_hit_rate'][p][i]:.1f}%"
                                               for p in ("lru", "lfu", "lfu_decay", "belady")) + " |"
            for i, x in enumerate(c["sizes"])]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="the training run's output folder")
    ap.add_argument("--strata", type=Path, required=True)
    ap.add_argument("--devices", default="cpu", help="comma-separated: cpu, cuda")
    ap.add_argument("--decode", type=int, default=1024, help="tokens decoded for the routing trace")
    ap.add_argument("--prompt-bytes", type=int, default=2000, help="bytes of held-out text that prompt it")
    ap.add_argument("--ppl", action="append", default=[], metavar="FILE[@BUDGET]",
                    help="a `strata perplexity --json` output measured elsewhere (repeatable)")
    ap.add_argument("--threads", type=int, help="CPU threads for the CPU runs")
    args = ap.parse_args(argv)
    d = args.dir
    summary = json.loads((d / "summary.json").read_text())
    ref = summary["perplexity"]
    devices = [x.strip() for x in args.devices.split(",") if x.strip()]
    ppl = perplexities(args.strata, d, devices, ref["ctx"], ref["ppl"], args.threads)
    for spec in args.ppl:
        path, _, budget = spec.partition("@")
        got = json.loads(Path(path).read_text())
        if got["scored"] != ref["scored"]:
            raise SystemExit(f"{path}: {got['scored']} tokens scored, the training run's figure {ref['scored']}")
        ppl.append(row(got, "cuda" if "CUDA" in got["backend"] else "cpu", budget or None, ref["ppl"]))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prompt = tmp / "prompt.txt"
        prompt.write_bytes((d / "heldout.txt").read_bytes()[:args.prompt_bytes].decode("utf-8", "ignore").encode())
        dev = "cuda" if "cuda" in devices else "cpu"
        traces = {"demo model, held-out text": trace_of(args.strata, d / "demo.gguf", prompt, args.decode,
                                                        tmp / "demo.bin", dev)}
        for skew in (0.0, 1.2):
            synth = tmp / f"synth-{skew}.gguf"
            run([args.strata, "synth", "--preset", "tiny-qwen3next", "--vocab", d / "demo.gguf", "--route-skew", skew,
                 "-o", synth, "--quiet"])
            traces[f"strata synth tiny-qwen3next, --route-skew {skew:g}"] = trace_of(
                args.strata, synth, prompt, args.decode, tmp / f"synth-{skew}.bin", dev)

    lines = ["| device | budget | perplexity | vs transformers | tokens scored |", "|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['budget'] or '-'} | {r['ppl']:.4f} | {100 * r['rel_diff']:+.3f}% | "
              f"{r['scored']} |" for r in ppl]
    lines += ["", f"transformers (the checkpoint before export): {ref['ppl']:.4f} over {ref['scored']} tokens; "
              f"`strata perplexity -m demo.gguf -f heldout.txt --ctx {ref['ctx']}`."]
    routing = [f"Decode hit rates of one cache over all (layer, expert) keys, sized in % of them, from `strata run` "
               f"on the first {args.prompt_bytes} bytes of heldout.txt, {args.decode} tokens decoded with "
               f"`{' '.join(DECODE_ARGS)}` (`--routing-trace`, `python -m tools.trace.summary`); LFU decay is the "
               f"engine's `--expert-cache-policy lfu` (counts halved every 32 tokens' requests); the synthetic files "
               f"have 8 experts per layer, the demo model "
               f"{traces['demo model, held-out text']['header']['n_expert']}.", "",
               "| trace | size | LRU | LFU | LFU decay | Belady |", "|---|---|---|---|---|---|"]
    for name, s in traces.items():
        routing += cache_table(name, s)
    top = {name: s["popularity"]["overall"]["top_share"] for name, s in traces.items()}
    routing += ["", "Share of the picks taken by the most popular 10% of (layer, expert) keys: " +
                "; ".join(f"{name} {100 * v:.1f}%" for name, v in top.items()) + "."]

    card_path = d / "MODEL_CARD.md"
    text = card.fill_section(card_path.read_text(), "strata-perplexity", "\n".join(lines))
    text = card.fill_section(text, "routing-trace", "\n".join(routing))
    card_path.write_text(text)
    (d / "evaluation.json").write_text(json.dumps({"perplexity": ppl, "traces": traces}, indent=2, default=str))
    print("\n".join(lines + [""] + routing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
