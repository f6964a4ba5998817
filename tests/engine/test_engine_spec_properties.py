"""Speculation under random traffic (hypothesis, tiny real models): random arrivals, prompt
lengths (chunked prefill beside trees), greedy and seeded sampled requests, stop tokens,
cancellations and injected faults at every point before commit, with every speculation mode
and drafter. After every step the bookkeeping invariants hold, and a fault that hit a step
before its commit left every domain bitwise as it was (prefill / AR rows rolled back) and
retired no one; at the end every request that finished normally produced exactly what it
produces alone without speculation, a cancelled one a prefix of it, none an error.
"""
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luce.engine import Engine, EngineConfig, FinishReason, SamplingParams
from luce.spec.config import SpecConfig
from luce.testing.tiny_models import make_dense, make_qwen35
from tests.engine.faults import POINTS, FaultInjector, domain_digests

request_st = st.fixed_dictionaries({
    "arrive": st.integers(0, 8),
    "prompt_len": st.one_of(st.integers(1, 12), st.integers(60, 140)),
    "max_tokens": st.integers(1, 16),
    "sampled": st.booleans(),
    "seed": st.integers(0, 2**32),
    "stop_token": st.one_of(st.none(), st.integers(3, 400)),
    "cancel_at": st.one_of(st.none(), st.integers(0, 15)),
    "token_seed": st.integers(0, 2**16),
})
SPECS = [SpecConfig(spec="chain", draft_kind="model", draft="self", chain_depth=3),
         SpecConfig(spec="ddtree", draft_kind="model", draft="self", ddtree_budget=6, spec_top_k=2),
         SpecConfig(spec="specla", draft_kind="ngram", ddtree_budget=5, spec_top_k=2, chain_depth=4)]
CTX = 192


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from luce.models import load_model

    root = tmp_path_factory.mktemp("spec_props")
    make_qwen35(root / "q35.gguf", seed=31)
    make_dense(root / "q3.gguf", "qwen3", seed=32)
    return {"qwen35": load_model(root / "q35.gguf", "cpu"), "qwen3": load_model(root / "q3.gguf", "cpu")}


def make_prompt(n, token_seed):
    return [3 + (token_seed * 7919 + 31 * i) % 60 for i in range(n)]   # a small alphabet: n-grams hit


def make_params(r):
    extra = dict(temperature=0.9, top_k=20, top_p=0.9) if r["sampled"] else {}
    return SamplingParams(max_tokens=r["max_tokens"], seed=r["seed"], **extra,
                          stop_token_ids=() if r["stop_token"] is None else (r["stop_token"],))


@functools.lru_cache(maxsize=None)
def alone(model, prompt, params):
    engine = Engine(model, None, EngineConfig(max_slots=1, ctx=CTX, token_budget=256))
    rid = engine.add_request(list(prompt), params)
    engine.run()
    return tuple(engine.take_output(rid).token_ids)


@pytest.mark.parametrize("target", ["qwen35", "qwen3"])
def test_random_traffic_with_speculation_gives_each_request_its_alone_output(models, target):
    model = models[target]
    verified = []

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(requests=st.lists(request_st, min_size=1, max_size=5), max_slots=st.integers(1, 4),
           extra_budget=st.integers(0, 40), spec_index=st.integers(0, len(SPECS) - 1),
           fault_steps=st.sets(st.integers(0, 20), max_size=1), point=st.sampled_from(POINTS))
    def run(requests, max_slots, extra_budget, spec_index, fault_steps, point):
        engine = Engine(model, None, EngineConfig(max_slots=max_slots, ctx=CTX, spec=SPECS[spec_index],
                                                  token_budget=max_slots + 64 + extra_budget), draft_model=model)
        faults = FaultInjector(engine, fault_steps, point)
        inject, seen = engine.fault_hook, {}

        def hook(at, step):
            if at == "before_forward":
                seen["before"] = domain_digests(engine)
            inject(at, step)

        engine.fault_hook = hook
        specs, ids = {}, {}
        for step_no in range(300):
            faults.step_no = step_no
            for i, r in enumerate(requests):
                if r["arrive"] == step_no:
                    specs[i] = (tuple(make_prompt(r["prompt_len"], r["token_seed"])), make_params(r))
                    ids[i] = engine.add_request(list(specs[i][0]), specs[i][1])
                if r["cancel_at"] == step_no and i in ids:
                    engine.cancel(ids[i])
            n_fired = len(faults.fired)
            updates = engine.step()
            errors = {u.request_id for u in updates if u.finish_reason == FinishReason.ERROR}
            if len(faults.fired) > n_fired:   # rolled back (prefill / AR rows) or nothing durable: dropped
                assert not updates and domain_digests(engine) == seen["before"]
            assert not errors                 # one fault never exceeds max_step_retries
            engine.check()
            if step_no > 8 and not engine.has_unfinished():
                break
        assert not engine.has_unfinished() and engine.pool.n_used == 0
        verified.append(engine.spec.stats.accepted)
        for i, rid in ids.items():
            out = engine.take_output(rid)
            want = alone(model, *specs[i])
            if out.finish_reason == FinishReason.CANCELLED:
                assert tuple(out.token_ids) == want[:len(out.token_ids)]
            else:
                assert tuple(out.token_ids) == want, (i, SPECS[spec_index].spec)

    run()
    assert sum(verified) > 0                        # drafts were accepted in some examples
