"""Scheduler: AR rows first, prompt chunks cut only at absolute multiples of 64, budget kept."""
import pytest

from luce.engine.request import DECODE, PREFILL, Request
from luce.engine.sampler import SamplingParams
from luce.engine.scheduler import PREFILL_ALIGN, Scheduler, prefill_end
from luce.ref.gdn_chunked import GDN_CHUNK


def test_alignment_is_the_gdn_chunk():
    assert PREFILL_ALIGN == GDN_CHUNK == 64


@pytest.mark.parametrize("done, n, room, want", [
    (0, 50, 100, 50),        # fits whole
    (0, 200, 100, 64),       # cut at the last multiple of 64 in reach
    (64, 200, 100, 128),
    (0, 200, 63, None),      # no multiple of 64 in reach: wait
    (128, 129, 1, 129),      # a one-token tail fits
    (0, 1, 1, 1),
    (64, 1000, 200, 256),
])
def test_prefill_end(done, n, room, want):
    assert prefill_end(done, n, room) == want


def request(order, n_prompt, phase, prefilled=0, outputs=()):
    r = Request(order, list(range(n_prompt)), SamplingParams(), 0, ctx=4096, order=order)
    r.phase, r.slot, r.n_prefilled = phase, order, prefilled
    r.out.token_ids.extend(outputs)
    return r


def test_decode_rows_first_then_prompts_in_submission_order():
    s = Scheduler(token_budget=140, max_slots=4)
    running = [request(3, 500, PREFILL), request(1, 300, PREFILL, prefilled=64),
               request(0, 10, DECODE, prefilled=10, outputs=[7, 8]), request(2, 5, DECODE, prefilled=5, outputs=[9])]
    cohort = s.schedule(running)
    assert [(r.slot, r.token_id, r.position) for r in cohort.decode] == [(0, 8, 11), (2, 9, 5)]
    # 138 tokens left: request 1 takes 64..192 (128 tokens), request 3 cannot reach 64 in 10
    assert [(c.slot, c.start, len(c.token_ids), c.completes_prompt) for c in cohort.prefill] == [(1, 64, 128, False)]
    assert cohort.n_rows <= 140


def test_prompt_tail_completes_and_every_chunk_starts_aligned():
    s = Scheduler(token_budget=100, max_slots=1)
    r = request(0, 300, PREFILL)
    starts = []
    while r.n_prefilled < 300:
        (chunk,) = s.schedule([r]).prefill
        starts.append(chunk.start)
        assert chunk.start % 64 == 0 and chunk.start == r.n_prefilled
        r.n_prefilled += len(chunk.token_ids)
        assert chunk.completes_prompt == (r.n_prefilled == 300)
    assert starts == [0, 64, 128, 192, 256]


def test_budget_too_small_is_refused():
    with pytest.raises(ValueError, match="token_budget 60"):
        Scheduler(token_budget=60, max_slots=1)
