"""Graph replay of a verified tree's commit (DESIGN.md sections 3 and 4).

Committing a slot's accepted path moves its KV rows in every attention layer and replays the
path's factors into every GDN layer's state: a few hundred launches at 27B shape. Graphed,
it is one launch: the key is the slot, the path length, the number of KV moves and the
device arrays the verify left staged (a replayed verify graph leaves its factors at the same
addresses every step); the path and the KV moves are the call's arena.
"""
from __future__ import annotations

import numpy as np

from luce.models.graph_cache import GraphCache
from luce.models.tree_rows import commit_tree_rows, tree_kv_moves
from luce.ref import gdn_tree as ref_tree


def _address(x):
    return getattr(x, "ptr", None) or id(x)


class GraphedCommit:
    """commit_tree_rows(state, slot, pages, prefix_len, path) through a GraphCache."""

    def __init__(self, backend, enabled: bool = True, max_graphs: int = 64):
        self.backend = backend
        self.enabled = bool(enabled) and bool(getattr(backend, "supports_graphs", False))
        self.cache = GraphCache(backend, max_graphs)
        self.counters = self.cache.counters

    def __call__(self, state, slot: int, pages, prefix_len: int, path) -> None:
        nodes = [int(p) for p in path]
        recurrent = getattr(state, "recurrent", None)
        staged = recurrent.staged(slot) if recurrent is not None else {}
        if not self.enabled or len(nodes) <= 1:
            return commit_tree_rows(state, slot, pages, prefix_len, nodes)
        src, dst = tree_kv_moves(pages, prefix_len, nodes)
        arrays = {"path": np.asarray(nodes, dtype=np.int32), "kv_src": src, "kv_dst": dst}
        staged_at = tuple((il, p.mode, _address(p.conv_inputs), _address(getattr(p.factors, "u", None)))
                          for il, p in sorted(staged.items()))
        key = (id(state), slot, len(nodes), len(src), staged_at)

        def replaying(graph):
            if nodes[0] != 0:
                raise ValueError(f"a committed tree path starts at the root (node 0), got {nodes}")
            for p in list(staged.values())[:1]:   # every layer staged the same tree
                ref_tree.check_path(np.asarray(nodes), ref_tree.check_parents(p.parents, len(p.parents)))
            if recurrent is not None:
                recurrent.drop_tree(slot)   # what commit_tree does once it has replayed the path

        from luce.ops import cuda_step_meta

        self.cache.call(key, lambda: commit_tree_rows(state, slot, pages, prefix_len, arrays["path"],
                                                      (arrays["kv_src"], arrays["kv_dst"])),
                        lambda allocator: cuda_step_meta.bind_arrays(self.backend, arrays, allocator),
                        lambda meta: cuda_step_meta.rewrite_arrays(self.backend, meta, arrays),
                        replaying=replaying)
