"""The three tiny golden models: Hugging Face configs and the deterministic weights that go with them.

Each config keeps every structural feature of the released model it imitates (see README.md for the list) at the
smallest sizes where every weight row is a multiple of 256 elements, so that K-quants and i-quants apply to every
matrix. Weights are named and shaped exactly as the released Hugging Face checkpoints name and shape them; their values
come from tools/golden/hashrng.py, scaled per tensor role to magnitudes like those of trained weights (not the tiny
0.02-std initialisation transformers would use), and rounded to bfloat16 like the released checkpoints.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from . import hashrng

SEED = 20260101  # the one seed of every golden model (each tensor's stream is also keyed by its name)

# The oracle's inputs. The first prompt is a chat turn (special tokens included) of exactly 64 tokens; the second,
# plain text of another length, is run in a left-padded batch of two with the first.
PROMPT_TEXT = ("<|im_start|>user\nThe router sends each token to a few experts. Which of them were chosen for the word "
               "fox, and why does it matter?<|im_end|>\n<|im_start|>assistant\n<think>")
PROMPT_LEN = 64
PROMPT2_TEXT = ("Numbers and names: she counted 12 boats on the river before noon, and the market was full of people "
                "by four.")
PROMPT2_LEN = 41
DECODE_STEPS = 16

HIDDEN = 256
VOCAB = 512

_COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_cache": True,
    "bos_token_id": 505,  # <|endoftext|>, as Qwen's config.json
    "eos_token_id": 507,  # <|im_end|>
    "torch_dtype": "bfloat16",
}

CONFIGS: dict[str, dict] = {
    # Qwen3-30B-A3B's structure: GQA with q/k RMSNorm, every layer MoE, softmax top-k with renormalisation.
    "qwen3moe": {
        **_COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "moe_intermediate_size": 256,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 2,
    },
    # Qwen3-Next-80B-A3B's structure: 3 Gated DeltaNet layers then 1 gated-attention layer (GQA, partial rotary,
    # output gate, zero-centred q/k norms), MoE with top-k >= 2 plus the sigmoid-gated shared expert,
    # n_v = 2 n_k linear-attention heads, fused in_proj_qkvz / in_proj_ba projections.
    "qwen3next": {
        **_COMMON,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "partial_rotary_factor": 0.25,
        "rope_theta": 5000000.0,
        "rope_scaling": None,
        "intermediate_size": 512,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 256,
        "num_experts": 8,
        "num_experts_per_tok": 3,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    # Qwen3.5-35B-A3B's text model: as Qwen3-Next but separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a,
    # interleaved multi-section RoPE, fused 3-D expert tensors, and one multi-token-prediction block (mtp.*) that the
    # GGUF carries and transformers ignores.
    "qwen35moe": {
        **_COMMON,
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 256,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "mtp_num_hidden_layers": 1,
    },
}

ARCH_OF = {"qwen3moe": "qwen3moe", "qwen3next": "qwen3next", "qwen35moe": "qwen35moe"}  # golden id -> GGUF arch


def layer_types(cfg: dict) -> list[str]:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    n = cfg["num_hidden_layers"]
    if "linear_num_key_heads" not in cfg:
        return ["full_attention"] * n
    k = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]


@dataclass(frozen=True)
class Dist:
    """How one tensor's values are drawn: mean + std * N(0,1)-ish, or uniform on [lo, hi)."""

    kind: str  # "normal" | "uniform"
    a: float  # mean | lo
    b: float  # std | hi


def _normal(mean: float, std: float) -> Dist:
    return Dist("normal", mean, std)


def _uniform(lo: float, hi: float) -> Dist:
    return Dist("uniform", lo, hi)


# Output projections (o_proj, GDN out_proj, shared-expert down_proj) at 0.4 / sqrt(fan_in) and routed-expert down_proj
# at 0.2 / sqrt(fan_in): each layer then moves the residual stream by a fraction of its size, as in a trained network,
# instead of replacing it, and a router near a tie (which a correct quantized engine may break the other way) moves the
# logits of that token a little, not a lot. Routers at 3 / sqrt(fan_in) make the expert weights peaked, for the same
# reason. Removing a mixer still changes the logits by 13-28% (rms), a layer's routed experts by 8-12%.
OUT_GAIN = 0.4
EXPERT_OUT_GAIN = 0.2
ROUTER_GAIN = 3.0


def _w(fan_in: int, gain: float = 1.0) -> Dist:
    return _normal(0.0, gain / float(np.sqrt(fan_in)))


def _attention_specs(cfg: dict, p: str, gated: bool, centred: bool) -> dict[str, tuple[tuple[int, ...], Dist]]:
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    norm = _normal(0.0, 0.1) if centred else _normal(1.0, 0.1)
    return {
        f"{p}.self_attn.q_proj.weight": ((nq * hd * (2 if gated else 1), h), _w(h)),
        f"{p}.self_attn.k_proj.weight": ((nkv * hd, h), _w(h)),
        f"{p}.self_attn.v_proj.weight": ((nkv * hd, h), _w(h)),
        # gated attention halves its output through sigmoid(gate): a larger o_proj keeps the layer's share realistic
        f"{p}.self_attn.o_proj.weight": ((h, nq * hd), _w(nq * hd, OUT_GAIN * (2.0 if gated else 1.0))),
        f"{p}.self_attn.q_norm.weight": ((hd,), norm),
        f"{p}.self_attn.k_norm.weight": ((hd,), norm),
    }


def _gdn_specs(cfg: dict, p: str, fused: bool) -> dict[str, tuple[tuple[int, ...], Dist]]:
    h = cfg["hidden_size"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    kdim, vdim = nk * dk, nv * dv
    conv_dim = 2 * kdim + vdim
    s = {
        f"{p}.linear_attn.conv1d.weight": ((conv_dim, 1, cfg["linear_conv_kernel_dim"]), _normal(0.0, 0.3)),
        # A = exp(A_log) in [0.37, 12] and dt_bias in [-5, -1]: per-step decays from ~0.999 (long memory) to ~0.5.
        f"{p}.linear_attn.A_log": ((nv,), _uniform(-1.0, 2.5)),
        f"{p}.linear_attn.dt_bias": ((nv,), _uniform(-5.0, -1.0)),
        f"{p}.linear_attn.norm.weight": ((dv,), _normal(1.0, 0.1)),
        f"{p}.linear_attn.out_proj.weight": ((h, vdim), _w(vdim, OUT_GAIN)),
    }
    if fused:
        s[f"{p}.linear_attn.in_proj_qkvz.weight"] = ((2 * kdim + 2 * vdim, h), _w(h))
        s[f"{p}.linear_attn.in_proj_ba.weight"] = ((2 * nv, h), _w(h))
    else:
        s[f"{p}.linear_attn.in_proj_qkv.weight"] = ((conv_dim, h), _w(h))
        s[f"{p}.linear_attn.in_proj_z.weight"] = ((vdim, h), _w(h))
        s[f"{p}.linear_attn.in_proj_b.weight"] = ((nv, h), _w(h))
        s[f"{p}.linear_attn.in_proj_a.weight"] = ((nv, h), _w(h))
    return s


def _moe_specs(cfg: dict, p: str, fused_experts: bool, shared: bool) -> dict[str, tuple[tuple[int, ...], Dist]]:
    h, ne, ff = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    s: dict[str, tuple[tuple[int, ...], Dist]] = {
        f"{p}.mlp.gate.weight": ((ne, h), _w(h, ROUTER_GAIN)),
    }
    if fused_experts:
        s[f"{p}.mlp.experts.gate_up_proj"] = ((ne, 2 * ff, h), _w(h))
        s[f"{p}.mlp.experts.down_proj"] = ((ne, h, ff), _w(ff, EXPERT_OUT_GAIN))
    else:
        for e in range(ne):
            s[f"{p}.mlp.experts.{e}.gate_proj.weight"] = ((ff, h), _w(h))
            s[f"{p}.mlp.experts.{e}.up_proj.weight"] = ((ff, h), _w(h))
            s[f"{p}.mlp.experts.{e}.down_proj.weight"] = ((h, ff), _w(ff, EXPERT_OUT_GAIN))
    if shared:
        sh = cfg["shared_expert_intermediate_size"]
        s[f"{p}.mlp.shared_expert.gate_proj.weight"] = ((sh, h), _w(h))
        s[f"{p}.mlp.shared_expert.up_proj.weight"] = ((sh, h), _w(h))
        s[f"{p}.mlp.shared_expert.down_proj.weight"] = ((h, sh), _w(sh, OUT_GAIN))
        s[f"{p}.mlp.shared_expert_gate.weight"] = ((1, h), _w(h))
    return s


def weight_specs(model_id: str) -> dict[str, tuple[tuple[int, ...], Dist]]:
    """Every Hugging Face tensor of the model: name -> (shape, distribution), in checkpoint order."""
    cfg = CONFIGS[model_id]
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hybrid = model_id != "qwen3moe"
    centred = hybrid  # Qwen3-Next and Qwen3.5 use (1 + w) RMSNorms, stored around zero
    norm = _normal(0.0, 0.1) if centred else _normal(1.0, 0.1)
    specs: dict[str, tuple[tuple[int, ...], Dist]] = {
        "model.embed_tokens.weight": ((v, h), _normal(0.0, 1.0)),
    }
    types = layer_types(cfg)

    def block(p: str, kind: str) -> None:
        specs[f"{p}.input_layernorm.weight"] = ((h,), norm)
        if kind == "full_attention":
            specs.update(_attention_specs(cfg, p, gated=hybrid, centred=centred))
        else:
            specs.update(_gdn_specs(cfg, p, fused=(model_id == "qwen3next")))
        specs[f"{p}.post_attention_layernorm.weight"] = ((h,), norm)
        specs.update(_moe_specs(cfg, p, fused_experts=(model_id == "qwen35moe"), shared=hybrid))

    for il, kind in enumerate(types):
        block(f"model.layers.{il}", kind)
    specs["model.norm.weight"] = ((h,), norm)
    specs["lm_head.weight"] = ((v, h), _w(h, 2.5))
    for im in range(cfg.get("mtp_num_hidden_layers", 0)):
        # the multi-token-prediction block of Qwen3.5: fc([enorm(embedding), hnorm(hidden)]) -> one full-attention
        # decoder layer -> norm -> the shared lm_head
        specs["mtp.fc.weight"] = ((h, 2 * h), _w(2 * h))
        specs["mtp.pre_fc_norm_embedding.weight"] = ((h,), norm)
        specs["mtp.pre_fc_norm_hidden.weight"] = ((h,), norm)
        block(f"mtp.layers.{im}", "full_attention")
        specs["mtp.norm.weight"] = ((h,), norm)
    return specs


def generate_tensor(model_id: str, name: str, shape: tuple[int, ...], dist: Dist, seed: int = SEED) -> np.ndarray:
    n = int(np.prod(shape))
    key = f"{model_id}/{name}"
    if dist.kind == "normal":
        x = dist.a + dist.b * hashrng.normal(seed, key, n)
    elif dist.kind == "uniform":
        x = dist.a + (dist.b - dist.a) * hashrng.uniform(seed, key, n)
    else:
        raise ValueError(f"{name}: unknown distribution {dist.kind!r}")
    return hashrng.round_to_bf16(x.astype(np.float32)).reshape(shape)


# The output matrix favours one successor token per token (row succ[t] gets 0.07 x the embedding of t): like a trained
# model, the top prediction then stands clear of the rest (top-1/top-2 gaps >= 0.04 at every oracle position of every
# file, logits spanning about +-20), so top-1 agreement measures the engine and not near-ties of a flat distribution.
# The layers still shape every logit (see OUT_GAIN) and the top-1 varies from position to position.
SUCCESSOR_GAIN = 0.07


def successor(model_id: str, seed: int = SEED) -> np.ndarray:
    """A fixed random permutation of the vocabulary: succ[t] is the token the output matrix favours after t."""
    v = CONFIGS[model_id]["vocab_size"]
    return np.argsort(hashrng.hash64(seed, f"{model_id}/successor", v), kind="stable")


def generate_state(model_id: str, seed: int = SEED) -> dict[str, np.ndarray]:
    """The model's Hugging Face state dict (float32 arrays holding bfloat16-exact values)."""
    state = {}
    for name, (shape, dist) in weight_specs(model_id).items():
        if name == "lm_head.weight" and SUCCESSOR_GAIN:
            n = int(np.prod(shape))
            x = hashrng.normal(seed, f"{model_id}/{name}", n).reshape(shape) * dist.b
            succ = successor(model_id, seed)
            x[succ] += SUCCESSOR_GAIN * state["model.embed_tokens.weight"].astype(np.float64)
            state[name] = hashrng.round_to_bf16(x.astype(np.float32))
        else:
            state[name] = generate_tensor(model_id, name, shape, dist, seed)
    return state


def hf_config(model_id: str) -> dict:
    return copy.deepcopy(CONFIGS[model_id])
