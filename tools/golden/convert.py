"""Hugging Face state dict -> GGUF, as llama.cpp's converter writes qwen3moe, qwen3next and qwen35moe files.

What the converter does, restated (../shared/REFERENCE.md §3 and llama.cpp's conversion code, read, not copied):
- names: HF module paths map to blk.{i}.<role>; MTP blocks of Qwen3.5 become blocks n_layer.. with nextn.* extras;
- qwen3next/qwen35moe: +1 folded into every RMSNorm weight except the gated GDN norm (linear_attn.norm);
  A_log stored as ssm_a = -exp(A_log); dt_bias stored as ssm_dt.bias; conv1d [C, 1, K] squeezed to [C, K];
- qwen3next: in_proj_qkvz (per k-head [q, k, v, z]) split into attn_qkv ([all q, all k, all v]) and attn_gate (z);
  in_proj_ba kept as ssm_ba (per k-head [b x r, a x r]);
- qwen35moe: when n_k != n_v the V heads are reordered from grouped (by k-head) to tiled order in the v rows of
  attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt, the v channels of ssm_conv1d and the columns of ssm_out;
- experts stacked (or split from the fused gate_up_proj) into ffn_{gate,up,down}_exps with the expert index slowest;
- tensor types for an F32/F16/BF16/Q8_0 file: vectors, norms, routers (ffn_gate_inp, ffn_gate_inp_shexp), ssm_conv1d
  and names not ending in ".weight" (ssm_a, ssm_dt.bias) stay F32; every other matrix takes the file's type.

Also the exact inverse (GGUF tensors -> HF state dict), used by the oracle to load a file's weights into transformers.
Numpy only: no PyTorch needed to write the files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import gguf

from . import models
from .vocab import CHAT_TEMPLATE, Vocab, build_vocab

# llama.cpp's general.file_type of each float/Q8_0 file we write directly.
FILE_TYPES = {
    "F32": (gguf.LlamaFileType.ALL_F32, gguf.GGMLQuantizationType.F32),
    "F16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16),
    "BF16": (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGMLQuantizationType.BF16),
    "Q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
}

TOKENIZER_PRE = {"qwen3moe": "qwen2", "qwen3next": "qwen2", "qwen35moe": "qwen35"}


# ---- shapes of the linear-attention projections -----------------------------------------------------------------


@dataclass(frozen=True)
class GdnDims:
    n_k: int
    n_v: int
    d_k: int
    d_v: int

    @property
    def r(self) -> int:
        return self.n_v // self.n_k

    @property
    def key_dim(self) -> int:
        return self.n_k * self.d_k

    @property
    def value_dim(self) -> int:
        return self.n_v * self.d_v


def gdn_dims(cfg: dict) -> GdnDims:
    return GdnDims(cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                   cfg["linear_value_head_dim"])


def grouped_to_tiled(x: np.ndarray, axis: int, n_k: int, r: int, head: int) -> np.ndarray:
    """V heads along `axis` from HF's grouped order (k-head major) to llama.cpp's tiled order (k-head minor)."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    y = x.reshape(n_k, r, head, *rest).swapaxes(0, 1).reshape(n_k * r * head, *rest)
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


def tiled_to_grouped(x: np.ndarray, axis: int, n_k: int, r: int, head: int) -> np.ndarray:
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    y = x.reshape(r, n_k, head, *rest).swapaxes(0, 1).reshape(n_k * r * head, *rest)
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


def neg_exp_f32(a_log: np.ndarray) -> np.ndarray:
    """-exp(A_log) rounded to float32, computed in float64.

    float64 exp is accurate to about one ulp on every platform; the result is reproducible in float32 unless it falls
    within that error of a float32 rounding boundary, which we check instead of assuming.
    """
    x = np.exp(a_log.astype(np.float64))
    y = x.astype(np.float32)
    lo = np.nextafter(y, np.float32(-np.inf)).astype(np.float64)
    hi = np.nextafter(y, np.float32(np.inf)).astype(np.float64)
    margin = np.minimum(x - (lo + y.astype(np.float64)) / 2, (hi + y.astype(np.float64)) / 2 - x)
    if np.any(margin < 1e-13 * x):  # float64 exp errs by ~1e-16 relative
        raise ValueError("-exp(A_log) is too close to a float32 rounding boundary to be reproducible")
    return -y


# ---- HF -> GGUF names and transforms ----------------------------------------------------------------------------

_LAYER_RENAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}

_MTP_RENAMES = {  # Qwen3.5's mtp.* extras, attached to block n_layer
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
}

_GLOBAL_RENAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def _split_layer(name: str, n_layer: int) -> tuple[int, str] | None:
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
    if m:
        return int(m.group(1)), m.group(2)
    m = re.match(r"^mtp\.layers\.(\d+)\.(.+)$", name)
    if m:
        return n_layer + int(m.group(1)), m.group(2)
    return None


def _is_centred_norm(hf_name: str) -> bool:
    """The (1 + w) RMSNorm weights of Qwen3-Next / Qwen3.5 (llama.cpp adds 1 to them; not to the gated GDN norm)."""
    if hf_name.endswith("linear_attn.norm.weight"):
        return False
    return hf_name.endswith("norm.weight") or hf_name in _MTP_RENAMES and "norm" in hf_name


def hf_to_gguf_tensors(model_id: str, cfg: dict, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order, i.e. reversed ggml ne) with every llama.cpp transform applied."""
    arch = models.ARCH_OF[model_id]
    hybrid = arch in ("qwen3next", "qwen35moe")
    n_layer = cfg["num_hidden_layers"]
    out: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    g = gdn_dims(cfg) if hybrid else None
    reorder = arch == "qwen35moe" and g is not None and g.n_k != g.n_v

    for name, w in state.items():
        w = np.asarray(w, dtype=np.float32)
        if hybrid and _is_centred_norm(name):
            w = (w + np.float32(1.0)).astype(np.float32)
        if name in _GLOBAL_RENAMES:
            out[_GLOBAL_RENAMES[name]] = w
            continue
        if name in _MTP_RENAMES:
            out[f"blk.{n_layer}.{_MTP_RENAMES[name]}"] = w
            continue
        split = _split_layer(name, n_layer)
        if split is None:
            raise ValueError(f"{name}: no GGUF name for this tensor")
        il, rest = split
        blk = f"blk.{il}."
        m = _EXPERT.match(rest)
        if m:
            experts.setdefault((il, m.group(2)), {})[int(m.group(1))] = w
            continue
        if rest == "mlp.experts.gate_up_proj":  # fused [E, 2 ff, H], gate half first
            ff = w.shape[1] // 2
            out[blk + "ffn_gate_exps.weight"] = np.ascontiguousarray(w[:, :ff, :])
            out[blk + "ffn_up_exps.weight"] = np.ascontiguousarray(w[:, ff:, :])
            continue
        if rest == "mlp.experts.down_proj":  # fused [E, H, ff]
            out[blk + "ffn_down_exps.weight"] = w
            continue
        if rest == "post_attention_layernorm.weight":
            out[blk + ("post_attention_norm.weight" if hybrid else "ffn_norm.weight")] = w
            continue
        if rest == "linear_attn.in_proj_qkvz.weight":
            assert g is not None
            per = [g.d_k, g.d_k, g.r * g.d_v, g.r * g.d_v]
            x = w.reshape(g.n_k, sum(per), w.shape[1])
            q, k, v, z = np.split(x, np.cumsum(per)[:-1], axis=1)
            out[blk + "attn_qkv.weight"] = np.concatenate(
                [q.reshape(-1, w.shape[1]), k.reshape(-1, w.shape[1]), v.reshape(-1, w.shape[1])], axis=0)
            out[blk + "attn_gate.weight"] = np.ascontiguousarray(z.reshape(-1, w.shape[1]))
            continue
        if rest not in _LAYER_RENAMES:
            raise ValueError(f"{name}: no GGUF name for this tensor")
        gname = blk + _LAYER_RENAMES[rest]
        if rest == "linear_attn.A_log":
            w = neg_exp_f32(w)
        if rest == "linear_attn.conv1d.weight":
            w = np.ascontiguousarray(w.reshape(w.shape[0], w.shape[2]))
        if reorder:
            assert g is not None
            if rest == "linear_attn.in_proj_qkv.weight":
                w = np.concatenate([w[: 2 * g.key_dim], grouped_to_tiled(w[2 * g.key_dim:], 0, g.n_k, g.r, g.d_v)])
            elif rest == "linear_attn.in_proj_z.weight":
                w = grouped_to_tiled(w, 0, g.n_k, g.r, g.d_v)
            elif rest in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
                          "linear_attn.A_log", "linear_attn.dt_bias"):
                w = grouped_to_tiled(w, 0, g.n_k, g.r, 1)
            elif rest == "linear_attn.conv1d.weight":
                w = np.concatenate([w[: 2 * g.key_dim], grouped_to_tiled(w[2 * g.key_dim:], 0, g.n_k, g.r, g.d_v)])
            elif rest == "linear_attn.out_proj.weight":
                w = grouped_to_tiled(w, 1, g.n_k, g.r, g.d_v)
        out[gname] = np.ascontiguousarray(w, dtype=np.float32)

    for (il, proj), per_expert in sorted(experts.items()):
        stacked = np.stack([per_expert[e] for e in range(len(per_expert))], axis=0)
        out[f"blk.{il}.ffn_{proj}_exps.weight"] = stacked
    return out


def tensor_order(names: list[str]) -> list[str]:
    """token_embd, the blocks in order (each block's tensors sorted by name), output_norm, output."""
    def key(n: str) -> tuple:
        m = re.match(r"^blk\.(\d+)\.(.+)$", n)
        if m:
            return (1, int(m.group(1)), m.group(2))
        return ({"token_embd.weight": 0, "output_norm.weight": 2, "output.weight": 3}.get(n, 4), 0, n)
    return sorted(names, key=key)


# ---- tensor types -------------------------------------------------------------------------------------------------

_ALWAYS_F32 = re.compile(r"(^|\.)(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d)\.weight$")


def tensor_type(gguf_name: str, shape: tuple[int, ...], file_type: str) -> gguf.GGMLQuantizationType:
    """The type llama.cpp's converter gives a tensor in a file of type F32/F16/BF16/Q8_0."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    if _ALWAYS_F32.search(gguf_name) or not gguf_name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    return FILE_TYPES[file_type][1]


# ---- metadata -----------------------------------------------------------------------------------------------------


def _rope_parameters(cfg: dict) -> dict:
    rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "rope_theta" not in rp and cfg.get("rope_theta") is not None:
        rp["rope_theta"] = cfg["rope_theta"]
    return rp


def add_metadata(w: gguf.GGUFWriter, model_id: str, cfg: dict, file_type: gguf.LlamaFileType, vocab: Vocab,
                 name: str | None = None) -> None:
    arch = models.ARCH_OF[model_id]
    n_mtp = cfg.get("mtp_num_hidden_layers", 0) if arch == "qwen35moe" else 0
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name or f"tiny-golden-{model_id}")
    w.add_block_count(cfg["num_hidden_layers"] + n_mtp)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    rp = _rope_parameters(cfg)
    if "mrope_section" in rp:
        sections = list(rp["mrope_section"]) + [0] * (4 - len(rp["mrope_section"]))
        w.add_rope_dimension_sections(sections[:4])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(file_type)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if "shared_expert_intermediate_size" in cfg:
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if arch in ("qwen3next", "qwen35moe"):
        w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
        partial = cfg.get("partial_rotary_factor", 0.25)
        w.add_rope_dimension_count(int(cfg["head_dim"] * partial))
    if n_mtp > 0:
        w.add_nextn_predict_layers(n_mtp)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # tokenizer, as llama.cpp writes a byte-level BPE (gpt2) vocabulary with Qwen's special tokens
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(TOKENIZER_PRE[model_id])
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_eos_token_id(vocab.id_of("<|im_end|>"))
    w.add_pad_token_id(vocab.id_of("<|endoftext|>"))
    w.add_bos_token_id(vocab.id_of("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def add_typed_tensor(w: gguf.GGUFWriter, name: str, data: np.ndarray, file_type: str) -> None:
    """One float32 tensor into a writer, in the type tensor_type gives it in a file of file_type."""
    qtype = tensor_type(name, data.shape, file_type)
    if qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, np.ascontiguousarray(data.astype(np.float16)))
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def write_gguf(path: Path, model_id: str, cfg: dict, state: dict[str, np.ndarray], file_type: str,
               vocab: Vocab | None = None, tensors: dict[str, np.ndarray] | None = None,
               general_name: str | None = None) -> None:
    """Write one GGUF file of type F32, F16, BF16 or Q8_0 (tensor types as llama.cpp's converter chooses).

    vocab defaults to the golden vocabulary and general_name (general.name) to tiny-golden-<model_id>.
    """
    vocab = vocab or build_vocab()
    tensors = tensors if tensors is not None else hf_to_gguf_tensors(model_id, cfg, state)
    ftype, _ = FILE_TYPES[file_type]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), models.ARCH_OF[model_id])
    add_metadata(w, model_id, cfg, ftype, vocab, general_name)
    for name in tensor_order(list(tensors)):
        add_typed_tensor(w, name, tensors[name], file_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- GGUF -> HF (the inverse, for the oracle and the tests) -------------------------------------------------------


def read_gguf_f32(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file dequantized to float32, numpy order (reversed ggml ne)."""
    r = gguf.GGUFReader(str(path))
    out: dict[str, np.ndarray] = {}
    for t in r.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        out[t.name] = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32) \
            .reshape(shape)
    return out


_INVERSE_LAYER = {v: k for k, v in _LAYER_RENAMES.items()}
_INVERSE_MTP = {v: k for k, v in _MTP_RENAMES.items()}
_INVERSE_GLOBAL = {v: k for k, v in _GLOBAL_RENAMES.items()}


def gguf_to_hf_state(model_id: str, cfg: dict, tensors: dict[str, np.ndarray],
                     fused_experts: bool | None = None) -> dict[str, np.ndarray]:
    """Undo hf_to_gguf_tensors: HF checkpoint names, shapes and values (A_log as float64-accurate log(-ssm_a)).

    Experts come back per expert (qwen3moe, qwen3next) or fused (qwen35moe), as the released checkpoints store them,
    unless fused_experts says otherwise.
    """
    arch = models.ARCH_OF[model_id]
    hybrid = arch in ("qwen3next", "qwen35moe")
    if fused_experts is None:
        fused_experts = arch == "qwen35moe"
    n_layer = cfg["num_hidden_layers"]
    g = gdn_dims(cfg) if hybrid else None
    reorder = arch == "qwen35moe" and g is not None and g.n_k != g.n_v
    hf: dict[str, np.ndarray] = {}

    def prefix(il: int) -> str:
        return f"model.layers.{il}." if il < n_layer else f"mtp.layers.{il - n_layer}."

    pending_qkv: dict[int, np.ndarray] = {}
    pending_gate: dict[int, np.ndarray] = {}
    for gname, w in tensors.items():
        w = np.asarray(w, dtype=np.float32)
        if gname in _INVERSE_GLOBAL:
            name = _INVERSE_GLOBAL[gname]
        else:
            m = re.match(r"^blk\.(\d+)\.(.+)$", gname)
            if not m:
                raise ValueError(f"{gname}: not a tensor of a {arch} file")
            il, rest = int(m.group(1)), m.group(2)
            p = prefix(il)
            if rest in _INVERSE_MTP:
                name = _INVERSE_MTP[rest]
            elif rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"):
                proj = rest.split("_")[1]
                if fused_experts:
                    name = p + ("mlp.experts.down_proj" if proj == "down" else f"mlp.experts._{proj}")
                else:
                    for e in range(w.shape[0]):
                        hf[p + f"mlp.experts.{e}.{proj}_proj.weight"] = np.ascontiguousarray(w[e])
                    continue
            elif rest in ("ffn_norm.weight", "post_attention_norm.weight"):
                name = p + "post_attention_layernorm.weight"
            elif arch == "qwen3next" and rest == "attn_qkv.weight":
                pending_qkv[il] = w
                continue
            elif arch == "qwen3next" and rest == "attn_gate.weight":
                pending_gate[il] = w
                continue
            elif rest in _INVERSE_LAYER:
                name = p + _INVERSE_LAYER[rest]
            else:
                raise ValueError(f"{gname}: not a tensor of a {arch} file")
            if rest == "ssm_a":
                w = np.log(-w.astype(np.float64)).astype(np.float32)
            if rest == "ssm_conv1d.weight":
                w = w.reshape(w.shape[0], 1, w.shape[1])
            if reorder:
                assert g is not None
                if rest == "attn_qkv.weight":
                    w = np.concatenate([w[: 2 * g.key_dim], tiled_to_grouped(w[2 * g.key_dim:], 0, g.n_k, g.r, g.d_v)])
                elif rest == "attn_gate.weight":
                    w = tiled_to_grouped(w, 0, g.n_k, g.r, g.d_v)
                elif rest in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
                    w = tiled_to_grouped(w, 0, g.n_k, g.r, 1)
                elif rest == "ssm_conv1d.weight":
                    w = np.concatenate([w[: 2 * g.key_dim], tiled_to_grouped(w[2 * g.key_dim:], 0, g.n_k, g.r, g.d_v)])
                elif rest == "ssm_out.weight":
                    w = tiled_to_grouped(w, 1, g.n_k, g.r, g.d_v)
        if hybrid and _is_centred_norm(name):
            w = (w - np.float32(1.0)).astype(np.float32)
        hf[name] = np.ascontiguousarray(w, dtype=np.float32)

    for il, qkv in pending_qkv.items():
        assert g is not None
        z = pending_gate.pop(il)
        h = qkv.shape[1]
        q = qkv[: g.key_dim].reshape(g.n_k, g.d_k, h)
        k = qkv[g.key_dim: 2 * g.key_dim].reshape(g.n_k, g.d_k, h)
        v = qkv[2 * g.key_dim:].reshape(g.n_k, g.r * g.d_v, h)
        zz = z.reshape(g.n_k, g.r * g.d_v, h)
        hf[prefix(il) + "linear_attn.in_proj_qkvz.weight"] = np.concatenate([q, k, v, zz], axis=1).reshape(-1, h)
    if pending_gate:
        raise ValueError("attn_gate without attn_qkv in a qwen3next file")

    if fused_experts:  # join gate and up into gate_up_proj [E, 2 ff, H]
        for name in [n for n in hf if n.endswith("mlp.experts._gate")]:
            base = name[: -len("_gate")]
            hf[base + "gate_up_proj"] = np.concatenate([hf.pop(name), hf.pop(base + "_up")], axis=1)
    return hf
