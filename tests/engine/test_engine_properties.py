"""Engine under random arrivals, cancellations and injected faults (hypothesis, fake model).

After every step: bookkeeping invariants hold (Engine.check), preflight changed nothing, the
model saw every live slot read exactly its own pages and state. A fault at any point before
commit leaves every domain bitwise as it was and retires no one (after the forward of
prefill / AR rows the engine rolls their state back); the step runs again. At the end every
request that finished normally produced exactly its reference output (what it gives alone),
a cancelled one a prefix of it, and none ended with an error.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luce.engine import Engine, EngineConfig, FinishReason, SamplingParams
from luce.engine.txn import Reject
from luce.models.kv_cache import pages_needed
from tests.engine.fake_model import FakeModel, reference_output
from tests.engine.faults import POINTS, FaultInjector, domain_digests

request_st = st.fixed_dictionaries({
    "arrive": st.integers(0, 12),
    "prompt_len": st.one_of(st.integers(1, 20), st.integers(60, 200)),
    "max_tokens": st.integers(1, 12),
    "temperature": st.sampled_from([0.0, 0.0, 0.8]),
    "seed": st.integers(0, 2**32),
    "stop_token": st.one_of(st.none(), st.integers(0, 47)),
    "cancel_at": st.one_of(st.none(), st.integers(0, 20)),
    "token_seed": st.integers(0, 2**16),
})


def make_prompt(n, token_seed):
    return [(token_seed * 7919 + 31 * i) % 48 for i in range(n)]


def checked_preflight(engine):
    """Wrap engine.txn.preflight: every call must leave every structure byte-identical."""
    inner = engine.txn.preflight

    def preflight(step):
        before = (engine.pool.digest(), engine.slots.digest(), engine.states.digest())
        plan = inner(step)
        assert (engine.pool.digest(), engine.slots.digest(), engine.states.digest()) == before
        assert not isinstance(plan, Reject), plan.reason
        return plan

    engine.txn.preflight = preflight


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request_st, min_size=1, max_size=7),
       max_slots=st.integers(1, 5), extra_budget=st.integers(0, 150), tight_pages=st.booleans(),
       pad=st.booleans(), fault_steps=st.sets(st.integers(0, 30), max_size=2), point=st.sampled_from(POINTS))
def test_random_traffic_gives_each_request_its_alone_output(requests, max_slots, extra_budget, tight_pages,
                                                           pad, fault_steps, point):
    model = FakeModel()
    kv_pages = pages_needed(212) + 3 if tight_pages else None   # tight: reservations make requests queue
    engine = Engine(model, config=EngineConfig(max_slots=max_slots, ctx=256, token_budget=max_slots + 64 + extra_budget,
                                               kv_pages=kv_pages, pad_steps=pad))
    checked_preflight(engine)
    faults = FaultInjector(engine, fault_steps, point)
    inject, seen = engine.fault_hook, {}

    def hook(at, step):
        if at == "before_forward":
            seen["before"] = domain_digests(engine)
        inject(at, step)

    engine.fault_hook = hook
    specs, ids = {}, {}
    for step_no in range(400):
        faults.step_no = step_no
        arrive_and_cancel(engine, requests, step_no, ids, specs)
        n_fired = len(faults.fired)
        updates = engine.step()
        errors = {u.request_id for u in updates if u.finish_reason == FinishReason.ERROR}
        if len(faults.fired) > n_fired:   # rolled back (prefill / AR rows) or nothing durable: dropped, retried
            assert not updates and domain_digests(engine) == seen["before"]
        assert not errors                 # two faults never exceed max_step_retries
        engine.check()
        assert not model.violations, model.violations
        if step_no > 12 and not engine.has_unfinished():
            break
    assert_alone_outputs(engine, ids, specs)


def arrive_and_cancel(engine, requests, step_no: int, ids: dict, specs: dict) -> None:
    """Add the requests (request_st dicts) arriving at step_no and cancel those due; ids /
    specs: test index -> request id / (prompt, params), filled in."""
    for i, r in enumerate(requests):
        if r["arrive"] == step_no:
            params = SamplingParams(max_tokens=r["max_tokens"], temperature=r["temperature"], seed=r["seed"],
                                    top_k=r.get("top_k", 0),
                                    stop_token_ids=() if r["stop_token"] is None else (r["stop_token"],))
            prompt = make_prompt(r["prompt_len"], r["token_seed"])
            ids[i] = engine.add_request(prompt, params)
            specs[i] = (prompt, params)
        if r["cancel_at"] == step_no and i in ids:
            engine.cancel(ids[i])


def assert_alone_outputs(engine, ids: dict, specs: dict) -> None:
    """Every request ended, nothing is held, and each request's output is its reference output
    (a prefix of it when cancelled); ids / specs: test index -> request id / (prompt, params)."""
    assert not engine.has_unfinished()
    assert engine.pool.n_used == 0 and engine.slots.n_live == 0
    for i, rid in ids.items():
        out = engine.take_output(rid)
        prompt, params = specs[i]
        want = reference_output(prompt, params, params.seed)
        if out.finish_reason == FinishReason.CANCELLED:
            assert out.token_ids == want[:len(out.token_ids)]
        else:
            assert out.token_ids == want, (i, out.finish_reason)
            assert out.finish_reason == (FinishReason.STOP if want[-1] in params.stop_token_ids
                                         else FinishReason.LENGTH)


def test_a_step_failing_every_retry_retires_only_its_cohort_and_reused_slot_matches_fresh_engine():
    """A prefill + AR step that faults after its forward every time: rolled back and run
    again max_step_retries times, then its requests end with the error; a prompt the step did
    not schedule survives, and a slot the faulted cohort held, reused, gives exactly what a
    fresh engine gives."""
    model = FakeModel()
    config = EngineConfig(max_slots=3, ctx=512, token_budget=67)
    engine = Engine(model, config=config)
    greedy = SamplingParams(max_tokens=6)
    a = engine.add_request(make_prompt(5, 1), greedy)
    engine.step()                                        # a decodes from now on
    b1 = engine.add_request(make_prompt(300, 2), greedy)  # takes the 64-token chunk each step
    b2 = engine.add_request(make_prompt(200, 3), greedy)  # waits: no budget left for a chunk
    fired, seen = [], {}

    def fault(point, step):
        cohort = {c.request_id for c in step.cohort.items}
        if point == "before_forward":     # after admission: what the failed step must leave
            seen["before"] = domain_digests(engine)
        if point == "after_forward" and cohort == {a, b1}:
            fired.append(True)
            raise RuntimeError("boom")

    engine.fault_hook = fault
    for _ in range(config.max_step_retries):
        assert engine.step() == [] and domain_digests(engine) == seen["before"]
    updates = engine.step()
    assert len(fired) == config.max_step_retries + 1 and engine.get(b2).phase == "prefill"
    assert {u.request_id for u in updates} == {a, b1} and all("boom" in u.error for u in updates)
    for rid in (a, b1):
        assert engine.get(rid).finish_reason == FinishReason.ERROR and "boom" in engine.get(rid).error
    c = engine.add_request(make_prompt(9, 4), greedy)    # reuses a slot of the faulted cohort
    engine.run()
    engine.check()
    assert not model.violations
    assert engine.take_output(b2).token_ids == reference_output(make_prompt(200, 3), greedy, 0)
    fresh = Engine(FakeModel(), config=config)
    fresh_c = fresh.add_request(make_prompt(9, 4), greedy)
    fresh.run()
    assert engine.take_output(c).token_ids == fresh.take_output(fresh_c).token_ids
    assert engine.stats.failed == 2 and engine.stats.dropped_steps == 3


def test_queue_full_and_oversized_requests_are_refused_with_reasons():
    engine = Engine(FakeModel(), config=EngineConfig(max_slots=1, ctx=128, token_budget=70, max_queue=1,
                                                     kv_pages=4))
    with pytest.raises(ValueError, match="needs 8 KV pages at worst but the pool has 4"):
        engine.add_request([1] * 100, SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="no room in the context"):
        engine.add_request([1] * 128)
    with pytest.raises(ValueError, match="token ids must lie in"):
        engine.add_request([48])
    engine.add_request([1, 2], SamplingParams(max_tokens=4))
    from luce.engine import QueueFull

    with pytest.raises(QueueFull, match="max_queue=1"):
        engine.add_request([1, 2], SamplingParams(max_tokens=4))
    assert len(engine.requests) == 1


def test_token_budget_must_leave_room_for_a_chunk():
    with pytest.raises(ValueError, match="at least max_slots \\+ 64"):
        Engine(FakeModel(), config=EngineConfig(max_slots=4, token_budget=67))


def test_prompt_chunks_short_of_the_prompts_end_read_nothing_back():
    """A step none of whose rows gives a token (a prompt's chunks before its last) reads no ids
    or logits from the backend, so the host builds the next chunk while the device runs this
    one; the output is the one the prompt gets alone."""
    model, reads = FakeModel(), []
    argmax, to_numpy = model.backend.argmax, model.backend.to_numpy
    model.backend.argmax = lambda x: reads.append("argmax") or argmax(x)
    model.backend.to_numpy = lambda x: reads.append("to_numpy") or to_numpy(x)
    engine = Engine(model, config=EngineConfig(max_slots=1, ctx=512, token_budget=65))
    prompt, params = make_prompt(300, 3), SamplingParams(max_tokens=3)
    request = engine.get(engine.add_request(prompt, params))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert request.output_ids == reference_output(prompt, params, request.seed)
    assert steps == 5 + 2 and len(reads) == 3, (steps, reads)   # 5 chunks of <= 64, 2 decode steps; a read a token
