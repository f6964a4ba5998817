"""The step ops of the host backends (luce.ops.api: conv1d_step, gdn_step, tree_commit and the
one-tree primitives they are made of), mixed into NumpyBackend and so inherited by CpuBackend.

The step ops only route segments: ordinary segments go to conv1d_segments /
gdn_recurrent_segments / gdn_chunked / gdn_recurrent, tree segments to the one-tree
primitives below, all through `self`, so a backend that implements those primitives (the
cpu backend's C kernels) keeps one GDN step for AR rows, tree nodes and commit (DESIGN 5
rule 4). The primitives here are the references (luce/ref); parents are host local parents
[n] (root -1, luce.ref.tree) and the slot's state is read only:

    conv1d_tree(x [n, C], weight [C, K], state [K-1, C], parents) -> y [n, C] (SiLU applied):
        node i convolved over its root path's window, topped up from state;
    gdn_tree_verify(mode, q, k [n, Hv, Dk], v [n, Hv, Dv], g, beta [n, Hv], parents,
        state [Hv, Dk, Dv]) -> (o [n, Hv, Dv], {'factors': TreeFactors} | {'node_states':
        [n, Hv, Dk, Dv]}), every output bitwise gdn_recurrent along its path;
    gdn_tree_commit(pending, conv_state, gdn_state, path) -> (conv [K-1, C], gdn [Hv, Dk, Dv]):
        pending (a TreeStage of one tree: .parents, .conv_inputs [n, C], .mode, .factors |
        .node_states); 'factor' replays the path's factors with the AR step's update,
        'baseline' takes the last node's state.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from luce.ops.api import SEG_AR, SEG_PAD, SEG_PREFILL, SEG_TREE, TreeStage
from luce.ref import gdn_tree as ref_tree
from luce.ref import tree_conv as ref_conv
from luce.ref.gdn_chunked import GDN_CHUNK, delta_rule_groups


def _masked(batch, keep: np.ndarray):
    """The batch with the segments not in `keep` [S] turned into padding."""
    kinds = batch.kinds
    return dataclasses.replace(batch, seq_slots=np.where(keep, batch.seq_slots, -1).astype(np.int32),
                               segment_kind=np.where(keep, kinds, SEG_PAD).astype(np.int8), tree_parents=None)


def _host(backend, x) -> np.ndarray:
    return np.asarray(backend.to_numpy(x))


class HostStepOps:
    """Mixin of luce.ops.numpy_backend.NumpyBackend (host arrays)."""

    # ---- one tree at a time: the references --------------------------------------------------
    def conv1d_tree(self, x, weight, state, parents):
        return ref_conv.conv_tree(_host(self, x).astype(np.float32), _host(self, weight).astype(np.float32),
                                  _host(self, state).astype(np.float32), parents)

    def gdn_tree_verify(self, mode, q, k, v, g, beta, parents, state):
        args = [_host(self, a) for a in (q, k, v, g, beta)]
        if mode == "factor":
            o, factors, _ = ref_tree.gdn_tree_verify(*args, parents, _host(self, state))
            return o, {"factors": factors}
        if mode == "baseline":
            o, states = ref_tree.gdn_tree_verify_baseline(*args, parents, _host(self, state))
            return o, {"node_states": states}
        raise ValueError(f"GDN tree mode must be one of 'factor', 'baseline', got {mode!r}")

    def gdn_tree_commit(self, pending, conv_state, gdn_state, path):
        conv = ref_conv.conv_tree_commit(_host(self, pending.conv_inputs), _host(self, conv_state), path,
                                         pending.parents)
        if pending.mode == "factor":
            gdn = ref_tree.gdn_tree_commit(_host(self, gdn_state), pending.factors, path, pending.parents)
        elif pending.mode == "baseline":
            gdn = ref_tree.gdn_tree_commit_baseline(_host(self, pending.node_states), path, pending.parents)
        else:
            raise ValueError(f"GDN tree mode must be one of 'factor', 'baseline', got {pending.mode!r}")
        return conv, gdn

    # ---- every segment of a step ---------------------------------------------------------------
    def conv1d_step(self, x, weight, pool, batch, silu: bool = True):
        kinds = batch.kinds
        ordinary = (kinds == SEG_PREFILL) | (kinds == SEG_AR)
        y = np.array(self.conv1d_segments(x, weight, pool, _masked(batch, ordinary), silu=silu), np.float32)
        for s in batch.tree_segments():
            r0, r1 = batch.segment_rows(s)
            slot = int(batch.seq_slots[s])
            y[r0:r1] = self.conv1d_tree(x[r0:r1], weight, pool[slot], batch.segment_tree_parents(s))
        return y

    def gdn_step(self, q, k, v, g, beta, pool, batch, mode: str = "factor"):
        kinds = batch.kinds
        o = np.array(self.gdn_recurrent_segments(q, k, v, g, beta, pool, _masked(batch, kinds == SEG_AR)),
                     np.float32)
        for s in np.nonzero(kinds == SEG_PREFILL)[0]:
            r0, r1 = batch.segment_rows(int(s))
            slot = int(batch.seq_slots[s])
            state = pool[slot]
            for begin, end, kind in delta_rule_groups(int(batch.positions[r0]), r1 - r0):
                rows = slice(r0 + begin, r0 + end)
                args = (q[rows], k[rows], v[rows], g[rows], beta[rows], state)
                if kind == "recurrent":
                    o[rows], state = self.gdn_recurrent(*args)
                else:
                    o[rows], state = self.gdn_chunked(*args, chunk=GDN_CHUNK)
            self.copy_into(pool[slot], state)
        trees = batch.tree_segments()
        if not trees:
            return o, None
        t0, T = batch.tree_start, batch.n_rows
        parts: dict[str, list] = {}
        for s in trees:
            r0, r1 = batch.segment_rows(s)
            o[r0:r1], part = self.gdn_tree_verify(mode, q[r0:r1], k[r0:r1], v[r0:r1], g[r0:r1], beta[r0:r1],
                                                  batch.segment_tree_parents(s), pool[int(batch.seq_slots[s])])
            parts.setdefault("rows", []).append((r0 - t0, r1 - t0))
            parts.setdefault("part", []).append(part)
        return o, _assemble(mode, parts, T - t0, q, v)

    def stage_tree_rows(self, x, batch, pool):
        return np.array(x[batch.tree_start:, :pool.shape[-1]], np.float32)

    def tree_commit(self, conv_pool, gdn_pool, stage: TreeStage, commit) -> None:
        indptr, rows = np.asarray(commit.path_indptr), np.asarray(commit.path_rows)
        for p, slot in enumerate(np.asarray(commit.slots).tolist()):
            if slot < 0:
                continue
            a, b = (int(x) for x in commit.tree_rows[p])
            path = rows[indptr[p]:indptr[p + 1]] - a
            one = TreeStage(conv_inputs=stage.conv_inputs[a:b], mode=stage.mode, parents=commit.parents[a:b],
                            factors=None if stage.factors is None else _slice_factors(stage.factors, a, b),
                            node_states=None if stage.node_states is None else stage.node_states[a:b])
            conv, gdn = self.gdn_tree_commit(one, conv_pool[slot], gdn_pool[slot], path)
            self.copy_into(conv_pool[slot], conv)
            self.copy_into(gdn_pool[slot], gdn)


def _slice_factors(f, a: int, b: int):
    return ref_tree.TreeFactors(k=f.k[a:b], g=f.g[a:b], beta=f.beta[a:b], u=f.u[a:b])


def _assemble(mode: str, parts: dict, n: int, q, v) -> dict:
    """Per-tree verify results -> one result over the n rows of the tree block."""
    H, dk, dv = q.shape[1], q.shape[2], v.shape[2]
    if mode == "baseline":
        states = np.zeros((n, H, dk, dv), np.float32)
        for (a, b), part in zip(parts["rows"], parts["part"]):
            states[a:b] = part["node_states"]
        return {"node_states": states}
    k, g, beta = np.zeros((n, H, dk), np.float32), np.zeros((n, H), np.float32), np.zeros((n, H), np.float32)
    u = None
    for (a, b), part in zip(parts["rows"], parts["part"]):
        f = part["factors"]
        if u is None:
            u = np.zeros((n, H, dv), np.asarray(f.u).dtype)
        k[a:b], g[a:b], beta[a:b], u[a:b] = f.k, f.g, f.beta, f.u
    return {"factors": ref_tree.TreeFactors(k=k, g=g, beta=beta, u=u)}
