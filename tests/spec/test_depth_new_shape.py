"""A new shape (more lanes) after the depth policy settled on plain decoding (luce.spec.depth):
its probes are a try, spaced so that they cost at most EXPLORE_SHARE of plain decoding's time,
graph warm-ups included (on a GPU a draft shape or row count never run takes an eager call and
a capture). Measured on the H100 (docs/PERF.md, session 44): the make-serve pair settled on
plain decoding at C1, then at C5 probed depths 1, 2 and 8 of 5 lanes at once (7 new graph keys,
0.12 s) and ran 13% behind plain decoding over its 4 timed waves.

Costs are in units of a one-row step, timed as the engine times them (a draft only after a
drafting step; a catch-up draft is the switch; a call that warms a graph key up is a warm-up)."""
from __future__ import annotations

from luce.spec.depth import DepthPolicy


class Machine:
    """step(rows) = 1 + slope (rows - 1); a draft of `lanes` lanes, `depth` deep: draft * depth *
    (1 + 0.25 (lanes - 1)); the first two calls of each draft shape and row count cost `warm` more
    (a graph key's eager call and capture); a draft after plain steps costs `switch` more.
    Acceptance: every verify of depth d accepts min(d, al - 1)."""

    def __init__(self, draft=1.2, slope=0.02, al=6, warm=20.0, switch=3.0):
        self.draft, self.slope, self.al, self.warm, self.switch = draft, slope, al, warm, switch
        self.calls: dict[tuple, int] = {}

    def step(self, rows):
        return 1.0 + self.slope * (rows - 1)

    def draft_cost(self, lanes, depth):
        return self.draft * depth * (1.0 + 0.25 * (lanes - 1))

    def warming(self, key) -> bool:
        self.calls[key] = self.calls.get(key, 0) + 1
        return self.calls[key] <= 2


def drive(policy, machine, lanes, steps, drafted=False):
    """`steps` steps of `lanes` lanes under the policy -> (depth per step, cost per step, drafted
    at the end). The engine's order: resting() first, choose() only where no rest is due."""
    depths, costs, slots = [], [], list(range(lanes))
    for _ in range(steps):
        d = 0 if policy.resting() else policy.choose(slots, 100)
        rows, cost = lanes * (d + 1), 0.0
        if d:
            seconds = machine.draft_cost(lanes, d)
            if machine.warming(("draft", lanes, d)):
                seconds += machine.warm
            if not drafted:
                policy.record_switch(seconds + machine.switch)
                seconds += machine.switch
            elif seconds > machine.draft_cost(lanes, d):
                policy.record_warmup(seconds)
            else:
                policy.record_draft(d, seconds, lanes=lanes)
            cost += seconds
            for s in slots:
                policy.record_verify(s, d, min(d, machine.al - 1))
        step = machine.step(rows) + (machine.warm if machine.warming(("step", rows)) else 0.0)
        if step > machine.step(rows):
            policy.record_warmup(step)
        else:
            policy.record_step(rows, step)
        cost += step
        drafted = d > 0
        depths.append(d)
        costs.append(cost)
    return depths, costs, drafted


def test_a_new_lane_counts_probes_wait_until_they_cost_a_share_of_plain_decoding():
    """One lane settles on plain decoding (a draft pass 1.2x a step loses at AL 6); then 5 lanes
    decode. Their probes (depths 2 and 8: a switch, two warm-ups of the draft shape and two of
    the verify's rows each) wait until they cost EXPLORE_SHARE of the plain steps before them
    (step ~19,400 here), not only until the try the one-lane spacing had due (~8,800: the
    probes ran there before). Over the 5-lane run plain decoding's cost grows by under 2%."""
    from luce.spec.depth import EXPLORE_SHARE

    machine, policy = Machine(), DepthPolicy(8, 0)
    depths, _, drafted = drive(policy, machine, 1, 3000)
    assert depths[-1000:].count(0) >= 990 and policy.warmup is not None and policy.switch is not None
    due = policy._explore_every - policy._since           # the one-lane try, in steps from now
    depths, costs, _ = drive(policy, machine, 5, 30000, drafted)
    first = next(i for i, d in enumerate(depths) if d)
    assert first >= due + 5000, (first, due)
    plain = machine.step(5) * len(costs)
    assert sum(costs) <= (1.0 + 2 * EXPLORE_SHARE) * plain, (sum(costs) / plain, first)
    assert (5, 0) in policy._probed          # the probes did run, once due


def test_a_new_lane_count_is_probed_at_once_while_speculation_pays():
    """While drafting is the best (a cheap draft, 0.1x a step), a new lane count is probed at
    once, warm-ups and all: speculation there is expected to pay them back."""
    machine, policy = Machine(draft=0.1), DepthPolicy(8, 0)
    depths, _, drafted = drive(policy, machine, 1, 300)
    assert depths[-100:].count(0) <= 10
    depths, _, _ = drive(policy, machine, 5, 50, drafted)
    assert next(i for i, d in enumerate(depths) if d) <= 1 and depths[-20:].count(0) <= 2


def test_warm_ups_of_untimed_shapes_count_in_a_trys_cost():
    """The spacing of a try from plain decoding counts two warm-ups (eager call, capture) for a
    draft shape and for a row count never timed, none for timed ones."""
    policy = DepthPolicy(8, 0)
    policy.record_step(1, 1.0)
    policy.record_step(3, 1.0)
    policy.record_draft(2, 2.0, lanes=1)
    policy.record_switch(3.0)
    without = policy._try_spacing([2], 1, 0)
    assert without == int((3.0 + 2.0 + 1.0) / 0.01) + 1
    policy.record_warmup(10.0)
    assert policy._try_spacing([2], 1, 0) == without                # both timed: no warm-up
    assert policy._try_spacing([4], 1, 0) == int((3.0 + 4.0 + 1.0 + 2 * 10.0 * 2) / 0.01) + 1
