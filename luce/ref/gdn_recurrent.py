"""Gated DeltaNet recurrence, one token at a time (kernel: cuda/gdn_recurrent.cu): the
arithmetic of AR decode rows, tree nodes and commit replay (DESIGN 3 and 5 rule 4).

Per token t and value head h, with state H [Dk, Dv]:
    H = exp(g_t) H                    decay
    u = beta_t (v_t - H^T k_t)        delta: what the decayed state mispredicts, scaled
    H = H + k_t u^T                   rank-one write
    o_t = H^T q_t                     read
q and k arrive L2-normalized per head (q also scaled by 1/sqrt(Dk)) and already repeated
from key heads to value heads; see `luce.models.gdn_layer`. The token update is split into
`gdn_decay`, `gdn_delta`, `gdn_write`, `gdn_read` so that tree verify (luce/ref/gdn_tree.py)
and the factor-replay commit run exactly the arithmetic of an AR step.
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


def gdn_decay(h: np.ndarray, g_t: np.ndarray) -> np.ndarray:
    """h [Hv, Dk, Dv] float64, g_t [Hv] f32 -> exp(g_t) h (float64)."""
    return h * np.exp(g_t.astype(np.float64))[:, None, None]


def gdn_delta(h_decayed: np.ndarray, k_t: np.ndarray, v_t: np.ndarray, beta_t: np.ndarray) -> np.ndarray:
    """u = beta (v - H^T k): h_decayed [Hv, Dk, Dv] float64, k_t [Hv, Dk], v_t [Hv, Dv],
    beta_t [Hv] f32 -> u [Hv, Dv] float64 (the factor a tree node keeps, DESIGN 3)."""
    predicted = np.einsum("hkv,hk->hv", h_decayed, k_t.astype(np.float64))
    return beta_t.astype(np.float64)[:, None] * (v_t.astype(np.float64) - predicted)


def gdn_write(h_decayed: np.ndarray, k_t: np.ndarray, u: np.ndarray) -> np.ndarray:
    """H + k u^T, rounded to f32 (the state is f32 between tokens), returned as float64:
    h_decayed [Hv, Dk, Dv] float64, k_t [Hv, Dk] f32, u [Hv, Dv] float64."""
    h = h_decayed + k_t.astype(np.float64)[:, :, None] * u[:, None, :]
    return h.astype(np.float32).astype(np.float64)


def gdn_read(h: np.ndarray, q_t: np.ndarray) -> np.ndarray:
    """o = H^T q: h [Hv, Dk, Dv] float64, q_t [Hv, Dk] f32 -> [Hv, Dv] float64."""
    return np.einsum("hkv,hk->hv", h, q_t.astype(np.float64))


def gdn_step(h: np.ndarray, q_t, k_t, v_t, g_t, beta_t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token from state h [Hv, Dk, Dv] (float64 holding f32 values): the update every AR
    row, tree node and commit shares (DESIGN 5 rule 4). q_t, k_t [Hv, Dk], v_t [Hv, Dv],
    g_t, beta_t [Hv] f32 -> (o_t [Hv, Dv] float64, new h float64, u [Hv, Dv] float64)."""
    decayed = gdn_decay(h, g_t)
    u = gdn_delta(decayed, k_t, v_t, beta_t)
    h_new = gdn_write(decayed, k_t, u)
    return gdn_read(h_new, q_t), h_new, u


def gdn_replay(h: np.ndarray, k_t, g_t, u: np.ndarray) -> np.ndarray:
    """Re-apply a token from its factors (k, g, u) without v, beta or q: bitwise the new
    state gdn_step left, when h is the state that step started from. -> new h float64."""
    return gdn_write(gdn_decay(h, g_t), k_t, u)


def gdn_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                  beta: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q, k [T, Hv, Dk] f32, v [T, Hv, Dv] f32, g (log decay, <= 0) and beta [T, Hv] f32,
    state [Hv, Dk, Dv] f32 -> (o [T, Hv, Dv] f32, new_state [Hv, Dk, Dv] f32).

    Accumulates in float64 within a token (`gdn_step`); the state is rounded to f32 after
    every token, so tokens split over calls give bitwise the same result as one call. The
    input state is not modified."""
    T, Hv, Dk, Dv = check_gdn_shapes(q, k, v, g, beta, state)
    h = state.astype(np.float64)
    o = np.empty((T, Hv, Dv), dtype=np.float64)
    for t in range(T):
        o[t], h, _ = gdn_step(h, q[t], k[t], v[t], g[t], beta[t])
    return o.astype(np.float32), h.astype(np.float32)
