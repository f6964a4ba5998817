"""Gated DeltaNet recurrence, one token at a time (kernel: cuda/gdn_recurrent.cu): the
arithmetic of AR decode rows, tree nodes and commit replay (DESIGN 3 and 5 rule 4).

Per token t and value head h, with state H [Dk, Dv]:
    H = exp(g_t) H                    decay
    u = beta_t (v_t - H^T k_t)        delta: what the decayed state mispredicts, scaled
    H = H + k_t u^T                   rank-one write
    o_t = H^T q_t                     read
q and k arrive L2-normalized per head (q also scaled by 1/sqrt(Dk)) and already repeated
from key heads to value heads; see `luce.models.gdn_layer`.
"""
from __future__ import annotations

import numpy as np


def check_gdn_shapes(q, k, v, g, beta, state) -> tuple[int, int, int, int]:
    """Validate the shared GDN argument shapes; returns (T, Hv, Dk, Dv)."""
    if q.ndim != 3 or q.shape != k.shape:
        raise ValueError(f"gdn: q {q.shape} and k {k.shape} must both be [T, Hv, Dk]")
    T, Hv, Dk = q.shape
    if v.ndim != 3 or v.shape[:2] != (T, Hv):
        raise ValueError(f"gdn: v must be [T={T}, Hv={Hv}, Dv], got {v.shape}")
    Dv = v.shape[2]
    if g.shape != (T, Hv) or beta.shape != (T, Hv):
        raise ValueError(f"gdn: g {g.shape} and beta {beta.shape} must be [T={T}, Hv={Hv}]")
    if state.shape != (Hv, Dk, Dv):
        raise ValueError(f"gdn: state must be [Hv={Hv}, Dk={Dk}, Dv={Dv}], got {state.shape}")
    return T, Hv, Dk, Dv


def gdn_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                  beta: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q, k [T, Hv, Dk] f32, v [T, Hv, Dv] f32, g (log decay, <= 0) and beta [T, Hv] f32,
    state [Hv, Dk, Dv] f32 -> (o [T, Hv, Dv] f32, new_state [Hv, Dk, Dv] f32).

    Accumulates in float64 within a token; the state is rounded to f32 after every token, so
    tokens split over calls give bitwise the same result as one call. The input state is
    not modified."""
    T, Hv, Dk, Dv = check_gdn_shapes(q, k, v, g, beta, state)
    h = state.astype(np.float64)  # copy: [Hv, Dk, Dv]
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    decay = np.exp(g.astype(np.float64))
    b64 = beta.astype(np.float64)
    o = np.empty((T, Hv, Dv), dtype=np.float64)
    for t in range(T):
        h *= decay[t][:, None, None]
        predicted = np.einsum("hkv,hk->hv", h, k64[t])
        u = b64[t][:, None] * (v64[t] - predicted)                    # [Hv, Dv]
        h += k64[t][:, :, None] * u[:, None, :]
        h = h.astype(np.float32).astype(np.float64)  # the state is f32 between tokens
        o[t] = np.einsum("hkv,hk->hv", h, q64[t])
    return o.astype(np.float32), h.astype(np.float32)
