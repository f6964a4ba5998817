"""Gated DeltaNet in chunk (WY / UT-transform) form (kernel: cuda/gdn_chunked.cu): the
arithmetic of prefill segments. Same maths as `gdn_recurrent`, many tokens per matmul.

Within one chunk of L tokens, with G_t the inclusive cumulative sum of g inside the chunk
and S the state entering the chunk, the per-token deltas U [L, Dv] solve the unit lower
triangular system
    (I + A) U = beta * (V - exp(G) * (K S)),   A[t, s] = beta_t exp(G_t - G_s) (k_t . k_s), s < t
and then
    o_t   = exp(G_t) S^T q_t + sum_{s <= t} exp(G_t - G_s) (q_t . k_s) u_s
    S_new = exp(G_L) S + sum_s exp(G_L - G_s) k_s u_s^T.

Chunks follow absolute positions (DESIGN 5 rule 3): a segment starting at position p first
runs up to the next multiple of `chunk`, then whole chunks, so a prompt cut into segments
anywhere on chunk multiples reduces exactly like one long segment.
"""
from __future__ import annotations

import numpy as np

from luce.ref.gdn_recurrent import check_gdn_shapes

GDN_CHUNK = 64


def chunk_spans(start_pos: int, n_tokens: int, chunk: int = GDN_CHUNK) -> list[tuple[int, int]]:
    """[(begin, end)) offsets into a segment of n_tokens starting at absolute position
    start_pos, cut at absolute multiples of chunk."""
    if chunk <= 0 or start_pos < 0:
        raise ValueError(f"chunk_spans: need chunk > 0 and start_pos >= 0, got {chunk}, {start_pos}")
    spans = []
    begin = 0
    first = (-start_pos) % chunk or chunk
    end = min(first, n_tokens)
    while begin < n_tokens:
        spans.append((begin, end))
        begin, end = end, min(end + chunk, n_tokens)
    return spans


def delta_rule_groups(start_pos: int, n: int) -> list[tuple[int, int, str]]:
    """How a prefill segment of n rows starting at absolute position start_pos runs the delta
    rule: [(begin, end, 'chunked' | 'recurrent')]. Chunks are cut at absolute multiples of
    GDN_CHUNK; a chunk of one token takes the recurrent step (the AR-row arithmetic), and
    aligned chunks of more than one token share one chunked call. A row's result then
    depends only on its position and the tokens before it, never on how the prompt was cut
    into segments on chunk multiples, nor on whether a one-row segment is a prefill tail or
    an AR row (cuda/gdn_chunked.cu walks a segment the same way)."""
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


def _one_chunk(q, k, v, g, beta, h):
    """float64 per head: q, k [H, L, Dk], v [H, L, Dv], g, beta [H, L], h [H, Dk, Dv]
    -> (o [H, L, Dv], new h)."""
    L = q.shape[1]
    G = np.cumsum(g, axis=1)                                          # [H, L]
    strictly_lower = np.tril(np.ones((L, L), dtype=bool), -1)
    causal = np.tril(np.ones((L, L), dtype=bool))
    diff = G[:, :, None] - G[:, None, :]                              # G_t - G_s
    decay_lower = np.where(strictly_lower, np.exp(np.where(strictly_lower, diff, 0.0)), 0.0)
    decay_causal = np.where(causal, np.exp(np.where(causal, diff, 0.0)), 0.0)
    kk = np.einsum("htd,hsd->hts", k, k)
    A = beta[:, :, None] * decay_lower * kk                           # [H, L, L]
    rhs = beta[:, :, None] * (v - np.exp(G)[:, :, None] * np.einsum("htk,hkv->htv", k, h))
    U = np.linalg.solve(np.eye(L) + A, rhs)                           # [H, L, Dv]
    qk = np.einsum("htd,hsd->hts", q, k) * decay_causal
    o = np.exp(G)[:, :, None] * np.einsum("htk,hkv->htv", q, h) + np.einsum("hts,hsv->htv", qk, U)
    tail = np.exp(G[:, -1:] - G)                                      # exp(G_L - G_s) [H, L]
    h_new = np.exp(G[:, -1])[:, None, None] * h + np.einsum("hsk,hsv->hkv", k * tail[:, :, None], U)
    return o, h_new


def gdn_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                state: np.ndarray, chunk: int = GDN_CHUNK,
                start_pos: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """q, k [T, Hv, Dk] f32, v [T, Hv, Dv] f32, g and beta [T, Hv] f32, state [Hv, Dk, Dv] f32
    -> (o [T, Hv, Dv] f32, new_state [Hv, Dk, Dv] f32). `start_pos` is the absolute position
    of token 0 (chunks are cut at its multiples of `chunk`). Accumulates in float64 within a
    chunk; the state is rounded to f32 at every chunk boundary, as between calls, so a
    segment cut at chunk multiples gives bitwise the same result as one call."""
    T, Hv, Dk, Dv = check_gdn_shapes(q, k, v, g, beta, state)
    # float64, heads first: [T, H, ...] -> [H, T, ...]
    qh, kh, vh, gh, bh = (np.swapaxes(a.astype(np.float64), 0, 1) for a in (q, k, v, g, beta))
    h = state.astype(np.float64)
    o = np.empty((Hv, T, Dv), dtype=np.float64)
    for begin, end in chunk_spans(start_pos, T, chunk):
        sl = slice(begin, end)
        o[:, sl], h = _one_chunk(qh[:, sl], kh[:, sl], vh[:, sl], gh[:, sl], bh[:, sl], h)
        h = h.astype(np.float32).astype(np.float64)  # the state is f32 between chunks
    return np.swapaxes(o, 0, 1).astype(np.float32), h.astype(np.float32)
