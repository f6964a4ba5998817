"""Speculation pays or steps aside (issue 17, deliverable 6), on the CPU with costs in closed
form: the depth policy (luce.spec.depth) against machines with the GPU's cost ratios, and the
engine's speculation path (luce.engine.speculation) under a fake clock that charges exactly those
costs, so what the policy sees is what the test says (no wall-clock timing is asserted).

Costs are in units of a one-row target step. The H200 pair of the issue (Qwen2.5-Coder-1.5B
target, 0.5B draft, Q4_K_M, graphs): target step 1.77 ms, the draft's own AR step 1.30 ms
(0.73x), and in the drafter's pipeline (top-k log-probs read back per pass) about 2.1 ms a
pass (1.2x: the fixed depth-8 chain arm of the waves, 296 tok/s at acceptance length 6); a
verify of d + 1 rows 1.0-1.3x a step. Acceptance: the benchmark's oracle (every verify deep
enough commits exactly `al` tokens) or geometric (each drafted token accepted with p)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from luce.spec.depth import DepthPolicy
from luce.spec.measured import expected_tokens


class Gpu:
    """step(rows) = 1 + slope (rows - 1) (or `wide` for any step of 2+ rows); a draft of depth
    d costs draft * d. Acceptance: oracle `al` (a verify of depth d accepts min(d, al - 1)) or
    geometric p."""

    def __init__(self, draft, slope=0.02, al=None, p=None, wide=None, ahead=None):
        self.draft, self.slope, self.al, self.p, self.wide = draft, slope, al, p, wide
        self.ahead = ahead      # a plain step launched ahead of the last one's ids (None: as a lone step)

    def step(self, rows):
        return self.wide if self.wide is not None and rows > 1 else 1.0 + self.slope * (rows - 1)

    def accepted(self, depth, rng):
        if self.al is not None:
            return min(depth, self.al - 1)
        n = 0
        while n < depth and rng.random() < self.p:
            n += 1
        return n

    def mean_tokens(self, depth):
        return min(depth, self.al - 1) + 1.0 if self.al is not None else expected_tokens(depth, self.p)

    def rate(self, depth):
        """Expected tokens per step unit of a fixed depth (one lane); plain steps run ahead
        where the machine has `ahead`."""
        if depth == 0 and self.ahead is not None:
            return 1.0 / self.ahead
        return self.mean_tokens(depth) / (self.draft * depth + self.step(depth + 1))

    def best(self, max_depth=8):
        return max(range(max_depth + 1), key=self.rate)


def drive(machine, steps=600, max_depth=8, seed=0, later=None, switch=0.0, noise=0.0):
    """One lane decoding `steps` steps under the policy, timed as the engine times it (a draft
    only after a drafting step; the first draft after plain steps, a catch-up, costs `switch`
    more and is recorded as the switch); -> (depths chosen, tokens, step units) per step. later:
    (step, machine) from which another machine runs; noise: each timing off by a relative
    Gaussian error of this deviation (what the policy sees, not what it costs)."""
    rng, policy, out, drafted = random.Random(seed), DepthPolicy(max_depth, 0), [], False
    seen = lambda t: t * (1.0 + noise * rng.gauss(0.0, 1.0))  # noqa: E731
    for i in range(steps):
        if later is not None and i == later[0]:
            machine = later[1]
        d = policy.choose([0], 100)
        tokens, cost = 1, machine.step(d + 1) + machine.draft * d
        if d:
            if drafted:
                policy.record_draft(d, seen(machine.draft * d))
            elif switch:
                policy.record_switch(seen(machine.draft * d + switch))
                cost += switch
            accepted = machine.accepted(d, rng)
            policy.record_verify(0, d, accepted)
            tokens = accepted + 1
        policy.record_step(d + 1, seen(machine.step(d + 1)))
        drafted = d > 0
        out.append((d, tokens, cost))
    return out


LOSING = [
    ("H200 as measured: a draft pass 1.2x a step in the drafter, oracle AL 6", Gpu(1.2, al=6)),
    ("a draft pass as dear as a step, oracle AL 6", Gpu(1.0, al=6)),
    ("draft pass 0.73x, a weak draft (p 0.4)", Gpu(0.73, p=0.4)),
    ("draft pass 0.73x, verify 1.3x from 2 rows, oracle AL 2", Gpu(0.73, al=2, wide=1.3)),
]
WINNING = [
    ("a cheap draft (0.1x), oracle AL 6", Gpu(0.1, al=6)),
    ("draft pass 0.73x (the 0.5B's own AR step), oracle AL 6", Gpu(0.73, al=6)),
    ("draft pass 0.73x, oracle AL 3", Gpu(0.73, al=3)),
    ("draft pass 0.1x, geometric p 0.85", Gpu(0.1, p=0.85)),
    ("a deep chain only: 2-16 rows 1.6x a step (a line through 1 and 3 rows says plain)", Gpu(0.75, al=6, wide=1.6)),
]


@pytest.mark.parametrize("name, machine", LOSING, ids=[n for n, _ in LOSING])
def test_it_steps_aside_when_drafting_costs_more_than_it_gains(name, machine):
    assert machine.best() == 0 and max(machine.rate(d) for d in range(1, 9)) < 1.0
    run = drive(machine)[100:]                      # after the warm-up (probes, first estimates)
    depths = Counter(d for d, _, _ in run)
    assert depths[0] >= 0.9 * len(run), (name, depths)   # plain decoding, trying a depth now and then
    tokens, cost = sum(t for _, t, _ in run), sum(c for _, _, c in run)
    assert tokens / cost >= 0.98, (name, depths)    # plain decoding is 1 token per unit


@pytest.mark.parametrize("name, machine", WINNING, ids=[n for n, _ in WINNING])
def test_it_speculates_when_drafting_pays(name, machine):
    best = machine.best()
    assert best > 0 and machine.rate(best) > 1.1
    run = drive(machine)[100:]
    depths = Counter(d for d, _, _ in run)
    assert depths[0] <= 0.1 * len(run), (name, depths)
    tokens, cost = sum(t for _, t, _ in run), sum(c for _, _, c in run)
    assert tokens / cost >= 0.95 * machine.rate(best), (name, best, depths)


def test_a_hopeless_draft_is_tried_rarely_but_timed_so_a_cheaper_one_is_found():
    """Drafts that could not pay even if always right (1.5x a step) are tried once in
    EXPLORE_HOPELESS choices, two steps at a time so the second draft is timed; when drafting
    turns cheap (0.1x) those timings bring speculation back."""
    from luce.spec.depth import EXPLORE_HOPELESS

    run = drive(Gpu(1.5, al=6), steps=3000, later=(300, Gpu(0.1, al=6)))
    before = Counter(d for d, _, _ in run[100:300])
    assert before[0] >= 198, before                 # 200 steps: one try at most
    assert sum(1 for d, _, _ in run[100:300] if d) <= 2 * (200 // EXPLORE_HOPELESS + 1)
    after = Counter(d for d, _, _ in run[2000:])
    assert after[0] <= 0.1 * 1000 and max(after, key=after.get) == Gpu(0.1, al=6).best(), after


def test_the_oracle_acceptance_is_modelled_as_measured_not_as_geometric():
    """Every verify deep enough commits exactly `al` tokens: after depth-6 verifies the
    expected tokens of depth 5 are 6 (measured per position), where the pooled rate 5/6 as a
    geometric chain would say 4."""
    policy = DepthPolicy(8, 0)
    for _ in range(60):
        policy.record_verify(0, 6, 5)
    assert policy.expected(0, 5) == pytest.approx(6.0, abs=0.1)
    assert policy.expected(0, 8) == pytest.approx(6.0, abs=0.1)
    assert expected_tokens(5, policy.acceptance(0)) < 4.1
    for _ in range(60):                              # a geometric lane stays geometric
        policy.record_verify(1, 8, 0)
    assert policy.expected(1, 4) < 1.1


def test_a_probe_gives_up_on_timings_it_never_gets():
    """A probe whose timings the engine keeps discarding (graph warm-ups) ends after
    PROBE_TRIES steps (each probed depth); with no draft ever timed, drafting has no estimate and decoding stays plain
    (but for a rare try of depth 1, two steps: a catch-up, then a timed draft)."""
    from luce.spec.depth import PROBE_TRIES

    policy = DepthPolicy(8, 0)
    chosen = [policy.choose([0], 100) for _ in range(2 * PROBE_TRIES)]
    assert chosen == [2] * PROBE_TRIES + [8] * PROBE_TRIES      # the short chain, then the deepest
    policy.record_step(1, 1.0)
    later = [policy.choose([0], 100) for _ in range(40)]
    assert later.count(0) >= 36 and set(later) <= {0, 1}


def test_draft_timings_are_per_lane_count_and_ar_rows_count_in_the_choice():
    policy = DepthPolicy(8, 0)
    policy.record_draft(2, 2.0, lanes=1)
    policy.record_draft(2, 6.0, lanes=4)
    assert policy.draft_seconds(1, 1) == pytest.approx(1.0)
    assert policy.draft_seconds(2, 4) == pytest.approx(6.0)
    assert policy.draft_seconds(2, 3) == pytest.approx(6.0)    # the nearest lane count measured
    for rows in range(1, 12):
        policy.record_step(rows, 1.0)
    # one lane drafting 2 beside 3 plain lanes: 3 + E(2) tokens over 3 rows + 3 tree rows
    assert policy.tokens_per_second(2, [0], ar_rows=3) == pytest.approx((3 + policy.expected(0, 2)) / 3.0)


# ---- the engine's speculation path under a fake clock ----------------------------------------
PROMPTS = [[5 + i, 6, 7, 8, 9 + i, 10, 11] for i in range(4)]
TOKENS = 40


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def charged_engine(tiny_models, machine, truth=None, overhead=0.0, warmup_cost=0.0, catch_up=0.0):
    """An engine whose clock moves only by the machine's costs: each forward step(live rows),
    each draft call draft * depth, `overhead` per step in the scheduler (outside the forward);
    with `warmup_cost`, a row count's first two steps (a graph key's eager call and capture on a
    GPU) cost that much more and count as graph warm-ups; with `catch_up`, each token a draft model
    feeds beyond two in a draft call (catching up after plain steps) or in a prompt prefill costs
    that much more. Speculation (truth given): luce-serve's
    default config for a draft model (depth chosen per step, down to plain), the oracle of the
    machine's acceptance length over the real tiny draft model (its catch-up path runs)."""
    from luce.engine import Engine, EngineConfig
    from luce.server.engine_core import ServeOptions, serve_spec_config
    from luce.spec.config import make_drafter
    from luce.spec.drafters.bench_drafters import OracleDrafter

    model, clock, seen, warm, ahead = tiny_models["qwen3"], Clock(), Counter(), [0], [False, set()]
    spec, drafter = None, None
    if truth is not None:
        spec = serve_spec_config(ServeOptions(draft_kind="model"), "oracle")
        inner = make_drafter(spec, model, 1, 128, draft_model=tiny_models["qwen3_draft"])
        drafter = OracleDrafter([p + t for p, t in zip(PROMPTS, truth)], model.config.vocab, inner=inner,
                                acceptance_length=machine.al)
        propose = drafter.propose

        prefill = drafter.prefill

        def charged_propose(lanes):
            clock.now += machine.draft * max((lane.depth for lane in lanes), default=0)
            clock.now += catch_up * sum(max(0, len(lane.tokens) - inner.seen[lane.slot] - 2) for lane in lanes)
            return propose(lanes)

        def charged_prefill(lanes):
            clock.now += catch_up * sum(len(tokens) for _, tokens in lanes)
            return prefill(lanes)
        drafter.propose, drafter.prefill = charged_propose, charged_prefill
    engine = Engine(model, None, EngineConfig(max_slots=1, ctx=128, token_budget=96, spec=spec,
                                              async_steps=machine.ahead is not None), drafter=drafter)

    def charge(point, step):
        if point == "before_forward":
            rows = step.cohort.n_rows
            seen[rows] += 1
            clock.now += 0.0 if ahead[0] else machine.step(rows)
            if warmup_cost and seen[rows] <= 2:
                clock.now += warmup_cost
                warm[0] += 1
    engine.fault_hook = charge
    launch_next, finish = engine._next, engine._finish

    def charged_next(current):       # a step launched ahead (luce.engine.ahead) costs machine.ahead,
        ahead[0] = True              # charged when its ids are waited for: the device runs it after
        try:                         # the step in flight
            following = launch_next(current)
        finally:
            ahead[0] = False
        if following is not None:
            ahead[1].add(id(following.step))
        return following

    def charged_finish(current):
        if id(current.step) in ahead[1]:
            ahead[1].discard(id(current.step))
            clock.now += machine.ahead
        return finish(current)
    engine._next, engine._finish = charged_next, charged_finish
    schedule = engine.scheduler.schedule

    def charged_schedule(running):
        clock.now += overhead
        return schedule(running)
    engine.scheduler.schedule = charged_schedule
    if engine.spec is not None:
        engine.spec.clock, engine.spec.warmups = clock, lambda: warm[0]
    return engine, clock


def serve(engine, clock, prompts):
    """The prompts one after another (C1): (outputs, clock after the first request)."""
    from luce.engine import SamplingParams

    outs, after_first = [], None
    for prompt in prompts:
        rid = engine.add_request(list(prompt), SamplingParams(max_tokens=TOKENS, ignore_eos=True))
        engine.run()
        outs.append(list(engine.take_output(rid).token_ids))
        after_first = clock.now if after_first is None else after_first
    return outs, after_first


@pytest.fixture(scope="module")
def truth(tiny_models):
    engine, clock = charged_engine(tiny_models, Gpu(1.0, al=6))
    return serve(engine, clock, PROMPTS)[0]


@pytest.mark.parametrize("machine, pays", [(Gpu(1.2, al=6), False), (Gpu(0.73, al=2, wide=1.3), False),
                                           (Gpu(0.73, al=6), True), (Gpu(0.1, al=6), True)])
def test_the_engine_with_the_default_config_is_never_slower_than_plain(tiny_models, truth, machine, pays):
    """Per request after the first (the warm-up): losing costs keep >= 85% of steps plain and
    the modelled time within 3% of plain decoding's; winning costs speculate and beat it."""
    plain, plain_clock = charged_engine(tiny_models, machine)
    _, plain_first = serve(plain, plain_clock, PROMPTS)
    engine, clock = charged_engine(tiny_models, machine, truth)
    outs, spec_first = serve(engine, clock, PROMPTS[:1])
    before = dict(engine.spec.depths)
    outs += serve(engine, clock, PROMPTS[1:])[0]
    assert outs == truth                                     # lossless whatever the depth
    depths = Counter({d: n - before.get(d, 0) for d, n in engine.spec.depths.items()})
    spec_time, plain_time = clock.now - spec_first, plain_clock.now - plain_first
    if pays:
        assert depths[0] <= 0.15 * sum(depths.values()), depths
        assert spec_time < 0.9 * plain_time, (spec_time, plain_time, depths)
    else:
        assert depths[0] >= 0.85 * sum(depths.values()), depths
        assert spec_time <= 1.03 * plain_time, (spec_time, plain_time, depths)


@pytest.mark.parametrize("machine", [Gpu(1.2, al=6), Gpu(0.73, al=2, wide=1.3)])
def test_a_draft_model_that_loses_costs_plain_decoding_under_a_percent(tiny_models, truth, machine):
    """With a draft model's switching costs charged (a catch-up after plain steps and a prompt's
    prefill, 0.1 step a token: the H200's 0.5B catching up), a losing draft settles on plain
    decoding, stops prefilling new prompts and spaces its tries so they cost at most
    EXPLORE_SHARE: the requests after the first take at most 1% longer than plain decoding."""
    plain, plain_clock = charged_engine(tiny_models, machine)
    _, plain_first = serve(plain, plain_clock, PROMPTS * 3)
    engine, clock = charged_engine(tiny_models, machine, truth, catch_up=0.1)
    outs, spec_first = serve(engine, clock, PROMPTS[:1])
    outs += serve(engine, clock, PROMPTS[1:] + PROMPTS * 2)[0]
    assert outs == truth * 3
    assert not engine.spec.policy.drafting and engine.spec.policy.switch is not None
    spec_time, plain_time = clock.now - spec_first, plain_clock.now - plain_first
    assert spec_time <= 1.01 * plain_time, (spec_time, plain_time, engine.spec.depths)


def test_the_engine_times_whole_steps_without_graph_warmups(tiny_models, truth):
    """The policy's step time is the whole step but its drafting (a per-step cost outside the
    forward counts, for plain and speculating steps alike), and a step or draft that warmed a
    graph up (20 units more here) is not timed at all: its time is the policy's warm-up cost."""
    machine = Gpu(0.73, al=6)
    engine, clock = charged_engine(tiny_models, machine, truth, overhead=0.25, warmup_cost=20.0)
    serve(engine, clock, PROMPTS[:2])
    step = engine.spec.policy.step.mean
    assert step and all(s == pytest.approx(machine.step(rows) + 0.25) for rows, s in step.items()), step
    assert 20.0 + 1.0 + 0.25 <= engine.spec.policy.warmup <= 20.0 + max(step.values()), engine.spec.policy.warmup
    drafts = engine.spec.policy.drafts[1].mean
    assert drafts and all(s == pytest.approx(machine.draft * d) for d, s in drafts.items()), drafts


def test_a_try_from_plain_decoding_drafts_the_most_promising_depth():
    """Depth 5 runs 6% ahead of plain decoding, timings are noisy (3%) and each switch to
    drafting costs a catch-up (3 steps). The probes leave deep positions' acceptance barely
    measured, so plain decoding may look best at first; a try from it drafts the depth that
    promises most (a try of depth 1 would learn nothing of positions 2-5), so the policy finds
    the deep chain and switches rarely."""
    machine = Gpu(0.8, al=6, wide=1.65)
    assert machine.best() == 5 and machine.rate(5) > 1.06
    run = drive(machine, steps=3000, seed=2, switch=3.0, noise=0.03)[200:]
    depths = [d for d, _, _ in run]
    switches = sum(1 for a, b in zip(depths, depths[1:]) if (a == 0) != (b == 0))
    assert switches <= 12, switches
    assert sum(t for _, t, _ in run) / sum(c for _, _, c in run) >= 1.03


def test_plain_steps_run_ahead_are_what_speculation_must_beat(tiny_models, truth):
    """The H100 pair as measured (session 25; units of a lone 1.5B step, 1.77 ms): plain steps
    run ahead 0.78 (1.38 ms), a 0.5B draft pass 0.68 (its fed chain at depth 5: 5.99 ms), a
    verify of 6 rows 1.52 (2.69 ms), acceptance length 6. A depth-5 chain makes 1.22 tokens a
    unit, plain decoding run ahead 1.28, a lone plain step 1.0: the policy must time plain
    decoding on steps run ahead (its probe rests; the step that switches into steps ahead is
    not timed), then stay plain, within 3% of a plain engine's time."""
    machine = Gpu(0.68, al=6, wide=1.52, ahead=0.78)
    assert machine.best() == 0 and machine.rate(5) > 1.2 > 1.0 / machine.step(1)
    plain, plain_clock = charged_engine(tiny_models, machine)
    assert plain.ahead
    _, plain_first = serve(plain, plain_clock, PROMPTS * 2)
    engine, clock = charged_engine(tiny_models, machine, truth)
    assert engine.ahead and engine.spec.policy.plain_probe_steps > 0
    outs, spec_first = serve(engine, clock, PROMPTS[:1])
    assert engine.spec.policy.step.mean[1] == pytest.approx(0.78)
    before = dict(engine.spec.depths)
    outs += serve(engine, clock, PROMPTS[1:] + PROMPTS)[0]
    assert outs == truth * 2
    depths = Counter({d: n - before.get(d, 0) for d, n in engine.spec.depths.items()})
    assert depths[0] >= 0.85 * sum(depths.values()), depths
    spec_time, plain_time = clock.now - spec_first, plain_clock.now - plain_first
    assert spec_time <= 1.03 * plain_time, (spec_time, plain_time, depths)


def test_the_floor_probe_rests_where_plain_steps_run_ahead():
    """With steps ahead the floor's probe is a rest of PLAIN_PROBE_STEPS steps (each a resting()
    step the engine may launch ahead and times), then the choice goes on; without, one step."""
    from luce.spec.depth import PLAIN_PROBE_STEPS

    for ahead, rest in ((True, PLAIN_PROBE_STEPS), (False, 0)):
        policy = DepthPolicy(8, 1, plain=True)
        policy.steps_ahead(ahead)
        for d in (2, 8):
            policy.record_draft(d, 0.5 * d)
            policy.record_step(d + 1, 1.2)
        assert policy.choose([0], 100) == 0 and policy.probing_plain == (rest > 0)
        rests = 0
        while policy.resting():
            rests += 1
            assert rests <= rest
        assert rests == rest and not policy.probing_plain
        policy.record_step(1, 0.5)
        assert policy.choose([0], 100) == 0 and policy.step.mean[1] == 0.5
