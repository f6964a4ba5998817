"""Step transactions: preflight -> (model runs, acceptance) -> commit (DESIGN.md sections 2, 9).

`preflight(step)` checks everything that can fail without changing anything: the batch
itself (luce.models.batch.validate_batch: the one validation of a step), each live
segment's slot is held by the request the cohort names, owns its recurrent state, starts at
its committed length, reads exactly its own pages (committed ones plus the free pages the
step adds), writes no page another request or the prefix cache shares, stays within the context, the added pages are free and distinct, and what the
commit will need is there (the layers whose features a drafter keeps are captured). It
returns a Plan, or a Reject carrying the reason.

The forward then writes durable state for prefill and AR rows only (their KV rows, past
the committed lengths until commit, and their recurrent state); tree rows write scratch.
Acceptance is pure. `commit(plan, outcome)` checks that the plan is still current and the
accepted paths are paths of their trees, before any change, then promotes the accepted
paths into KV, conv and GDN state (one model-level call: luce.models.commit through the
graphed committer) and the committed rows' features into the drafter, takes the pages and
advances the committed lengths (tree slots by their accepted path only), and hands the
committed prompt chunks to the prefix cache (their full pages become shareable). Everything it
could fail on was checked, so after its first change it cannot fail.
A step that fails before commit leaves every domain as it was: tree rows wrote scratch, and
the recurrent state that prefill and AR rows advance in place is rolled back to the
checkpoint the engine took before their forward (ModelState.checkpoint); the engine drops
and retries the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

from luce.engine.slots import SlotManager
from luce.engine.step import DecodeRow, StepBatch
from luce.models.batch import ensure_valid
from luce.models.commit import TreeCommit, plan_tree_commit
from luce.models.kv_cache import PAGE_SIZE, pages_needed


class SlotChange(NamedTuple):   # one per row of every step: a tuple is quicker to make than a frozen dataclass
    slot: int
    request_id: Any
    kv_len_before: int
    kv_len_after: int                 # trees: start + N (every node's KV row)
    new_pages: tuple[int, ...]        # enough for kv_len_after
    is_tree: bool


@dataclass(frozen=True)
class Plan:
    step: StepBatch
    changes: tuple[SlotChange, ...]

    @property
    def slots(self) -> list[int]:
        return [c.slot for c in self.changes]


@dataclass(frozen=True)
class Reject:
    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass
class StepOutcome:
    """What a step decided (pure): the forward's output, each tree's accepted path and the
    tokens every request emits."""

    output: Any                                          # luce.models.batch.ForwardOutput
    paths: dict[int, tuple[int, ...]] = field(default_factory=dict)   # tree slot -> path (root first)
    tokens: dict[Any, list[int]] = field(default_factory=dict)        # request id -> emitted tokens
    accepted: dict[int, Any] = field(default_factory=dict)            # tree slot -> luce.spec Acceptance
    logprobs: dict[Any, list] = field(default_factory=dict)           # request id -> [TokenLogprob] (if asked)


@dataclass(frozen=True)
class Promotion:
    """A commit's device work, computed before any change: the trees' accepted paths
    (luce.models.commit.TreeCommit) and the committed rows whose features a drafter keeps:
    rows [N] of the step and (slot, first position, count) segments of them."""

    trees: TreeCommit
    feature_rows: tuple[int, ...]
    feature_segments: tuple[tuple[int, int, int], ...]


class StalePlan(RuntimeError):
    """commit() got a plan whose slots or pages changed since preflight; nothing was changed."""


class Transaction:
    def __init__(self, slots: SlotManager, ctx: int, promote: Callable[[Promotion, Any], None] | None = None,
                 feature_layers=(), vocab: int | None = None, check: Callable[[Promotion], None] | None = None,
                 cache=None):
        """promote(promotion, output): the device side of a commit (the engine's: the graphed
        tree commit and the drafter's features); check(promotion): what promote would refuse,
        raised before any change; feature_layers: target layers a drafter needs captured on
        every step; cache: a luce.engine.prefix_cache.PrefixCache, given the committed prompt
        chunks (it registers their full pages and takes the snapshots due; it never raises)."""
        self.slots = slots
        self.pool = slots.pool
        self.states = slots.states
        self.ctx = ctx
        self.promote = promote
        self.feature_layers = tuple(feature_layers)
        self.vocab = vocab
        self.check = check
        self.cache = cache

    # ---- preflight ------------------------------------------------------------------------
    def preflight(self, step: StepBatch) -> Plan | Reject:
        """Plan for `step` or Reject(reason); reads only."""
        try:
            ensure_valid(step.forward, self.slots.max_slots, self.vocab)
            missing = set(self.feature_layers) - set(step.forward.capture_layers) if self.feature_layers else ()
            if missing:
                raise _Refusal(f"the drafter keeps features of layers {sorted(missing)} the step does not capture")
            return Plan(step, tuple(self._check(step)))
        except (_Refusal, ValueError) as r:
            return Reject(str(r))

    def _check(self, step: StepBatch) -> list[SlotChange]:
        pool, table, states, ctx = self.pool, self.slots.table, self.states, self.ctx
        max_slots, kv_len_after, new_pages = self.slots.max_slots, step.kv_len_after, step.new_pages
        trees = {t.slot for t in step.cohort.tree}
        changes: dict[int, SlotChange] = {}
        owned: dict[int, list[int]] = {}      # slot -> the pages it will hold, what its segment must read
        claimed: set[int] = set()
        for item in step.cohort.items:
            slot, rid = item.slot, item.request_id
            if not 0 <= slot < max_slots:
                raise _Refusal(f"slot {slot} is not a live slot id (0..{max_slots - 1})")
            if slot in changes:
                raise _Refusal(f"slot {slot} appears twice in one step")
            entry = table[slot]
            if entry is None or entry.request_id != rid:
                raise _Refusal(f"slot {slot} is not held by request {rid!r}")
            if not states.owns(slot, rid):
                raise _Refusal(f"slot {slot}'s recurrent state is not owned by request {rid!r}")
            start, kv_len = item.position if isinstance(item, DecodeRow) else item.start, entry.kv_len
            if start != kv_len:
                raise _Refusal(f"slot {slot} has {kv_len} committed tokens but the step starts at {start}")
            after = kv_len_after.get(slot)
            if after is None or after > ctx:
                raise _Refusal(f"slot {slot} would reach {after} tokens, beyond the context of {ctx}")
            new = tuple(new_pages.get(slot, ()))
            held = pool.slot_pages(slot)
            need = pages_needed(after)
            if len(held) + len(new) != max(len(held), need):
                raise _Refusal(f"slot {slot} adds {len(new)} pages, {pool.extra_pages_needed(slot, after)} needed")
            shared = [p for p in held[kv_len // PAGE_SIZE:] if pool.is_shared(p)]
            if shared:
                raise _Refusal(f"slot {slot} would write KV rows from {kv_len} into pages {shared}, "
                               "which other requests or the prefix cache share")
            for page in new:
                if not pool.is_free(page) or page in claimed:
                    raise _Refusal(f"page {page} planned for slot {slot} is not free")
                claimed.add(page)
            changes[slot] = SlotChange(slot, rid, kv_len, after, new, slot in trees)
            owned[slot] = (held + list(new))[:need] if new else held[:need]
        self._check_reads(step, changes, owned)
        return list(changes.values())

    def _check_reads(self, step: StepBatch, changes: dict[int, SlotChange], owned: dict[int, list[int]]) -> None:
        """Every live segment reads exactly the pages its own slot will hold (`owned`)."""
        f = step.forward
        kv_ptr, kv, last = f.kv_indptr.tolist(), f.kv_indices.tolist(), f.kv_last_page_len.tolist()
        seen = set()
        for s, slot in enumerate(f.seq_slots.tolist()):
            if slot < 0:
                continue
            c = changes.get(slot)
            if c is None or slot in seen:
                raise _Refusal(f"segment {s} runs slot {slot}, which the cohort does not schedule once")
            seen.add(slot)
            want, reads = owned[slot], kv[kv_ptr[s]:kv_ptr[s + 1]]
            if reads != want or (want and (len(reads) - 1) * PAGE_SIZE + last[s] != c.kv_len_after):
                raise _Refusal(f"segment {s} (slot {slot}) reads pages {reads}, it owns {want}")
        if len(seen) != len(changes):
            raise _Refusal(f"slots {sorted(set(changes) - seen)} are in the cohort but have no segment")

    # ---- commit ------------------------------------------------------------------------------
    def commit(self, plan: Plan, outcome: StepOutcome) -> None:
        """Make the step durable: promote the accepted paths and features (device), take the
        pages, advance the committed lengths. Raises (changing nothing) on a stale plan or a
        path that is not one of its tree's; after its first change it cannot fail."""
        finals, promotion = self.prepare(plan, outcome.paths)
        if self.promote is not None:
            self.promote(promotion, outcome.output)
        for slot, length, pages in finals:
            self.pool.take(slot, pages)
            self.slots.advance(slot, length)
        if self.cache is not None and plan.step.cohort.prefill:
            self.cache.commit_prefill(plan.step.cohort.prefill)

    def prepare(self, plan: Plan, paths: Mapping[int, tuple[int, ...]]):
        """The checks and arrays of a commit (pure): ([(slot, length, pages)], Promotion)."""
        step, finals = plan.step, []
        for c in plan.changes:
            entry = self.slots.table[c.slot]
            if entry is None or entry.request_id != c.request_id or entry.kv_len != c.kv_len_before \
                    or c.new_pages and not all([self.pool.is_free(p) for p in c.new_pages]):
                raise StalePlan(f"slot {c.slot} changed since preflight; build and preflight the step again")
            if c.is_tree:
                n = len(paths.get(c.slot, ()))
                if not 1 <= n <= c.kv_len_after - c.kv_len_before:
                    raise ValueError(f"slot {c.slot}: an accepted path of {n} nodes, 1 to "
                                     f"{c.kv_len_after - c.kv_len_before} possible")
                length = c.kv_len_before + n
                pages = c.new_pages[:self.pool.extra_pages_needed(c.slot, length)]
            else:
                length, pages = c.kv_len_after, c.new_pages
            finals.append((c.slot, length, pages))
        trees = plan_tree_commit(step.forward, paths)    # every path a path of its tree, or ValueError
        rows, segments = [], []
        if self.feature_layers:
            f = step.forward
            for s in range(f.n_segments):
                slot = int(f.seq_slots[s])
                if slot < 0:
                    continue
                r0, r1 = f.segment_rows(s)
                kept = [r0 + int(node) for node in paths[slot]] if slot in paths else list(range(r0, r1))
                segments.append((slot, f.kv_len(s) - (r1 - r0), len(kept)))
                rows.extend(kept)
        promotion = Promotion(trees, tuple(rows), tuple(segments))
        if self.check is not None:
            self.check(promotion)
        return finals, promotion


class _Refusal(Exception):
    pass
