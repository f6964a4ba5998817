"""The adaptive draft depth (luce.spec.depth): its estimates, the depth it settles on for
machines whose costs are known in closed form (it must find the fastest fixed depth), and that
any depth it picks leaves the output of greedy decoding unchanged."""
from __future__ import annotations

import random

import pytest

from luce.spec.depth import DepthPolicy
from luce.spec.measured import Timings, expected_tokens


def test_expected_tokens_of_a_chain():
    assert expected_tokens(0, 0.9) == 1.0
    assert expected_tokens(3, 0.0) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(2, 0.5) == pytest.approx(1.75)


def test_timings_interpolate_and_extrapolate_as_documented():
    steps = Timings()
    steps.add(2, 10.0)
    steps.add(6, 30.0)
    assert steps.seconds(4) == pytest.approx(20.0)     # between: linear
    assert steps.seconds(1) == 10.0                    # fewer rows: never cheaper
    assert steps.seconds(12) == pytest.approx(60.0)    # more rows: the slope of the last two
    flat = Timings()
    flat.add(1, 30.0)
    assert flat.seconds(3) == pytest.approx(90.0)      # one point: as if compute-bound from it
    flat.add(3, 31.0)
    assert flat.seconds(4) == pytest.approx(31.5)      # memory-bound so far: it stays nearly flat
    flat.add(2, 32.0)
    assert flat.seconds(5) == pytest.approx(31.0)      # a falling slope never makes more rows cheaper
    drafts = Timings(through_zero=True)
    drafts.add(4, 8.0)
    assert drafts.seconds(1) == pytest.approx(2.0)     # a draft of fewer passes: proportional
    assert Timings().seconds(3) is None


class Machine:
    """Costs in closed form: a step of `rows` rows takes base seconds up to `flat` rows (memory-
    bound), then grows linearly (compute-bound); a draft pass costs `draft` seconds."""

    def __init__(self, base, flat, draft, p):
        self.base, self.flat, self.draft, self.p = base, flat, draft, p

    def step(self, rows):
        return self.base * max(1.0, rows / self.flat)

    def rate(self, depth, lanes=1):
        cost = self.step(lanes * (depth + 1)) + self.draft * depth
        return lanes * expected_tokens(depth, self.p) / cost

    def best(self, max_depth, lanes=1):
        return max(range(max_depth + 1), key=lambda d: self.rate(d, lanes))


def settle(policy, machine, slots, steps=300):
    """Run the policy against the machine; the depths it chose in the last half."""
    rng = random.Random(0)
    chosen = []
    for i in range(steps):
        d = policy.choose(slots, 100)
        if d > 0:
            policy.record_draft(d, machine.draft * d, lanes=len(slots))
            for s in slots:   # each drafted token accepted with probability p until one is not
                accepted = 0
                while accepted < d and rng.random() < machine.p:
                    accepted += 1
                policy.record_verify(s, d, accepted)
        policy.record_step(len(slots) * (d + 1), machine.step(len(slots) * (d + 1)))
        chosen.append(d)
    return chosen[steps // 2:]


@pytest.mark.parametrize("name, machine, lanes", [
    ("cpu: verify turns compute-bound at 2 rows, a draft pass ~0.4 step", Machine(25e-3, 2, 10e-3, 0.88), 1),
    ("cpu, packed weights: flat to 4 rows", Machine(25e-3, 4, 10e-3, 0.88), 1),
    ("gpu: flat to 16 rows, cheap drafts", Machine(10e-3, 16, 1e-3, 0.88), 1),
    ("gpu, 4 lanes share the verify", Machine(10e-3, 16, 1.5e-3, 0.8), 4),
    ("a draft that is rarely right", Machine(25e-3, 2, 10e-3, 0.1), 1),
])
def test_it_settles_near_the_fastest_fixed_depth(name, machine, lanes):
    policy = DepthPolicy(max_depth=8, min_depth=0)
    slots = list(range(lanes))
    chosen = settle(policy, machine, slots)
    best = machine.best(8, lanes)
    achieved = sum(machine.rate(d, lanes) for d in chosen) / len(chosen)
    assert achieved >= 0.93 * machine.rate(best, lanes), (name, best, sorted(set(chosen)))
    if best == 0:
        assert chosen.count(0) > 0.8 * len(chosen)      # it steps aside


def test_a_fixed_depth_is_kept_within_the_limit():
    policy = DepthPolicy(max_depth=5, min_depth=5)       # min_depth = max_depth: not adaptive
    assert not policy.adaptive
    assert policy.choose([0], 100) == 5 and policy.choose([0], 3) == 3
    with pytest.raises(ValueError):
        DepthPolicy(max_depth=2, min_depth=3)


def test_acceptance_is_per_lane_and_forgotten_with_it():
    policy = DepthPolicy(max_depth=8, min_depth=0)
    assert policy.acceptance(0) == pytest.approx(0.75)    # nothing measured: the prior
    for _ in range(60):
        policy.record_verify(0, 8, 8)
        policy.record_verify(1, 8, 0)
    assert policy.acceptance(0) > 0.9 and policy.acceptance(1) < 0.1
    policy.forget(0)
    assert policy.acceptance(0) == policy.acceptance(7)   # back to what all lanes measured
    assert 0.4 < policy.acceptance(0) < 0.95
    for _ in range(5):                                   # which weighs a few verifies only
        policy.record_verify(0, 8, 0)
    assert policy.acceptance(0) < policy.acceptance(7) - 0.1


@pytest.mark.parametrize("target", ["qwen35", "qwen3"])
def test_adaptive_depth_leaves_greedy_output_unchanged(tiny_models, target):
    from luce.engine import Engine, EngineConfig, SamplingParams
    from luce.spec.config import SpecConfig

    model = tiny_models[target]
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5], [9, 10, 11, 12, 13], list(range(30, 60))]

    def run(spec):
        engine = Engine(model, None, EngineConfig(max_slots=3, ctx=128, token_budget=96, spec=spec),
                        draft_model=model if spec is not None and spec.draft_kind == "model" else None)
        ids = [engine.add_request(p, SamplingParams(max_tokens=24)) for p in prompts]
        engine.run()
        return [engine.take_output(i).token_ids for i in ids], engine

    want, _ = run(None)
    for kind in ("model", "ngram"):
        spec = SpecConfig(spec="chain", draft_kind=kind, draft="self" if kind == "model" else None,
                          chain_depth=4, draft_min=0)
        got, engine = run(spec)
        assert got == want, kind
        assert engine.spec.policy.adaptive and engine.spec.policy.step.mean   # it measured steps


def test_a_draft_is_timed_only_after_a_drafting_step(tiny_models):
    """A draft model fed only the last one or two rows is timed; its first draft and a draft
    after plain steps (a catch-up on every token since) are not: they would pass a switching
    cost for the cost of the depth."""
    from luce.engine import Engine, EngineConfig, SamplingParams
    from luce.spec.config import SpecConfig

    model = tiny_models["qwen3"]

    def run(choices):
        spec = SpecConfig(spec="chain", draft_kind="model", draft="self", chain_depth=2, draft_min=0)
        engine = Engine(model, None, EngineConfig(max_slots=1, ctx=128, token_budget=96, spec=spec),
                        draft_model=model)
        policy, timed, drafts = engine.spec.policy, [], []
        policy.record_draft = lambda depth, seconds, lanes=1: timed.append(depth)
        picks = iter(choices)

        def choose(slots, limit, ar_rows=0):
            d = min(next(picks, 0), limit) if slots else 0
            if d:
                drafts.append(d)
            return d
        policy.choose = choose
        engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=16))
        engine.run()
        return timed, drafts

    timed, drafts = run([2] * 4)
    assert len(drafts) == 4 and timed == [2, 2, 2]        # every draft but the first
    timed, drafts = run([2, 0] * 4)
    assert len(drafts) == 4 and timed == []               # each one follows a plain step


@pytest.mark.parametrize("machine, plain_best", [
    (Machine(25e-3, 2, 10e-3, 0.1), True),     # drafts rarely right: plain decoding wins
    (Machine(10e-3, 16, 1e-3, 0.88), False),   # cheap, good drafts: a deep chain wins
])
def test_a_draft_min_allows_plain_decoding_but_no_shorter_draft(machine, plain_best):
    """As llama-server's --draft-min: a step drafts 0 (plain) or a depth in [min, max], never 1..min-1."""
    policy = DepthPolicy(max_depth=8, min_depth=4, plain=True)
    assert policy.adaptive and policy.allowed(4, 8) == [0, 4, 5, 6, 7, 8]
    chosen = settle(policy, machine, [0])
    assert not set(chosen) & {1, 2, 3}, sorted(set(chosen))
    if plain_best:
        assert chosen.count(0) > 0.8 * len(chosen)
    else:
        assert chosen.count(0) < 0.2 * len(chosen) and max(chosen) >= 4
    assert policy.choose([0], 0) == 0                   # no room left: plain


def test_draft_min_equal_to_draft_max_is_that_depth_or_plain():
    policy = DepthPolicy(max_depth=5, min_depth=5, plain=True)
    assert policy.adaptive
    chosen = settle(policy, Machine(25e-3, 2, 10e-3, 0.1), [0])
    assert set(chosen) <= {0, 5} and chosen.count(0) > 0.8 * len(chosen)
    assert DepthPolicy(max_depth=5, min_depth=0, plain=True).allowed(0, 5) == [0, 1, 2, 3, 4, 5]
