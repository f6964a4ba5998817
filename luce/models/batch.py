"""The model-facing step interface: ForwardBatch in, ForwardOutput out.

A ForwardBatch is one step as the model sees it (built by the one packer,
luce/models/packer.py): T rows in S segments, in the order
`[prefill segments][AR rows][tree segments]`, each live segment possibly followed by a
padding segment (slot -1). A segment is a run of rows of one sequence; its rows sit at
row indices `qo_indptr[s]:qo_indptr[s+1]`. The paged-KV CSR describes each segment's KV
AFTER this step's rows are written: segment s has `kv_len(s) = (pages - 1) * PAGE_SIZE +
kv_last_page_len[s]` rows and its row j is stored at KV index `kv_len(s) - n_rows(s) + j`.
Ordinary rows sit at that index as their position and attend to KV indices 0..their own
(causal). Segments with `seq_slots[s] == -1` are padding: their rows write nothing and
their outputs are unspecified (zeros on the numpy backend).

Tree segments (speculative verify, `segment_kind` SEG_TREE) set `tree_parents` [T] (the
global row of each row's parent, -1 for the root and for rows of other segments). With n
rows and P = kv_len(s) - n committed rows, row j writes its K/V at scratch KV index P + j,
sits at position P + depth(j) and attends to KV 0..P-1 then P + a for a on its root path
(luce/ref/tree_attention.py); GDN layers verify it without touching the slot's state and
leave what commit needs in ForwardOutput.staged (luce.models.commit promotes the accepted
path). Tree segments come last: rows tree_start..T-1 are the step's tree block.

`validate_batch` is the one check of these rules; a batch is validated once (the engine
does it in txn.preflight, direct callers in model.forward) and remembers it; a valid batch
advanced by one decode step (`advance`) stays valid by construction, its token ids checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from luce.models.kv_cache import PAGE_SIZE, ModelState, bucket
from luce.ops.api import SEG_AR, SEG_PAD, SEG_PREFILL, SEG_TREE  # noqa: F401 (the engine's row kinds too)
from luce.ref.tree import tree_depths

STEP_INT64 = frozenset({"kv_dst", "logits_indices"})   # step_values held as int64 in the arena (the rest int32)

@dataclass
class ForwardBatch:
    token_ids: np.ndarray          # [T] int32 input token of each row
    positions: np.ndarray          # [T] int32 absolute position of each row (rotary)
    qo_indptr: np.ndarray          # [S+1] int32 segment s owns rows qo_indptr[s]:qo_indptr[s+1]
    seq_slots: np.ndarray          # [S] int32 state slot of each segment; -1 = padding
    kv_indptr: np.ndarray          # [S+1] int32 segment s's pages: kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indices: np.ndarray         # [nnz] int32 page ids
    kv_last_page_len: np.ndarray   # [S] int32 rows used in the last page (1..PAGE_SIZE; 0 if no pages)
    logits_indices: np.ndarray     # [L] int32 rows whose logits are computed, in output order
    capture_layers: tuple[int, ...] = ()    # layers whose outputs [T, hidden] are returned
    tree_parents: np.ndarray | None = None  # [T] int32 parent row of tree rows (-1: root or not a tree row)
    segment_kind: np.ndarray | None = None  # [S] int8 SEG_*; None: derived (PAD, PREFILL > 1 row, AR, TREE)
    replay_key: tuple | None = None         # topology (luce.models.packer): equal keys, equal launches
    row_capacity: int = 0                   # most rows any segment may hold under this key (0: the actual most)
    tree_width: int = 0                     # most rows a tree segment may hold under this key (0: actual)
    prompt_gemm: bool = True                # False: prompt rows' matmuls take the decode family too
                                            # (a draft's short catch-up, whose bits only steer speed)

    @property
    def n_rows(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def n_segments(self) -> int:
        return int(self.seq_slots.shape[0])

    def segment_rows(self, s: int) -> tuple[int, int]:
        """Row range [start, end) of segment s."""
        return int(self.qo_indptr[s]), int(self.qo_indptr[s + 1])

    def segment_pages(self, s: int) -> np.ndarray:
        """Page ids [P] of segment s."""
        return self.kv_indices[self.kv_indptr[s]:self.kv_indptr[s + 1]]

    def kv_len(self, s: int) -> int:
        """KV rows of segment s after this step (including its own rows)."""
        n_pages = int(self.kv_indptr[s + 1] - self.kv_indptr[s])
        return 0 if n_pages == 0 else (n_pages - 1) * PAGE_SIZE + int(self.kv_last_page_len[s])

    def _cached(self, name, make):
        value = self.__dict__.get("_" + name)
        if value is None:
            value = self.__dict__["_" + name] = make()
        return value

    @property
    def kinds(self) -> np.ndarray:
        """[S] int8 kind of every segment (segment_kind, or derived from slots and sizes)."""
        def make():
            if self.segment_kind is not None:
                return np.asarray(self.segment_kind, dtype=np.int8)
            n = np.diff(self.qo_indptr)
            kinds = np.where(self.seq_slots < 0, SEG_PAD, np.where(n > 1, SEG_PREFILL, SEG_AR)).astype(np.int8)
            if self.tree_parents is not None:   # hand-made batches: a segment with parented rows is a tree
                parented = np.asarray(self.tree_parents) >= 0
                for s in np.nonzero(self.seq_slots >= 0)[0]:
                    if parented[self.qo_indptr[s]:self.qo_indptr[s + 1]].any():
                        kinds[s] = SEG_TREE
            return kinds
        return self._cached("kinds", make)

    @property
    def prefill_spans(self) -> tuple[tuple[int, int], ...]:
        """Row ranges [start, end) of the runs of prefill segments (padding between two
        prefill segments joins them): the rows whose matmuls take the prompt-row arithmetic
        (DESIGN 5 rule 1; luce.ops.api.Backend.matmul). The packer's order gives one run
        starting at row 0 (or none). None with prompt_gemm False."""
        def make():
            if not self.prompt_gemm:
                return ()
            spans, cur = [], None
            for s, kind in enumerate(self.kinds):
                r0, r1 = self.segment_rows(s)
                if kind == SEG_PREFILL:
                    cur = [r0, r1] if cur is None else [cur[0], r1]
                elif kind != SEG_PAD and cur is not None:
                    spans.append(tuple(cur))
                    cur = None
            return tuple(spans) + ((tuple(cur),) if cur is not None else ())
        return self._cached("prefill_spans", make)

    @property
    def has_padding_rows(self) -> bool:
        """Some row lies in no live segment (padding: no kernel writes its outputs)."""
        def make():
            qo, slots = self.qo_indptr.tolist(), self.seq_slots.tolist()
            return sum(b - a for a, b, slot in zip(qo, qo[1:], slots) if slot >= 0) != self.n_rows
        return self._cached("has_padding_rows", make)

    @property
    def decode_only(self) -> bool:
        """Every live segment is one AR row, and there is one (padding segments of any size):
        each row's new key is the last of its keys (a decode step's attention fuses its input)."""
        def make():
            qo = self.qo_indptr.tolist()
            kinds = list(zip(self.kinds.tolist(), qo, qo[1:]))
            return any(k == SEG_AR for k, _, _ in kinds) and \
                all(k == SEG_PAD or (k == SEG_AR and b - a == 1) for k, a, b in kinds)
        return self._cached("decode_only", make)

    @property
    def has_trees(self) -> bool:
        return self._cached("has_trees", lambda: bool((self.kinds == SEG_TREE).any()))

    @property
    def has_ar_rows(self) -> bool:
        return self._cached("has_ar_rows", lambda: bool((self.kinds == SEG_AR).any()))

    @property
    def ar_slots(self) -> np.ndarray:
        """[S] int32: the slot of each AR segment (one row), -1 on the others."""
        return self._cached("ar_slots", lambda: np.where(self.kinds == SEG_AR, self.seq_slots, -1).astype(np.int32))

    @property
    def tree_start(self) -> int:
        """First row of the tree block (T when the batch has no tree segment)."""
        def make():
            trees = np.nonzero(self.kinds == SEG_TREE)[0]
            return int(self.qo_indptr[trees[0]]) if trees.size else self.n_rows
        return self._cached("tree_start", make)

    @property
    def local_tree_parents(self) -> np.ndarray:
        """[T] int64: each row's parent as a row of its own segment (-1 for roots and for
        rows of other segments)."""
        def make():
            out = np.full(self.n_rows, -1, dtype=np.int64)
            if self.tree_parents is not None:
                for s in np.nonzero(self.kinds == SEG_TREE)[0]:
                    r0, r1 = self.segment_rows(s)
                    p = np.asarray(self.tree_parents[r0:r1], dtype=np.int64)
                    out[r0:r1] = np.where(p >= 0, p - r0, -1)
            return out
        return self._cached("local_parents", make)

    def tree_segments(self) -> list[int]:
        return [s for s, kind in enumerate(self.kinds.tolist()) if kind == SEG_TREE]

    def segment_tree_parents(self, s: int) -> np.ndarray:
        """Local parents [n] int64 (root -1) of tree segment s."""
        r0, r1 = self.segment_rows(s)
        return self.local_tree_parents[r0:r1]

    @property
    def max_rows(self) -> int:
        """Rows of the largest segment under this topology (grid sizes)."""
        return self.row_capacity or int(np.diff(self.qo_indptr).max(initial=0))

    @property
    def max_tree_rows(self) -> int:
        def make():
            if self.tree_width:
                return self.tree_width
            n = np.diff(self.qo_indptr)[self.kinds == SEG_TREE]
            return int(n.max(initial=0))
        return self._cached("max_tree_rows", make)

    @property
    def kv_span(self) -> int:
        """KV rows the attention grid covers: the largest live segment's pages, bucketed."""
        def make():
            kv_ptr = self.kv_indptr.tolist()
            pages = [b - a for a, b, slot in zip(kv_ptr, kv_ptr[1:], self.seq_slots.tolist()) if slot >= 0]
            return bucket(max(pages, default=0)) * PAGE_SIZE
        return self._cached("kv_span", make)

    def _row_kv(self) -> tuple[list[int], list[int], list[int]]:
        """(pages, offsets, kv_index) of every row as lists; -1 on padding rows."""
        def make():
            T = self.n_rows
            pages, offsets, kv_index = [-1] * T, [-1] * T, [-1] * T
            qo, kv_ptr, last = self.qo_indptr.tolist(), self.kv_indptr.tolist(), self.kv_last_page_len.tolist()
            kv = self.kv_indices.tolist()
            for s, slot in enumerate(self.seq_slots.tolist()):
                if slot < 0 or qo[s] == qo[s + 1]:
                    continue
                r0, r1, first_page = qo[s], qo[s + 1], kv_ptr[s]
                kv_len = (kv_ptr[s + 1] - first_page - 1) * PAGE_SIZE + last[s]
                idx = range(kv_len - (r1 - r0), kv_len)
                pages[r0:r1] = [kv[first_page + i // PAGE_SIZE] for i in idx]
                offsets[r0:r1] = [i % PAGE_SIZE for i in idx]
                kv_index[r0:r1] = idx
            return pages, offsets, kv_index
        return self._cached("kv_lists", make)

    def row_kv_locations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where each row's K/V goes: (pages [T], offsets [T], kv_index [T]) int64; -1 on padding rows."""
        return self._cached("kv_locations", lambda: tuple(np.asarray(x, np.int64) for x in self._row_kv()))

    def step_values(self) -> dict[str, list[int]]:
        """Every per-step value the step's kernels read, in arena order, as lists (step_arrays
        gives them as arrays of their device dtypes, STEP_INT64 or int32): the batch's arrays,
        each row's flat KV destination, each segment's first position, the slots of each kind
        of segment (-1 elsewhere) and, with trees, the tree block as a batch of its own (rows
        tree_start.. renumbered from 0: block_qo, block_slots, block_parents). A replay packs
        these lists straight into its arena (luce/ops/cuda_step_meta.py); a step has few
        segments, so they are made on Python lists."""
        def make():
            pages, offsets, _ = self._row_kv()
            kinds, slots, qo = self.kinds.tolist(), self.seq_slots.tolist(), self.qo_indptr.tolist()
            positions = self.positions.tolist()
            out = dict(token_ids=self.token_ids.tolist(), positions=positions, qo_indptr=qo,
                       kv_indptr=self.kv_indptr.tolist(), kv_indices=self.kv_indices.tolist(),
                       kv_last_page_len=self.kv_last_page_len.tolist(), seq_slots=slots,
                       kv_dst=[p * PAGE_SIZE + o if p >= 0 else -1 for p, o in zip(pages, offsets)],
                       logits_indices=self.logits_indices.tolist(),
                       start_pos=[positions[a] if b > a else 0 for a, b in zip(qo, qo[1:])],
                       ordinary_slots=[s if k == SEG_PREFILL or k == SEG_AR else -1 for k, s in zip(kinds, slots)],
                       ar_slots=self.ar_slots.tolist(),
                       prefill_slots=[s if k == SEG_PREFILL else -1 for k, s in zip(kinds, slots)])
            if self.tree_parents is not None:
                tp = self.tree_parents.tolist() if isinstance(self.tree_parents, np.ndarray) else list(self.tree_parents)
                trees = [s for s, k in enumerate(kinds) if k == SEG_TREE]
                s0 = trees[0] if trees else self.n_segments       # by kind: fixed by the key
                t0 = qo[s0] if trees else self.n_rows
                in_tree = [-1] * self.n_rows
                for s in trees:
                    in_tree[qo[s]:qo[s + 1]] = tp[qo[s]:qo[s + 1]]
                tree_slots = [s if k == SEG_TREE else -1 for k, s in zip(kinds, slots)]
                out.update(tree_parents=in_tree, tree_slots=tree_slots, block_qo=[r - t0 for r in qo[s0:]],
                           block_slots=tree_slots[s0:], block_parents=[p - t0 if p >= 0 else -1 for p in tp[t0:]])
            return out
        return self._cached("step_values", make)

    def step_arrays(self) -> dict[str, np.ndarray]:
        """step_values as contiguous 1-D arrays of their device dtypes (the arena's layout)."""
        return {name: np.asarray(v, np.int64 if name in STEP_INT64 else np.int32)
                for name, v in self.step_values().items()}

    def advance(self, token_ids) -> ForwardBatch | None:
        """The next decode step of this batch when each live segment is one AR row (padding
        segments hold no rows) whose last KV page has room: the batch whose rows feed
        `token_ids` (one per row) one position on, in the same pages, padding and topology
        (the same replay key; the arrays that stay are shared, read-only); else None. Its
        rows and KV lengths move together within the last pages, so it is valid
        (validate_batch) when this batch was and its token ids are in range: then it is
        marked valid alike (its token ids checked here). Step values made for this batch
        are carried over with what a decode step moves (positions, KV destinations, last
        page lengths, segment starts), not made again."""
        ar = self.__dict__.get("_ar_rows")       # [S] 1 on the AR segments, 0 on padding
        shared = (self.qo_indptr, self.seq_slots, self.kv_indptr, self.kv_indices, self.logits_indices,
                  self.tree_parents, self.segment_kind)
        if ar is None:
            kinds, qo = self.kinds.tolist(), self.qo_indptr.tolist()
            if any(k not in (SEG_AR, SEG_PAD) or b - a != (k == SEG_AR) for k, a, b in zip(kinds, qo, qo[1:])):
                return None
            ar = [int(k == SEG_AR) for k in kinds]
            for a in shared:
                if a is not None:
                    a.flags.writeable = False
        last = [n + a for n, a in zip(self.kv_last_page_len.tolist(), ar)]
        tokens = list(token_ids)
        if len(tokens) != self.n_rows or max(last, default=0) > PAGE_SIZE:
            return None
        nxt = ForwardBatch(np.asarray(tokens, np.int32), self.positions + 1, *shared[:2], *shared[2:4],
                           np.asarray(last, np.int32), shared[4], self.capture_layers, *shared[5:], self.replay_key,
                           self.row_capacity, self.tree_width, self.prompt_gemm)
        carried = nxt.__dict__
        for name in ("_kinds", "_kv_span", "_prefill_spans", "_has_padding_rows", "_has_trees",
                     "_has_ar_rows", "_ar_slots", "_decode_only"):
            if name in self.__dict__:
                carried[name] = self.__dict__[name]
        carried["_ar_rows"] = ar
        values = self.__dict__.get("_step_values")
        if values is not None:
            carried["_step_values"] = dict(
                values, token_ids=tokens, positions=[p + 1 for p in values["positions"]], kv_last_page_len=last,
                kv_dst=[d + 1 for d in values["kv_dst"]], start_pos=[p + a for p, a in zip(values["start_pos"], ar)])
        validated = self.__dict__.get("_validated")
        if validated is not None and (validated[1] is None or not tokens or 0 <= min(tokens) and max(tokens) < validated[1]):
            carried["_validated"] = validated
        return nxt

    def validate(self, max_slots: int | None = None, vocab: int | None = None) -> None:
        validate_batch(self, max_slots, vocab)


@dataclass
class ForwardOutput:
    logits: object                 # [L, V] f32 backend array (np.ndarray on numpy), rows = logits_indices
    captured: dict = field(default_factory=dict)  # {layer: [T, hidden] f32 backend array}
    staged: dict = field(default_factory=dict)    # {GDN layer: luce.ops.api.TreeStage of the tree block}
    greedy_ids: object = None      # [L] int64 backend array: each logits row's argmax, when asked (GraphedForward)


class Model(Protocol):
    """What every luce model provides (dense, qwen35, dflash)."""

    config: object                 # luce.gguf.config.ModelConfig
    backend: object                # luce.ops.api.Backend

    def new_state(self, max_pages: int, max_slots: int) -> ModelState:
        """Fresh state: KV pages for every attention layer, zeroed recurrent state per slot."""

    def forward(self, batch: ForwardBatch, state: ModelState) -> ForwardOutput:
        """Run one step: writes the rows' KV (and, for prefill and AR rows, recurrent state);
        tree rows write scratch only. Returns logits of `batch.logits_indices`, the outputs
        of `batch.capture_layers` and what a tree commit needs (luce.models.commit)."""


def validate_batch(batch: ForwardBatch, max_slots: int | None = None, vocab: int | None = None) -> None:
    """Raise ValueError naming the first inconsistency (shapes, CSR, positions, trees, slots
    < max_slots and token ids < vocab when given); then remember that `batch` is valid.
    Segments are checked in order, on Python lists: a step has a few segments, and a small
    numpy call costs more than the check it makes."""
    T, S = batch.n_rows, batch.n_segments
    for name, arr, n in (("positions", batch.positions, T), ("qo_indptr", batch.qo_indptr, S + 1),
                         ("kv_indptr", batch.kv_indptr, S + 1), ("kv_last_page_len", batch.kv_last_page_len, S)):
        if np.shape(arr) != (n,):
            raise ValueError(f"ForwardBatch.{name} has shape {np.shape(arr)}, expected ({n},)")
    qo, kv_ptr = batch.qo_indptr.tolist(), batch.kv_indptr.tolist()
    if qo[0] != 0 or qo[-1] != T or any(a > b for a, b in zip(qo, qo[1:])):
        raise ValueError(f"qo_indptr {qo} must rise from 0 to T={T}")
    if kv_ptr[0] != 0 or kv_ptr[-1] != len(batch.kv_indices) or any(a > b for a, b in zip(kv_ptr, kv_ptr[1:])):
        raise ValueError(f"kv_indptr {kv_ptr} must rise from 0 to nnz={len(batch.kv_indices)}")
    if len(batch.logits_indices) and (batch.logits_indices.min() < 0 or batch.logits_indices.max() >= T):
        raise ValueError(f"logits_indices must lie in [0, {T})")
    if batch.segment_kind is not None and np.shape(batch.segment_kind) != (S,):
        raise ValueError(f"ForwardBatch.segment_kind has shape {np.shape(batch.segment_kind)}, expected ({S},)")
    slots = batch.seq_slots.tolist()
    if max_slots is not None and S and max(slots) >= max_slots:
        raise ValueError(f"slot {max(slots)} >= max_slots {max_slots}")
    if vocab is not None and T and (batch.token_ids.min() < 0 or batch.token_ids.max() >= vocab):
        raise ValueError(f"token id out of range [0, {vocab}): {batch.token_ids.min()}..{batch.token_ids.max()}")
    tp = None if batch.tree_parents is None else np.asarray(batch.tree_parents)
    if tp is not None and tp.shape != (T,):
        raise ValueError(f"ForwardBatch.tree_parents has shape {tp.shape}, expected ({T},)")
    parents = None if tp is None else tp.tolist()
    kinds, last, positions = batch.kinds.tolist(), batch.kv_last_page_len.tolist(), batch.positions.tolist()
    seen_tree = False
    for s in range(S):
        r0, r1, kind = qo[s], qo[s + 1], kinds[s]
        parented = parents is not None and any(p >= 0 for p in parents[r0:r1])
        if (kind == SEG_PAD) != (slots[s] < 0):
            raise ValueError(f"segment {s}: kind {kind} does not fit slot {slots[s]} (padding is slot -1)")
        if kind == SEG_PAD:
            if parented:
                raise ValueError(f"segment {s}: padding rows cannot have tree parents")
            continue
        if seen_tree and kind != SEG_TREE:
            raise ValueError(f"segment {s}: tree segments come last (after prefill and AR rows)")
        seen_tree |= kind == SEG_TREE
        pages = kv_ptr[s + 1] - kv_ptr[s]
        if pages and not 1 <= last[s] <= PAGE_SIZE:
            raise ValueError(f"segment {s}: kv_last_page_len {last[s]} not in 1..{PAGE_SIZE}")
        kv_len = 0 if pages == 0 else (pages - 1) * PAGE_SIZE + last[s]
        if r1 - r0 > kv_len:
            raise ValueError(f"segment {s}: {r1 - r0} rows but only {kv_len} KV rows after the step")
        start = kv_len - (r1 - r0)
        if kind == SEG_TREE:
            if parents is None or r1 == r0:
                raise ValueError(f"segment {s}: a tree segment needs tree_parents and at least its root")
            rows = parents[r0:r1]
            if any(p < r0 for p in rows[1:]):
                raise ValueError(f"segment {s}: tree_parents {rows} must be -1 for the root (row {r0}) and "
                                 "an earlier row of the segment for every other row")
            want = (start + tree_depths([p - r0 if p >= 0 else -1 for p in rows])).tolist()
        else:
            if parented:
                raise ValueError(f"segment {s}: rows of a {'prefill' if kind == SEG_PREFILL else 'AR'} segment "
                                 "cannot have tree parents")
            want = list(range(start, kv_len))
        if positions[r0:r1] != want:
            what = "the committed length plus the depth" if kind == SEG_TREE else \
                "the segment's KV indices (consecutive, ending at kv_len-1)"
            raise ValueError(f"segment {s}: positions {positions[r0:r1]} must be {what}: {want}")
    batch.__dict__["_validated"] = (max_slots, vocab)


def ensure_valid(batch: ForwardBatch, max_slots: int | None = None, vocab: int | None = None) -> None:
    """validate_batch unless `batch` was validated already with these bounds (once per step)."""
    if batch.__dict__.get("_validated") != (max_slots, vocab):
        validate_batch(batch, max_slots, vocab)
