"""StepBuilder: one engine step's cohort -> one StepBatch (DESIGN.md section 2 step 3).

Row order is `[prefill segments][AR rows][tree rows]`. With padding on (the default), each
prefill segment of n rows is followed by a padding segment (slot -1) of bucket(n) - n rows,
each tree by one up to the step's tree width, and a last zero-row padding segment carries the
padding pages that round the KV page count up to its bucket. Every array's shape is then a
function of the replay key alone:

    replay_key = (prefill topology: bucketed length of each prefill segment, in order,
                  AR row count, logits row count, (tree count, tree width), padded KV pages)

so steps with one key can replay one captured graph. Only completed prompt tails, AR rows
and tree rows reach the LM head (`logits_indices`), never prompt interiors.

New pages are only peeked here (PagePool.plan_growth); the transaction takes them at commit.
A tree of N nodes (speculative verify, luce.models.tree_rows) is one segment over the slot's
own pages: its rows write KV at start..start+N-1 (scratch beyond the committed length, so
its pages cover start + N), sit at positions start + depth, and all reach the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from luce.engine.pages import PagePool
from luce.models.batch import ForwardBatch
from luce.models.kv_cache import PAGE_SIZE, bucket, pages_needed

ROW_PAD, ROW_PREFILL, ROW_AR, ROW_TREE = -1, 0, 1, 2
PAD_PAGE = 0  # page id written into padding CSR entries; padding segments never touch it


@dataclass(frozen=True)
class PrefillChunk:
    slot: int
    request_id: Any
    token_ids: tuple[int, ...]   # [n] prompt tokens start..start+n-1
    start: int                   # absolute position of the first (= the slot's committed length)
    completes_prompt: bool       # its last row's logits give the first generated token


@dataclass(frozen=True)
class DecodeRow:
    slot: int
    request_id: Any
    token_id: int                # the last sampled token, fed at `position`
    position: int                # = the slot's committed length


@dataclass(frozen=True)
class TreeChunk:
    """A draft tree to verify over a slot's committed prefix. Node 0 is the root: the
    slot's newest token (what an AR row would feed), at position `start`."""

    slot: int
    request_id: Any
    token_ids: tuple[int, ...]   # [N] nodes in insertion order (a parent before its children)
    parents: tuple[int, ...]     # [N] parent node index; -1 for the root (node 0) only
    start: int                   # the slot's committed length = the root's position

    def depths(self) -> list[int]:
        if not self.token_ids or len(self.parents) != len(self.token_ids):
            raise ValueError(f"slot {self.slot}: a tree needs one parent per node and at least the root")
        d: list[int] = []
        for i, p in enumerate(self.parents):
            if (i == 0 and p != -1) or (i > 0 and not 0 <= p < i):
                raise ValueError(f"tree node {i} has parent {p}: node 0 is the root (parent -1) and "
                                 f"every other node's parent is an earlier node")
            d.append(0 if p < 0 else d[p] + 1)
        return d


@dataclass
class Cohort:
    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[DecodeRow] = field(default_factory=list)
    tree: list[TreeChunk] = field(default_factory=list)

    @property
    def items(self) -> list:
        return [*self.prefill, *self.decode, *self.tree]

    @property
    def slots(self) -> list[int]:
        return [item.slot for item in self.items]

    @property
    def n_rows(self) -> int:
        return (sum(len(c.token_ids) for c in self.prefill) + len(self.decode)
                + sum(len(t.token_ids) for t in self.tree))

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode or self.tree)


@dataclass
class StepBatch:
    forward: ForwardBatch                # what the model runs (T rows, S segments, L logits rows)
    row_kind: np.ndarray                 # [T] int8 ROW_PREFILL | ROW_AR | ROW_TREE | ROW_PAD
    row_slot: np.ndarray                 # [T] int32 slot of each row, -1 on padding
    segment_kind: np.ndarray             # [S] int8 kind of each segment
    logits_slot: np.ndarray              # [L] int32 slot of each logits row
    logits_kind: np.ndarray              # [L] int8 kind of each logits row
    logits_position: np.ndarray          # [L] int32 absolute position of the token it predicts
    tree_parents: np.ndarray             # [T] int32 parent row of a tree row (-1: root or not a tree row)
    new_pages: dict[int, tuple[int, ...]]  # slot -> pages its rows need (taken at commit; trees: as accepted)
    kv_len_after: dict[int, int]         # slot -> KV rows the step writes (trees: start + N, the most)
    cohort: Cohort
    replay_key: tuple

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every array of the step (what a captured graph fixes)."""
        f = self.forward
        arrays = dict(token_ids=f.token_ids, positions=f.positions, qo_indptr=f.qo_indptr,
                      seq_slots=f.seq_slots, kv_indptr=f.kv_indptr, kv_indices=f.kv_indices,
                      kv_last_page_len=f.kv_last_page_len, logits_indices=f.logits_indices,
                      row_kind=self.row_kind, row_slot=self.row_slot, segment_kind=self.segment_kind,
                      logits_slot=self.logits_slot, tree_parents=self.tree_parents)
        return {name: tuple(a.shape) for name, a in arrays.items()}


class _Packer:
    """Accumulates rows and segments; `segment()` appends one."""

    def __init__(self):
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.row_kind: list[int] = []
        self.row_slot: list[int] = []
        self.parents: list[int] = []
        self.qo = [0]
        self.seg_slots: list[int] = []
        self.seg_kind: list[int] = []
        self.kv_indptr = [0]
        self.kv_indices: list[int] = []
        self.last: list[int] = []
        self.logits: list[tuple[int, int, int, int]] = []   # (row, slot, kind, predicted position)

    def segment(self, slot, kind, tokens, positions, pages, kv_len, parents=None):
        row0 = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        self.positions.extend(int(p) for p in positions)
        self.row_kind.extend([kind] * len(tokens))
        self.row_slot.extend([slot] * len(tokens))
        self.parents.extend([-1] * len(tokens) if parents is None else [row0 + p if p >= 0 else -1 for p in parents])
        self.qo.append(len(self.tokens))
        self.seg_slots.append(slot)
        self.seg_kind.append(kind)
        self.kv_indices.extend(int(p) for p in pages)
        self.kv_indptr.append(len(self.kv_indices))
        self.last.append(0 if not pages else kv_len - (len(pages) - 1) * PAGE_SIZE)
        return row0

    def padding(self, n_rows: int, n_pages: int = 0):
        self.segment(-1, ROW_PAD, [0] * n_rows, [0] * n_rows, [PAD_PAGE] * n_pages, n_pages * PAGE_SIZE)


class StepBuilder:
    def __init__(self, pool: PagePool, pad: bool = True):
        """pad: round segment lengths, tree width and KV pages up to buckets so shapes follow
        the replay key; pad=False packs exactly (same live rows, fewer padding rows)."""
        self.pool = pool
        self.pad = pad

    def _b(self, n: int) -> int:
        return bucket(n) if self.pad else n

    def build(self, cohort: Cohort, capture_layers=()) -> StepBatch:
        """Pack `cohort`; raises PoolExhausted (changing nothing) when pages run short and
        ValueError on a malformed cohort (a slot twice, empty segment, bad tree)."""
        pool = self.pool
        depths = {t.slot: t.depths() for t in cohort.tree}
        demands = ([(c.slot, c.start + len(c.token_ids)) for c in cohort.prefill]
                   + [(r.slot, r.position + 1) for r in cohort.decode]
                   + [(t.slot, t.start + len(t.token_ids)) for t in cohort.tree])
        for item in cohort.prefill:
            if not item.token_ids:
                raise ValueError(f"slot {item.slot}: a prefill chunk needs at least one token")
        if any(s < 0 for s, _ in demands):
            raise ValueError("live cohort items need a slot >= 0 (-1 is padding)")
        new_pages = pool.plan_growth(demands)
        width = self._b(max((len(t.token_ids) for t in cohort.tree), default=0))

        def pages_for(slot, kv_len):
            return (pool.slot_pages(slot) + new_pages[slot])[:pages_needed(kv_len)]

        p = _Packer()
        for c in cohort.prefill:
            n, kv_len = len(c.token_ids), c.start + len(c.token_ids)
            row0 = p.segment(c.slot, ROW_PREFILL, c.token_ids, range(c.start, kv_len), pages_for(c.slot, kv_len), kv_len)
            if c.completes_prompt:
                p.logits.append((row0 + n - 1, c.slot, ROW_PREFILL, kv_len))
            if self.pad:
                p.padding(self._b(n) - n)
        for r in cohort.decode:
            row0 = p.segment(r.slot, ROW_AR, [r.token_id], [r.position], pages_for(r.slot, r.position + 1), r.position + 1)
            p.logits.append((row0, r.slot, ROW_AR, r.position + 1))
        for t in cohort.tree:
            d, kv_len = depths[t.slot], t.start + len(t.token_ids)
            row0 = p.segment(t.slot, ROW_TREE, t.token_ids, [t.start + x for x in d],
                             pages_for(t.slot, kv_len), kv_len, parents=t.parents)
            p.logits.extend((row0 + i, t.slot, ROW_TREE, t.start + x + 1) for i, x in enumerate(d))
            if self.pad:
                p.padding(width - len(t.token_ids))
        live_pages = len(p.kv_indices)
        if self.pad:
            p.padding(0, self._b(live_pages) - live_pages)

        i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
        forward = ForwardBatch(
            token_ids=i32(p.tokens), positions=i32(p.positions), qo_indptr=i32(p.qo),
            seq_slots=i32(p.seg_slots), kv_indptr=i32(p.kv_indptr), kv_indices=i32(p.kv_indices),
            kv_last_page_len=i32(p.last), logits_indices=i32([x[0] for x in p.logits]),
            capture_layers=tuple(capture_layers), tree_parents=i32(p.parents) if cohort.tree else None)
        kv_after = {s: n for s, n in demands}
        key = (tuple(self._b(len(c.token_ids)) for c in cohort.prefill), len(cohort.decode), len(p.logits),
               (len(cohort.tree), width), len(p.kv_indices))
        return StepBatch(
            forward=forward, row_kind=np.asarray(p.row_kind, np.int8), row_slot=i32(p.row_slot),
            segment_kind=np.asarray(p.seg_kind, np.int8),
            logits_slot=i32([x[1] for x in p.logits]), logits_kind=np.asarray([x[2] for x in p.logits], np.int8),
            logits_position=i32([x[3] for x in p.logits]), tree_parents=i32(p.parents),
            new_pages={s: tuple(v) for s, v in new_pages.items()}, kv_len_after=kv_after, cohort=cohort, replay_key=key)
