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

    merged: Any = None         # [wqkv] or [wqk, wv] (merge()) | None
    merged_biases: Any = None  # their biases, [b] per merged weight | None

    @property
    def projections(self) -> list:
        """The weights the normed input goes through: columns side by side [q | k | v]."""
        return self.merged if self.merged is not None else [self.wq, self.wk, self.wv]

    @property
    def biases(self) -> list:
        return self.merged_biases if self.merged is not None else [self.bq, self.bk, self.bv]

    def merge(self, backend) -> "AttentionWeights":
        """q, k, v (or q, k) as one weight where the backend multiplies them as one
        (backend.merge_weights); wq, wk, wv and their biases are then dropped (projections
        and biases are the only way in). The column layout stays [q | k | v] (a gated
        attention's q: its [query | gate] heads)."""
        groups = ([self.wq, self.wk, self.wv], [self.bq, self.bk, self.bv]), \
                 ([self.wq, self.wk], [self.bq, self.bk])
        for ws, bs in groups:
            w = backend.merge_weights(ws)
            if w is None:
                continue
            b = None if all(x is None for x in bs) else backend.concat_rows(
                [x if x is not None else backend.zeros((wi.shape[0],)) for x, wi in zip(bs, ws)])
            self.merged, self.merged_biases = [w], [b]
            if len(ws) == 2:
                self.merged.append(self.wv)
                self.merged_biases.append(self.bv)
            self.wq = self.wk = self.wv = self.bq = self.bk = self.bv = None
            break
        return self

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


def gqa_attention(backend, w: AttentionWeights, projections, batch, kv, config):
    """Self-attention of one dense layer from the outputs of w.projections (with w.biases) on
    the normed input, columns [q | k | v] -> [T, hidden]: q/k norm, rotary and the KV write,
    then attention over the pages, in one op (backend.rope_kv_attention: one launch on CUDA
    decode steps, two on others)."""
    o = backend.rope_kv_attention(projections, kv, batch, config.n_head, config.rope_dim, config.rope_theta,
                                  config.rope_sections, w.q_norm, w.k_norm, config.rms_eps,
                                  1.0 / float(np.sqrt(config.head_dim)))
    return backend.matmul(o.reshape(o.shape[0], -1), w.wo, prefill_spans=batch.prefill_spans)


@dataclass
class FFNWeights:
    """SwiGLU feed-forward of one layer. gate_up: gate and up merged into one weight [2F,
    hidden] where the backend multiplies them as one (backend.merge_weights; gate and up
    are then None: the merged copy is the only one kept)."""

    gate: Any                  # [ffn, hidden] | None
    up: Any                    # [ffn, hidden] | None
    down: Any                  # [hidden, ffn]
    gate_up: Any = None        # [2 ffn, hidden] | None

    @classmethod
    def load(cls, backend, gguf, il: int) -> "FFNWeights":
        gate = backend.load_weight(gguf, blk(il, "ffn_gate.weight"))
        up = backend.load_weight(gguf, blk(il, "ffn_up.weight"))
        down = backend.load_weight(gguf, blk(il, "ffn_down.weight"))
        merged = backend.merge_weights([gate, up])
        if merged is not None:
            return cls(gate=None, up=None, down=down, gate_up=merged)
        return cls(gate=gate, up=up, down=down)

    @property
    def input_weights(self) -> list:
        """The weights x goes through before the SwiGLU: [gate_up] or [gate, up]."""
        return [self.gate_up] if self.gate_up is not None else [self.gate, self.up]


def swiglu_of(backend, projections: list):
    """swiglu_matmul's (gate, up) from the outputs of FFNWeights.input_weights."""
    return (projections[0], None) if len(projections) == 1 else tuple(projections)


def swiglu_ffn(backend, w: FFNWeights, x, prefill_spans=()):
    """x [T, hidden] (already normed) -> down(silu(gate x) * up x) [T, hidden]; the rows of
    prefill_spans are prompt rows (Backend.matmul)."""
    gate, up = swiglu_of(backend, backend.matmuls(x, w.input_weights, prefill_spans=prefill_spans))
    return backend.swiglu_matmul(gate, up, w.down, prefill_spans)


def ffn_block(backend, norm, w: FFNWeights, x, residual, eps: float, prefill_spans=()):
    """The FFN half of a pre-norm block on the residual stream: s = x + residual (residual
    None: s = x), -> (s, ffn(rmsnorm(s) * norm) [T, hidden]); the add, the norm and the
    matmuls' activation quantization are one fused op (backend.add_rmsnorm_matmuls). The
    rows of prefill_spans are prompt rows (Backend.matmul)."""
    s, projections = backend.add_rmsnorm_matmuls(x, residual, norm, eps, w.input_weights,
                                                 prefill_spans=prefill_spans)
    gate, up = swiglu_of(backend, projections)
    return s, backend.swiglu_matmul(gate, up, w.down, prefill_spans)


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

    def final_logits(self, x, pending, logits_indices: np.ndarray):
        """The logits [L, V] of rows logits_indices of x + pending (the last layer's residual stream
        [T, hidden] and its FFN output, or None): lm_head of those rows. Where they are every row in
        order (a decode or verify step), the add, the final norm and the output matrix are
        add_rmsnorm_matmuls (CUDA: one quantizing norm launch for the add, the norm and the LM head's
        x quantization), the same bits."""
        b = self.backend
        if pending is not None and np.array_equal(logits_indices, np.arange(x.shape[0])):
            _, (logits,) = b.add_rmsnorm_matmuls(x, pending, self.output_norm, self.config.rms_eps, [self.output])
            return logits
        if pending is not None:
            x = b.add(x, pending)
        return self.lm_head(b.take_rows(x, logits_indices))
