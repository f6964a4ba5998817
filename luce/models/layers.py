"""Blocks shared by the models: GQA self-attention pieces and the SwiGLU FFN.

Every function takes the backend first and touches arrays only through it. Tensor names
are llama.cpp's (`blk.{il}.attn_q.weight`, ...).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def blk(il: int, name: str) -> str:
    """GGUF tensor name of layer il: blk(3, 'attn_q.weight') -> 'blk.3.attn_q.weight'."""
    return f"blk.{il}.{name}"


def optional_tensor(backend, gguf, name: str):
    """backend.load_tensor(name), or None when the file has no such tensor."""
    return backend.load_tensor(gguf, name) if name in gguf.tensors else None


@dataclass
class AttentionWeights:
    """Plain GQA attention of one layer (qwen2: biases; qwen3: per-head q/k norms)."""

    wq: Any                    # [Hq*D, hidden]
    wk: Any                    # [Hkv*D, hidden]
    wv: Any                    # [Hkv*D, hidden]
    wo: Any                    # [hidden, Hq*D]
    bq: Any = None             # [Hq*D] | None
    bk: Any = None             # [Hkv*D] | None
    bv: Any = None             # [Hkv*D] | None
    q_norm: Any = None         # [D] | None
    k_norm: Any = None         # [D] | None

    @classmethod
    def load(cls, backend, gguf, il: int) -> "AttentionWeights":
        return cls(
            wq=backend.load_weight(gguf, blk(il, "attn_q.weight")),
            wk=backend.load_weight(gguf, blk(il, "attn_k.weight")),
            wv=backend.load_weight(gguf, blk(il, "attn_v.weight")),
            wo=backend.load_weight(gguf, blk(il, "attn_output.weight")),
            bq=optional_tensor(backend, gguf, blk(il, "attn_q.bias")),
            bk=optional_tensor(backend, gguf, blk(il, "attn_k.bias")),
            bv=optional_tensor(backend, gguf, blk(il, "attn_v.bias")),
            q_norm=optional_tensor(backend, gguf, blk(il, "attn_q_norm.weight")),
            k_norm=optional_tensor(backend, gguf, blk(il, "attn_k_norm.weight")),
        )


def qk_norm_rope(backend, q, k, positions: np.ndarray, config, q_norm=None, k_norm=None):
    """Per-head RMSNorm (when given) then rotary on q [T, Hq, D] and k [T, Hkv, D]
    (llama.cpp qwen3: norm before rope). Rotary: config.rope_dim dims, rope_theta,
    rope_sections (M-RoPE) when the config has them."""
    if q_norm is not None:
        q = backend.rmsnorm(q, q_norm, config.rms_eps)
    if k_norm is not None:
        k = backend.rmsnorm(k, k_norm, config.rms_eps)
    q = backend.rope(q, positions, config.rope_dim, config.rope_theta, config.rope_sections)
    k = backend.rope(k, positions, config.rope_dim, config.rope_theta, config.rope_sections)
    return q, k


def attend(backend, q, k, v, kv, batch, scale: float, causal: bool = True):
    """Write this step's k, v [T, Hkv, D] into the layer's pages, then attend
    q [T, Hq, D] over each segment's KV -> [T, Hq*D]."""
    backend.kv_write(kv, batch, k, v)
    o = backend.attention(q, kv, batch, scale, causal)
    return o.reshape(o.shape[0], -1)


def gqa_attention(backend, w: AttentionWeights, x, batch, kv, config):
    """Self-attention of one dense layer: x [T, hidden] (already normed) -> [T, hidden]."""
    T, D = x.shape[0], config.head_dim
    P = batch.prefill_spans
    q, k, v = backend.matmuls(x, [w.wq, w.wk, w.wv], [w.bq, w.bk, w.bv], prefill_spans=P)
    q, k, v = q.reshape(T, config.n_head, D), k.reshape(T, config.n_head_kv, D), v.reshape(T, config.n_head_kv, D)
    q, k = qk_norm_rope(backend, q, k, batch.positions, config, w.q_norm, w.k_norm)
    o = attend(backend, q, k, v, kv, batch, 1.0 / float(np.sqrt(D)))
    return backend.matmul(o, w.wo, prefill_spans=P)


@dataclass
class FFNWeights:
    """SwiGLU feed-forward of one layer."""

    gate: Any                  # [ffn, hidden]
    up: Any                    # [ffn, hidden]
    down: Any                  # [hidden, ffn]

    @classmethod
    def load(cls, backend, gguf, il: int) -> "FFNWeights":
        return cls(gate=backend.load_weight(gguf, blk(il, "ffn_gate.weight")),
                   up=backend.load_weight(gguf, blk(il, "ffn_up.weight")),
                   down=backend.load_weight(gguf, blk(il, "ffn_down.weight")))


def swiglu_ffn(backend, w: FFNWeights, x, prefill_spans=()):
    """x [T, hidden] (already normed) -> down(silu(gate x) * up x) [T, hidden]; the rows of
    prefill_spans are prompt rows (Backend.matmul)."""
    gate, up = backend.matmuls(x, [w.gate, w.up], prefill_spans=prefill_spans)
    return backend.matmul(backend.swiglu(gate, up), w.down, prefill_spans=prefill_spans)


class TokenIO:
    """Embedding and LM head of a target model with `backend`, `config`, `token_embd`,
    `output_norm` and `output` (the DFlash draft borrows both from its target)."""

    def embed(self, token_ids):
        """token_ids [T] int -> [T, hidden] f32."""
        return self.backend.embedding(self.token_embd, token_ids)

    def lm_head(self, hidden):
        """hidden [L, hidden] -> logits [L, V] f32: final RMSNorm then the output matrix."""
        b = self.backend
        return b.matmul(b.rmsnorm(hidden, self.output_norm, self.config.rms_eps), self.output)
