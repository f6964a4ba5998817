"""Prefix cache under random multi-turn traffic (hypothesis, fake model): conversations that
share prefixes of random lengths, arrivals, cancellations, faults in steps and inside the
cache (a snapshot restore or a snapshot copy that raises), tight pools and tiny cache
budgets (evictions). After every step every invariant holds (Engine.check: the pool's
refcounts equal the slot lists plus the cache's entries, the chain is a tree, snapshot bytes
add up) and the fake model saw every slot read pages and state holding exactly its own
sequence (a wrong shared page or restored snapshot shows there). Every request that
finished normally produced exactly its reference output; at the end only the cache holds
pages, and clearing it frees every page and snapshot: nothing leaked.
"""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luce.engine import Engine, EngineConfig, FinishReason, SamplingParams
from luce.models.kv_cache import pages_needed
from tests.engine.fake_model import FakeModel, reference_output

STEP_POINTS = ("before_forward", "after_forward", "after_accept")
CACHE_POINTS = ("cache_restore", "cache_snapshot")

request_st = st.fixed_dictionaries({
    "arrive": st.integers(0, 25),
    "conversation": st.integers(0, 2),
    "shared": st.integers(0, 260),          # tokens of the conversation's history it repeats
    "tail": st.integers(1, 40),
    "max_tokens": st.integers(1, 8),
    "temperature": st.sampled_from([0.0, 0.8]),
    "seed": st.integers(0, 2**32),
    "cancel_at": st.one_of(st.none(), st.integers(0, 30)),
})


def history(conversation: int, n: int) -> list[int]:
    return [(conversation * 7919 + 31 * i + (i * i) % 7) % 48 for i in range(n)]


def make_prompt(r) -> list[int]:
    tail = [(r["seed"] + 13 * i) % 48 for i in range(r["tail"])]
    return history(r["conversation"], r["shared"]) + tail


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(request_st, min_size=1, max_size=9), max_slots=st.integers(1, 4),
       tight_pages=st.booleans(), budget=st.sampled_from([0, 1500, 4000, 1 << 30]), interval=st.sampled_from([0, 64, 128]),
       faults=st.sets(st.tuples(st.integers(0, 40), st.sampled_from(STEP_POINTS + CACHE_POINTS)), max_size=3))
def test_random_multi_turn_traffic_keeps_the_cache_consistent(requests, max_slots, tight_pages, budget, interval,
                                                              faults):
    model = FakeModel()
    kv_pages = pages_needed(310) + 4 if tight_pages else None
    engine = Engine(model, config=EngineConfig(max_slots=max_slots, ctx=320, token_budget=max_slots + 64 + 40,
                                               kv_pages=kv_pages, prefix_cache=True, cache_memory=budget,
                                               snapshot_interval=interval))
    state = {"step": 0}

    def hook(point, step):
        if (state["step"], point) in faults:
            raise RuntimeError(f"injected fault at {point}")

    engine.fault_hook = hook
    ids, specs, errors = {}, {}, set()
    for step_no in range(600):
        state["step"] = step_no
        for i, r in enumerate(requests):
            if r["arrive"] == step_no:
                params = SamplingParams(max_tokens=r["max_tokens"], temperature=r["temperature"], seed=r["seed"])
                prompt = make_prompt(r)
                ids[i], specs[i] = engine.add_request(prompt, params), (prompt, params)
            if r["cancel_at"] == step_no and i in ids:
                engine.cancel(ids[i])
        updates = engine.step()
        errors |= {u.request_id for u in updates if u.finish_reason == FinishReason.ERROR}
        engine.check()
        assert not model.violations, model.violations
        if step_no > 25 and not engine.has_unfinished():
            break
    assert not engine.has_unfinished()
    for i, rid in ids.items():
        out = engine.take_output(rid)
        prompt, params = specs[i]
        want = reference_output(prompt, params, params.seed)
        if out.finish_reason in (FinishReason.ERROR, FinishReason.CANCELLED):
            assert out.token_ids == want[:len(out.token_ids)]
            assert out.finish_reason == FinishReason.CANCELLED or rid in errors
        else:
            assert out.token_ids == want, i
        assert out.metrics.get("cached_tokens", 0) % 64 == 0 and out.metrics.get("cached_tokens", 0) < len(prompt)
    cache = engine.cache
    assert engine.slots.n_live == 0 and engine.pool.n_used == len(cache.entries)
    assert cache.bytes <= budget or cache.n_snapshots == 0
    cache.clear()
    engine.check()
    assert engine.pool.n_used == 0 and cache.bytes == 0 and not cache.entries and not cache.children


def test_shared_pages_are_served_and_evicted_under_pressure():
    """A second request sharing a 200-token history prefills only past the snapshot at 192;
    a pool too small for the cache and a third request evicts the least recently used pages."""
    model = FakeModel()
    engine = Engine(model, config=EngineConfig(max_slots=1, ctx=320, token_budget=1 + 64 + 40, kv_pages=22,
                                               prefix_cache=True, snapshot_interval=0))
    greedy = SamplingParams(max_tokens=4)
    a = engine.add_request(history(0, 200) + [1, 2], greedy)
    engine.run()
    assert engine.take_output(a).metrics["cached_tokens"] == 0
    assert engine.cache.n_snapshots == 1 and len(engine.cache.entries) == 12    # 202 prompt tokens: 12 full pages
    b = engine.add_request(history(0, 200) + [3], greedy)
    engine.run()
    out = engine.take_output(b)
    assert out.metrics["cached_tokens"] == 192 and out.token_ids == reference_output(history(0, 200) + [3], greedy, 0)
    c = engine.add_request(history(1, 300), greedy)          # needs 19 pages of 22: the old chain goes
    engine.run()
    assert engine.take_output(c).token_ids == reference_output(history(1, 300), greedy, 0)
    assert engine.cache.stats.evicted_pages > 0 and not model.violations
    engine.check()
