"""Draft-tree parent arrays: the one validator every layer uses (DESIGN.md sections 3 and 7).

A tree of N nodes lists `parents [N]`: -1 for node 0 (the root), and for every other node i
a parent p with 0 <= p < i (insertion order is topological). A committed path is the root
then each next node a child of the previous one.
"""
from __future__ import annotations

import numpy as np


def check_parents(parents, n: int | None = None) -> np.ndarray:
    """Validate a parent array [N] (N = n when given) -> int64 copy. ValueError names the
    first bad node."""
    parents = np.asarray(parents, dtype=np.int64)
    if parents.ndim != 1 or parents.size == 0 or (n is not None and parents.shape != (n,)):
        raise ValueError(f"tree parents must be [N{'' if n is None else '=' + str(n)}] with N >= 1, "
                         f"got shape {np.shape(parents)}")
    later = parents[1:]
    bad = np.nonzero(np.concatenate([[parents[0] != -1], (later < 0) | (later >= np.arange(1, parents.size))]))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"tree node {i} has parent {int(parents[i])}: node 0 is the root (parent -1) and "
                         "every other node's parent is an earlier node")
    return parents.astype(np.int64, copy=True)


def tree_depths(parents) -> np.ndarray:
    """[N] int64 depth of every node (0 for the root) of a validated parent array."""
    parents = check_parents(parents).tolist()      # Python ints: a verify step's host time
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return np.array(depths, dtype=np.int64)


def check_path(path, parents) -> list[int]:
    """A committed path [P] (node ids, root first) of the tree `parents` -> list of ints."""
    path = [int(p) for p in path]
    if not path or path[0] != 0 or any(b >= len(parents) or parents[b] != a for a, b in zip(path, path[1:])):
        raise ValueError(f"commit path {path} must start at the root (0) and follow parent links")
    return path
