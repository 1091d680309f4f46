"""Golden models: regenerate every GGUF from the seeded generator, check its hash, its layout against REFERENCE.md's
description of the architecture, and the committed oracles against a numpy forward pass over the same file."""
import os
import re
from pathlib import Path

import numpy as np
import pytest

import gguf

from tools.golden import convert, generate, hashrng, manifest, models, npref, vocab
from tools.golden.oracle import ORACLE_SOURCES

MANIFEST = manifest.load()
MODEL_IDS = list(models.CONFIGS)
FLOAT_FILES = [(m, v) for m in MODEL_IDS for v in generate.FLOAT_VARIANTS]
QUANT_FILES = [(m, v) for m in MODEL_IDS for v in generate.QUANT_VARIANTS]


def _file(golden_dir: Path, model_id: str, variant: str) -> Path:
    p = golden_dir / generate.file_name(model_id, variant)
    if not p.exists():
        pytest.skip(f"{p.name} not generated (quantized mixes need the strata binary and recorded hashes)")
    return p


# ---- generator ------------------------------------------------------------------------------------------------------


def test_hash_known_answers():
    # fixed outputs of the counter hash: any platform or numpy version must give exactly these
    assert [int(x) for x in hashrng.hash64(1, "a", 3)] == [
        0xED70BC3E66FE33AC, 0xC19E8F26F7193F58, 0x90704992E89594CE]
    assert hashrng.stream_key(20260101, "qwen3moe/lm_head.weight") == 17732461214074817575
    assert hashrng.normal(7, "x", 3).tolist() == [0.6363045539532913, 0.47466480266660216, 1.2422421892950055]
    assert hashrng.uniform(7, "x", 2).tolist() == [0.7289618615545271, 0.7209959979233344]


def test_hash_statistics():
    z = hashrng.normal(3, "stats", 200000)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01 and np.abs(z).max() < 3.47
    u = hashrng.uniform(3, "stats", 200000)
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005


def test_bf16_rounding():
    x = np.array([1.0, 1.00390625, 1.01171875, 1e-5, -3.14159, 100.0], np.float32)
    y = hashrng.round_to_bf16(x)
    assert y.tolist() == [1.0, 1.0, 1.015625, 0.0, -3.140625, 100.0]
    assert np.array_equal(y.astype(np.float16).astype(np.float32), y)  # also exact in float16


def test_manifest_matches_code():
    static = generate.static_manifest()
    for key in ("seed", "sequences", "vocab"):
        assert MANIFEST[key] == static[key], key
    for mid in MODEL_IDS:
        for key in ("arch", "hf_config", "quant_mixes"):
            assert MANIFEST["models"][mid][key] == static["models"][mid][key], (mid, key)


# ---- tokenizer ------------------------------------------------------------------------------------------------------


def test_vocab_shape():
    v = vocab.build_vocab()
    assert len(v.tokens) == 512 and len(set(v.tokens)) == 512
    ids = {t: i for i, t in enumerate(v.tokens)}
    for m in v.merges:
        a, b = m.split(" ")
        assert a in ids and b in ids and a + b in ids, m
    types = {t: ty for t, ty in zip(v.tokens, v.token_types)}
    assert types["<|im_start|>"] == 3 and types["<|endoftext|>"] == 3 and types["<think>"] == 4
    assert all(ty == 1 for ty in v.token_types[:505])


def test_prompts_tokenize_as_recorded():
    v = vocab.build_vocab()
    seq = MANIFEST["sequences"]
    for key in ("prompt", "prompt2"):
        assert vocab.encode(v, seq[key]["text"]) == seq[key]["ids"]
    assert len(seq["prompt"]["ids"]) == 64 and len(seq["prompt2"]["ids"]) != 64


def test_prompts_match_tokenizers_package():
    """An independent BPE (the `tokenizers` package) with Qwen2's pre-tokenizer regex gives the same ids."""
    tk = pytest.importorskip("tokenizers")
    v = vocab.build_vocab()
    specials = [t for t, _ in vocab.SPECIAL_TOKENS]
    bpe = tk.models.BPE(vocab={t: i for i, t in enumerate(v.tokens) if t not in specials},
                        merges=[tuple(m.split(" ")) for m in v.merges])
    tok = tk.Tokenizer(bpe)
    qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+")
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(qwen2), behavior="isolated", invert=False),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in specials])
    for key in ("prompt", "prompt2"):
        assert tok.encode(MANIFEST["sequences"][key]["text"]).ids == MANIFEST["sequences"][key]["ids"]


# ---- converter ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_converter_roundtrip(model_id):
    cfg = models.hf_config(model_id)
    state = models.generate_state(model_id)
    back = convert.gguf_to_hf_state(model_id, cfg, convert.hf_to_gguf_tensors(model_id, cfg, state))
    assert set(back) == set(state)
    for name, w in state.items():
        if name.endswith("A_log"):  # log(exp(x)) in float: within a few ulps
            np.testing.assert_allclose(back[name], w, rtol=1e-6)
        else:
            assert np.array_equal(back[name], w), name


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_names_agree_with_gguf_package_map(model_id):
    """Every plainly renamed HF tensor maps to the name gguf-py's own tensor map gives it for the architecture."""
    cfg = models.hf_config(model_id)
    arch = {"qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "qwen3next": gguf.MODEL_ARCH.QWEN3NEXT,
            "qwen35moe": gguf.MODEL_ARCH.QWEN35MOE}[model_id]
    tmap = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"] + cfg.get("mtp_num_hidden_layers", 0))
    ours = convert.hf_to_gguf_tensors(model_id, cfg, models.generate_state(model_id))
    checked = 0
    for name in models.weight_specs(model_id):
        if name.startswith("mtp.") or ".experts." in name or "in_proj_qkvz" in name:
            continue  # MTP blocks (not in gguf 0.19's qwen35moe table), stacked experts, split qkvz: checked below
        hf = name.replace(".dt_bias", ".dt_proj.bias")
        mapped = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        assert mapped in ours, (name, mapped)
        checked += 1
    assert checked > 10
    for il in range(cfg["num_hidden_layers"]):
        for proj in ("gate", "up", "down"):
            assert tmap.get_name(f"model.layers.{il}.mlp.experts.{proj}_proj.weight",
                                 try_suffixes=(".weight",)) == f"blk.{il}.ffn_{proj}_exps.weight"


# ---- files ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id,variant", FLOAT_FILES + QUANT_FILES)
def test_file_hash_matches_manifest(golden_dir, model_id, variant):
    entry = MANIFEST["models"][model_id].get("files", {}).get(variant)
    if entry is None:
        pytest.skip(f"no hash recorded for {model_id} {variant}")
    path = _file(golden_dir, model_id, variant)
    assert manifest.sha256_file(path) == entry["sha256"], f"{path.name} differs from the manifest"


def _expected_tensors(model_id: str) -> dict[str, tuple[int, ...]]:
    """Names and ggml shapes (ne0 first) as ../shared/REFERENCE.md §3 gives them, for our sizes."""
    c = models.CONFIGS[model_id]
    E, H, V, hd = c["hidden_size"], c["num_experts"], c["vocab_size"], c["head_dim"]
    nq, nkv, ff = c["num_attention_heads"], c["num_key_value_heads"], c["moe_intermediate_size"]
    n = E
    out = {"token_embd.weight": (n, V), "output_norm.weight": (n,), "output.weight": (n, V)}
    hybrid = model_id != "qwen3moe"
    n_mtp = c.get("mtp_num_hidden_layers", 0)
    kinds = models.layer_types(c) + ["full_attention"] * n_mtp
    for il, kind in enumerate(kinds):
        b = f"blk.{il}."
        out[b + "attn_norm.weight"] = (n,)
        out[b + ("post_attention_norm.weight" if hybrid else "ffn_norm.weight")] = (n,)
        if kind == "full_attention":
            out[b + "attn_q.weight"] = (n, (2 if hybrid else 1) * nq * hd)
            out[b + "attn_k.weight"] = (n, nkv * hd)
            out[b + "attn_v.weight"] = (n, nkv * hd)
            out[b + "attn_output.weight"] = (nq * hd, n)
            out[b + "attn_q_norm.weight"] = (hd,)
            out[b + "attn_k_norm.weight"] = (hd,)
        else:
            nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                              c["linear_value_head_dim"])
            k_dim, v_dim = nk * dk, nv * dv
            out[b + "attn_qkv.weight"] = (n, 2 * k_dim + v_dim)
            out[b + "attn_gate.weight"] = (n, v_dim)
            if model_id == "qwen3next":
                out[b + "ssm_ba.weight"] = (n, 2 * nv)
            else:
                out[b + "ssm_beta.weight"] = (n, nv)
                out[b + "ssm_alpha.weight"] = (n, nv)
            out[b + "ssm_conv1d.weight"] = (c["linear_conv_kernel_dim"], 2 * k_dim + v_dim)
            out[b + "ssm_dt.bias"] = (nv,)
            out[b + "ssm_a"] = (nv,)
            out[b + "ssm_norm.weight"] = (dv,)
            out[b + "ssm_out.weight"] = (v_dim, n)
        out[b + "ffn_gate_inp.weight"] = (n, H)
        out[b + "ffn_gate_exps.weight"] = (n, ff, H)
        out[b + "ffn_up_exps.weight"] = (n, ff, H)
        out[b + "ffn_down_exps.weight"] = (ff, n, H)
        if hybrid:
            sh = c["shared_expert_intermediate_size"]
            out[b + "ffn_gate_inp_shexp.weight"] = (n,)
            out[b + "ffn_gate_shexp.weight"] = (n, sh)
            out[b + "ffn_up_shexp.weight"] = (n, sh)
            out[b + "ffn_down_shexp.weight"] = (sh, n)
        if il >= c["num_hidden_layers"]:  # Qwen3.5 MTP block
            out[b + "nextn.eh_proj.weight"] = (2 * n, n)
            out[b + "nextn.enorm.weight"] = (n,)
            out[b + "nextn.hnorm.weight"] = (n,)
            out[b + "nextn.shared_head_norm.weight"] = (n,)
    return out


_F32_ROLES = re.compile(r"(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d)\.weight$")
_TYPE_OF = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0"}


def _expected_type(name: str, ne: tuple[int, ...], model_id: str, variant: str) -> str:
    """llama.cpp's choices: vectors, norms, routers, conv kernels, ssm_a/ssm_dt stay F32 in every file."""
    vector = len([d for d in ne if d != 1]) <= 1
    if vector or _F32_ROLES.search(name) or not name.endswith(".weight"):
        return "F32"
    if variant in _TYPE_OF:
        return _TYPE_OF[variant]
    mix = MANIFEST["models"][model_id]["quant_mixes"][variant]
    for pattern, qtype in mix["rules"]:
        if re.search(pattern, name):
            return qtype
    return mix["default_type"]


def _padded(shape) -> tuple[int, ...]:
    s = tuple(int(x) for x in shape)
    return s + (1,) * (4 - len(s))


@pytest.mark.parametrize("model_id,variant", FLOAT_FILES + QUANT_FILES)
def test_gguf_layout(golden_dir, model_id, variant):
    path = _file(golden_dir, model_id, variant)
    r = gguf.GGUFReader(str(path))
    arch = models.ARCH_OF[model_id]
    c = models.CONFIGS[model_id]
    expected = _expected_tensors(model_id)
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(expected), f"missing {set(expected) - set(got)}, extra {set(got) - set(expected)}"
    for name, ne in expected.items():
        t = got[name]
        assert _padded(t.shape) == _padded(ne), (name, tuple(t.shape), ne)
        want = _expected_type(name, ne, model_id, variant)
        assert t.tensor_type.name == want, (name, t.tensor_type.name, want)

    def kv(key):
        f = r.fields.get(key)
        assert f is not None, f"missing key {key}"
        return f.contents()

    n_mtp = c.get("mtp_num_hidden_layers", 0)
    assert kv("general.architecture") == arch
    assert kv("general.quantization_version") == 2
    assert kv("general.file_type") == {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}.get(variant, kv("general.file_type"))
    want = {
        "context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
        "block_count": c["num_hidden_layers"] + n_mtp, "attention.head_count": c["num_attention_heads"],
        "attention.head_count_kv": c["num_key_value_heads"], "attention.key_length": c["head_dim"],
        "attention.value_length": c["head_dim"], "expert_count": c["num_experts"],
        "expert_used_count": c["num_experts_per_tok"], "expert_feed_forward_length": c["moe_intermediate_size"],
    }
    if arch != "qwen3moe":
        want.update({
            "expert_shared_feed_forward_length": c["shared_expert_intermediate_size"],
            "ssm.conv_kernel": c["linear_conv_kernel_dim"], "ssm.state_size": c["linear_key_head_dim"],
            "ssm.group_count": c["linear_num_key_heads"], "ssm.time_step_rank": c["linear_num_value_heads"],
            "ssm.inner_size": c["linear_value_head_dim"] * c["linear_num_value_heads"],
            "full_attention_interval": 4, "rope.dimension_count": c["head_dim"] // 4,
        })
    if arch == "qwen35moe":
        want.update({"nextn_predict_layers": 1, "rope.dimension_sections": [3, 3, 2, 0]})
        assert r.fields[f"{arch}.rope.dimension_sections"].types[-1] == gguf.GGUFValueType.INT32
    for key, value in want.items():
        assert kv(f"{arch}.{key}") == value, key
    assert abs(kv(f"{arch}.attention.layer_norm_rms_epsilon") - 1e-6) < 1e-12
    theta = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta"))
    assert kv(f"{arch}.rope.freq_base") == theta
    # tokenizer as llama.cpp writes Qwen's
    assert kv("tokenizer.ggml.model") == "gpt2"
    assert kv("tokenizer.ggml.pre") == ("qwen35" if arch == "qwen35moe" else "qwen2")
    v = vocab.build_vocab()
    assert kv("tokenizer.ggml.tokens") == v.tokens
    assert kv("tokenizer.ggml.token_type") == v.token_types
    assert kv("tokenizer.ggml.merges") == v.merges
    assert kv("tokenizer.ggml.eos_token_id") == v.id_of("<|im_end|>")
    assert kv("tokenizer.ggml.bos_token_id") == v.id_of("<|endoftext|>")
    assert kv("tokenizer.ggml.padding_token_id") == v.id_of("<|endoftext|>")
    assert kv("tokenizer.ggml.add_bos_token") is False
    assert "<|im_start|>" in kv("tokenizer.chat_template")


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_float_files_hold_the_same_values(golden_dir, model_id):
    """F32, F16 and BF16 encode the same numbers (bfloat16-exact weights), so they share one oracle."""
    ref = convert.read_gguf_f32(_file(golden_dir, model_id, "F32"))
    for variant in ("F16", "BF16"):
        other = convert.read_gguf_f32(_file(golden_dir, model_id, variant))
        for name, w in ref.items():
            assert np.array_equal(other[name], w), (variant, name)


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_converter_semantics_on_file(golden_dir, model_id):
    """Spot checks of llama.cpp's transforms on the written file, against the generator's HF tensors."""
    t = convert.read_gguf_f32(_file(golden_dir, model_id, "F32"))
    st = models.generate_state(model_id)
    c = models.CONFIGS[model_id]
    if model_id == "qwen3moe":
        assert np.array_equal(t["blk.0.attn_norm.weight"], st["model.layers.0.input_layernorm.weight"])
        return
    assert np.array_equal(t["blk.0.attn_norm.weight"], st["model.layers.0.input_layernorm.weight"] + 1)  # +1 folded
    assert np.array_equal(t["blk.0.ssm_norm.weight"], st["model.layers.0.linear_attn.norm.weight"])  # not folded
    nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
    r = nv // nk
    a_log = st["model.layers.0.linear_attn.A_log"].astype(np.float64)
    order = [(j % nk) * r + j // nk for j in range(nv)] if model_id == "qwen35moe" else list(range(nv))
    np.testing.assert_allclose(t["blk.0.ssm_a"], -np.exp(a_log[order]), rtol=1e-7)  # (and tiled for qwen35moe)
    conv = st["model.layers.0.linear_attn.conv1d.weight"][:, 0, :]
    assert np.array_equal(t["blk.0.ssm_conv1d.weight"][: 2 * nk * dk], conv[: 2 * nk * dk])
    if model_id == "qwen3next":
        qkvz = st["model.layers.0.linear_attn.in_proj_qkvz.weight"].reshape(nk, 2 * dk + 2 * r * dv, -1)
        qkv = t["blk.0.attn_qkv.weight"]
        assert np.array_equal(qkv[dk: 2 * dk], qkvz[1, :dk])  # q of k-head 1 follows q of k-head 0
        assert np.array_equal(qkv[2 * nk * dk: 2 * nk * dk + r * dv], qkvz[0, 2 * dk: 2 * dk + r * dv])
        assert np.array_equal(t["blk.0.attn_gate.weight"][r * dv: 2 * r * dv], qkvz[1, 2 * dk + r * dv:])
        assert np.array_equal(t["blk.0.ssm_ba.weight"], st["model.layers.0.linear_attn.in_proj_ba.weight"])
    else:
        v_hf = st["model.layers.0.linear_attn.in_proj_qkv.weight"][2 * nk * dk:]
        v_gguf = t["blk.0.attn_qkv.weight"][2 * nk * dk:]
        for j in range(nv):  # tiled position j holds HF v-head (j mod n_k) * r + j div n_k
            src = (j % nk) * r + j // nk
            assert np.array_equal(v_gguf[j * dv: (j + 1) * dv], v_hf[src * dv: (src + 1) * dv])
        assert np.array_equal(t["blk.4.nextn.eh_proj.weight"], st["mtp.fc.weight"])
        assert np.array_equal(t["blk.4.nextn.enorm.weight"], st["mtp.pre_fc_norm_embedding.weight"] + 1)


# ---- oracles --------------------------------------------------------------------------------------------------------

ORACLES = [(m, o) for m in MODEL_IDS for o in ORACLE_SOURCES if o in MANIFEST["models"][m].get("oracles", {})]


def test_every_model_has_float_and_q8_oracles():
    for m in MODEL_IDS:
        assert {"float", "Q8_0"} <= set(MANIFEST["models"][m].get("oracles", {})), m


@pytest.mark.parametrize("model_id,oracle", ORACLES)
def test_oracle_file_intact(model_id, oracle):
    entry = MANIFEST["models"][model_id]["oracles"][oracle]
    path = manifest.GOLDEN_DIR / entry["file"]
    assert manifest.sha256_file(path) == entry["sha256"]
    arrays = manifest.load_npz(path)
    assert manifest.arrays_digest(arrays) == entry["digest"]
    seq = MANIFEST["sequences"]
    assert arrays["prompt_ids"].tolist() == seq["prompt"]["ids"]
    assert arrays["prompt2_ids"].tolist() == seq["prompt2"]["ids"]
    assert arrays["decode_tokens"].tolist() == entry["decode_tokens"]
    V = models.CONFIGS[model_id]["vocab_size"]
    assert arrays["prompt_logits"].shape == (64, V)
    assert arrays["decode_logits"].shape == (seq["decode_steps"], V)
    assert arrays["prompt2_logits"].shape == (len(seq["prompt2"]["ids"]), V)
    # greedy decoding: each fed token is the argmax of the logits before it
    prev = np.concatenate([arrays["prompt_logits"][-1:], arrays["decode_logits"][:-1]])
    assert prev.argmax(-1).tolist() == entry["decode_tokens"]
    assert entry["source_sha256"] == MANIFEST["models"][model_id]["files"][ORACLE_SOURCES[oracle]]["sha256"]


@pytest.mark.parametrize("model_id,oracle", ORACLES)
def test_numpy_reference_matches_oracle(golden_dir, model_id, oracle):
    """A float64 numpy forward over the GGUF (llama.cpp's layout and semantics) reproduces transformers' logits."""
    path = _file(golden_dir, model_id, ORACLE_SOURCES[oracle])
    entry = MANIFEST["models"][model_id]["oracles"][oracle]
    arrays = manifest.load_npz(manifest.GOLDEN_DIR / entry["file"])
    ref = npref.NumpyModel(model_id, convert.read_gguf_f32(path))
    seq = MANIFEST["sequences"]
    full = ref.forward(seq["prompt"]["ids"] + entry["decode_tokens"])
    ora = np.concatenate([arrays["prompt_logits"], arrays["decode_logits"]])
    scale = np.abs(ora).max()
    assert np.abs(full - ora).max() <= 1e-5 * scale
    p2 = ref.forward(seq["prompt2"]["ids"])
    assert np.abs(p2 - arrays["prompt2_logits"]).max() <= 1e-5 * scale


def test_oracles_are_not_degenerate():
    """Varied top-1 across positions, every expert used, and every mixer layer matters (checked at recording)."""
    for m in MODEL_IDS:
        ch = MANIFEST["models"][m]["oracles"]["float"]["checks"]
        assert ch["top1_distinct"] >= 40
        assert all(n == models.CONFIGS[m]["num_experts"] for n in ch["experts_used_per_layer"])
        assert all(n >= 15 for n in ch["expert_sets_per_layer"])


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_every_mixer_and_the_experts_matter(golden_dir, model_id):
    """Removing any attention / Gated DeltaNet layer, or the routed experts of a layer, moves the logits far beyond the
    float tolerance: an engine that gets one of them wrong cannot pass."""
    model = npref.NumpyModel(model_id, convert.read_gguf_f32(_file(golden_dir, model_id, "F32")))
    ids = MANIFEST["sequences"]["prompt"]["ids"][:32]
    base = model.forward(ids)
    for il, kind in enumerate(models.layer_types(models.CONFIGS[model_id])):
        for key in (f"blk.{il}.attn_output.weight" if kind == "full_attention" else f"blk.{il}.ssm_out.weight",
                    f"blk.{il}.ffn_down_exps.weight"):
            kept = model.t[key]
            model.t[key] = np.zeros_like(kept)
            d = model.forward(ids) - base
            model.t[key] = kept
            assert np.sqrt(np.mean(d * d) / np.mean(base * base)) > 0.05, key


@pytest.mark.parametrize("model_id,variant", [(m, v) for m in MODEL_IDS for v in ("F32", "Q8_0", "Q4_K_M", "LOWBIT")])
def test_quantized_engine_headroom(golden_dir, model_id, variant):
    """A correct engine that rounds every matmul input to int8 blocks of 256 (Q8_K, the CPU K-quant path) stays well
    inside the quantized tolerance against this file's exact function: the oracles leave room for rounding."""
    from tools.golden import compare

    t = convert.read_gguf_f32(_file(golden_dir, model_id, variant))
    seqs = [MANIFEST["sequences"]["prompt"]["ids"], MANIFEST["sequences"]["prompt2"]["ids"]]
    exact = np.concatenate([npref.NumpyModel(model_id, t).forward(s) for s in seqs])
    rounded = np.concatenate([npref.NumpyModel(model_id, t, act_quant_block=256).forward(s) for s in seqs])
    m = compare.compare(exact, rounded)
    assert m.nmse_total <= 5e-4 and np.mean(m.top1) >= 0.99, (m.nmse_total, np.mean(m.top1))
