"""A plain float64 numpy forward pass over a GGUF file's tensors, with llama.cpp's semantics for each architecture.

It reads the file the way an engine must (norm weights with +1 already folded in, ssm_a = -exp(A_log), the qwen3next
attn_qkv/attn_gate/ssm_ba layouts, qwen35moe's tiled V heads: v-head j reads k-head j mod n_k) and shares no code with
the converter's inverse. Agreement with the transformers oracle therefore checks the converter, the oracle and the
written-down semantics against each other. It is slow and simple on purpose: one sequence, no cache (decode logits are
the logits of the longer sequence), recurrent form of the gated delta rule.

Not a model of numerics: everything is float64; quantized tensors are dequantized first.
"""
from __future__ import annotations

import numpy as np

from . import models


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _rope_neox(x: np.ndarray, pos: np.ndarray, n_rot: int, theta: float) -> np.ndarray:
    """Rotate the first n_rot dims of x [T, H, D] in NeoX (rotate-half) pairs (i, i + n_rot/2)."""
    half = n_rot // 2
    inv_freq = theta ** (-np.arange(0, half, dtype=np.float64) * 2.0 / n_rot)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [T, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def quantize_q8_blocks(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x with each run of `block` values along the last axis rounded to int8 steps of max|x|/127 (as activations are
    quantized for Q8_0/Q8_1/Q8_K dot products), to estimate how far a correct quantized engine may drift."""
    shp = x.shape
    b = x.reshape(-1, shp[-1] // block, block)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
    q = np.where(d > 0, np.round(b / np.where(d > 0, d, 1.0)), 0.0)
    return (q * d).reshape(shp)


class NumpyModel:
    def __init__(self, model_id: str, tensors: dict[str, np.ndarray], act_quant_block: int = 0):
        self.act_quant_block = act_quant_block  # > 0: quantize every matmul input in blocks of this many values
        self.model_id = model_id
        self.arch = models.ARCH_OF[model_id]
        self.cfg = models.CONFIGS[model_id]
        self.t = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
        self.types = models.layer_types(self.cfg)

    def mm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """x @ w.T, w in ggml order [out, in] (numpy view of ne = {in, out})."""
        if self.act_quant_block:
            x = quantize_q8_blocks(x, self.act_quant_block)
        return x @ w.T

    # ---- mixers ----

    def attention(self, il: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        c, t = self.cfg, self.t
        p = f"blk.{il}."
        T = x.shape[0]
        nq, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        gated = self.arch != "qwen3moe"
        q = self.mm(x, t[p + "attn_q.weight"])
        if gated:  # per head [query(hd), gate(hd)]
            q = q.reshape(T, nq, 2 * hd)
            q, gate = q[..., :hd], q[..., hd:].reshape(T, nq * hd)
        else:
            q = q.reshape(T, nq, hd)
        k = self.mm(x, t[p + "attn_k.weight"]).reshape(T, nkv, hd)
        v = self.mm(x, t[p + "attn_v.weight"]).reshape(T, nkv, hd)
        eps = c["rms_norm_eps"]
        q = _rmsnorm(q, t[p + "attn_q_norm.weight"], eps)
        k = _rmsnorm(k, t[p + "attn_k_norm.weight"], eps)
        if self.arch == "qwen3moe":
            n_rot, theta = hd, c["rope_theta"]
        else:
            # qwen35moe's interleaved multi-section RoPE reduces to this when all position streams are equal (text)
            rp = c.get("rope_parameters") or {}
            n_rot = int(hd * c.get("partial_rotary_factor", rp.get("partial_rotary_factor", 0.25)))
            theta = rp.get("rope_theta", c.get("rope_theta"))
        q = _rope_neox(q, pos, n_rot, theta)
        k = _rope_neox(k, pos, n_rot, theta)
        group = nq // nkv
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        mask = np.triu(np.ones((T, T), dtype=bool), 1)
        scores = np.where(mask[None], -np.inf, scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        prob = np.exp(scores)
        prob /= prob.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", prob, v).reshape(T, nq * hd)
        if gated:
            o = o * _sigmoid(gate)
        return self.mm(o, t[p + "attn_output.weight"])

    def gated_delta_net(self, il: int, x: np.ndarray) -> np.ndarray:
        c, t = self.cfg, self.t
        p = f"blk.{il}."
        T = x.shape[0]
        n_k, n_v = c["linear_num_key_heads"], c["linear_num_value_heads"]
        d_k, d_v = c["linear_key_head_dim"], c["linear_value_head_dim"]
        r = n_v // n_k
        kdim = n_k * d_k
        qkv = self.mm(x, t[p + "attn_qkv.weight"])  # [T, 2 kdim + vdim]: all q heads, all k heads, all v heads
        z = self.mm(x, t[p + "attn_gate.weight"]).reshape(T, n_v, d_v)
        if self.arch == "qwen3next":
            ba = self.mm(x, t[p + "ssm_ba.weight"]).reshape(T, n_k, 2 * r)  # per k-head [b x r, a x r]
            b, a = ba[..., :r].reshape(T, n_v), ba[..., r:].reshape(T, n_v)
            k_head_of_v = np.arange(n_v) // r
        else:
            b = self.mm(x, t[p + "ssm_beta.weight"])
            a = self.mm(x, t[p + "ssm_alpha.weight"])
            k_head_of_v = np.arange(n_v) % n_k  # tiled V heads
        w = t[p + "ssm_conv1d.weight"]  # [conv_dim, K]
        K = w.shape[1]
        xp = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv], axis=0)
        conv = sum(w[:, i][None, :] * xp[i: i + T] for i in range(K))
        conv = _silu(conv)
        q = conv[:, :kdim].reshape(T, n_k, d_k)
        k = conv[:, kdim: 2 * kdim].reshape(T, n_k, d_k)
        v = conv[:, 2 * kdim:].reshape(T, n_v, d_v)
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6)
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
        q = q / np.sqrt(d_k)
        beta = _sigmoid(b)
        g = t[p + "ssm_a"][None, :] * _softplus(a + t[p + "ssm_dt.bias"][None, :])
        S = np.zeros((n_v, d_k, d_v))
        o = np.zeros((T, n_v, d_v))
        for s in range(T):
            qs, ks = q[s][k_head_of_v], k[s][k_head_of_v]  # [n_v, d_k]
            S = S * np.exp(g[s])[:, None, None]
            kv_mem = np.einsum("hkv,hk->hv", S, ks)
            delta = (v[s] - kv_mem) * beta[s][:, None]
            S = S + ks[:, :, None] * delta[:, None, :]
            o[s] = np.einsum("hkv,hk->hv", S, qs)
        o = _rmsnorm(o, t[p + "ssm_norm.weight"], c["rms_norm_eps"]) * _silu(z)
        return self.mm(o.reshape(T, n_v * d_v), t[p + "ssm_out.weight"])

    def moe(self, il: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, t = self.cfg, self.t
        p = f"blk.{il}."
        logits = x @ t[p + "ffn_gate_inp.weight"].T  # F32 router: activations stay float
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        k = c["num_experts_per_tok"]
        sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # ties: lower expert id first
        wsel = np.take_along_axis(probs, sel, axis=-1)
        if c.get("norm_topk_prob", True):
            wsel = wsel / wsel.sum(axis=-1, keepdims=True)
        gate_e, up_e, down_e = t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"], t[p + "ffn_down_exps.weight"]
        out = np.zeros_like(x)
        for e in np.unique(sel):
            rows, slot = np.nonzero(sel == e)  # tokens routed to expert e (each at most once)
            xe = x[rows]
            h = _silu(self.mm(xe, gate_e[e])) * self.mm(xe, up_e[e])
            out[rows] += wsel[rows, slot][:, None] * self.mm(h, down_e[e])
        if p + "ffn_gate_inp_shexp.weight" in t:
            sg = _sigmoid(x @ t[p + "ffn_gate_inp_shexp.weight"].reshape(-1))
            h = _silu(self.mm(x, t[p + "ffn_gate_shexp.weight"])) * self.mm(x, t[p + "ffn_up_shexp.weight"])
            out += sg[:, None] * self.mm(h, t[p + "ffn_down_shexp.weight"])
        return out, sel

    # ---- whole model ----

    def forward(self, tokens: list[int], trace: dict | None = None) -> np.ndarray:
        c, t = self.cfg, self.t
        eps = c["rms_norm_eps"]
        x = t["token_embd.weight"][np.asarray(tokens)]
        pos = np.arange(len(tokens))
        post = "ffn_norm.weight" if self.arch == "qwen3moe" else "post_attention_norm.weight"
        for il, kind in enumerate(self.types):
            xn = _rmsnorm(x, t[f"blk.{il}.attn_norm.weight"], eps)
            mix = self.attention(il, xn, pos) if kind == "full_attention" else self.gated_delta_net(il, xn)
            x = x + mix
            hn = _rmsnorm(x, t[f"blk.{il}.{post}"], eps)
            ffn, sel = self.moe(il, hn)
            x = x + ffn
            if trace is not None:
                trace.setdefault("mixer_rms", []).append(float(np.sqrt(np.mean(mix * mix))))
                trace.setdefault("moe_rms", []).append(float(np.sqrt(np.mean(ffn * ffn))))
                trace.setdefault("experts", []).append(sel)
        x = _rmsnorm(x, t["output_norm.weight"], eps)
        return self.mm(x, t["output.weight"])
