"""Commit of a verified step's trees: the accepted paths into KV, conv and GDN state
(DESIGN.md sections 2 step 7, 3 and 4), every slot of the step at once.

    commit = plan_tree_commit(batch, {slot: path})     # pure: checks the paths, builds arrays
    committer(state, out.staged, commit)               # GraphedCommit: one graph launch on GPUs

A tree of n nodes over P committed rows wrote its K/V at scratch rows P..P+n-1 of its slot's
pages. Committing the path (root first) moves the row of its d-th node (KV index
P + path[d]) to P + d in every attention layer (ascending d never overwrites a later source,
path[d] >= d), then advances every GDN layer's conv and GDN state of the slot along the
path (luce.ops.api.tree_commit: one launch per op per layer over every slot). Attention-only
models have only the KV moves, and none when every accepted node is in place (a chain's path):
then nothing is launched.

The arrays have fixed sizes per step topology (a TreeCommit of the tree block's rows), so
graph replay keys repeat: `replay_key = (trees, tree block rows)`; padding entries are -1
(moves) or beyond path_indptr (path rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from luce.models.batch import ForwardBatch
from luce.models.graph_cache import GraphCache
from luce.models.kv_cache import PAGE_SIZE
from luce.ops import cuda_step_meta
from luce.ref.tree import check_path


@dataclass(frozen=True)
class TreeCommit:
    """The accepted paths of a step's tree segments, in rows of its tree block."""

    slots: np.ndarray         # [P] int32 slot of each tree
    path_indptr: np.ndarray   # [P+1] int32 path p is path_rows[path_indptr[p]:path_indptr[p+1]]
    path_rows: np.ndarray     # [Nt] int32 tree block rows of the paths, root first (tail unused)
    tree_rows: np.ndarray     # [P, 2] int32 rows [a, b) of each tree in the block
    parents: np.ndarray       # [Nt] int64 local parent of each block row (-1: root or padding)
    kv_src: np.ndarray        # [Nt] int64 flat KV rows (page * PAGE_SIZE + offset) to move; -1: none
    kv_dst: np.ndarray        # [Nt] int64 where they go; -1: none
    path_last: np.ndarray     # [P] int64 block row of each path's last node
    state_rows: np.ndarray    # [P] int64 the slots again, as gather rows
    replay_key: tuple

    @property
    def moves_kv(self) -> bool:
        """Does some accepted node's KV row move? (Not on a chain's path: node d is at P + d.)"""
        return bool((self.kv_src >= 0).any())

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-step arrays a commit graph reads (its arena)."""
        return {"slots": self.slots, "path_indptr": self.path_indptr, "path_rows": self.path_rows,
                "kv_src": self.kv_src, "kv_dst": self.kv_dst, "path_last": self.path_last,
                "state_rows": self.state_rows}


def tree_kv_moves(pages, prefix_len: int, path: Sequence[int]) -> tuple[list[int], list[int]]:
    """(src, dst) flat KV rows of committing `path` over prefix_len committed rows, for the
    nodes not already in place."""
    pages = np.asarray(pages, dtype=np.int64)
    flat = lambda idx: int(pages[idx // PAGE_SIZE] * PAGE_SIZE + idx % PAGE_SIZE)  # noqa: E731
    moves = [(flat(prefix_len + int(node)), flat(prefix_len + d)) for d, node in enumerate(path) if int(node) != d]
    return [a for a, _ in moves], [b for _, b in moves]


def plan_tree_commit(batch: ForwardBatch, paths: Mapping[int, Sequence[int]]) -> TreeCommit:
    """The commit of `paths` (tree slot -> accepted path: node ids, root first) for every
    tree segment of `batch`. Raises ValueError (nothing done) for a missing or bad path."""
    if not paths and not batch.has_trees:
        return NO_TREES
    trees = batch.tree_segments()
    if set(paths) != {int(batch.seq_slots[s]) for s in trees}:
        raise ValueError(f"paths for slots {sorted(paths)}, the step verifies trees of slots "
                         f"{sorted(int(batch.seq_slots[s]) for s in trees)}")
    if not trees:
        return NO_TREES
    t0 = batch.tree_start
    n_block = batch.n_rows - t0
    slots, indptr, rows, tree_rows, src, dst = [], [0], [], [], [], []
    parents = np.full(n_block, -1, dtype=np.int64)
    for s in trees:
        slot = int(batch.seq_slots[s])
        r0, r1 = batch.segment_rows(s)
        local = batch.segment_tree_parents(s)
        path = check_path(paths[slot], local)
        parents[r0 - t0:r1 - t0] = local
        slots.append(slot)
        rows.extend(r0 - t0 + node for node in path)
        indptr.append(len(rows))
        tree_rows.append((r0 - t0, r1 - t0))
        a, b = tree_kv_moves(batch.segment_pages(s), batch.kv_len(s) - (r1 - r0), path)
        src.extend(a)
        dst.extend(b)
    pad = lambda xs, fill, dtype: np.asarray(list(xs) + [fill] * (n_block - len(xs)), dtype=dtype)  # noqa: E731
    return TreeCommit(slots=np.asarray(slots, np.int32), path_indptr=np.asarray(indptr, np.int32),
                      path_rows=pad(rows, 0, np.int32), tree_rows=np.asarray(tree_rows, np.int32).reshape(-1, 2),
                      parents=parents, kv_src=pad(src, -1, np.int64), kv_dst=pad(dst, -1, np.int64),
                      path_last=np.asarray([rows[i - 1] for i in indptr[1:]], np.int64),
                      state_rows=np.asarray(slots, np.int64), replay_key=(len(trees), n_block))


_none32, _none64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
NO_TREES = TreeCommit(slots=_none32, path_indptr=np.zeros(1, np.int32), path_rows=_none32,
                      tree_rows=np.zeros((0, 2), np.int32), parents=_none64, kv_src=_none64, kv_dst=_none64,
                      path_last=_none64, state_rows=_none64, replay_key=(0, 0))   # a step without trees: nothing to move
for _a in (_none32, _none64, NO_TREES.path_indptr, NO_TREES.tree_rows):
    _a.flags.writeable = False


def _gdn_layers(state) -> tuple:
    return tuple(getattr(state.recurrent, "gdn_layers", ()) or ())


def changes_nothing(state, commit: TreeCommit) -> bool:
    """No tree, or an attention-only model's paths whose nodes are all in place (a chain's)."""
    return not len(commit.slots) or not _gdn_layers(state) and not commit.moves_kv


def commit_trees(state, staged: dict, commit: TreeCommit) -> None:
    """Promote `commit` into `state` (luce.models.kv_cache.ModelState): KV rows into place in
    every attention layer, then every GDN layer's state (staged: ForwardOutput.staged of the
    verify step). Checks what it needs before it changes anything."""
    gdn_layers = _gdn_layers(state)
    missing = [il for il in gdn_layers if il not in staged]
    if missing and len(commit.slots):
        raise ValueError(f"tree commit: the verify step staged nothing for GDN layers {missing}")
    if changes_nothing(state, commit):
        return
    for kv in state.kv.values():
        state.backend.kv_move_rows(kv, commit.kv_src, commit.kv_dst)
    if gdn_layers:
        state.recurrent.commit(staged, commit)


def _address(x):
    return getattr(x, "ptr", None) or id(x)


class GraphedCommit:
    """commit_trees through a GraphCache: one graph launch per commit on GPU backends. The key
    (`key`) is the commit's topology and the addresses of the staged arrays, which the graph
    reads: GPU backends keep a layer's stage at one address whether the verify ran eagerly,
    was captured or replayed (luce.ops.cuda_step_ops), so the key repeats with the topology;
    the paths and moves are the arena."""

    def __init__(self, backend, enabled: bool = True, max_graphs: int = 64):
        self.backend = backend
        self.enabled = bool(enabled) and bool(getattr(backend, "supports_graphs", False))
        self.cache = GraphCache(backend, max_graphs)
        self.counters = self.cache.counters

    @staticmethod
    def key(state, staged: dict, commit: TreeCommit) -> tuple:
        staged_at = tuple((il, st.mode, _address(st.conv_inputs),
                           _address(st.factors.u if st.factors is not None else st.node_states))
                          for il, st in sorted(staged.items()))
        return commit.replay_key, id(state), staged_at

    def __call__(self, state, staged: dict, commit: TreeCommit) -> None:
        if changes_nothing(state, commit):
            return      # no launch
        if not self.enabled:
            return commit_trees(state, staged, commit)
        arrays = commit.arrays()
        self.cache.call(self.key(state, staged, commit), lambda: commit_trees(state, staged, commit),
                        lambda allocator: cuda_step_meta.bind_arrays(self.backend, arrays, allocator),
                        lambda meta: cuda_step_meta.rewrite_arrays(self.backend, meta, arrays))
