"""The Gated DeltaNet token mixer of qwen35 (llama.cpp src/models/qwen35.cpp
build_layer_attn_linear; transformers Qwen3_5GatedDeltaNet), on any backend.

For rows x [T, hidden] (already RMS-normed):
    qkv = attn_qkv x [T, C]  (C = 2 Hk Dk + Hv Dv)     z = attn_gate x [T, Hv Dv]
    beta = sigmoid(ssm_beta x) [T, Hv]                  g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias)
    per segment: causal conv1d (K taps, state carried per slot) + SiLU -> split q, k, v
                 q, k L2-normed per head (q also / sqrt(Dk)), repeated from Hk key heads to Hv
                 value heads in TILED order (value head j reads key head j % Hk, matching the
                 GGUF's tiled value heads), delta rule with the slot's state
    out = ssm_out (gated_rmsnorm(o, z, ssm_norm) reshaped [T, Hv Dv])   [T, hidden]

Arithmetic (DESIGN 5 rules 1 and 3): segments are cut into chunks at absolute multiples of
GDN_CHUNK; chunks of several tokens take the chunked (prefill) path, a chunk of one token
(an AR row, or a prefill tail) the recurrent (decode) step (`delta_rule_groups`). Tree
segments (speculative verify) run that same step node by node along the tree without
advancing the slot's state (luce.models.gdn_tree); commit advances it along the path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from luce.models.gdn_tree import PendingTree, tree_conv, tree_delta_rule
from luce.models.layers import blk
from luce.models.tree_rows import segment_tree_parents
from luce.ref.gdn_chunked import GDN_CHUNK, chunk_spans

L2NORM_EPS = 1e-6  # transformers' l2norm (FLA); llama.cpp uses the RMS eps (1e-6 in Qwen3.5)


@dataclass
class GDNWeights:
    qkv: Any          # Weight [C, hidden]
    gate: Any         # Weight [Hv*Dv, hidden] (z)
    beta: Any         # Weight [Hv, hidden]
    alpha: Any        # Weight [Hv, hidden]
    out: Any          # Weight [hidden, Hv*Dv]
    conv: Any         # [C, K]
    dt_bias: Any      # [Hv]
    ssm_a: Any        # [Hv]  (-exp(A_log))
    norm: Any         # [Dv]

    @classmethod
    def load(cls, backend, gguf, il: int) -> "GDNWeights":
        w = lambda name: backend.load_weight(gguf, blk(il, name))  # noqa: E731
        t = lambda name: backend.load_tensor(gguf, blk(il, name))  # noqa: E731
        return cls(qkv=w("attn_qkv.weight"), gate=w("attn_gate.weight"), beta=w("ssm_beta.weight"),
                   alpha=w("ssm_alpha.weight"), out=w("ssm_out.weight"), conv=t("ssm_conv1d.weight"),
                   dt_bias=t("ssm_dt.bias"), ssm_a=t("ssm_a"), norm=t("ssm_norm.weight"))


@dataclass(frozen=True)
class GDNDims:
    n_k_heads: int
    n_v_heads: int
    head_dim: int     # Dk = Dv (ssm.state_size)
    conv_kernel: int

    @classmethod
    def of(cls, config) -> "GDNDims":
        return cls(config.ssm_n_k_heads, config.ssm_n_v_heads, config.ssm_state_size,
                   config.ssm_conv_kernel)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_channels)

    @property
    def gdn_state_shape(self) -> tuple[int, int, int]:
        return (self.n_v_heads, self.head_dim, self.head_dim)


def concat_rows(backend, parts: list):
    """Concatenate arrays [n_i, ...] along rows (one part: itself, no copy)."""
    return parts[0] if len(parts) == 1 else backend.concat_rows(parts)


def tiled_head_rows(n_rows: int, n_k_heads: int, n_v_heads: int) -> np.ndarray:
    """Row ids [n_rows * n_v_heads] into x [n_rows * n_k_heads, D] that repeat key heads to
    value heads in tiled order: value head j of row t reads key head j % n_k_heads."""
    t = np.arange(n_rows)[:, None] * n_k_heads
    return (t + np.arange(n_v_heads)[None, :] % n_k_heads).reshape(-1)


def delta_rule_groups(start_pos: int, n: int) -> list[tuple[int, int, str]]:
    """How a segment of n rows starting at absolute position start_pos runs the delta rule:
    [(begin, end, 'chunked' | 'recurrent')]. Chunks are cut at absolute multiples of
    GDN_CHUNK; a chunk of one token takes the recurrent step (the AR-row arithmetic), and
    aligned chunks of more than one token share one chunked call. The result of a row then
    depends only on its position and the tokens before it, never on how the prompt was cut
    into segments on chunk multiples, nor on whether a one-row segment is a prefill tail or
    an AR row."""
    groups: list[tuple[int, int, str]] = []
    for begin, end in chunk_spans(start_pos, n, GDN_CHUNK):
        kind = "recurrent" if end - begin == 1 else "chunked"
        aligned = (start_pos + begin) % GDN_CHUNK == 0
        if kind == "chunked" and aligned and groups and groups[-1][2] == "chunked" \
                and (start_pos + groups[-1][0]) % GDN_CHUNK == 0:
            groups[-1] = (groups[-1][0], end, kind)
        else:
            groups.append((begin, end, kind))
    return groups


def delta_rule_segment(backend, q, k, v, g, beta, state, start_pos: int):
    """Run one segment's rows q, k [n, Hv, Dk], v [n, Hv, Dv], g, beta [n, Hv] through the
    delta rule from `state` [Hv, Dk, Dv], grouped by `delta_rule_groups`.
    Returns (o [n, Hv, Dv], new state)."""
    groups = delta_rule_groups(start_pos, q.shape[0])
    outputs = []
    for begin, end, kind in groups:
        args = (q, k, v, g, beta)
        if len(groups) > 1:
            rows = np.arange(begin, end)
            args = tuple(backend.take_rows(a, rows) for a in args)
        if kind == "recurrent":
            o, state = backend.gdn_recurrent(*args, state)
        else:
            o, state = backend.gdn_chunked(*args, state, chunk=GDN_CHUNK)
        outputs.append(o)
    return concat_rows(backend, outputs), state


def qkv_heads(b, mixed, n: int, d: GDNDims):
    """Conv output [n, C] -> q, k [n, Hv, Dk] (L2-normed, q / sqrt(Dk), key heads tiled to
    value heads) and v [n, Hv, Dv]."""
    q_scale = b.asarray(np.full(1, 1.0 / np.sqrt(d.head_dim), dtype=np.float32))
    q, k, v = b.split(mixed, [d.key_dim, d.key_dim, d.value_dim])
    q = b.mul(b.l2norm(q.reshape(n, d.n_k_heads, d.head_dim), L2NORM_EPS), q_scale)
    k = b.l2norm(k.reshape(n, d.n_k_heads, d.head_dim), L2NORM_EPS)
    repeat = tiled_head_rows(n, d.n_k_heads, d.n_v_heads)
    q = b.take_rows(q.reshape(n * d.n_k_heads, d.head_dim), repeat).reshape(n, d.n_v_heads, d.head_dim)
    k = b.take_rows(k.reshape(n * d.n_k_heads, d.head_dim), repeat).reshape(n, d.n_v_heads, d.head_dim)
    return q, k, v.reshape(n, d.n_v_heads, d.head_dim)


def single_row_segments(batch) -> bool:
    """Is every live segment one row that is not a tree node (AR rows, one-row prompt tails)?
    Those take the recurrent step from their slot's state, all in one call."""
    n = np.diff(batch.qo_indptr)
    live = batch.seq_slots >= 0
    if not np.all(n[live] == 1):
        return False
    return batch.tree_parents is None or not np.any(np.asarray(batch.tree_parents) >= 0)


def gdn_mixer(backend, w: GDNWeights, x, batch, recurrent, il: int, dims: GDNDims, rms_eps: float,
              tree_mode: str = "factor"):
    """Gated DeltaNet layer il over all rows: x [T, hidden] (normed) -> [T, hidden].
    Reads and replaces each live segment's (il, slot) state in `recurrent`; a tree segment
    (luce.models.tree_rows) leaves the state as it is and stages what its commit needs
    (luce.models.gdn_tree, `tree_mode` 'factor' | 'baseline' | 'closed')."""
    b, d = backend, dims
    T = x.shape[0]
    qkv, z, beta, alpha = b.matmuls(x, [w.qkv, w.gate, w.beta, w.alpha])   # [T, C], [T, Hv*Dv], [T, Hv] x 2
    z = z.reshape(T, d.n_v_heads, d.head_dim)
    beta = b.sigmoid(beta)
    g = b.mul(b.softplus(b.add(alpha, w.dt_bias)), w.ssm_a)

    if single_row_segments(batch):   # decode: one launch per op over every slot, state in place
        conv_pool, gdn_pool = recurrent.pools(il)
        mixed = b.conv1d_segments(qkv, w.conv, conv_pool, batch)
        q, k, v = qkv_heads(b, mixed, T, d)
        o = b.gdn_recurrent_segments(q, k, v, g, beta, gdn_pool, batch)
        normed = b.gated_rmsnorm(o, z, w.norm, rms_eps)
        return b.matmul(normed.reshape(T, d.value_dim), w.out)

    outputs = []
    for s in range(batch.n_segments):
        r0, r1 = batch.segment_rows(s)
        n, slot = r1 - r0, int(batch.seq_slots[s])
        if n == 0:
            continue
        if slot < 0:  # padding: no state, zero output
            outputs.append(b.zeros((n, d.n_v_heads, d.head_dim)))
            continue
        rows = np.arange(r0, r1)
        parents = segment_tree_parents(batch, s)
        x_rows = b.take_rows(qkv, rows)
        if parents is not None:
            mixed = tree_conv(b, x_rows, w.conv, recurrent.conv(il, slot), parents)
            q, k, v = qkv_heads(b, mixed, n, d)
            o, kept = tree_delta_rule(b, tree_mode, q, k, v, b.take_rows(g, rows), b.take_rows(beta, rows),
                                      parents, recurrent.gdn(il, slot))
            recurrent.stage_tree(il, slot, PendingTree(parents, x_rows, tree_mode, **kept))
            outputs.append(o)
            continue
        mixed, conv_state = b.causal_conv1d(x_rows, w.conv, recurrent.conv(il, slot))
        q, k, v = qkv_heads(b, mixed, n, d)
        o, gdn_state = delta_rule_segment(b, q, k, v, b.take_rows(g, rows), b.take_rows(beta, rows),
                                          recurrent.gdn(il, slot), int(batch.positions[r0]))
        recurrent.store(il, slot, conv_state, gdn_state)
        outputs.append(o)
    o = concat_rows(b, outputs)                                         # [T, Hv, Dv]
    normed = b.gated_rmsnorm(o, z, w.norm, rms_eps)
    return b.matmul(normed.reshape(T, d.value_dim), w.out)
