"""Step transactions: preflight -> (model runs) -> commit | abort (DESIGN.md section 2).

`preflight(step)` checks every domain the step touches without changing anything: each live
segment's slot is held by the request the cohort names, owns its recurrent state, starts at
its committed length, reads exactly its own pages (committed ones plus the free pages the
step adds), stays within the context, and the added pages are free and distinct. A tree's
rows are KV rows start..start+N-1 like any segment's; only the accepted part stays.
It returns a Plan, or a Reject carrying the reason.

`commit(plan, accepted)` makes the step durable in the bookkeeping: the added pages join
their slots and committed lengths advance (tree slots by the accepted count only). Every
check it needs was done by preflight; it validates the plan is still current (and the
accepted counts) before its first change, so it either raises on misuse with nothing
changed or completes. `abort(plan)` leaves the bookkeeping as preflight found it (commit
never ran) and, when the plan captured the cohort's recurrent state (`capture_state`), puts
that state back exactly, undoing what a failed forward wrote.
KV rows a failed forward wrote lie beyond the committed lengths, so nothing reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from luce.engine.slots import SlotManager
from luce.engine.step import StepBatch
from luce.models.kv_cache import pages_needed


@dataclass(frozen=True)
class SlotChange:
    slot: int
    request_id: Any
    kv_len_before: int
    kv_len_after: int                 # trees: start + N (every node's KV row)
    new_pages: tuple[int, ...]        # enough for kv_len_after
    is_tree: bool


@dataclass(frozen=True)
class Plan:
    changes: tuple[SlotChange, ...]
    saved_state: Mapping[int, Any] | None = None   # slot -> captured recurrent state (rollback)

    @property
    def slots(self) -> list[int]:
        return [c.slot for c in self.changes]


@dataclass(frozen=True)
class Reject:
    reason: str

    def __bool__(self) -> bool:
        return False


class StalePlan(RuntimeError):
    """commit() got a plan whose slots or pages changed since preflight; nothing was changed."""


class Transaction:
    def __init__(self, slots: SlotManager, ctx: int):
        self.slots = slots
        self.pool = slots.pool
        self.states = slots.states
        self.ctx = ctx

    # ---- preflight ------------------------------------------------------------------------
    def preflight(self, step: StepBatch, capture_state: bool = False) -> Plan | Reject:
        """Plan for `step` or Reject(reason); reads only. capture_state: keep the cohort's
        recurrent state in the plan so abort() can restore it."""
        try:
            changes = self._check(step)
        except _Refusal as r:
            return Reject(str(r))
        saved = {c.slot: self.states.capture(c.slot) for c in changes} if capture_state else None
        return Plan(tuple(changes), saved)

    def _check(self, step: StepBatch) -> list[SlotChange]:
        pool, table = self.pool, self.slots.table
        trees = {t.slot for t in step.cohort.tree}
        changes: list[SlotChange] = []
        claimed: set[int] = set()
        for item in step.cohort.items:
            slot, rid = item.slot, item.request_id
            if not 0 <= slot < self.slots.max_slots:
                raise _Refusal(f"slot {slot} is not a live slot id (0..{self.slots.max_slots - 1})")
            if any(c.slot == slot for c in changes):
                raise _Refusal(f"slot {slot} appears twice in one step")
            entry = table[slot]
            if entry is None or entry.request_id != rid:
                raise _Refusal(f"slot {slot} is not held by request {rid!r}")
            if not self.states.owns(slot, rid):
                raise _Refusal(f"slot {slot}'s recurrent state is not owned by request {rid!r}")
            start = getattr(item, "start", getattr(item, "position", None))
            if start != entry.kv_len:
                raise _Refusal(f"slot {slot} has {entry.kv_len} committed tokens but the step starts at {start}")
            after = step.kv_len_after.get(slot)
            if after is None or after > self.ctx:
                raise _Refusal(f"slot {slot} would reach {after} tokens, beyond the context of {self.ctx}")
            new = tuple(step.new_pages.get(slot, ()))
            if len(pool.slot_pages(slot)) + len(new) != max(len(pool.slot_pages(slot)), pages_needed(after)):
                raise _Refusal(f"slot {slot} adds {len(new)} pages, {pool.extra_pages_needed(slot, after)} needed")
            for page in new:
                if not pool.is_free(page) or page in claimed:
                    raise _Refusal(f"page {page} planned for slot {slot} is not free")
                claimed.add(page)
            changes.append(SlotChange(slot, rid, entry.kv_len, after, new, slot in trees))
        self._check_reads(step, {c.slot: c for c in changes})
        return changes

    def _check_reads(self, step: StepBatch, changes: dict[int, SlotChange]) -> None:
        """Every live segment reads exactly the pages its own slot will hold."""
        f = step.forward
        seen = set()
        for s in range(f.n_segments):
            slot = int(f.seq_slots[s])
            if slot < 0:
                continue
            c = changes.get(slot)
            if c is None or slot in seen:
                raise _Refusal(f"segment {s} runs slot {slot}, which the cohort does not schedule once")
            seen.add(slot)
            kv_len = c.kv_len_after
            want = (self.pool.slot_pages(slot) + list(c.new_pages))[:pages_needed(kv_len)]
            if f.segment_pages(s).tolist() != want or (want and f.kv_len(s) != kv_len):
                raise _Refusal(f"segment {s} (slot {slot}) reads pages {f.segment_pages(s).tolist()}, "
                               f"it owns {want}")
        if seen != set(changes):
            raise _Refusal(f"slots {sorted(set(changes) - seen)} are in the cohort but have no segment")

    # ---- commit / abort ----------------------------------------------------------------------
    def commit(self, plan: Plan, accepted: Mapping[int, int] | None = None) -> None:
        """Make the step durable. accepted: tree slot -> tree rows kept (the accepted root
        path, root included: 1..N; missing slots keep 0)."""
        accepted = dict(accepted or {})
        finals = []
        for c in plan.changes:
            entry = self.slots.table[c.slot]
            if entry is None or entry.request_id != c.request_id or entry.kv_len != c.kv_len_before \
                    or not all(self.pool.is_free(p) for p in c.new_pages):
                raise StalePlan(f"slot {c.slot} changed since preflight; build and preflight the step again")
            if c.is_tree:
                n = accepted.pop(c.slot, 0)
                if not 0 <= n <= c.kv_len_after - c.kv_len_before:
                    raise ValueError(f"slot {c.slot}: {n} accepted tokens, at most "
                                     f"{c.kv_len_after - c.kv_len_before} possible")
                length = c.kv_len_before + n
                pages = c.new_pages[:self.pool.extra_pages_needed(c.slot, length)]
            else:
                length, pages = c.kv_len_after, c.new_pages
            finals.append((c.slot, length, pages))
        if accepted:
            raise ValueError(f"accepted counts for slots {sorted(accepted)} that have no tree in the plan")
        for slot, length, pages in finals:
            self.pool.take(slot, pages)
            self.slots.advance(slot, length)

    def abort(self, plan: Plan) -> None:
        """Forget the step: bookkeeping is untouched until commit; captured recurrent state
        goes back into slots still held by the same request."""
        if plan.saved_state:
            for c in plan.changes:
                if self.states.owns(c.slot, c.request_id):
                    self.states.put(c.slot, plan.saved_state[c.slot])


class _Refusal(Exception):
    pass
