"""The operands of a gated attention's output gate (luce.ops.api gate_output_matmul): the
attention output o and qg, each head's query then its gate, either as qg [T, H, 2D] or as the
first 2HD columns of a merged projection's output [T, W] (q|gate beside k, or k and v: the
merged weight's one matmul), which CUDA reads in place at its row stride W."""
from __future__ import annotations


def gate_layout(o, qg) -> tuple[int, int, int, int]:
    """(T, H, D, qg's row stride in elements) of o [T, H*D] with qg [T, H, 2D], or of
    o [T, H, D] with qg [T, W >= 2HD]; ValueError for anything else."""
    if qg.ndim == 3:
        T, H, D = qg.shape[0], qg.shape[1], qg.shape[2] // 2
        if o.shape not in ((T, H * D), (T, H, D)) or qg.shape[2] != 2 * D:
            raise ValueError(f"gate: o {o.shape} is not [T, H*D] = [{T}, {H * D}] for qg {qg.shape}")
        return T, H, D, 2 * H * D
    if o.ndim != 3 or qg.ndim != 2 or qg.shape[0] != o.shape[0] or qg.shape[1] < 2 * o.shape[1] * o.shape[2]:
        raise ValueError(f"gate: o {o.shape}, qg {qg.shape}: want o [T, H*D] with qg [T, H, 2D], or o [T, H, D] "
                         "with qg [T, W >= 2HD] (its first 2HD columns)")
    T, H, D = o.shape
    return T, H, D, qg.shape[1]


def gate_operands(b, o, qg):
    """(o [T, H*D], qg [T, H, 2D]) for the composition: a merged projection's qg columns split
    off first (b.split: a copy)."""
    T, H, D, stride = gate_layout(o, qg)
    if qg.ndim == 2:
        qg = b.split(qg, [2 * H * D, stride - 2 * H * D])[0] if stride > 2 * H * D else qg
    return o.reshape(T, H * D), qg.reshape(T, H, 2 * D)
