"""SlotManager: which request holds which slot, how far its sequence is committed, and the
queue of requests waiting for a slot.

Admission is FIFO. A request enters a slot only when a slot is free AND the pool can cover
its worst case (`reserve_pages`, normally the pages of min(ctx, prompt + max_tokens)
tokens), so a running request never meets an exhausted pool. A request that could never fit
is rejected at submit; a full queue rejects too (QueueFull), each with the reason.
Retire frees the slot's pages and state ownership; the next assignment re-initialises the
recurrent state (StateSlots.assign), so a reused slot never inherits anything.
"""
from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from luce.engine.pages import PagePool
from luce.engine.state_slots import StateSlots


class AdmissionError(ValueError):
    """A request that can never be admitted (too large for the pool); nothing was changed."""


class QueueFull(RuntimeError):
    """Every slot is busy and the waiting queue is at capacity; nothing was changed."""


@dataclass
class SlotEntry:
    request_id: Any
    kv_len: int = 0           # tokens whose KV (and recurrent state) are committed
    reserve_pages: int = 0    # pages set aside for this request's worst case


class SlotManager:
    def __init__(self, pool: PagePool, states: StateSlots, max_queue: int = 1024):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.pool = pool
        self.states = states
        self.max_slots = states.max_slots
        self.max_queue = max_queue
        self.table: list[SlotEntry | None] = [None] * self.max_slots
        self.queue: deque[tuple[Any, int]] = deque()   # (request_id, reserve_pages), FIFO

    # ---- queries ------------------------------------------------------------------------------
    @property
    def n_live(self) -> int:
        return sum(e is not None for e in self.table)

    @property
    def reserved_pages(self) -> int:
        return sum(e.reserve_pages for e in self.table if e is not None)

    def live_slots(self) -> list[int]:
        return [s for s, e in enumerate(self.table) if e is not None]

    def entry(self, slot: int) -> SlotEntry:
        if not 0 <= slot < self.max_slots or self.table[slot] is None:
            raise KeyError(f"slot {slot} holds no request")
        return self.table[slot]

    def slot_of(self, request_id) -> int | None:
        for s, e in enumerate(self.table):
            if e is not None and e.request_id == request_id:
                return s
        return None

    def is_queued(self, request_id) -> bool:
        return any(rid == request_id for rid, _ in self.queue)

    # ---- admission ------------------------------------------------------------------------------
    def submit(self, request_id, reserve_pages: int) -> None:
        """Queue a request for a slot. Raises AdmissionError when it could never fit and
        QueueFull when the queue is at max_queue (nothing changes in either case)."""
        if reserve_pages > self.pool.n_pages:
            raise AdmissionError(f"request {request_id!r} needs {reserve_pages} KV pages at worst but the "
                                 f"pool has {self.pool.n_pages}: lower max_tokens or raise kv_pages")
        if self.slot_of(request_id) is not None or self.is_queued(request_id):
            raise ValueError(f"request {request_id!r} was already submitted")
        if len(self.queue) >= self.max_queue:
            raise QueueFull(f"all {self.max_slots} slots are busy and {len(self.queue)} requests are "
                            f"queued (max_queue={self.max_queue}); retry later or raise max_queue")
        self.queue.append((request_id, int(reserve_pages)))

    def admit_next(self) -> tuple[Any, int] | None:
        """Move the head of the queue into the lowest free slot (state re-initialised) when a
        slot is free and its reservation fits; returns (request_id, slot) or None."""
        if not self.queue:
            return None
        free = [s for s, e in enumerate(self.table) if e is None]
        request_id, reserve = self.queue[0]
        if not free or self.reserved_pages + reserve > self.pool.n_pages:
            return None
        slot = free[0]
        self.states.assign(slot, request_id)
        self.queue.popleft()
        self.table[slot] = SlotEntry(request_id, 0, reserve)
        return request_id, slot

    def admit_all(self) -> list[tuple[Any, int]]:
        admitted = []
        while (got := self.admit_next()) is not None:
            admitted.append(got)
        return admitted

    # ---- progress and release ---------------------------------------------------------------
    def advance(self, slot: int, kv_len: int) -> None:
        """Record that `slot`'s sequence is committed up to kv_len tokens (pages must cover it)."""
        entry = self.entry(slot)
        if kv_len < entry.kv_len or len(self.pool.slot_pages(slot)) * self.pool.page_size < kv_len:
            raise ValueError(f"slot {slot}: cannot move from {entry.kv_len} to {kv_len} committed tokens")
        entry.kv_len = kv_len

    def retire(self, slot: int) -> Any:
        """Free `slot`: its pages go back to the pool, its state loses its owner. Returns the
        request id it held."""
        entry = self.entry(slot)
        self.pool.release(slot)
        self.states.release(slot)
        self.table[slot] = None
        return entry.request_id

    def cancel(self, request_id) -> str:
        """Remove a request wherever it is: 'queued', 'live' (slot retired) or 'unknown'."""
        for i, (rid, _) in enumerate(self.queue):
            if rid == request_id:
                del self.queue[i]
                return "queued"
        slot = self.slot_of(request_id)
        if slot is None:
            return "unknown"
        self.retire(slot)
        return "live"

    # ---- checks -----------------------------------------------------------------------------
    def digest(self) -> str:
        rows = [None if e is None else (e.request_id, e.kv_len, e.reserve_pages) for e in self.table]
        return hashlib.sha256(repr((rows, list(self.queue))).encode()).hexdigest()

    def check(self) -> None:
        """Slot table, pool and state owners agree: a live slot's state belongs to its request
        and its pages cover its committed tokens; free slots own no pages and no state."""
        ids = [e.request_id for e in self.table if e is not None]
        assert len(ids) == len(set(ids)), "a request holds two slots"
        assert not set(ids) & {rid for rid, _ in self.queue}, "a request is both queued and live"
        for slot, e in enumerate(self.table):
            if e is None:
                assert not self.pool.slot_pages(slot), f"free slot {slot} still owns pages"
                assert self.states.owner[slot] is None, f"free slot {slot} still owns state"
            else:
                assert self.states.owns(slot, e.request_id), f"slot {slot} state not owned by its request"
                assert e.kv_len <= len(self.pool.slot_pages(slot)) * self.pool.page_size
        assert self.reserved_pages <= self.pool.n_pages, "reservations exceed the pool"
