"""Steps ahead: a decode step launched before the previous step's ids reach the host (mixed
into luce.engine.Engine; vLLM's asynchronous scheduling).

A decode step's inputs are the previous step's outputs, so a synchronous engine leaves the
device idle while the host reads the ids, hands them out, and builds and launches the next
step. Here a step of plain AR rows whose tokens the device draws (greedy, or seeded sampling
without penalties, bias, grammar or log-probs: `ahead_eligible`) is launched and committed at
once: an AR row's commit (its KV row and pages, its committed length) does not depend on the
token it produces. Its ids stay on the device as well, kept by slot (the graph's argmax,
GraphedForward.keep_ids_for, or backend.keep_ids after the draw), so the next step, the same
rows one position on, is built, preflighted and launched `fed` from them (backend.feed_ids)
before this step's ids are read (backend.ids_start / ids_wait). The device runs the steps
back to back while the host hands out the previous step's tokens. Tokens are the same as
without it: the next step computes what a step fed from the host would.

A request that reaches max_tokens or the context has no row in the next step. One that
finishes otherwise (stop token, stop string, cancellation) while its next row is in flight
wastes that row: its slot is retired as usual, and what the row writes lands in the
slot's own pages and state, which nothing reads before a later step (on the same stream)
re-initialises them. The next step is launched ahead only while every row of the step in
flight is live, no prompt waits for a slot or for budget, and some row goes on past this
step (max_tokens and the context are known ahead), and, with speculation, while its depth
policy has settled on plain decoding or times it (EngineSpeculation.rests: no try due; the
first step of such a run is not timed, `steady`; a DFlash drafter,
which takes the target's features of every step, keeps the engine waiting); otherwise the
engine takes its ordinary path once the step in flight is done.

Failures: a step ahead that fails before its launch is just not launched. It takes no
checkpoint of its rows' recurrent state (the copy a step of the ordinary path makes, ~150 MB a
slot at the 27B's shapes): one that fails in its forward is not committed, and on a model with
recurrent state its requests end with the error (their state may have moved on; DESIGN.md 9:
after durable mutation the cohort retires). A step in flight is committed, so a failure on
reading its ids (a diverged row, an injected fault) ends its live requests with the error
instead of retrying them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from luce.engine.outcome import device_draw, greedy
from luce.engine.request import DECODE, PREFILL
from luce.engine.sampler import backend_can_draw
from luce.engine.step import Cohort, DecodeRow, StepBatch
from luce.engine.txn import Reject, StepOutcome


@dataclass
class InFlight:
    """A launched and committed step whose ids have not reached the host."""

    step: StepBatch
    ids: Any             # backend.ids_start's handle


def ahead_enabled(config, backend, forward, spec) -> bool:
    """Does the engine run steps ahead? config.async_steps None: where the backend launches
    asynchronously and graphs are on (LUCE_ASYNC_STEPS=0 turns that off, for A/B runs); True:
    wherever the backend has the ops (tests)."""
    if config.async_steps is False or spec is not None and spec.feature_layers:
        return False      # a DFlash drafter takes the target's features of every step it commits
    if config.async_steps is None and os.environ.get("LUCE_ASYNC_STEPS", "1") == "0":
        return False
    ops = ("ids_store", "put_ids", "keep_ids", "feed_ids", "ids_start", "ids_wait")
    if not all(hasattr(backend, op) for op in ops):
        return False
    return config.async_steps is True or (bool(getattr(backend, "launches_async", False)) and forward.enabled)


class StepsAhead:
    """Mixin of Engine (uses its requests, slots, builder, txn, forward, model_state, hooks,
    _apply, _record, _fail)."""

    in_flight: InFlight | None = None
    _broken: tuple | None = None       # (cohort, why) of a step ahead whose forward failed

    def ahead_eligible(self, step: StepBatch) -> bool:
        """May this step be launched ahead: plain AR rows whose tokens are drawn on the device
        (greedy, or seeded sampling the backend does: outcome.device_draw)?"""
        cohort = step.cohort
        if not self.ahead or cohort.prefill or cohort.tree or not cohort.decode:
            return False
        params = [self.requests[r.request_id].params for r in cohort.decode]
        return greedy(params) or (hasattr(self.model.backend, "sample_ids") and all(map(backend_can_draw, params)))

    def _ids_in_flight(self, step: StepBatch, out) -> Any:
        """Start the copy of the step's tokens to the host: the argmax its graph kept, or the
        seeded draw, queued after the forward and kept by slot for the next step to feed from."""
        backend, ids = self.model.backend, getattr(out, "greedy_ids", None)
        if ids is None:
            requests = [self._request_in(s) if s >= 0 else None for s in step.logits_slot.tolist()]
            ids = device_draw(step, out.logits, backend, requests)
            backend.keep_ids(ids, step.forward, self.forward.last_ids)
        return backend.ids_start(ids)

    def _live(self, row: DecodeRow) -> bool:
        """Is the row's request still running in its slot?"""
        r, entry = self.requests.get(row.request_id), self.slots.table[row.slot]
        return r is not None and not r.finished and entry is not None and entry.request_id == row.request_id

    def _launch(self, step: StepBatch, plan, fed: bool) -> InFlight:
        """Forward (ids kept on the device, their copy to the host queued), then the commit,
        which for AR rows needs no token."""
        greedy_ids = greedy([self.requests[r.request_id].params for r in step.cohort.decode])
        out = self.forward(step.forward, self.model_state, greedy_ids=greedy_ids, fed=fed)
        ids = self._ids_in_flight(step, out)
        self.txn.commit(plan, StepOutcome(out))
        return InFlight(step, ids)

    def _run_ahead(self, current: InFlight, steady: bool = True) -> list:
        """Launch the next step if it may go ahead, then hand out the current step's tokens;
        steady False: the current step was not itself launched ahead (its time is not a plain
        step's in steady state: EngineSpeculation.end_step)."""
        following = self._next(current)
        updates = self._finish(current)
        if self._broken is not None:     # the step in flight's tokens out first, then the error
            (cohort, message), self._broken = self._broken, None
            updates += self._fail(Cohort(decode=[r for r in cohort.decode if self._live(r)]), message)
        if self.spec is not None:
            self.spec.end_step(current.step, steady=steady)
        self.in_flight = following
        if following is not None and not any(self._live(r) for r in following.step.cohort.decode):
            self.in_flight = None                            # every row ended: nothing to hand out
            self.model.backend.ids_wait(following.ids)
        return updates

    def _step_in_flight(self) -> list:
        current, self.in_flight = self.in_flight, None
        if self.spec is not None:
            self.spec.begin_step()
        if not any(self._live(r) for r in current.step.cohort.decode):
            self.model.backend.ids_wait(current.ids)         # cancelled meanwhile: an ordinary step
            return self.step()
        return self._run_ahead(current)

    def _next(self, current: InFlight) -> InFlight | None:
        rows = current.step.cohort.decode
        if not self._may_follow(rows):
            return None
        cohort = Cohort(decode=[DecodeRow(r.slot, r.request_id, 0, r.position + 1) for r in rows
                                if not self._ends_next(self.requests[r.request_id])])
        try:
            step = self.builder.build(cohort)
            plan = self.txn.preflight(step)
            if isinstance(plan, Reject):
                return None
            self._hook("before_forward", step)
        except Exception:  # noqa: BLE001 - nothing changed: the engine's ordinary path runs it next
            return None
        try:      # no checkpoint (a copy of every row's recurrent state a step): see the module's text
            return self._launch(step, plan, fed=True)
        except Exception as e:  # noqa: BLE001 - not committed; KV rows past the committed lengths are scratch
            if self.model_state.recurrent is not None:    # ... but the rows' state may have moved on
                self._broken = (cohort, f"a step launched ahead failed: {type(e).__name__}: {e}")
            return None

    def _may_follow(self, rows: list[DecodeRow]) -> bool:
        """Every row live, nothing waiting to be scheduled, and some request going on past
        the step in flight."""
        if not all(self._live(r) for r in rows):
            return False
        if self.slots.queue and None in self.slots.table:
            return False
        if sum(r.phase in (PREFILL, DECODE) for r in self.requests.values()) != len(rows):
            return False
        if not any(not self._ends_next(self.requests[r.request_id]) for r in rows):
            return False
        return self.spec is None or self.spec.rests()     # speculation: only while it steps aside

    @staticmethod
    def _ends_next(r) -> bool:
        """Does the request reach max_tokens or the context with its next token?"""
        return r.out.length_left() <= 1

    def _finish(self, current: InFlight) -> list:
        """The step's ids to the host, then its live rows' tokens to their requests."""
        step = current.step
        live = Cohort(decode=[r for r in step.cohort.decode if self._live(r)])
        try:
            ids = self.model.backend.ids_wait(current.ids).tolist()
            self._hook("after_forward", step)
            row_of = {r.request_id: i for i, r in enumerate(step.cohort.decode)}    # logits row i is AR row i
            tokens = {r.request_id: [ids[row_of[r.request_id]]] for r in live.decode}
            bad = [r.slot for r in live.decode if tokens[r.request_id][0] < 0]
            if bad:
                raise ValueError(f"NaN in the logits of slots {bad}: the forward pass diverged")
            outcome = StepOutcome(None, tokens=tokens)
            self._hook("after_accept", step)
        except Exception as e:  # noqa: BLE001 - committed: its requests end with the error
            return self._fail(live, f"{type(e).__name__}: {e}")
        self._record(step, outcome)
        return self._apply(live, outcome.tokens)
