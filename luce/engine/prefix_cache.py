"""Prefix cache: prompt KV pages and recurrent snapshots shared across requests (DESIGN.md section 3).

Pages. Every full 16-token page of prompt KV made by prefill rows is registered under a hash
chain, key_i = H(key_{i-1}, tokens of page i): the cache takes one reference on it
(PagePool.hold). A request whose prompt starts with a cached chain shares those pages
(PagePool.share, one reference each) and prefills only the rest. A shared page is never
written again: the transaction refuses a step that would (luce.engine.txn). Dense models also
use a cached page in part, when the prompt diverges or ends inside it: the rows it shares are
copied into a fresh page of its own (backend.kv_move_rows), so no page is written by two.

Snapshots. A hybrid model's recurrent state (conv + GDN of every GDN layer) cannot be rewound,
so a cached prefix is usable only up to a position where that state was saved. It is saved
(`recurrent.snapshot`: device copies on GPU backends) when a prompt's prefill reaches its last
multiple of 64 before the prompt's end, and every `interval` tokens before (so a prompt that
edits the middle of a cached history resumes near the edit); the scheduler ends a chunk at each
(`Request.prefill_stops`). Each is a chunk boundary, so the state is bitwise what any cold prefill gives there (section 5
rule 3) and a request resumed from it computes exactly what it would have computed cold.

Only prefill rows make cached state: KV and state written by AR and tree rows come from the
decode arithmetic, which is not bitwise the prefill arithmetic (section 5 rule 1), so a
generated continuation is prefilled again when a later prompt contains it (and cached then).

Budget. Cache bytes (pages the cache holds x bytes per page, plus snapshot bytes) stay within
`budget`, and pages only the cache holds never exceed the pool's pages not reserved by live
requests (so admission's reservations still hold, luce.engine.slots): `make_room` evicts least
recently used leaves of the chain (a page and its snapshot) and snapshots of inner pages.
"""
from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from luce.models.kv_cache import PAGE_SIZE

SNAPSHOT_ALIGN = 64   # = luce.engine.scheduler.PREFILL_ALIGN, the GDN chunk
BROKEN = b""          # a cursor whose chain was evicted under it


def chain_key(parent: bytes | None, tokens) -> bytes:
    """Key of a page holding `tokens` [16] after the page keyed `parent` (None: the first)."""
    h = hashlib.blake2b(parent or b"root", digest_size=16)
    h.update(np.asarray(tokens, np.int64).tobytes())
    return h.digest()


@dataclass
class Entry:
    key: bytes
    parent: bytes | None
    page: int
    tokens: tuple[int, ...]                 # [16] the page's tokens
    index: int                              # page index in the sequence (tokens index*16 ..)
    tick: int = 0                           # last use (LRU)
    snapshot: Any = None                    # recurrent state after the page (hybrid models)
    snapshot_bytes: int = 0


@dataclass(frozen=True)
class Match:
    """What a prompt can take from the cache: n_tokens served, shared full pages (with their
    keys), an optional partially used page (its key, rows to copy) and the recurrent
    snapshot at n_tokens (hybrid)."""

    n_tokens: int = 0
    pages: tuple[int, ...] = ()
    keys: tuple[bytes, ...] = ()
    partial: tuple[bytes, int] | None = None
    snapshot: Any = None


@dataclass
class Cursor:
    """A slot's position in the chain: the key of its last registered page and the prompt
    tokens after it (fewer than a page)."""

    key: bytes | None = None
    tail: list[int] = field(default_factory=list)
    n_tokens: int = 0
    stops: tuple[int, ...] = ()             # where snapshots are due (multiples of 64)


@dataclass
class CacheStats:
    hit_tokens: int = 0         # prompt tokens served from the cache
    lookups: int = 0
    snapshot_hits: int = 0      # hybrid lookups resumed from a snapshot
    snapshot_misses: int = 0    # hybrid lookups that found no usable snapshot
    snapshots_taken: int = 0
    snapshot_failures: int = 0  # a snapshot copy raised (the cache went on without it)
    attach_failures: int = 0    # an attach raised (the request prefilled cold)
    evicted_pages: int = 0
    evicted_snapshots: int = 0


class PrefixCache:
    def __init__(self, pool, slots, model_state, backend, budget_bytes: int, interval: int = 1024):
        """pool: luce.engine.pages.PagePool; slots: luce.engine.slots.SlotManager (its
        reservations bound the cache-only pages); model_state: the model's ModelState;
        backend: its ops (kv_move_rows for partial pages); interval: hybrid models snapshot every
        this many prompt tokens besides the prompt's end (a multiple of 64, 0: only there)."""
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.pool, self.slots, self.model_state, self.backend = pool, slots, model_state, backend
        self.budget = int(budget_bytes)
        self.interval = int(interval)
        rec = model_state.recurrent
        self.needs_snapshots = rec is not None and tuple(getattr(rec, "gdn_layers", (0,))) != ()
        self.page_bytes = _page_bytes(model_state)
        self.entries: dict[bytes, Entry] = {}
        self.children: dict[bytes | None, set[bytes]] = {}
        self.cursors: dict[int, Cursor] = {}
        self.snapshot_bytes = 0
        self.stats = CacheStats()
        self._tick = 0
        self._keep: bytes | None = None
        self.fault = None      # tests: fault(point) raises inside attach ('cache_restore') or a snapshot

    # ---- queries ------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        return len(self.entries) * self.page_bytes + self.snapshot_bytes

    @property
    def n_snapshots(self) -> int:
        return sum(e.snapshot is not None for e in self.entries.values())

    def counters(self) -> dict[str, int]:
        s = self.stats
        return dict(prompt_tokens=s.hit_tokens, lookups=s.lookups, snapshot_hits=s.snapshot_hits,
                    snapshot_misses=s.snapshot_misses, evicted_pages=s.evicted_pages,
                    evicted_snapshots=s.evicted_snapshots, bytes=self.bytes, pages=len(self.entries),
                    snapshots=self.n_snapshots)

    def snapshot_stops(self, prompt_len: int, start: int) -> tuple[int, ...]:
        """Where a hybrid prompt prefilled from `start` pauses for snapshots: every `interval`
        tokens and the last multiple of 64 before its last token (none for dense models)."""
        if not self.needs_snapshots:
            return ()
        end = (prompt_len - 1) // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN
        stops = set(range(self.interval, end, self.interval)) if self.interval else set()
        return tuple(sorted(s for s in stops | {end} if s > start))

    def match(self, prompt) -> Match:
        """The longest usable cached prefix of `prompt` (pure). At least the prompt's last
        token is left to prefill (its logits give the first generated token)."""
        limit, keys, key = len(prompt) - 1, [], None
        for i in range(len(prompt) // PAGE_SIZE):
            tokens = tuple(prompt[i * PAGE_SIZE:(i + 1) * PAGE_SIZE])
            nxt = chain_key(key, tokens)
            entry = self.entries.get(nxt)
            if entry is None or entry.tokens != tokens:
                break
            keys.append(key := nxt)
        if self.needs_snapshots:
            j = min(len(keys), limit // PAGE_SIZE)
            while j > 0 and (j * PAGE_SIZE % SNAPSHOT_ALIGN or self.entries[keys[j - 1]].snapshot is None):
                j -= 1
            keys = keys[:j]
            snap = self.entries[keys[-1]].snapshot if keys else None
            return Match(j * PAGE_SIZE, tuple(self.entries[k].page for k in keys), tuple(keys), None, snap)
        keys = keys[:limit // PAGE_SIZE]
        n = len(keys) * PAGE_SIZE
        partial, rows = None, 0
        want = prompt[n:min(n + PAGE_SIZE, limit)]
        for child in self.children.get(keys[-1] if keys else None, ()):
            entry = self.entries[child]
            common = _common_prefix(entry.tokens, want)
            if common > rows:
                partial, rows = (child, common), common
        return Match(n + rows, tuple(self.entries[k].page for k in keys), tuple(keys), partial, None)

    # ---- a request enters a slot --------------------------------------------------------------
    def attach(self, slot: int, prompt) -> int:
        """Give the freshly admitted `slot` (no pages, zeroed state) the prompt's cached prefix:
        shared pages, a copied partial page, the restored recurrent state, its committed length.
        Returns the prompt tokens served (0 on a miss, or when a copy raised: then the slot
        is back to a fresh one)."""
        self.stats.lookups += 1
        m = self.match(prompt)
        if self.needs_snapshots:
            if m.snapshot is not None:
                self.stats.snapshot_hits += 1
            elif len(prompt) > SNAPSHOT_ALIGN:
                self.stats.snapshot_misses += 1
        cursor = Cursor(m.keys[-1] if m.keys else None, list(prompt[len(m.keys) * PAGE_SIZE:m.n_tokens]),
                        m.n_tokens, self.snapshot_stops(len(prompt), m.n_tokens))
        if m.n_tokens:
            try:
                self.pool.share(slot, m.pages)
                self._touch(m.keys)
                if m.partial is not None:
                    key, rows = m.partial
                    self.make_room(keep=key)
                    self._copy_partial(slot, self.entries[key].page, rows)
                if m.snapshot is not None:
                    if self.fault is not None:
                        self.fault("cache_restore")
                    self.model_state.recurrent.restore(slot, m.snapshot)
                self.slots.advance(slot, m.n_tokens)
            except Exception:  # noqa: BLE001 - the cache is an optimisation: fall back to a cold prefill
                self.stats.attach_failures += 1
                self.pool.release(slot)
                self.model_state.reset_slot(slot)
                self.slots.table[slot].kv_len = 0
                m, cursor = Match(), Cursor(stops=self.snapshot_stops(len(prompt), 0))
        self.cursors[slot] = cursor
        self.stats.hit_tokens += m.n_tokens
        return m.n_tokens

    def _copy_partial(self, slot: int, src_page: int, rows: int) -> None:
        (dst_page,) = self.pool.peek_free(1)
        self.pool.take(slot, [dst_page])
        src = np.arange(rows, dtype=np.int64) + src_page * PAGE_SIZE
        dst = np.arange(rows, dtype=np.int64) + dst_page * PAGE_SIZE
        for kv in self.model_state.kv.values():
            self.backend.kv_move_rows(kv, src, dst)

    def forget(self, slot: int) -> None:
        """The slot's request ended: nothing more of it is registered."""
        self.cursors.pop(slot, None)

    # ---- at commit ------------------------------------------------------------------------------
    def commit_prefill(self, chunks) -> None:
        """After a step's commit: register the full pages its prompt chunks completed (the
        cache takes a reference) and take the snapshots due at their ends. Never raises: a
        snapshot that fails is counted and skipped."""
        for c in chunks:
            cursor = self.cursors.get(c.slot)
            if cursor is None or cursor.n_tokens != c.start:
                continue
            pages = self.pool.slot_pages(c.slot)
            for t in c.token_ids:
                cursor.tail.append(int(t))
                cursor.n_tokens += 1
                if len(cursor.tail) == PAGE_SIZE:
                    cursor.key = self._register(cursor.key, tuple(cursor.tail), pages[cursor.n_tokens // PAGE_SIZE - 1])
                    cursor.tail = []
            if cursor.n_tokens in cursor.stops:
                if cursor.key in self.entries:
                    self._snapshot(c.slot, self.entries[cursor.key])
        self.make_room()

    def _register(self, parent, tokens, page: int) -> bytes:
        """Cache the slot's full `page` of `tokens` after the page keyed `parent`; returns its
        key, or BROKEN when the chain above it was evicted meanwhile (nothing more of this
        slot is registered then)."""
        if parent == BROKEN or (parent is not None and parent not in self.entries):
            return BROKEN
        key = chain_key(parent, tokens)
        entry = self.entries.get(key)
        if entry is None:
            self.pool.hold(page)
            index = 0 if parent is None else self.entries[parent].index + 1
            self.entries[key] = Entry(key, parent, page, tokens, index)
            self.children.setdefault(parent, set()).add(key)
        elif entry.page != page and self.pool.refcount[entry.page] == 1:
            # another request cached the same tokens (the same bits) first and has gone: keep
            # this slot's page instead, which the slot pins while it lives
            self.pool.unhold(entry.page)
            self.pool.hold(page)
            entry.page = page
        self._touch([key])
        return key

    def _snapshot(self, slot: int, entry: Entry) -> None:
        if entry.snapshot is not None:
            return
        try:
            if self.fault is not None:
                self.fault("cache_snapshot")
            snap = self.model_state.recurrent.snapshot(slot)
        except Exception:  # noqa: BLE001 - a missing snapshot only costs a later prefill
            self.stats.snapshot_failures += 1
            return
        entry.snapshot, entry.snapshot_bytes = snap, _nbytes(snap)
        self.snapshot_bytes += entry.snapshot_bytes
        self.stats.snapshots_taken += 1

    # ---- eviction -----------------------------------------------------------------------------
    def make_room(self, keep: bytes | None = None) -> None:
        """Evict least recently used leaves (page + snapshot) and inner snapshots until the
        cache fits its budget and its cache-only pages fit the unreserved pool; the entry
        keyed `keep` stays (an attach is copying from it)."""
        if not self._over():
            return
        self._keep = keep
        heap = [(e.tick, 0 if self._evictable(e) else 1, key) for key, e in self.entries.items()
                if self._evictable(e) or e.snapshot is not None]
        heapq.heapify(heap)
        while heap and self._over():
            tick, kind, key = heapq.heappop(heap)
            entry = self.entries.get(key)
            if entry is None or entry.tick != tick:
                continue
            if kind == 0 and self._evictable(entry):
                self._evict(entry)
                parent = self.entries.get(entry.parent) if entry.parent is not None else None
                if parent is not None and self._evictable(parent):
                    heapq.heappush(heap, (parent.tick, 0, parent.key))
            elif kind == 1 and entry.snapshot is not None and self.bytes > self.budget:
                self._drop_snapshot(entry)
        self._keep = None

    def _over(self) -> bool:
        unreserved = self.pool.n_pages - self.slots.reserved_pages
        return self.bytes > self.budget or self.pool.n_cache_only > unreserved

    def _evictable(self, e: Entry) -> bool:
        return not self.children.get(e.key) and self.pool.refcount[e.page] == 1 and e.key != self._keep

    def _evict(self, entry: Entry) -> None:
        self._drop_snapshot(entry)
        del self.entries[entry.key]
        siblings = self.children[entry.parent]
        siblings.discard(entry.key)
        if not siblings:
            del self.children[entry.parent]
        self.children.pop(entry.key, None)
        self.pool.unhold(entry.page)
        self.stats.evicted_pages += 1

    def _drop_snapshot(self, entry: Entry) -> None:
        if entry.snapshot is not None:
            self.snapshot_bytes -= entry.snapshot_bytes
            entry.snapshot, entry.snapshot_bytes = None, 0
            self.stats.evicted_snapshots += 1

    def clear(self) -> None:
        """Evict everything not in use (tests, shutdown)."""
        budget, self.budget = self.budget, -1
        self.make_room()
        self.budget = budget

    def _touch(self, keys) -> None:
        self._tick += 1
        for key in keys:
            self.entries[key].tick = self._tick

    # ---- checks -------------------------------------------------------------------------------
    def check(self) -> None:
        """Every entry's page is held once, the held pages are exactly the entries' pages, the
        chain is a tree, snapshot bytes add up, and cursors belong to live slots."""
        held = np.zeros(self.pool.n_pages, bool)
        for key, e in self.entries.items():
            assert not held[e.page], f"page {e.page} cached twice"
            held[e.page] = True
            assert chain_key(e.parent, e.tokens) == key, "entry key is not its chain key"
            assert key in self.children.get(e.parent, ()), "entry missing from its parent's children"
            assert e.parent is None or e.parent in self.entries, "entry whose parent was evicted"
            assert e.index == (0 if e.parent is None else self.entries[e.parent].index + 1)
            assert (e.snapshot is None) == (e.snapshot_bytes == 0), "snapshot bytes of an entry"
            assert e.snapshot is None or (e.index + 1) * PAGE_SIZE % SNAPSHOT_ALIGN == 0, "snapshot off a chunk boundary"
        assert np.array_equal(held, self.pool.held), "pool's cached pages differ from the cache's entries"
        assert sum(len(v) for v in self.children.values()) == len(self.entries), "children index out of date"
        assert self.snapshot_bytes == sum(e.snapshot_bytes for e in self.entries.values()), "snapshot bytes drift"
        for slot in self.cursors:
            assert self.slots.table[slot] is not None, f"cursor of free slot {slot}"


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _page_bytes(model_state) -> int:
    total = 0
    for layer in model_state.kv.values():
        for name in ("k", "v"):
            arr = getattr(layer, name, None)
            if arr is not None:
                total += int(arr.nbytes) // int(arr.shape[0])
    return total


def _nbytes(obj) -> int:
    """Bytes of every array reachable from a snapshot (dicts, tuples, .layers)."""
    if obj is None:
        return 0
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    if hasattr(obj, "layers"):
        return _nbytes(obj.layers)
    return int(getattr(obj, "nbytes", 0))
