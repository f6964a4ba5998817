"""The model-facing step interface: ForwardBatch in, ForwardOutput out.

A ForwardBatch is the engine's StepBatch (DESIGN.md section 2 step 3) as the model sees it:
T rows in S segments. A segment is a run of rows of one sequence (a prefill chunk, or one
AR row); its rows are consecutive positions and sit at consecutive row indices
`qo_indptr[s]:qo_indptr[s+1]`. The paged-KV CSR describes each segment's KV AFTER this
step's rows are written, so segment s has `kv_len(s) = (pages - 1) * PAGE_SIZE +
kv_last_page_len[s]` rows and its row j (0-based within the segment) is stored at KV index
`kv_len(s) - n_rows(s) + j`, which for linear sequences equals its position. A row attends
to KV indices 0..its own (causal). Segments with `seq_slots[s] == -1` are padding: their
rows write nothing and their outputs are unspecified (zeros on the numpy backend).

Tree rows (speculation) set `tree_parents`; their layout is luce.models.tree_rows'.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from luce.models.kv_cache import PAGE_SIZE, ModelState, pages_needed


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
    capture_layers: tuple[int, ...] = ()   # layers whose outputs [T, hidden] are returned
    tree_parents: np.ndarray | None = None  # [T] int32 parent row of tree rows (-1: root or ordinary row)

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

    def row_kv_locations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where each row's K/V goes: (pages [T], offsets [T], kv_index [T]) int64; -1 on padding rows."""
        pages = np.full(self.n_rows, -1, dtype=np.int64)
        offsets = np.full(self.n_rows, -1, dtype=np.int64)
        kv_index = np.full(self.n_rows, -1, dtype=np.int64)
        for s in range(self.n_segments):
            if self.seq_slots[s] < 0:
                continue
            r0, r1 = self.segment_rows(s)
            idx = np.arange(self.kv_len(s) - (r1 - r0), self.kv_len(s), dtype=np.int64)
            pages[r0:r1] = self.segment_pages(s)[idx // PAGE_SIZE]
            offsets[r0:r1] = idx % PAGE_SIZE
            kv_index[r0:r1] = idx
        return pages, offsets, kv_index

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistency (shapes, CSR, positions).
        Batches with tree rows follow the tree-segment rules of luce.models.tree_rows."""
        if self.tree_parents is not None:
            from luce.models.tree_rows import validate_batch  # tree_rows builds on this module

            validate_batch(self)
            return
        T, S = self.n_rows, self.n_segments
        for name, arr, n in (("positions", self.positions, T), ("qo_indptr", self.qo_indptr, S + 1),
                             ("kv_indptr", self.kv_indptr, S + 1), ("kv_last_page_len", self.kv_last_page_len, S)):
            if arr.shape != (n,):
                raise ValueError(f"ForwardBatch.{name} has shape {arr.shape}, expected ({n},)")
        if self.qo_indptr[0] != 0 or self.qo_indptr[-1] != T or np.any(np.diff(self.qo_indptr) < 0):
            raise ValueError(f"qo_indptr {self.qo_indptr.tolist()} must rise from 0 to T={T}")
        if self.kv_indptr[0] != 0 or self.kv_indptr[-1] != len(self.kv_indices) or np.any(np.diff(self.kv_indptr) < 0):
            raise ValueError(f"kv_indptr {self.kv_indptr.tolist()} must rise from 0 to nnz={len(self.kv_indices)}")
        if len(self.logits_indices) and (self.logits_indices.min() < 0 or self.logits_indices.max() >= T):
            raise ValueError(f"logits_indices must lie in [0, {T})")
        for s in range(S):
            if self.seq_slots[s] < 0:
                continue
            r0, r1 = self.segment_rows(s)
            n_pages = int(self.kv_indptr[s + 1] - self.kv_indptr[s])
            if n_pages and not 1 <= self.kv_last_page_len[s] <= PAGE_SIZE:
                raise ValueError(f"segment {s}: kv_last_page_len {self.kv_last_page_len[s]} not in 1..{PAGE_SIZE}")
            kv_len = self.kv_len(s)
            if r1 - r0 > kv_len:
                raise ValueError(f"segment {s}: {r1 - r0} rows but only {kv_len} KV rows after the step")
            want = np.arange(kv_len - (r1 - r0), kv_len)
            if not np.array_equal(self.positions[r0:r1], want):
                raise ValueError(f"segment {s}: positions {self.positions[r0:r1].tolist()} must be the "
                                 f"segment's KV indices {want.tolist()} (consecutive, ending at kv_len-1)")


@dataclass
class ForwardOutput:
    logits: object                 # [L, V] f32 backend array (np.ndarray on numpy), rows = logits_indices
    captured: dict = field(default_factory=dict)  # {layer: [T, hidden] f32 backend array}


class Model(Protocol):
    """What every luce model provides (dense, qwen35, dflash)."""

    config: object                 # luce.gguf.config.ModelConfig
    backend: object                # luce.ops.api.Backend

    def new_state(self, max_pages: int, max_slots: int) -> ModelState:
        """Fresh state: KV pages for every attention layer, zeroed recurrent state per slot."""

    def forward(self, batch: ForwardBatch, state: ModelState) -> ForwardOutput:
        """Run one step: writes the rows' KV (and recurrent state) and returns logits of
        `batch.logits_indices` and the outputs of `batch.capture_layers`."""


@dataclass
class SegmentSpec:
    """One segment for `build_batch`: `token_ids` at positions start_pos.. of the sequence in
    `slot` whose KV lives in `pages` (enough pages for start_pos + len(token_ids) rows).
    slot -1 makes a padding segment: no pages, no logits."""

    slot: int
    token_ids: Sequence[int]
    start_pos: int
    pages: Sequence[int]
    logits: str = "last"           # 'last' | 'all' | 'none': which rows reach the LM head


def build_batch(segments: Sequence[SegmentSpec], capture_layers: Sequence[int] = ()) -> ForwardBatch:
    """Pack segments (in order) into one ForwardBatch; logits rows follow segment order."""
    token_ids, positions, qo, slots, kv_indptr, kv_indices, last, logits = [], [], [0], [], [0], [], [], []
    for seg in segments:
        n = len(seg.token_ids)
        kv_len = seg.start_pos + n
        n_pages = pages_needed(kv_len) if seg.slot >= 0 else 0  # padding rows keep no KV
        if len(seg.pages) < n_pages:
            raise ValueError(f"slot {seg.slot}: {kv_len} KV rows need {n_pages} pages, got {len(seg.pages)}")
        row0 = qo[-1]
        token_ids.extend(int(t) for t in seg.token_ids)
        positions.extend(range(seg.start_pos, kv_len))
        qo.append(row0 + n)
        slots.append(seg.slot)
        kv_indices.extend(int(p) for p in list(seg.pages)[:n_pages])
        kv_indptr.append(len(kv_indices))
        last.append(kv_len - (n_pages - 1) * PAGE_SIZE if n_pages else 0)
        if seg.slot < 0:
            pass
        elif seg.logits == "all":
            logits.extend(range(row0, row0 + n))
        elif seg.logits == "last" and n:
            logits.append(row0 + n - 1)
        elif seg.logits not in ("last", "none"):
            raise ValueError(f"SegmentSpec.logits must be 'last', 'all' or 'none', got {seg.logits!r}")
    i32 = lambda xs: np.asarray(xs, dtype=np.int32)  # noqa: E731
    return ForwardBatch(
        token_ids=i32(token_ids), positions=i32(positions), qo_indptr=i32(qo), seq_slots=i32(slots),
        kv_indptr=i32(kv_indptr), kv_indices=i32(kv_indices), kv_last_page_len=i32(last),
        logits_indices=i32(logits), capture_layers=tuple(capture_layers))


def generate_greedy(model: Model, tokens: Sequence[int], n: int, *, slot: int = 0,
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
    backend = model.backend
    out: list[int] = []
    batch = build_batch([SegmentSpec(slot, list(tokens), 0, pages)])
    for step in range(n):
        logits = model.forward(batch, state).logits
        nxt = int(backend.argmax(logits)[0])
        out.append(nxt)
        if step + 1 < n:
            batch = build_batch([SegmentSpec(slot, [nxt], len(tokens) + step, pages)])
    return out
