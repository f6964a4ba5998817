"""Gated DeltaNet over a draft tree (DESIGN.md section 3): tree verify and commit.

A tree of N nodes (node 0 the root, parents[i] < i, parents[0] = -1) hangs off the
resident state h0: node i's state is its parent's state (h0 for the root) advanced by
node i's token. Three ways to compute the node outputs and the committed state:

- exact factor capture (`gdn_tree_verify` + `gdn_tree_commit`, the default): a depth-first
  walk runs `gdn_step` (the AR step's own arithmetic) with one running state, saving a copy
  only at branch points while siblings remain. Per node it keeps the factors (k, g, beta,
  u); commit replays the accepted path's factors on h0 with `gdn_replay`. Outputs and the
  committed state are bitwise those of AR decoding of the same tokens.
- per-node stored states (`gdn_tree_verify_baseline`, as Luce DFlash does): every node's
  state is kept [N, Hv, Dk, Dv]; commit copies the accepted leaf's state. Same outputs.
- closed form (`gdn_tree_closed_form`, optional fast mode): all nodes from h0 and the
  ancestor factors in one solve, the tree-masked chunk form of DESIGN 3. Not bitwise equal
  to AR (no f32 rounding between tokens); tested against the baseline to f32 tolerance.

Shapes: q, k [N, Hv, Dk] f32 (as the AR step takes them), v [N, Hv, Dv], g, beta [N, Hv],
state [Hv, Dk, Dv] f32. u is kept at the step's working precision (float64 here; the
device kernel's is f32).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from luce.ref.gdn_recurrent import check_gdn_shapes, gdn_replay, gdn_step
from luce.ref.tree import check_parents, check_path


@dataclass
class TreeFactors:
    """Per-node factors of a verified tree: all a commit needs besides the resident state."""

    k: np.ndarray      # [N, Hv, Dk] f32
    g: np.ndarray      # [N, Hv] f32
    beta: np.ndarray   # [N, Hv] f32 (kept for the closed form; replay does not read it)
    u: np.ndarray      # [N, Hv, Dv] float64: beta (v - (exp(g) h_parent)^T k)


def children_lists(parents: np.ndarray) -> list[list[int]]:
    """children[i]: the children of node i in index order."""
    children: list[list[int]] = [[] for _ in range(len(parents))]
    for i in range(1, len(parents)):
        children[int(parents[i])].append(i)
    return children


def subtree_sizes(parents: np.ndarray) -> np.ndarray:
    """[N] int: nodes in each node's subtree, itself included."""
    sizes = np.ones(len(parents), dtype=np.int64)
    for i in range(len(parents) - 1, 0, -1):
        sizes[parents[i]] += sizes[i]
    return sizes


def gdn_tree_verify(q, k, v, g, beta, parents, state) -> tuple[np.ndarray, TreeFactors, int]:
    """Exact factor capture. -> (o [N, Hv, Dv] f32, factors, peak number of saved states).

    The walk holds one running state; a node with c > 1 children saves its state once and
    every child but the last restores from it. Children are visited smallest subtree first,
    so a save is alive only while the walk is inside a subtree of at most half its branch
    node's size: at most floor(log2 N) saves at once (the third return value, for the
    memory plan). The order changes no bits: every node starts from its parent's state."""
    N, Hv, Dk, Dv = check_gdn_shapes(q, k, v, g, beta, state)
    parents = check_parents(parents, N)
    children = children_lists(parents)
    sizes = subtree_sizes(parents)
    children = [sorted(c, key=lambda i: (sizes[i], i)) for c in children]
    o = np.empty((N, Hv, Dv), dtype=np.float64)
    u = np.empty((N, Hv, Dv), dtype=np.float64)
    saved: dict[int, np.ndarray] = {}   # branch node -> its state, while children remain
    pending = [0]                        # depth-first stack of nodes to visit
    h = state.astype(np.float64)         # running state = state of the parent of pending[-1]
    peak = 0
    while pending:
        node = pending.pop()
        parent = int(parents[node])
        if parent >= 0 and parent in saved:
            h = saved[parent]
            if children[parent][-1] == node:  # last child consumes the save
                del saved[parent]
        o[node], h, u[node] = gdn_step(h, q[node], k[node], v[node], g[node], beta[node])
        if len(children[node]) > 1:
            saved[node] = h
            peak = max(peak, len(saved))
        pending.extend(reversed(children[node]))
    factors = TreeFactors(k=np.array(k, dtype=np.float32), g=np.array(g, dtype=np.float32),
                          beta=np.array(beta, dtype=np.float32), u=u)
    return o.astype(np.float32), factors, peak


def gdn_tree_commit(state, factors: TreeFactors, path, parents) -> np.ndarray:
    """Replay the accepted path's factors on the resident state [Hv, Dk, Dv] f32 with the
    AR step's own update -> new state f32 (bitwise what AR decoding leaves)."""
    path = check_path(path, check_parents(parents, factors.u.shape[0]))
    h = np.asarray(state, dtype=np.float32).astype(np.float64)
    for node in path:
        h = gdn_replay(h, factors.k[node], factors.g[node], factors.u[node])
    return h.astype(np.float32)


def gdn_tree_verify_baseline(q, k, v, g, beta, parents, state) -> tuple[np.ndarray, np.ndarray]:
    """Per-node stored states: -> (o [N, Hv, Dv] f32, node_states [N, Hv, Dk, Dv] f32).
    Node i starts from node_states[parents[i]] (the resident state for the root)."""
    N, Hv, Dk, Dv = check_gdn_shapes(q, k, v, g, beta, state)
    parents = check_parents(parents, N)
    o = np.empty((N, Hv, Dv), dtype=np.float64)
    states = np.empty((N, Hv, Dk, Dv), dtype=np.float32)
    for node in range(N):
        p = int(parents[node])
        h = (state if p < 0 else states[p]).astype(np.float64)
        o[node], h, _ = gdn_step(h, q[node], k[node], v[node], g[node], beta[node])
        states[node] = h.astype(np.float32)
    return o.astype(np.float32), states


def gdn_tree_commit_baseline(node_states: np.ndarray, path, parents) -> np.ndarray:
    """The accepted leaf's stored state (a copy) [Hv, Dk, Dv] f32."""
    path = check_path(path, check_parents(parents, node_states.shape[0]))
    return np.array(node_states[path[-1]], dtype=np.float32)


def _root_path_sums(g64: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """G [N, Hv]: the sum of g along each node's root path, inclusive."""
    G = np.empty_like(g64)
    for i in range(len(parents)):
        G[i] = g64[i] + (G[parents[i]] if parents[i] >= 0 else 0.0)
    return G


def gdn_tree_closed_form(q, k, v, g, beta, parents, state) -> tuple[np.ndarray, np.ndarray]:
    """Tree-masked chunk form (DESIGN 3) in float64 -> (o [N, Hv, Dv] f32, U [N, Hv, Dv]
    float64). anc(r) = proper ancestors of r:
        (I + A) U = beta * (V - exp(G) * (K h0)),  A[r, s] = beta_r exp(G_r - G_s) (k_r . k_s), s in anc(r)
        o_r = exp(G_r) q_r^T h0 + sum_{s in anc(r) + {r}} exp(G_r - G_s) (q_r . k_s) u_s"""
    N, Hv, Dk, Dv = check_gdn_shapes(q, k, v, g, beta, state)
    parents = check_parents(parents, N)
    anc = np.zeros((N, N), dtype=bool)      # anc[r, s]: s is r or an ancestor of r
    for r in range(N):
        if parents[r] >= 0:
            anc[r] = anc[parents[r]]
        anc[r, r] = True
    strict = anc & ~np.eye(N, dtype=bool)
    qh, kh, vh, gh, bh = (np.swapaxes(np.asarray(a, dtype=np.float64), 0, 1) for a in (q, k, v, g, beta))
    G = np.swapaxes(_root_path_sums(np.asarray(g, dtype=np.float64), parents), 0, 1)  # [Hv, N]
    h0 = np.asarray(state, dtype=np.float64)
    diff = G[:, :, None] - G[:, None, :]                                # G_r - G_s
    decay_strict = np.where(strict, np.exp(np.where(strict, diff, 0.0)), 0.0)
    decay_incl = np.where(anc, np.exp(np.where(anc, diff, 0.0)), 0.0)
    A = bh[:, :, None] * decay_strict * np.einsum("hrd,hsd->hrs", kh, kh)
    rhs = bh[:, :, None] * (vh - np.exp(G)[:, :, None] * np.einsum("hrk,hkv->hrv", kh, h0))
    U = np.linalg.solve(np.eye(N) + A, rhs)                              # [Hv, N, Dv]
    qk = np.einsum("hrd,hsd->hrs", qh, kh) * decay_incl
    o = np.exp(G)[:, :, None] * np.einsum("hrk,hkv->hrv", qh, h0) + np.einsum("hrs,hsv->hrv", qk, U)
    return np.swapaxes(o, 0, 1).astype(np.float32), np.swapaxes(U, 0, 1)


def gdn_tree_commit_closed_form(state, k, g, u, path, parents) -> np.ndarray:
    """h_a = exp(G_a) h0 + sum_{s in path(a)} exp(G_a - G_s) k_s u_s^T for the path's last
    node a, in float64 -> [Hv, Dk, Dv] f32. k [N, Hv, Dk], g [N, Hv], u [N, Hv, Dv]."""
    path = check_path(path, check_parents(parents, len(g)))
    g64 = np.asarray(g, dtype=np.float64)[path]                          # [P, Hv]
    G = np.cumsum(g64, axis=0)
    tail = np.exp(G[-1][None, :] - G)                                    # exp(G_a - G_s) [P, Hv]
    k64 = np.asarray(k, dtype=np.float64)[path]
    u64 = np.asarray(u, dtype=np.float64)[path]
    h = np.exp(G[-1])[:, None, None] * np.asarray(state, dtype=np.float64)
    h = h + np.einsum("phk,phv->hkv", k64 * tail[:, :, None], u64)
    return h.astype(np.float32)
