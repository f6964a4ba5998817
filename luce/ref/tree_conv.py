"""Causal conv1d over a draft tree (kernel family: conv1d tree gather), DESIGN.md section 3.

A tree node's window is the K-1 inputs before it along its root path: its ancestors'
inputs, topped up from the resident conv state [K-1, C] when the path is shorter. Each
node runs `causal_conv1d` (the AR step's function) on its own row with that window, so its
output is bitwise what AR decoding of its path gives. Commit gathers the window of the
accepted path's last node: the same K-1 inputs AR decoding would leave as the conv state.
"""
from __future__ import annotations

import numpy as np

from luce.ref.conv1d import causal_conv1d
from luce.ref.tree import check_parents, check_path


def path_window(x: np.ndarray, state: np.ndarray, parents: np.ndarray, node: int) -> np.ndarray:
    """The K-1 conv inputs before position of `node` along its root path, oldest first:
    x [N, C] tree rows' inputs, state [K-1, C] resident window -> [K-1, C] f32.
    node = -1 gives the resident window itself."""
    width = state.shape[0]
    rows = []
    p = int(parents[node]) if node >= 0 else -1
    while p >= 0 and len(rows) < width:
        rows.append(x[p])
        p = int(parents[p])
    rows = rows[::-1]
    need = width - len(rows)
    head = state[state.shape[0] - need:] if need else state[:0]
    return np.concatenate([head, np.asarray(rows, dtype=np.float32).reshape(-1, x.shape[1])]).astype(np.float32)


def conv_tree(x: np.ndarray, weight: np.ndarray, state: np.ndarray, parents, silu: bool = True) -> np.ndarray:
    """x [N, C] f32 tree rows' conv inputs, weight [C, K], state [K-1, C], parents [N]
    -> y [N, C] f32 (node i convolved over its own root path)."""
    parents = check_parents(parents, x.shape[0])
    y = np.empty(x.shape, dtype=np.float32)
    for node in range(x.shape[0]):
        y[node] = causal_conv1d(x[node:node + 1], weight, path_window(x, state, parents, node), silu=silu)[0][0]
    return y


def conv_tree_commit(x: np.ndarray, state: np.ndarray, path, parents) -> np.ndarray:
    """The conv state after committing `path` (root first): the last K-1 inputs of
    concat(state, x[path]) -> [K-1, C] f32."""
    parents = check_parents(parents, x.shape[0])
    path = check_path(path, parents)
    window = np.concatenate([np.asarray(state, dtype=np.float32), np.asarray(x, dtype=np.float32)[path]])
    return np.ascontiguousarray(window[len(window) - state.shape[0]:])
