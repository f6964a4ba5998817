"""Steps ahead (luce.engine.ahead): greedy decode steps launched before the previous step's ids
reach the host, fed from ids kept on the "device" (the numpy backend's reference ops, forced on
with async_steps=True; the fake model checks that every slot's pages hold exactly its token
sequence, so a row fed a wrong id, or a slot reused with stale state, breaks it).

Under random arrivals, stop tokens, sampled requests and cancellations every request gets
exactly what it gets alone, the bookkeeping holds after every call (a request's next row may
be committed ahead), and steps do run ahead, greedy or sampled on the backend (a request the
host samples keeps its steps waiting). Faults: a step ahead that fails before its launch
is not launched and nothing is lost; one whose ids fail on the way back ends its requests with
the error."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luce.engine import Engine, EngineConfig, FinishReason, SamplingParams
from luce.ops.numpy_backend import NumpyBackend
from tests.engine.fake_model import FakeModel, reference_output
from tests.engine.test_engine_properties import arrive_and_cancel, assert_alone_outputs, make_prompt


def ahead_engine(max_slots=3, **config):
    """(fake model on the numpy backend, engine running steps ahead, [rows of each fed forward])."""
    model = FakeModel()
    model.backend = NumpyBackend()
    engine = Engine(model, config=EngineConfig(max_slots=max_slots, ctx=256, token_budget=max_slots + 128,
                                               async_steps=True, **config))
    return model, engine, count_fed(engine)


def count_fed(engine) -> list:
    """Wrap engine.forward; -> a list that gets the rows of every fed forward (a step ahead)."""
    fed, forward = [], engine.forward

    class Counting:
        def __call__(self, batch, state, **kw):
            if kw.get("fed"):
                fed.append(batch.n_rows)
            return forward(batch, state, **kw)

        def __getattr__(self, name):
            return getattr(forward, name)
    engine.forward = Counting()
    return fed


def test_the_numpy_backend_runs_ahead_only_when_asked():
    model = FakeModel()
    model.backend = NumpyBackend()
    assert not Engine(model, config=EngineConfig(max_slots=2, ctx=64)).ahead          # host: runs each call to its end
    assert Engine(model, config=EngineConfig(max_slots=2, ctx=64, async_steps=True)).ahead


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9}], ids=["greedy", "seeded"])
def test_decode_runs_ahead_and_gives_the_alone_output(sampling):
    """Greedy, and seeded sampling drawn on the backend (its draw kept by slot after it)."""
    model, engine, fed = ahead_engine()
    prompts = [make_prompt(n, s) for n, s in ((5, 1), (70, 2), (9, 3))]
    params = [SamplingParams(max_tokens=20, seed=7 + i, **sampling) for i in range(3)]
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    while engine.has_unfinished():
        engine.step()
        engine.check()
        assert not model.violations, model.violations
    assert len(fed) > 10                      # most decode steps went ahead
    for rid, p, q in zip(ids, prompts, params):
        out = engine.take_output(rid)
        assert out.token_ids == reference_output(p, q, q.seed) and out.finish_reason == FinishReason.LENGTH
    assert engine.pool.n_used == 0 and engine.slots.n_live == 0


def test_host_sampled_requests_wait_for_every_step():
    """A request whose tokens the host draws (penalties here) keeps its steps from going ahead."""
    model, engine, fed = ahead_engine()
    params = SamplingParams(max_tokens=12, temperature=0.7, top_k=20, repetition_penalty=1.3, seed=3)
    rid = engine.add_request(make_prompt(8, 4), params)
    engine.run()
    assert not fed and engine.take_output(rid).token_ids == reference_output(make_prompt(8, 4), params, 3)


request_st = st.fixed_dictionaries({
    "arrive": st.integers(0, 12),
    "prompt_len": st.one_of(st.integers(1, 20), st.integers(60, 140)),
    "max_tokens": st.integers(1, 14),
    "temperature": st.sampled_from([0.0, 0.0, 0.0, 0.8]),
    "top_k": st.sampled_from([0, 40]),      # 40: drawn on the backend (ahead); 0: on the host
    "seed": st.integers(0, 2**32),
    "stop_token": st.one_of(st.none(), st.integers(0, 47)),
    "cancel_at": st.one_of(st.none(), st.integers(0, 24)),
    "token_seed": st.integers(0, 2**16),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request_st, min_size=1, max_size=6), max_slots=st.integers(1, 4), pad=st.booleans())
def test_random_traffic_ahead_gives_each_request_its_alone_output(requests, max_slots, pad):
    model, engine, _ = ahead_engine(max_slots, pad_steps=pad)
    specs, ids = {}, {}
    for step_no in range(400):
        arrive_and_cancel(engine, requests, step_no, ids, specs)
        updates = engine.step()
        assert not [u for u in updates if u.finish_reason == FinishReason.ERROR]
        engine.check()
        assert not model.violations, model.violations
        if step_no > 12 and not engine.has_unfinished():
            break
    assert_alone_outputs(engine, ids, specs)


def _decode_two(engine, params):
    prompts = [make_prompt(6, 1), make_prompt(8, 2)]
    return prompts, [engine.add_request(p, params) for p in prompts]


def test_a_step_ahead_failing_before_its_launch_is_not_launched_and_loses_nothing():
    model, engine, fed = ahead_engine()
    params = SamplingParams(max_tokens=12)
    prompts, ids = _decode_two(engine, params)
    calls = {"n": 0}

    def hook(at, step):
        if at == "before_forward" and step.cohort.decode and step.cohort.decode[0].token_id == 0:
            calls["n"] += 1
            if calls["n"] % 2:            # every other step ahead refuses to launch
                raise RuntimeError("injected")
    engine.fault_hook = hook
    while engine.has_unfinished():
        assert not [u for u in engine.step() if u.finish_reason == FinishReason.ERROR]
        engine.check()
        assert not model.violations
    assert calls["n"] > 2 and fed
    for rid, p in zip(ids, prompts):
        assert engine.take_output(rid).token_ids == reference_output(p, params, 0)


@pytest.mark.parametrize("point", ["after_forward", "after_accept"])
def test_a_step_in_flight_failing_on_its_way_back_ends_its_requests_with_the_error(point):
    model, engine, fed = ahead_engine()
    params = SamplingParams(max_tokens=12)
    prompts, ids = _decode_two(engine, params)
    while not fed:
        engine.step()

    def hook(at, step):
        if at == point:
            raise RuntimeError("injected fault")
    engine.fault_hook = hook
    updates = engine.step()
    assert {u.request_id for u in updates if u.finish_reason == FinishReason.ERROR} == set(ids)
    engine.fault_hook = None
    engine.check()
    assert not engine.has_unfinished() and engine.in_flight is None
    assert engine.pool.n_used == 0 and engine.slots.n_live == 0
    later = engine.add_request(prompts[0], params)      # the freed slots serve a new request exactly
    engine.run()
    assert engine.take_output(later).token_ids == reference_output(prompts[0], params, 0)
    assert not model.violations


def test_a_step_ahead_failing_in_its_forward_ends_its_requests_on_a_model_with_state():
    """No checkpoint is taken for a step ahead: when its forward fails, the rows' recurrent state
    (the fake model's token sequence) may have moved on, so its requests end with the error;
    nothing leaks and the freed slots serve a new request exactly."""
    model, engine, fed = ahead_engine()
    params = SamplingParams(max_tokens=12)
    prompts, ids = _decode_two(engine, params)
    forward = model.forward

    def failing(batch, state):
        out = forward(batch, state)            # the state moved on, then the launch fails
        if len(fed) >= 3:
            raise RuntimeError("device fault")
        return out
    model.forward = failing
    errors, tokens = set(), {rid: 0 for rid in ids}
    while engine.has_unfinished():
        for u in engine.step():
            tokens[u.request_id] += len(u.token_ids)
            errors |= {u.request_id} if u.finish_reason == FinishReason.ERROR else set()
        engine.check()
    assert errors == set(ids) and len(fed) == 3
    # every token of the steps before the failed one reached its request, the error after them
    assert all(engine.get(rid).output_ids == reference_output(p, params, 0)[:tokens[rid]]
               and tokens[rid] >= 3 for rid, p in zip(ids, prompts))
    model.forward = forward
    assert engine.pool.n_used == 0 and engine.slots.n_live == 0 and engine.in_flight is None
    later = engine.add_request(prompts[1], params)
    engine.run()
    assert engine.take_output(later).token_ids == reference_output(prompts[1], params, 0)
    assert not model.violations
