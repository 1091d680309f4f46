"""The perplexity of a demo GGUF through transformers: the file's dequantized weights loaded into
Qwen3NextForCausalLM, the text tokenized by the `tokenizers` vocabulary of the run, scored with llama.cpp's chunking
(train.perplexity, float32). The independent figure tests/python/test_demo_model.py stores for `strata perplexity`.

    python -m tools.demo.reference --dir models/demo -f TEXT [--ctx 512]

--dir holds demo.gguf, summary.json (the model config) and tokenizer.json. Needs torch, transformers, tokenizers and
the gguf package.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from tools.golden import convert, oracle

from . import tokenizer, train


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("-f", "--file", type=Path, required=True)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args(argv)
    from transformers import Qwen3NextForCausalLM

    summary = json.loads((args.dir / "summary.json").read_text())
    cfg = summary["model"]["config"]
    tok = tokenizer.load(args.dir / "tokenizer.json")
    model = Qwen3NextForCausalLM(train.hf_config(cfg, tok, summary["training"]["aux_loss_coef"]))
    weights = convert.gguf_to_hf_state(train.MODEL_ID, cfg, convert.read_gguf_f32(args.dir / "demo.gguf"))
    oracle.load_weights(model, {k: np.array(v) for k, v in weights.items()}, lambda *a: None)
    torch.set_float32_matmul_precision("highest")
    ids = np.asarray(train.encode_text(tok, args.file.read_text(encoding="utf-8")), np.int64)
    got = train.perplexity(model, ids, args.ctx, "cpu")
    print(json.dumps({"file": str(args.file), "gguf_sha256": summary["gguf"]["sha256"], **got}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
