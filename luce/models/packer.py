"""The one CSR packer: segments in, a ForwardBatch with its replay key out (DESIGN.md 2, 4).

    p = Packer()
    p.segment(slot, SEG_PREFILL, tokens, positions, pages, kv_len, logits=[n - 1], pad_to=64)
    p.segment(slot, SEG_AR, [tok], [pos], pages, pos + 1, logits=[0])
    p.segment(slot, SEG_TREE, tokens, positions, pages, kv_len, parents=parents, logits=range(n), pad_to=8)
    batch = p.finish(capture_layers, pad_pages=True)

Every segment lists the pages covering its KV after the step (its first pages_needed(kv_len)
of `pages`). `pad_to` follows the segment with a padding segment (slot -1) of pad_to - n
rows (always, even of 0 rows), and for trees gives the padding rows logits too, so the
segment's rows and logits rows depend on pad_to alone; `finish(pad_pages=True)` ends with a
zero-row padding segment carrying the padding pages that round the KV page count up to its
bucket. The replay key is the topology only:

    replay_key = (((kind, rows or pad_to), ...) per live segment, KV pages, logits rows,
                  KV span (bucketed pages of the longest segment), captured layers)
                 (+ ("decode matmuls",) for a batch built with prompt_gemm False)

so steps with one key have the same shapes, the same grids and the same launches: every
per-step value (token ids, positions, CSR, slots, parents) lives in the step's metadata
arena, never in the key (luce/ops/cuda_step_meta.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from luce.models.batch import SEG_AR, SEG_PAD, SEG_PREFILL, SEG_TREE, ForwardBatch
from luce.models.kv_cache import PAGE_SIZE, ModelState, bucket, pages_needed
from luce.ref.tree import tree_depths

PAD_PAGE = 0  # page id written into padding CSR entries; padding segments never touch it


class Packer:
    """Accumulates segments in row order; `finish()` returns the ForwardBatch."""

    def __init__(self):
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.parents: list[int] = []
        self.qo = [0]
        self.slots: list[int] = []
        self.kinds: list[int] = []
        self.kv_indptr = [0]
        self.kv_indices: list[int] = []
        self.last: list[int] = []
        self.logits: list[int] = []
        self.blocks: list[tuple[int, int]] = []   # (kind, rows or pad_to) of each live segment
        self.capacity = 0
        self.tree_width = 0
        self.has_tree = False

    @property
    def n_rows(self) -> int:
        return len(self.tokens)

    def segment(self, slot: int, kind: int, tokens, positions, pages, kv_len: int, parents=None,
                logits=(), pad_to: int | None = None) -> int:
        """Append one live segment (then its padding when pad_to is given); returns its
        first row. parents: local parents [n] of a tree segment; logits: local rows that
        reach the LM head, in order."""
        n = len(tokens)
        if slot < 0 or kind == SEG_PAD:
            raise ValueError("live segments need a slot >= 0 and a kind (padding is added by pad_to / finish)")
        need = pages_needed(kv_len)
        if len(pages) < need:
            raise ValueError(f"slot {slot}: {kv_len} KV rows need {need} pages, got {len(pages)}")
        if pad_to is not None and pad_to < n:
            raise ValueError(f"slot {slot}: {n} rows do not fit a padded segment of {pad_to}")
        row0 = self._append(slot, kind, tokens, positions, pages[:need], kv_len, parents)
        self.logits.extend(row0 + int(j) for j in logits)
        rows = n if pad_to is None else pad_to
        self.blocks.append((kind, rows))
        self.capacity = max(self.capacity, rows)
        if kind == SEG_TREE:
            self.tree_width = max(self.tree_width, rows)
        if pad_to is not None:
            pad_row0 = self._append(-1, SEG_PAD, [0] * (pad_to - n), [0] * (pad_to - n), [], 0, None)
            if kind == SEG_TREE:
                self.logits.extend(range(pad_row0, pad_row0 + pad_to - n))
        return row0

    def _append(self, slot, kind, tokens, positions, pages, kv_len, parents) -> int:
        row0 = len(self.tokens)
        self.tokens.extend(map(int, tokens))
        self.positions.extend(map(int, positions))
        if parents is not None:
            self.has_tree = True
            self.parents.extend(row0 + int(p) if p >= 0 else -1 for p in parents)
        else:
            self.parents.extend([-1] * len(tokens))
        self.qo.append(len(self.tokens))
        self.slots.append(slot)
        self.kinds.append(kind)
        self.kv_indices.extend(map(int, pages))
        self.kv_indptr.append(len(self.kv_indices))
        self.last.append(kv_len - (len(pages) - 1) * PAGE_SIZE if len(pages) else 0)
        return row0

    def finish(self, capture_layers=(), pad_pages: bool = False, prompt_gemm: bool = True) -> ForwardBatch:
        """The batch; pad_pages rounds the KV page count up to its bucket (a last zero-row
        padding segment whose pages are PAD_PAGE); prompt_gemm as ForwardBatch's."""
        if pad_pages:
            extra = bucket(len(self.kv_indices)) - len(self.kv_indices)
            self._append(-1, SEG_PAD, [], [], [PAD_PAGE] * extra, extra * PAGE_SIZE, None)
        i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
        batch = ForwardBatch(
            token_ids=i32(self.tokens), positions=i32(self.positions), qo_indptr=i32(self.qo),
            seq_slots=i32(self.slots), kv_indptr=i32(self.kv_indptr), kv_indices=i32(self.kv_indices),
            kv_last_page_len=i32(self.last), logits_indices=i32(self.logits), capture_layers=tuple(capture_layers),
            tree_parents=i32(self.parents) if self.has_tree else None, segment_kind=np.asarray(self.kinds, np.int8),
            row_capacity=self.capacity, tree_width=self.tree_width, prompt_gemm=prompt_gemm)
        batch.replay_key = (tuple(self.blocks), len(self.kv_indices), len(self.logits), batch.kv_span,
                            tuple(capture_layers)) + (() if prompt_gemm else ("decode matmuls",))
        return batch


@dataclass
class SegmentSpec:
    """One segment for `build_batch`: `token_ids` at positions start_pos.. of the sequence in
    `slot` whose KV lives in `pages` (enough for start_pos + len(token_ids) rows). With
    `parents` (local parents [n], root -1) it is a tree segment: rows at start_pos + depth,
    every row reaching the LM head."""

    slot: int
    token_ids: Sequence[int]
    start_pos: int
    pages: Sequence[int]
    logits: str = "last"           # 'last' | 'all' | 'none' | 'block' (all but the first row)
    parents: Sequence[int] | None = None
    pad_to: int | None = None      # the segment padded to this many rows (Packer.segment)
    block_logits: int | None = None   # 'block': only the first this many rows after the first


def build_batch(segments: Sequence[SegmentSpec], capture_layers: Sequence[int] = (),
                pad_pages: bool = False, prompt_gemm: bool = True) -> ForwardBatch:
    """Pack segments (in order; trees last) into one ForwardBatch; logits rows follow
    segment order. Segments of slot -1 become padding rows. pad_pages rounds the KV page count
    up to its bucket, so that the replay key of a step repeats as its sequences grow page by
    page (what graph replay wants; the exact layout otherwise). prompt_gemm False: prompt
    rows' matmuls take the decode family (ForwardBatch.prompt_gemm)."""
    p = Packer()
    for seg in segments:
        n = len(seg.token_ids)
        if seg.slot < 0:
            p._append(-1, SEG_PAD, seg.token_ids, [0] * n, [], 0, None)
            continue
        if seg.logits not in ("last", "all", "none", "block"):
            raise ValueError(f"SegmentSpec.logits must be 'last', 'all', 'none' or 'block', got {seg.logits!r}")
        if seg.parents is not None:
            depths = tree_depths(seg.parents)
            if len(depths) != n:
                raise ValueError(f"slot {seg.slot}: {len(depths)} parents for {n} tree rows")
            p.segment(seg.slot, SEG_TREE, seg.token_ids, seg.start_pos + depths, seg.pages, seg.start_pos + n,
                      parents=seg.parents, logits=range(n), pad_to=seg.pad_to)
            continue
        if seg.block_logits is not None and (seg.logits != "block" or seg.block_logits < 0):
            raise ValueError(f"slot {seg.slot}: block_logits={seg.block_logits} needs logits='block' and >= 0")
        block_end = n if seg.block_logits is None else min(n, 1 + seg.block_logits)
        rows = {"last": range(n - 1, n) if n else range(0), "all": range(n), "none": range(0),
                "block": range(1, block_end)}[seg.logits]
        p.segment(seg.slot, SEG_PREFILL if n > 1 else SEG_AR, seg.token_ids, range(seg.start_pos, seg.start_pos + n),
                  seg.pages, seg.start_pos + n, logits=rows, pad_to=seg.pad_to)
    return p.finish(capture_layers, pad_pages, prompt_gemm)


def generate_greedy(model, tokens: Sequence[int], n: int, *, slot: int = 0,
                    state: ModelState | None = None) -> list[int]:
    """Greedy-decode `n` tokens after `tokens` (prefill in one step, then one row per step).

    Uses pages 0.. of a fresh state (or `state`, whose slot `slot` is reset first)."""
    if not tokens:
        raise ValueError("generate_greedy needs at least one prompt token")
    total = len(tokens) + n
    if state is None:
        state = model.new_state(max_pages=pages_needed(total), max_slots=slot + 1)
    state.reset_slot(slot)
    pages = list(range(pages_needed(total)))
    out: list[int] = []
    batch = build_batch([SegmentSpec(slot, list(tokens), 0, pages)])
    for step in range(n):
        nxt = int(model.backend.argmax(model.forward(batch, state).logits)[0])
        out.append(nxt)
        if step + 1 < n:
            batch = build_batch([SegmentSpec(slot, [nxt], len(tokens) + step, pages)])
    return out
