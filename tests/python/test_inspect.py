"""`strata inspect`: the real Qwen vocabulary file, a small MoE file written by the gguf package, and bad files."""
import json
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
QT = gguf.GGMLQuantizationType


def inspect(strata_bin, path, *args, check=True):
    return subprocess.run([strata_bin, "inspect", str(path), *args], capture_output=True, text=True, check=check)


def test_qwen_vocabulary(strata_bin, shared_dir):
    path = shared_dir / "testdata" / "vocab" / "ggml-vocab-qwen2.gguf"
    d = json.loads(inspect(strata_bin, path, "--json").stdout)
    assert d["file"]["version"] == 3
    assert d["file"]["n_tensors"] == 0
    assert d["file"]["size_bytes"] == path.stat().st_size
    assert d["architecture"] == "qwen2"
    assert d["hyperparameters"]["context_length"] == 32768
    assert d["hyperparameters"]["attention.layer_norm_rms_epsilon"] == 1e-06
    tok = d["tokenizer"]
    assert tok["model"] == "gpt2"
    assert tok["pre"] == "qwen2"
    assert tok["vocab_size"] == 151936
    assert tok["n_merges"] == 151387
    # The file names bos, eos and padding (all <|endoftext|>), and nothing else.
    assert tok["special_tokens"] == {
        "bos": {"id": 151643, "text": "<|endoftext|>"},
        "eos": {"id": 151643, "text": "<|endoftext|>"},
        "padding": {"id": 151643, "text": "<|endoftext|>"},
    }
    assert tok["add_bos"] is None and tok["add_eos"] is None
    assert tok["chat_template"]["present"] is True and tok["chat_template"]["bytes"] > 0
    assert d["tensors"] == [] and d["experts"] is None
    # Long arrays are summarised, not dumped.
    toks = next(m for m in d["metadata"] if m["key"] == "tokenizer.ggml.tokens")
    assert toks["count"] == 151936 and toks["truncated"] is True and len(toks["value"]) == 8
    assert toks["value"][:3] == ["!", "\"", "#"]

    text = inspect(strata_bin, path).stdout
    assert "151,936 tokens, 151,387 merges" in text
    assert 'bos            151643   "<|endoftext|>"' in text
    assert "pre            \"qwen2\"" in text
    assert len(text) < 5000  # no vocabulary dump


N_EMBD, N_FF, N_EXPERT, N_VOCAB = 64, 32, 4, 16


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    """A two-block qwen3moe-shaped file plus one MTP block, written by gguf-py (not by us)."""
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.gguf"
    w = gguf.GGUFWriter(path, arch="qwen3moe")
    w.add_block_count(3)
    w.add_uint32("qwen3moe.nextn_predict_layers", 1)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(2)
    w.add_uint32("qwen3moe.expert_gating_func", 2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(N_VOCAB)])
    w.add_eos_token_id(3)
    w.add_array("qwen3moe.rope.dimension_sections", [11, 11, 10, 0])

    def q8(name, ne):  # Q8_0 bytes: 34 per 32 elements
        rows = int(np.prod(ne[1:]))
        w.add_tensor(name, np.zeros(tuple(reversed(ne[1:])) + (ne[0] // 32 * 34,), np.uint8), raw_dtype=QT.Q8_0)
        return rows * ne[0] // 32 * 34

    def f32(name, ne):
        w.add_tensor(name, np.zeros(tuple(reversed(ne)), np.float32))
        return 4 * int(np.prod(ne))

    sizes = {"token_embd.weight": f32("token_embd.weight", [N_EMBD, N_VOCAB])}
    for il in range(3):
        b = f"blk.{il}."
        sizes[b + "attn_norm.weight"] = f32(b + "attn_norm.weight", [N_EMBD])
        sizes[b + "attn_q.weight"] = q8(b + "attn_q.weight", [N_EMBD, N_EMBD])
        sizes[b + "ffn_gate_inp.weight"] = f32(b + "ffn_gate_inp.weight", [N_EMBD, N_EXPERT])
        sizes[b + "ffn_gate_exps.weight"] = q8(b + "ffn_gate_exps.weight", [N_EMBD, N_FF, N_EXPERT])
        sizes[b + "ffn_up_exps.weight"] = q8(b + "ffn_up_exps.weight", [N_EMBD, N_FF, N_EXPERT])
        sizes[b + "ffn_down_exps.weight"] = q8(b + "ffn_down_exps.weight", [N_FF, N_EMBD, N_EXPERT])
    sizes["output_norm.weight"] = f32("output_norm.weight", [N_EMBD])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, sizes


def test_moe_facts(strata_bin, moe_file):
    path, sizes = moe_file
    d = json.loads(inspect(strata_bin, path, "--json").stdout)
    assert d["architecture"] == "qwen3moe"
    hp = d["hyperparameters"]
    assert hp["block_count"] == 3 and hp["expert_count"] == N_EXPERT
    assert hp["expert_gating_func"] == "2 (sigmoid)"
    assert hp["rope.dimension_sections"] == [11, 11, 10, 0]
    assert d["tokenizer"]["special_tokens"] == {"eos": {"id": 3, "text": "t3"}}

    table = {t["name"]: t for t in d["tensors"]}
    assert {n: t["bytes"] for n, t in table.items()} == sizes
    assert table["blk.0.ffn_down_exps.weight"]["shape"] == [N_FF, N_EMBD, N_EXPERT]
    assert table["blk.0.ffn_down_exps.weight"]["type"] == "Q8_0"
    assert table["blk.0.ffn_down_exps.weight"]["role"] == "routed_expert"
    assert table["blk.1.ffn_gate_inp.weight"]["role"] == "router"
    assert table["blk.2.ffn_gate_inp.weight"]["role"] == "mtp"  # block 2 is past the 2-block trunk
    assert table["token_embd.weight"]["role"] == "embedding"

    by_role = d["totals"]["by_role"]
    exps = sum(v for n, v in sizes.items() if n.endswith("_exps.weight") and not n.startswith("blk.2."))
    assert by_role["routed_expert"] == {"tensors": 6, "bytes": exps}
    assert by_role["mtp"]["tensors"] == 6
    assert sum(r["bytes"] for r in by_role.values()) == sum(sizes.values()) == d["file"]["tensor_bytes"]
    assert d["totals"]["by_type"]["Q8_0"]["tensors"] == 12
    assert d["totals"]["by_type"]["F32"]["tensors"] == 8

    e = d["experts"]
    assert e["n_expert"] == N_EXPERT and e["n_expert_used"] == 2
    per_layer = 3 * N_EMBD * N_FF // 32 * 34 * N_EXPERT  # gate + up + down, all experts
    assert [(l["layer"], l["bytes"], l["bytes_per_expert"], l["mtp"]) for l in e["layers"]] == [
        (0, per_layer, per_layer // N_EXPERT, False),
        (1, per_layer, per_layer // N_EXPERT, False),
        (2, per_layer, per_layer // N_EXPERT, True),
    ]

    assert e["bytes_per_expert_min"] == e["bytes_per_expert_max"] == per_layer // N_EXPERT
    assert e["bytes"] == 3 * per_layer

    text = inspect(strata_bin, path).stdout
    assert "Routed experts" in text
    assert f"{per_layer // N_EXPERT:,}" in text
    assert "blk.0.ffn_down_exps.weight" in text


def test_bad_files_exit_with_one_error(strata_bin, moe_file, tmp_path):
    path, _ = moe_file
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    r = inspect(strata_bin, cut, check=False)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.startswith(f"strata: error: {cut}: tensor info ")
    assert "runs past the end of the file" in r.stderr
    assert r.stderr.count("\n") == 1

    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(data[:4] + (2).to_bytes(4, "little") + data[8:])
    r = inspect(strata_bin, v2, check=False)
    assert r.returncode == 1
    assert "found GGUF version 2; only version 3 is supported" in r.stderr

    r = inspect(strata_bin, tmp_path / "missing.gguf", check=False)
    assert r.returncode == 1 and "cannot open" in r.stderr
