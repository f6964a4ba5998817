"""StepBuilder: one engine step's cohort -> one StepBatch (DESIGN.md section 2 step 3).

Row order is `[prefill segments][AR rows][tree rows]`, packed by the one CSR packer
(luce.models.packer). With padding on (the default) the builder owns the shapes: each
prefill segment of n rows is padded to bucket(n) rows, each tree to the step's tree bucket
(bucket of its largest tree, padding rows reaching the LM head), each prefill segment
keeps its last row's logits whether or not it completes the prompt, and the KV page count
is rounded up to its bucket. Every shape, grid and launch of the step is then a function of
its replay key alone (topology: bucketed segment lengths, AR rows, tree bucket, padded KV
pages and span), which graph replay uses as it is; slots and every per-step value go to the
metadata arena. Only completed prompt tails, AR rows and tree rows give tokens
(`logits_slot` -1 marks the logits rows that give none).

A steady decode step (the same AR rows as the last step built, one position on, no page to
add) is that step's batch advanced (ForwardBatch.advance: new token ids, positions and
last-page lengths; the same topology, pages and key), which is what packing would give.
New pages are only peeked here (PagePool.plan_growth); the transaction takes them at commit.
A tree of N nodes (speculative verify) is one segment over the slot's own pages: its rows
write KV at start..start+N-1 (scratch beyond the committed length, so its pages cover
start + N), sit at positions start + depth, and all reach the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from luce.engine.pages import PagePool
from luce.models.batch import SEG_AR, SEG_PAD, SEG_PREFILL, SEG_TREE, ForwardBatch
from luce.models.kv_cache import bucket, pages_needed
from luce.models.packer import Packer
from luce.ref.tree import tree_depths

ROW_PAD, ROW_PREFILL, ROW_AR, ROW_TREE = SEG_PAD, SEG_PREFILL, SEG_AR, SEG_TREE


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
        """Depth of every node; ValueError for a malformed tree (luce.ref.tree)."""
        if len(self.parents) != len(self.token_ids):
            raise ValueError(f"slot {self.slot}: a tree needs one parent per node and at least the root")
        return tree_depths(self.parents).tolist()


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
    logits_slot: np.ndarray              # [L] int32 slot whose token a logits row gives; -1: none
    logits_kind: np.ndarray              # [L] int8 kind of each logits row
    logits_position: np.ndarray          # [L] int32 absolute position of the token it predicts
    new_pages: dict[int, tuple[int, ...]]  # slot -> pages its rows need (taken at commit; trees: as accepted)
    kv_len_after: dict[int, int]         # slot -> KV rows the step writes (trees: start + N, the most)
    cohort: Cohort

    @property
    def row_kind(self) -> np.ndarray:
        """[T] int8 ROW_PREFILL | ROW_AR | ROW_TREE | ROW_PAD of each row."""
        return np.repeat(self.forward.kinds, np.diff(self.forward.qo_indptr))

    @property
    def row_slot(self) -> np.ndarray:
        """[T] int32 slot of each row, -1 on padding."""
        return np.repeat(self.forward.seq_slots, np.diff(self.forward.qo_indptr))

    @property
    def replay_key(self) -> tuple:
        """The step's topology (luce.models.packer): what graph replay keys on."""
        return self.forward.replay_key

    @property
    def segment_kind(self) -> np.ndarray:
        return self.forward.kinds

    @property
    def tree_parents(self) -> np.ndarray:
        """[T] int32 parent row of a tree row (-1: root or not a tree row)."""
        tp = self.forward.tree_parents
        return np.full(self.forward.n_rows, -1, np.int32) if tp is None else tp

    @property
    def durable_slots(self) -> tuple[int, ...]:
        """Slots whose state the forward changes in place (prefill and AR rows)."""
        return tuple([item.slot for item in (*self.cohort.prefill, *self.cohort.decode)])

    @property
    def durable(self) -> bool:
        """Does the forward write durable state (prefill or AR rows)?"""
        return bool(self.cohort.prefill or self.cohort.decode)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every array of the step (what a captured graph fixes)."""
        f = self.forward
        arrays = dict(token_ids=f.token_ids, positions=f.positions, qo_indptr=f.qo_indptr,
                      seq_slots=f.seq_slots, kv_indptr=f.kv_indptr, kv_indices=f.kv_indices,
                      kv_last_page_len=f.kv_last_page_len, logits_indices=f.logits_indices,
                      row_kind=self.row_kind, row_slot=self.row_slot, segment_kind=self.segment_kind,
                      logits_slot=self.logits_slot, tree_parents=self.tree_parents)
        return {name: tuple(a.shape) for name, a in arrays.items()}


class StepBuilder:
    def __init__(self, pool: PagePool, pad: bool = True):
        """pad: round segment lengths, tree width and KV pages up to buckets so shapes follow
        the replay key; pad=False packs exactly (same live rows, fewer padding rows)."""
        self.pool = pool
        self.pad = pad
        self._last: StepBatch | None = None   # the last step built

    def build(self, cohort: Cohort, capture_layers=()) -> StepBatch:
        """Pack `cohort`; raises PoolExhausted (changing nothing) when pages run short and
        ValueError on a malformed cohort (a slot twice, empty segment, bad tree)."""
        step = self._advance(cohort, tuple(capture_layers))
        self._last = step = step if step is not None else self._pack(cohort, capture_layers)
        return step

    def _advance(self, cohort: Cohort, capture_layers: tuple) -> StepBatch | None:
        """A steady decode step, the last step built advanced (ForwardBatch.advance) when
        that is what packing would give: the same AR rows (slots, requests, order), each one
        position on, and every slot holding the pages its segment read, with room in the last
        one (no page to add; the padding and replay key stay). None: pack the step."""
        last = self._last
        if last is None or cohort.prefill or cohort.tree or last.cohort.prefill or last.cohort.tree \
                or len(cohort.decode) != len(last.cohort.decode) or capture_layers != last.forward.capture_layers:
            return None
        f = last.forward
        kv_ptr, kv = f.kv_indptr.tolist(), f.kv_indices.tolist()
        for s, (r, q) in enumerate(zip(cohort.decode, last.cohort.decode)):
            if r.slot != q.slot or r.request_id != q.request_id or r.position != q.position + 1 \
                    or self.pool.slot_pages(r.slot)[:kv_ptr[s + 1] - kv_ptr[s]] != kv[kv_ptr[s]:kv_ptr[s + 1]]:
                return None
        forward = f.advance([r.token_id for r in cohort.decode])
        if forward is None:
            return None
        last.logits_slot.flags.writeable = last.logits_kind.flags.writeable = False    # shared by both steps
        return StepBatch(forward=forward, logits_slot=last.logits_slot, logits_kind=last.logits_kind,
                         logits_position=last.logits_position + 1, new_pages={r.slot: () for r in cohort.decode},
                         kv_len_after={r.slot: r.position + 1 for r in cohort.decode}, cohort=cohort)

    def _pack(self, cohort: Cohort, capture_layers) -> StepBatch:
        pool, pad = self.pool, self.pad
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
        width = max((len(t.token_ids) for t in cohort.tree), default=0)
        width = bucket(width) if pad else width

        def pages_for(slot, kv_len):
            return (pool.slot_pages(slot) + new_pages[slot])[:pages_needed(kv_len)]

        p, logits = Packer(), []           # logits: (slot or -1, kind, predicted position)
        for c in cohort.prefill:
            n, kv_len = len(c.token_ids), c.start + len(c.token_ids)
            rows = [n - 1] if c.completes_prompt or pad else []
            p.segment(c.slot, SEG_PREFILL, c.token_ids, range(c.start, kv_len), pages_for(c.slot, kv_len), kv_len,
                      logits=rows, pad_to=bucket(n) if pad else None)
            logits.extend((c.slot if c.completes_prompt else -1, ROW_PREFILL, kv_len) for _ in rows)
        for r in cohort.decode:
            p.segment(r.slot, SEG_AR, [r.token_id], [r.position], pages_for(r.slot, r.position + 1), r.position + 1,
                      logits=[0])
            logits.append((r.slot, ROW_AR, r.position + 1))
        for t in cohort.tree:
            d, n = depths[t.slot], len(t.token_ids)
            p.segment(t.slot, SEG_TREE, t.token_ids, [t.start + x for x in d], pages_for(t.slot, t.start + n),
                      t.start + n, parents=t.parents, logits=range(n), pad_to=width if pad else None)
            logits.extend((t.slot, ROW_TREE, t.start + x + 1) for x in d)
            logits.extend((-1, ROW_PAD, 0) for _ in range(width - n if pad else 0))
        forward = p.finish(capture_layers, pad_pages=pad)
        i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
        return StepBatch(
            forward=forward, logits_slot=i32([x[0] for x in logits]),
            logits_kind=np.asarray([x[1] for x in logits], np.int8), logits_position=i32([x[2] for x in logits]),
            new_pages={s: tuple(v) for s, v in new_pages.items()}, kv_len_after={s: n for s, n in demands},
            cohort=cohort)
