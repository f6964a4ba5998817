"""Tree rows in a ForwardBatch (speculative verify, DESIGN.md sections 2, 3 and 7).

A tree segment is a live segment some of whose rows have a parent (`batch.tree_parents`
[T] int32: the global row of each row's parent, -1 for the root and for rows of ordinary
segments). Its first row is the root (the slot's newest token) and every other row's
parent is an earlier row of the same segment. With n rows and kv_len(s) KV rows after the
step, P = kv_len(s) - n is the slot's committed length and:
- row j writes its K/V at KV index P + j (the ordinary rule: scratch rows in the slot's
  own pages beyond what is committed; nothing reads them unless committed);
- row j sits at position P + depth(j) (depth 0 for the root);
- row j attends to KV indices 0..P-1 and then P + a for a on its root path (root first,
  itself last): the keys, in the order, an AR row at its position sees once the path is
  committed (luce/ref/tree_attention.py);
- recurrent layers run the AR step along the tree without advancing the slot's state and
  keep per-node factors until `commit_tree_rows` (luce.models.gdn_tree).
A tree of the root alone is an ordinary one-row segment (an AR row) in every respect.

`validate_batch` is ForwardBatch.validate extended to these rules (ForwardBatch.validate
itself rejects tree rows until the batch owner adopts them).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from luce.models.batch import ForwardBatch


def local_tree_parents(batch) -> np.ndarray:
    """[T] int64: each row's parent as a row of its own segment (-1 for roots, ordinary and
    padding rows), computed once per batch. segment_tree_parents hands out views of it (a
    GPU backend mirrors the array once per step, luce/ops/cuda_step_meta.py)."""
    cached = batch.__dict__.get("_local_tree_parents")
    if cached is not None:
        return cached
    out = np.full(batch.n_rows, -1, dtype=np.int64)
    if batch.tree_parents is not None:
        for s in range(batch.n_segments):
            r0, r1 = batch.segment_rows(s)
            if batch.seq_slots[s] >= 0 and r1 > r0:
                parents = np.asarray(batch.tree_parents[r0:r1], dtype=np.int64)
                out[r0:r1] = np.where(parents >= 0, parents - r0, -1)
    batch.__dict__["_local_tree_parents"] = out
    return out


def segment_tree_parents(batch, s: int) -> np.ndarray | None:
    """Local parents [n] int64 (root -1) of segment s if it is a tree segment, else None
    (a view of local_tree_parents(batch))."""
    if batch.tree_parents is None or batch.seq_slots[s] < 0:
        return None
    r0, r1 = batch.segment_rows(s)
    parents = local_tree_parents(batch)[r0:r1]
    if not (parents >= 0).any():
        return None
    return parents


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """[n] int64 depth of each node of a local parent array (parents precede children)."""
    depths = np.zeros(len(parents), dtype=np.int64)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths


def has_tree_segments(batch) -> bool:
    return batch.tree_parents is not None and bool((np.asarray(batch.tree_parents) >= 0).any())


def validate_batch(batch) -> None:
    """ForwardBatch.validate, accepting tree segments (the rules above)."""
    if batch.tree_parents is None:
        ForwardBatch.validate(batch)
        return
    T = batch.n_rows
    tp = np.asarray(batch.tree_parents)
    if tp.shape != (T,):
        raise ValueError(f"ForwardBatch.tree_parents has shape {tp.shape}, expected ({T},)")
    positions = np.array(batch.positions, copy=True)
    for s in range(batch.n_segments):
        r0, r1 = batch.segment_rows(s)
        rows = tp[r0:r1]
        if not (rows >= 0).any():
            continue
        if batch.seq_slots[s] < 0:
            raise ValueError(f"segment {s}: padding rows cannot have tree parents")
        if rows[0] != -1 or any(not r0 <= rows[j] < r0 + j for j in range(1, r1 - r0)):
            raise ValueError(f"segment {s}: tree_parents {rows.tolist()} must be -1 for the root (row {r0}) "
                             f"and an earlier row of the segment for every other row")
        kv_len = batch.kv_len(s)
        want = kv_len - (r1 - r0) + tree_depths(np.where(rows >= 0, rows - r0, -1))
        if not np.array_equal(batch.positions[r0:r1], want):
            raise ValueError(f"segment {s}: tree row positions {batch.positions[r0:r1].tolist()} must be the "
                             f"committed length plus the depth: {want.tolist()}")
        positions[r0:r1] = np.arange(kv_len - (r1 - r0), kv_len)
    # everything else is what ForwardBatch checks for ordinary segments
    ForwardBatch.validate(dataclasses.replace(batch, tree_parents=None, positions=positions))


def ordinary_view(batch):
    """The batch with tree segments turned into padding (for ops that do not know trees)."""
    slots = np.array(batch.seq_slots, copy=True)
    for s in range(batch.n_segments):
        if segment_tree_parents(batch, s) is not None:
            slots[s] = -1
    return dataclasses.replace(batch, seq_slots=slots, tree_parents=None)


def tree_kv_moves(pages, prefix_len: int, path) -> tuple[np.ndarray, np.ndarray]:
    """The KV row moves of committing `path`: (src, dst) [n] int64 flat rows (page *
    PAGE_SIZE + offset); the row of the path's d-th node (KV index prefix_len + path[d])
    goes to prefix_len + d, for the nodes not already in place."""
    from luce.models.kv_cache import PAGE_SIZE

    if any(int(node) < d for d, node in enumerate(path)):
        raise ValueError(f"tree path {list(path)} is not a root path (node ids grow with depth)")
    pages = np.asarray(pages, dtype=np.int64)
    src = np.array([prefix_len + int(node) for d, node in enumerate(path) if int(node) != d], dtype=np.int64)
    dst = np.array([prefix_len + d for d, node in enumerate(path) if int(node) != d], dtype=np.int64)
    flat = lambda idx: pages[idx // PAGE_SIZE] * PAGE_SIZE + idx % PAGE_SIZE  # noqa: E731
    return flat(src), flat(dst)


def commit_tree_kv(state, pages, prefix_len: int, path, moves=None) -> None:
    """Move the accepted tree rows' K/V into place in every attention layer (tree_kv_moves,
    or `moves` computed by it). Ascending d never overwrites a later source (path[d] >= d),
    so the moves may run all at once (`backend.kv_move_rows` of the state's backend)."""
    from luce.models.kv_cache import PAGE_SIZE

    src, dst = tree_kv_moves(pages, prefix_len, path) if moves is None else moves
    if not len(src):
        return
    backend = getattr(state, "backend", None)
    for kv in state.kv.values():
        if backend is not None:
            backend.kv_move_rows(kv, src, dst)
            continue
        for a, b in zip(src, dst):  # host pages: in order, each move reads a row no earlier move wrote
            k, v = kv.read(np.array([a // PAGE_SIZE]), np.array([a % PAGE_SIZE]))
            kv.write(np.array([b // PAGE_SIZE]), np.array([b % PAGE_SIZE]), k, v)


def commit_tree_rows(state, slot: int, pages, prefix_len: int, path, moves=None) -> None:
    """Commit a verified tree's accepted root path (node ids, root first) for `slot`: KV rows
    into place and, for hybrid models, the recurrent state advanced along the path. A slot
    whose tree was the root alone (an AR row) has nothing pending and path must be (0,).
    `path` may be an array the caller mirrors on the device (luce.models.graphed_commit):
    it is handed down as given; `moves` are tree_kv_moves' (src, dst) when precomputed."""
    nodes = [int(p) for p in path]
    if not nodes or nodes[0] != 0:
        raise ValueError(f"a committed tree path starts at the root (node 0), got {nodes}")
    commit_tree_kv(state, pages, prefix_len, nodes, moves)
    recurrent = state.recurrent
    if recurrent is not None and hasattr(recurrent, "commit_tree"):
        recurrent.commit_tree(slot, path if isinstance(path, np.ndarray) else nodes)
