"""Paged KV storage of the attention layers and the per-model state container.

Layout (what a GPU backend mirrors on the device): each attention layer owns
`k_pages, v_pages [n_pages, PAGE_SIZE, Hkv, D] f32`. A sequence is a list of page ids
(its CSR row in `ForwardBatch.kv_indices`); its KV index j lives at
`(pages[j // PAGE_SIZE], j % PAGE_SIZE)`. Pages are shared by all attention layers: page p
of layer 3 and page p of layer 7 hold the same tokens.

Recurrent state (conv, GDN) of hybrid models is kept per slot by the model that needs it
(`luce.models.qwen35`); `ModelState` only holds it and forwards slot resets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

PAGE_SIZE = 16  # tokens per KV page (DESIGN.md section 3)


class PagedKV:
    """One attention layer's KV pages: `k, v [n_pages, PAGE_SIZE, n_kv_heads, head_dim] f32`."""

    def __init__(self, n_pages: int, n_kv_heads: int, head_dim: int, zeros=np.zeros):
        """`zeros(shape, dtype)` allocates the pages: a backend's `zeros` (default numpy).
        write/read/gather_sequence index with numpy and serve tests on host arrays."""
        if n_pages <= 0:
            raise ValueError(f"PagedKV needs at least one page, got n_pages={n_pages}")
        shape = (n_pages, PAGE_SIZE, n_kv_heads, head_dim)
        self.k = zeros(shape, dtype=np.float32)
        self.v = zeros(shape, dtype=np.float32)

    @property
    def n_pages(self) -> int:
        return self.k.shape[0]

    def _check_pages(self, pages: np.ndarray) -> None:
        if pages.size and (pages.min() < 0 or pages.max() >= self.n_pages):
            raise IndexError(
                f"KV page id out of range [0, {self.n_pages}): got {pages.min()}..{pages.max()}; "
                "allocate more pages (new_state(max_pages=...)) or fix the batch's kv_indices")

    def write(self, pages: np.ndarray, offsets: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store row i of `k, v [N, Hkv, D]` at `(pages[i], offsets[i])`; pages/offsets [N] int."""
        pages = np.asarray(pages, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        self._check_pages(pages)
        self.k[pages, offsets] = k
        self.v[pages, offsets] = v

    def read(self, pages: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows at `(pages[i], offsets[i])` -> `(k, v) [N, Hkv, D]` copies."""
        pages = np.asarray(pages, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        self._check_pages(pages)
        return self.k[pages, offsets], self.v[pages, offsets]

    def gather_sequence(self, pages: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The first `length` KV rows of a sequence stored in `pages [P]` -> `(k, v) [length, Hkv, D]`."""
        pages = np.asarray(pages, dtype=np.int64)
        if length > len(pages) * PAGE_SIZE:
            raise ValueError(f"sequence of {length} KV rows does not fit its {len(pages)} pages")
        self._check_pages(pages)
        hkv, d = self.k.shape[2:]
        k = self.k[pages].reshape(-1, hkv, d)[:length]
        v = self.v[pages].reshape(-1, hkv, d)[:length]
        return k, v


class RecurrentStore(Protocol):
    """Per-slot recurrent state of a hybrid model (conv [K-1, C] and GDN [Hv, Dk, Dv] per layer)."""

    def reset_slot(self, slot: int) -> None:
        """Zero slot `slot`'s state (a new sequence starts there)."""

    def checkpoint(self, slots) -> None:
        """Save the state of `slots`; `rollback` puts the last checkpoint back bitwise."""

    def rollback(self) -> None:
        """Restore the state of the last checkpoint."""


@dataclass
class ModelState:
    """Everything a model's forward mutates across steps.

    kv: attention layer index -> that layer's PagedKV (all share page ids).
    recurrent: hybrid models' per-slot state (None for dense models).
    backend: the luce.ops backend whose arrays these are (tree commits go through it).
    """

    max_pages: int
    max_slots: int
    kv: dict[int, Any] = field(default_factory=dict)
    recurrent: RecurrentStore | None = None
    backend: Any = None

    def reset_slot(self, slot: int) -> None:
        """Forget slot `slot`'s recurrent state. KV needs no reset: pages are rewritten
        before they are read (a sequence's CSR only covers rows it has written)."""
        if not 0 <= slot < self.max_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.max_slots})")
        if self.recurrent is not None:
            self.recurrent.reset_slot(slot)

    def checkpoint(self, slots) -> None:
        """Save what a step's forward changes in place before commit: the recurrent state of
        `slots`, the step's prefill and AR slots (their rows advance it; tree rows write
        scratch). KV needs nothing: a step writes KV rows only past every slot's committed length."""
        if self.recurrent is not None:
            self.recurrent.checkpoint(slots)

    def rollback(self) -> None:
        """Undo everything since `checkpoint` (a step that failed before commit)."""
        if self.recurrent is not None:
            self.recurrent.rollback()


def bucket(n: int) -> int:
    """Padded size of n (rows or KV pages of a step): the next power of two up to 64, then the
    next multiple of 64. Steps padded to buckets repeat their shapes (graph replay)."""
    if n <= 0:
        return 0
    if n <= 64:
        return 1 << (n - 1).bit_length()
    return -(-n // 64) * 64


def pages_needed(kv_len: int) -> int:
    """Number of pages that hold `kv_len` KV rows."""
    return (kv_len + PAGE_SIZE - 1) // PAGE_SIZE
