"""Scheduler: picks each step's cohort under a token budget (continuous batching).

Every decoding request gets one AR row per step (decode first: it keeps inter-token latency
flat). The rest of the budget goes to prompts in submission order. A prompt is cut only at
absolute multiples of `align` (the GDN chunk, 64), whatever the budget left, so its chunks,
and therefore its arithmetic, are the same alone or among others (DESIGN.md section 5 rule
3); a chunk that cannot reach the next multiple waits for the next step. A request may also
name multiples of `align` where chunks must end (`Request.prefill_stops`: the prefix cache
snapshots the recurrent state there, luce.engine.prefix_cache).
"""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from luce.engine.request import DECODE, PREFILL, Request
from luce.engine.step import Cohort, DecodeRow, PrefillChunk

PREFILL_ALIGN = 64  # = luce.ref.gdn_chunked.GDN_CHUNK (tests check they agree)


def prefill_end(done: int, prompt_len: int, room: int, align: int = PREFILL_ALIGN) -> int | None:
    """End of the next prompt chunk starting at `done` with `room` tokens of budget: the whole
    rest if it fits, else the last multiple of `align` within reach; None when none is."""
    if prompt_len - done <= room:
        return prompt_len
    end = (done + room) // align * align
    return end if end > done else None


class Scheduler:
    def __init__(self, token_budget: int, max_slots: int, align: int = PREFILL_ALIGN):
        if token_budget < max_slots + align:
            raise ValueError(f"token_budget {token_budget} must be at least max_slots + {align} = "
                             f"{max_slots + align}, so a prompt chunk always fits beside every AR row")
        self.token_budget = token_budget
        self.align = align

    def schedule(self, running: Sequence[Request]) -> Cohort:
        """Cohort for the requests holding slots (any order; served by submission order)."""
        running = sorted(running, key=attrgetter("order"))
        cohort = Cohort()
        for r in running:
            if r.phase == DECODE:
                cohort.decode.append(DecodeRow(r.slot, r.request_id, r.next_input, r.n_tokens - 1))
        room = self.token_budget - len(cohort.decode)
        for r in running:
            if r.phase != PREFILL or room <= 0:
                continue
            end = prefill_end(r.n_prefilled, len(r.prompt_ids), room, self.align)
            if end is None:
                continue
            stop = next((s for s in r.prefill_stops if s > r.n_prefilled), None)
            if stop is not None and stop < end:
                end = stop                    # the prefix cache saves the recurrent state there
            chunk = tuple(r.prompt_ids[r.n_prefilled:end])
            cohort.prefill.append(PrefillChunk(r.slot, r.request_id, chunk, r.n_prefilled,
                                               end == len(r.prompt_ids)))
            room -= len(chunk)
        return cohort
