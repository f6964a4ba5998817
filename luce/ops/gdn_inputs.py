"""A GDN layer's inputs as the backends' composition reads them (luce.ops.api FusedOps.conv_gdn_norm;
the CUDA backend's fused launches take the same widths and q scale): the projections' column blocks,
q / k L2-normed and tiled from key heads to value heads; and its output, the out projection of the
normed chain where conv_gdn_norm is given one (gdn_out_proj)."""
from __future__ import annotations

import numpy as np


def gdn_input_widths(conv_channels: int, n_v_heads: int, dv: int) -> list[int]:
    """Column widths of a GDN layer's projections side by side: [qkv | z | b | a]."""
    return [conv_channels, n_v_heads * dv, n_v_heads, n_v_heads]


def gdn_input_blocks(b, parts, widths) -> list:
    """parts [T, w_i] whose columns side by side are the blocks `widths`, each block inside one
    part -> the blocks as arrays [T, width]: a part that is one block as is, a merged part
    split (b.split: a copy per block; CUDA reads merged parts in place where it fuses)."""
    blocks, i = [], 0
    for part in parts:
        n, w = 0, 0
        while w < part.shape[-1] and i + n < len(widths):
            w, n = w + widths[i + n], n + 1
        if part.ndim != 2 or w != part.shape[-1] or n == 0:
            raise ValueError(f"parts {[p.shape for p in parts]} are not [T, w] column blocks of widths {list(widths)}")
        blocks += [part] if n == 1 else b.split(part, widths[i:i + n])
        i += n
    if i != len(widths):
        raise ValueError(f"parts {[p.shape for p in parts]} cover {i} of the column blocks {list(widths)}")
    return blocks


def gdn_q_scale(dk: int) -> float:
    """The f32 factor 1 / sqrt(Dk) a GDN layer's q takes after its L2 norm."""
    return float(np.float32(1.0 / np.sqrt(dk)))


def tiled_head_rows(n_rows: int, n_k_heads: int, n_v_heads: int) -> np.ndarray:
    """Row ids [n_rows * n_v_heads] into x [n_rows * n_k_heads, D] that repeat key heads to
    value heads in tiled order: value head j of row t reads key head j % n_k_heads."""
    t = np.arange(n_rows)[:, None] * n_k_heads
    return (t + np.arange(n_v_heads)[None, :] % n_k_heads).reshape(-1)


def gdn_qkv_heads(b, mixed, n: int, n_k_heads: int, n_v_heads: int, dk: int, dv: int, l2_eps: float):
    """Conv output [n, C] on backend b -> q, k [n, Hv, Dk] (L2-normed, q times gdn_q_scale(Dk),
    key heads tiled to value heads, tiled_head_rows) and v [n, Hv, Dv]."""
    q_scale = b.asarray(np.full(1, gdn_q_scale(dk), dtype=np.float32))
    q, k, v = b.split(mixed, [n_k_heads * dk, n_k_heads * dk, n_v_heads * dv])
    q = b.mul(b.l2norm(q.reshape(n, n_k_heads, dk), l2_eps), q_scale)
    k = b.l2norm(k.reshape(n, n_k_heads, dk), l2_eps)
    repeat = tiled_head_rows(n, n_k_heads, n_v_heads)
    q = b.take_rows(q.reshape(n * n_k_heads, dk), repeat).reshape(n, n_v_heads, dk)
    k = b.take_rows(k.reshape(n * n_k_heads, dk), repeat).reshape(n, n_v_heads, dk)
    return q, k, v.reshape(n, n_v_heads, dv)


def gdn_out_proj(b, normed, out_proj, batch):
    """conv_gdn_norm's result: normed [T, Hv, Dv] as is (out_proj None), else
    b.matmul(normed [T, Hv*Dv], out_proj, prefill_spans=batch.prefill_spans)."""
    if out_proj is None:
        return normed
    return b.matmul(normed.reshape(normed.shape[0], int(np.prod(normed.shape[1:]))), out_proj,
                    prefill_spans=batch.prefill_spans)
