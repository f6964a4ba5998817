"""What an engine shows of itself (mixed into luce.engine.Engine): graph counters, prefix
cache counters, occupancy gauges and the bookkeeping invariants tests check after every call."""
from __future__ import annotations

from luce.engine.request import DECODE, PREFILL
from luce.engine.speculation import drafter_chain


class EngineViews:
    """Mixin of Engine (reads its forward, committer, spec, cache, pool, slots, requests,
    config and in_flight)."""

    def graph_counters(self) -> dict:
        """Graph replay counters of the target's forward, its tree commits and the draft
        model's forward (summed), and `eager_reasons`: why calls ran eagerly."""
        total, reasons = {}, {}
        for owner in self._graph_owners():
            for name, n in getattr(owner, "counters", {}).items():
                total[name] = total.get(name, 0) + n
            cache = getattr(owner, "cache", None)
            for why, n in getattr(cache, "eager_reasons", {}).items():
                reasons[why] = reasons.get(why, 0) + n
        total["eager_reasons"] = reasons
        return total

    def _graph_owners(self) -> list:
        """What captures graphs: the target's forward, its tree commits, the draft models' forwards."""
        drafter = getattr(getattr(self.spec, "speculator", None), "drafter", None)
        return [self.forward, self.committer] + [getattr(d, "forward", None) for d in drafter_chain(drafter)]

    def prefix_cache_counters(self) -> dict[str, int]:
        """The prefix cache's counters and size ({} when it is off)."""
        return self.cache.counters() if self.cache is not None else {}

    def gauges(self) -> dict[str, int]:
        """Current occupancy: slots, queue, KV pages, the prefix cache's bytes."""
        c = self.cache
        return dict(slots_total=self.config.max_slots, slots_busy=self.slots.n_live,
                    queue_depth=len(self.slots.queue), kv_pages_total=self.pool.n_pages,
                    kv_pages_used=self.pool.n_used, prefix_cache_bytes=c.bytes if c else 0)

    def check(self) -> None:
        """Every bookkeeping invariant (tests call this after each operation)."""
        self.pool.check()
        self.slots.check()
        if self.cache is not None:
            self.cache.check()
        for r in self.requests.values():
            live = r.phase in (PREFILL, DECODE)
            assert live == (self.slots.slot_of(r.request_id) is not None), f"request {r.request_id} slot mismatch"
            if live:
                kv = self.slots.table[r.slot].kv_len
                ahead = self.in_flight is not None and any(row.request_id == r.request_id
                                                           for row in self.in_flight.step.cohort.decode)
                assert kv == (r.n_prefilled if r.phase == PREFILL else r.n_tokens - 1 + ahead)
