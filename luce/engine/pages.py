"""Paged KV bookkeeping: a refcounted pool of 16-token pages and per-slot page lists.

Only ids and counts live here; the KV arrays themselves belong to the model state. A step's
device layout (the paged-KV CSR) is packed by luce.models.packer from the pages planned here.
Pages are peeked when a step is planned (`plan_growth`) and taken at its commit (`take`).
A page may be shared: the prefix cache holds one reference on each page it keeps (`hold`) and
a request whose prompt starts with cached pages takes references on them (`share`); a page
returns to the free list when its last reference goes. Every mutating call checks first and
changes nothing when it cannot succeed.
"""
from __future__ import annotations

import hashlib

import numpy as np

from luce.models.kv_cache import PAGE_SIZE, pages_needed


class PoolExhausted(RuntimeError):
    """Not enough free KV pages; nothing was changed."""


class PagePool:
    def __init__(self, n_pages: int):
        if n_pages <= 0:
            raise ValueError(f"a page pool needs at least one page, got {n_pages}")
        self.n_pages = n_pages
        self.page_size = PAGE_SIZE
        self.refcount = np.zeros(n_pages, np.int32)      # [n_pages]
        self._free = list(range(n_pages - 1, -1, -1))    # stack; pops the lowest id first
        self.pages: dict[int, list[int]] = {}            # slot -> page ids in sequence order
        self.held = np.zeros(n_pages, bool)              # [n_pages] the prefix cache holds a reference

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self.n_pages - len(self._free)

    def slot_pages(self, slot: int) -> list[int]:
        return self.pages.get(slot, [])

    def extra_pages_needed(self, slot: int, n_tokens: int) -> int:
        """Pages `slot` must gain so its list covers `n_tokens` tokens."""
        return max(0, pages_needed(n_tokens) - len(self.slot_pages(slot)))

    def peek_free(self, n: int, skip: int = 0) -> list[int]:
        """The ids the next allocations would hand out, after the first `skip` of them: pure read.
        Raises PoolExhausted when fewer than skip + n pages are free."""
        if skip + n > len(self._free):
            raise PoolExhausted(f"{skip + n} free KV pages needed, {len(self._free)} free of {self.n_pages}")
        top = len(self._free) - 1 - skip
        return [self._free[top - i] for i in range(n)]

    def plan_growth(self, demands) -> dict[int, list[int]]:
        """Pages each (slot, n_tokens) demand would gain, in order, without changing anything.

        Returns {slot: new page ids} (distinct across slots); PoolExhausted names the shortfall."""
        planned: dict[int, list[int]] = {}
        taken = 0
        for slot, n_tokens in demands:
            if slot in planned:
                raise ValueError(f"slot {slot} appears twice in one page plan")
            need = self.extra_pages_needed(slot, n_tokens)
            if taken + need > len(self._free):
                raise PoolExhausted(f"slot {slot} needs {need} more KV pages for {n_tokens} tokens, "
                                    f"{len(self._free) - taken} left free of {self.n_pages}")
            planned[slot] = self.peek_free(need, skip=taken)
            taken += need
        return planned

    def is_free(self, page: int) -> bool:
        return 0 <= page < self.n_pages and self.refcount[page] == 0

    def take(self, slot: int, page_ids) -> None:
        """Append the given free pages to `slot`'s list (the ids a plan peeked).
        Raises ValueError, changing nothing, when one is not free or repeats."""
        if not page_ids:
            return
        page_ids = [int(p) for p in page_ids]
        if len(set(page_ids)) != len(page_ids) or not all(self.is_free(p) for p in page_ids):
            raise ValueError(f"pages {page_ids} for slot {slot} are not distinct free pages")
        k = len(page_ids)
        if self._free[len(self._free) - k:][::-1] == page_ids:
            del self._free[len(self._free) - k:]
        else:
            chosen = set(page_ids)
            self._free = [p for p in self._free if p not in chosen]
        self.refcount[page_ids] += 1
        self.pages.setdefault(slot, []).extend(page_ids)

    def share(self, slot: int, page_ids) -> None:
        """Start `slot`'s (empty) list with pages the prefix cache holds, one reference each.
        Raises ValueError, changing nothing, when the slot has pages or one is not held."""
        page_ids = [int(p) for p in page_ids]
        if self.slot_pages(slot) or not all(0 <= p < self.n_pages and self.held[p] for p in page_ids):
            raise ValueError(f"slot {slot} cannot share pages {page_ids}: it has pages or they are not cached")
        if page_ids:
            self.refcount[page_ids] += 1
            self.pages[slot] = list(page_ids)

    def hold(self, page: int) -> None:
        """The prefix cache takes a reference on a page some slot owns."""
        if not 0 <= page < self.n_pages or self.held[page] or self.refcount[page] == 0:
            raise ValueError(f"page {page} cannot be cached: it is free or already cached")
        self.held[page] = True
        self.refcount[page] += 1

    def unhold(self, page: int) -> None:
        """The prefix cache drops its reference (the page is freed when it was the last)."""
        if not 0 <= page < self.n_pages or not self.held[page]:
            raise ValueError(f"page {page} is not held by the prefix cache")
        self.held[page] = False
        self._decref(page)

    @property
    def n_cache_only(self) -> int:
        """Pages only the prefix cache references (evicting them frees them)."""
        return int((self.held & (self.refcount == 1)).sum())

    def is_shared(self, page: int) -> bool:
        return self.refcount[page] > 1 or bool(self.held[page])

    def release(self, slot: int) -> None:
        for page in self.pages.pop(slot, []):
            self._decref(page)

    def _decref(self, page: int) -> None:
        self.refcount[page] -= 1
        if self.refcount[page] == 0:
            self._free.append(page)

    def digest(self) -> str:
        """Hash of every structure (refcounts, free order, page lists): equal iff unchanged."""
        h = hashlib.sha256(self.refcount.tobytes())
        h.update(np.asarray(self._free, np.int64).tobytes() + self.held.tobytes())
        for slot in sorted(self.pages):
            h.update(f"|{slot}:".encode() + np.asarray(self.pages[slot], np.int64).tobytes())
        return h.hexdigest()

    def check(self) -> None:
        """Invariants: free + used == total, refcounts >= 0, refcount == owners (slot lists and
        the cache), free pages unowned, no page twice in one slot's list."""
        owners = self.held.astype(np.int32)
        for slot, pages in self.pages.items():
            assert len(set(pages)) == len(pages), f"slot {slot} lists a page twice"
            np.add.at(owners, np.asarray(pages, np.int64), 1)
        assert (self.refcount >= 0).all(), "negative refcount"
        assert np.array_equal(owners, self.refcount), "refcount differs from owners"
        free = np.zeros(self.n_pages, bool)
        free[self._free] = True
        assert len(set(self._free)) == len(self._free), "page freed twice"
        assert not (free & (self.refcount > 0)).any(), "free page still owned"
        assert int(free.sum()) + int((self.refcount > 0).sum()) == self.n_pages, "page leaked"
