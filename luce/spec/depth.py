"""How deep to draft, from what speculation measurably costs and gains (speculation pays or
steps aside).

A chain of depth d commits E(d) = 1 + S(1) + ... + S(d) tokens per verify (the target's bonus
token plus each drafted token the target accepts), S(k) being the chance that the first k
drafted tokens are all accepted. It costs the draft (d passes of a draft model, one DFlash
block, nothing for n-grams) plus the verify step, whose time grows with its rows once the
target's matmuls turn compute-bound (a CPU at a few rows, a GPU at tens). The policy keeps
both measured: draft time per depth and per number of drafting lanes, step time per row count
(exponential averages of wall time, what the engine observed), and acceptance per lane and
drafted position (`LaneAcceptance`: S(k) from the measured per-position acceptance, no shape
assumed; positions never drafted fall back to the lane's pooled rate, i.e. the geometric
E(d) = (1 - p^(d+1)) / (1 - p)). A new lane (a new request) starts from the acceptance all
lanes measured, weighing LANE_PRIOR verifies (its own verifies soon outweigh it), so it does
not climb from a blind prior at every request.

Each step it drafts, for all its speculating lanes together (they share the draft call and
the step), the depth in [min_depth, max_depth] (with `plain`, or 0) with the most expected
tokens per second, where depth 0 is plain decoding (one row per lane, no draft); decoding lanes that cannot
draft this step are AR rows of the same step, counted in both. Row counts, depths and lane
counts not yet measured are estimated from the nearest measured ones (linearly in rows; past
the largest, along the slope of the last two, or proportionally from one). It measures a
short chain (PROBE_DEPTH), the deepest chain and the floor first, at most PROBE_TRIES steps
each (a timing the engine discards does not hold the probe forever). A step's time is not
linear in its rows (on a GPU one row takes the one-row kernels and 2-16 rows cost about the
same): the deep probe keeps a deep chain from being judged by a line through 1 and 3 rows.
Then now and then it tries a neighbour of the best depth: after EXPLORE_EVERY choices, then
twice as many after each try while the best depth stays, up to EXPLORE_MAX; every
EXPLORE_HOPELESS choices while plain decoding would win even if every draft were accepted. A try from plain decoding drafts two steps in a row: the
first draft catches up on the plain steps (a switching cost, `record_switch`) and is not timed,
the second is, so the draft cost that keeps speculation off is measured again. Such tries are
spaced so that what they cost (the switch, the timed draft and its verify, and the graph
warm-ups of a draft shape or row count never timed: a key's first, eager call and its capture,
`record_warmup`) stays under EXPLORE_SHARE of plain decoding's time: on a GPU where a draft
model's catch-up costs a few steps, speculation that steps aside costs well under a percent.
Once settled on plain decoding, a new shape (more lanes, say) is probed as a try, so spaced: on
the H100 the make-serve pair's probes of 5 lanes (7 new graph keys) cost 0.12 s, 13% of the
plain decoding around them (docs/PERF.md, session 44). While plain decoding is the
best, the draft state is not kept up (`drafting` is False: a draft model does not prefill new
prompts; a try catches up on the whole sequence), and a choice between tries is a counter.
A try from plain decoding drafts the depth that promises most (not depth 1): acceptance at deep
positions is learnt only by drafting that deep.

Where the engine launches plain steps ahead (luce.engine.ahead: the device runs them back to back),
plain decoding costs less a token than a lone plain step's time: the floor's probe is then a short
rest (PLAIN_PROBE_STEPS steps, `steps_ahead`), whose steps the engine launches ahead and times.
Measured on the H100 (docs/PERF.md, session 25): a lone plain step of the Coder-1.5B 1.6-1.8 ms,
the same steps run ahead 1.42 ms a token, so a depth-5 chain at 1.45 ms a token looked 1.2x faster
than plain decoding and ran 0.89x as fast.

The engine times what a depth costs in steady state only (luce.engine.speculation): not a
step or draft that ran a graph's warm-up (a key's first, eager call or its capture), nor a
draft whose lanes did not draft in the previous step (a draft model then catches up on every
token since: a switching cost, not its depth's). Any depth gives the same output
(speculation is lossless): the policy only decides speed.
"""
from __future__ import annotations

from luce.spec.measured import EMA, LaneAcceptance, Timings

LANE_PRIOR = 4.0          # a new lane starts from the acceptance of all lanes, weighing this many verifies
EXPLORE_EVERY = 8         # choices between tries of a neighbour of the best depth, at first;
EXPLORE_MAX = 64          # doubled after each try while the best stays (a losing depth tried less)
EXPLORE_HOPELESS = 256    # between tries while plain decoding would win even if every draft were right
EXPLORE_SHARE = 0.01      # the most of plain decoding's time that tries of drafting may cost
PROBE_DEPTH = 2           # the first depth measured: cheap when drafts are rarely right
PROBE_TRIES = 8           # steps a probe may take to get a timing the engine keeps
PLAIN_PROBE_STEPS = 6     # where plain steps run ahead: the rest that probes plain decoding


class DepthPolicy:
    """Depths in [min_depth, max_depth]; with `plain` also 0 (plain decoding) below a min_depth > 0:
    a draft shorter than min_depth is not made, as llama-server's --draft-min."""

    def __init__(self, max_depth: int, min_depth: int = 0, plain: bool = False):
        if not 0 <= min_depth <= max_depth:
            raise ValueError(f"draft depth range [{min_depth}, {max_depth}] is empty")
        self.min_depth, self.max_depth = min_depth, max_depth
        self.plain = plain and min_depth > 0 and max_depth > 0   # 0 allowed outside the range
        self.drafts: dict[int, Timings] = {}   # drafting lanes -> depth -> seconds of the draft call
        self.step = Timings()           # rows of a decode step -> its seconds (all of it but the draft)
        self._lanes: dict[int, LaneAcceptance] = {}
        self._all = LaneAcceptance()    # every lane's verifies: where a new lane starts from
        self._best, self._since, self._explore_every = None, 0, EXPLORE_EVERY
        self._again: int | None = None  # a try from plain decoding takes two steps: this depth next
        self._probes: dict[tuple, int] = {}    # (what, key) -> steps spent probing it
        self._probed: set[tuple] = set()       # (lanes, AR rows) probed
        self.switch: float | None = None       # seconds of a draft that catches up after plain steps (EMA)
        self.warmup: float | None = None       # seconds of a draft or step that warmed a graph key up (EMA)
        self.plain_probe_steps = 0             # > 0: the floor's probe rests this many steps (steps_ahead)
        self._plain_probe = 0                  # steps of the floor's probe left to rest

    def steps_ahead(self, on: bool) -> None:
        """Whether the engine launches plain steps ahead: then the floor's probe is a rest of
        PLAIN_PROBE_STEPS steps (the engine times those it launched ahead), not one lone step."""
        self.plain_probe_steps = PLAIN_PROBE_STEPS if on else 0

    @property
    def probing_plain(self) -> bool:
        """Resting to time plain decoding (every step of it is timed)."""
        return self._plain_probe > 0

    @property
    def adaptive(self) -> bool:
        return self.min_depth < self.max_depth or self.plain

    def allowed(self, lo: int, hi: int) -> list[int]:
        """The depths a step may draft, [lo, hi] (and 0 with `plain`), increasing."""
        return ([0] if self.plain and lo > 0 else []) + list(range(lo, hi + 1))

    # ---- what the engine observed ------------------------------------------------------------
    def record_draft(self, depth: int, seconds: float, lanes: int = 1) -> None:
        """One draft call of `lanes` lanes, `depth` deep."""
        self.drafts.setdefault(lanes, Timings(through_zero=True)).add(depth, seconds)

    def record_switch(self, seconds: float) -> None:
        """A draft that caught up after plain steps (not its depth's cost): what a try costs."""
        self.switch = seconds if self.switch is None else (1 - EMA) * self.switch + EMA * seconds

    def record_warmup(self, seconds: float) -> None:
        """A draft call or a step that ran graph warm-ups (a key's first, eager call or its
        capture): not what its depth or rows cost in steady state, but what a try pays twice
        for each draft shape or row count never timed before."""
        self.warmup = seconds if self.warmup is None else (1 - EMA) * self.warmup + EMA * seconds

    @property
    def drafting(self) -> bool:
        """Whether drafts are in use, so a drafter should keep its state up (prefill new
        prompts): False once the policy has settled on plain decoding."""
        return not self.adaptive or self._best != 0

    def record_step(self, rows: int, seconds: float) -> None:
        """A step of `rows` rows, all of them AR or tree rows (no prompt chunk)."""
        self.step.add(rows, seconds)

    def record_verify(self, slot: int, drafted: int, accepted: int) -> None:
        """A chain of `drafted` tokens verified, `accepted` of them taken (a rejection ends it)."""
        if slot not in self._lanes:
            self._lanes[slot] = self._all.prior(LANE_PRIOR)
        self._lanes[slot].record(drafted, accepted)
        self._all.record(drafted, accepted)

    def forget(self, slot: int) -> None:
        """The lane's sequence ended: the next one in the slot starts from all lanes' acceptance."""
        self._lanes.pop(slot, None)

    def _lane(self, slot: int) -> LaneAcceptance:
        return self._lanes.get(slot, self._all)

    def acceptance(self, slot: int) -> float:
        """The lane's pooled per-token acceptance."""
        return self._lane(slot).p

    def expected(self, slot: int, depth: int) -> float:
        """Tokens a depth-`depth` verify of the lane is expected to commit."""
        return self._lane(slot).expected_tokens(depth)

    def draft_seconds(self, depth: int, lanes: int) -> float | None:
        """A draft call's estimated time: from `lanes` lanes' timings, else the nearest lane count's."""
        if depth == 0:
            return 0.0
        timings = self._draft_timings(lanes)
        return None if timings is None else timings.seconds(depth)

    def _draft_timings(self, lanes: int) -> Timings | None:
        timings = self.drafts.get(lanes)
        if timings is None and self.drafts:
            timings = self.drafts[min(self.drafts, key=lambda n: (abs(n - lanes), n))]
        return timings

    # ---- the choice --------------------------------------------------------------------------
    def tokens_per_second(self, depth: int, slots: list[int], ar_rows: int = 0) -> float | None:
        """Expected tokens per second of a step in which the lanes `slots` draft `depth` and
        `ar_rows` other lanes decode plainly."""
        return self._rates(slots, ar_rows, depth, depth)[depth]

    @staticmethod
    def _rows(depth: int, lanes: int, ar_rows: int) -> int:
        """Rows of a step in which `lanes` lanes draft `depth` and `ar_rows` others decode plainly."""
        return ar_rows + lanes * (depth + 1)

    def _rates(self, slots: list[int], ar_rows: int, lo: int, hi: int) -> dict[int, float | None]:
        """tokens_per_second of every depth in [lo, hi] (None: no estimate)."""
        tokens = [float(ar_rows)] * (hi + 1)
        for s in slots:
            for d, e in enumerate(self._lane(s).expected_upto(hi)):
                tokens[d] += e
        drafts, out = self._draft_timings(len(slots)), {}
        for d in range(lo, hi + 1):
            step = self.step.seconds(self._rows(d, len(slots), ar_rows))
            draft = 0.0 if d == 0 else None if drafts is None else drafts.seconds(d)
            out[d] = None if step is None or draft is None else tokens[d] / (draft + step)
        return out

    def choose(self, slots: list[int], limit: int, ar_rows: int = 0) -> int:
        """The depth the lanes `slots` draft this step, at most `limit` (their tokens or context
        left); `ar_rows`: decoding lanes of the step that do not draft (AR rows either way)."""
        hi = min(self.max_depth, limit)
        lo = min(self.min_depth, hi)
        allowed = self.allowed(lo, hi)
        if not self.adaptive or len(allowed) < 2 or not slots:
            return hi
        rows = lambda d: self._rows(d, len(slots), ar_rows)  # noqa: E731
        shape = (len(slots), ar_rows)
        probes = [d for d in (max(PROBE_DEPTH, lo), self.max_depth) if d <= hi]
        if probes and shape not in self._probed:   # (near a request's end, estimates do)
            if self._best == 0:                # settled on plain decoding: a new shape's probes are a
                every = self._try_spacing(probes, len(slots), ar_rows)   # try, spaced as one
                if self._since + 1 < every:
                    self._since += 1
                    self._explore_every = max(self._explore_every, every)
                    return 0
                self._best = None              # they run as the first shape's did
            for d in probes + [allowed[0]]:    # a short chain, the deepest and the floor first; from them,
                unmeasured = self._unmeasured(d, len(slots), rows(d))   # estimates, refined by exploring
                if unmeasured:
                    for key in unmeasured:
                        self._probes[key] = self._probes.get(key, 0) + 1
                    if d == 0:                 # this step, then a rest whose steps run ahead
                        self._plain_probe = self.plain_probe_steps
                    return d
            if len(probes) == 2:               # (a short request probes the deepest chain later)
                self._probed.add(shape)
        again, self._again = self._again, None
        if again is not None and again in allowed:
            return again
        if self.resting():                     # (the engine asks resting() itself, before its lanes)
            return 0
        known = {d: r for d, r in self._rates(slots, ar_rows, allowed[0], hi).items()
                 if r is not None and d in allowed}
        if not known:
            return lo
        best = max(known, key=lambda d: (known[d], -d))
        if best != self._best:                 # a new best: its neighbours are tried soon
            self._best, self._since, self._explore_every = best, 0, EXPLORE_EVERY
        self._since += 1
        at = allowed.index(best)
        near = [allowed[i] for i in (at - 1, at + 1) if 0 <= i < len(allowed)]
        tried = min(near, key=lambda d: (self.step.count.get(rows(d), 0), d)) if near else best
        drafting = [d for d in known if d > 0]
        if best == 0 and drafting:             # from plain decoding: the most promising depth (its
            tried = max(drafting, key=lambda d: (known[d], -d))   # deep positions' acceptance is learnt)
        every = self._explore_every
        if best == 0:
            if self._hopeless(slots, ar_rows, lo, hi, known.get(0)):
                every = max(every, EXPLORE_HOPELESS)
            every = max(every, self._try_spacing([tried], len(slots), ar_rows))
        if self._since < every:
            if best == 0:                      # the counter above runs until the try
                self._explore_every = max(self._explore_every, every)
            return best
        self._since, self._explore_every = 0, min(2 * self._explore_every, EXPLORE_MAX)
        if best == 0 and tried:                # its first draft catches up on the plain steps (not
            self._again = tried                # timed), a second is timed
        return tried

    def at_rest(self) -> bool:
        """Whether the next choice will be plain decoding with no try due (resting() without
        counting the step); also while the floor's probe rests."""
        return self._plain_probe > 0 or \
            self._best == 0 and self._again is None and self._since + 1 < self._explore_every

    def resting(self) -> bool:
        """Plain decoding is the best and no try is due: this step decodes plainly (counted
        towards the next try), with nothing to weigh; the engine then skips choose() (whose
        probes of a new lane count wait for the next try)."""
        if not self.at_rest():
            return False
        if self._plain_probe > 0:
            self._plain_probe -= 1
        else:
            self._since += 1
        return True

    def _try_spacing(self, depths: list[int], lanes: int, ar_rows: int) -> int:
        """Plain steps between tries of `depths` (one try, or a new shape's probes) from plain
        decoding so that they cost at most EXPLORE_SHARE of their time: per depth the switch, a
        timed draft and its verify, and two graph warm-ups (a key's first call, its capture) each
        for a draft shape and a row count never timed."""
        plain = self.step.seconds(ar_rows + lanes)
        if not plain or self.switch is None:
            return 0
        cost = 0.0
        for d in depths:
            if d == 0:
                continue
            rows = self._rows(d, lanes, ar_rows)
            cost += self.switch + (self.draft_seconds(d, lanes) or 0.0) + (self.step.seconds(rows) or plain)
            if self.warmup is not None:
                cost += 2 * self.warmup * len(self._untimed(d, lanes, rows))
        return int(cost / (EXPLORE_SHARE * plain)) + 1

    def _hopeless(self, slots: list[int], ar_rows: int, lo: int, hi: int, plain: float | None) -> bool:
        """Whether plain decoding (`plain` tokens per second) beats every depth in [lo, hi]
        even if every drafted token were accepted (then only new timings could change it)."""
        if plain is None:
            return False
        drafts = self._draft_timings(len(slots))
        for d in range(max(lo, 1), hi + 1):
            rows = self._rows(d, len(slots), ar_rows)
            step, draft = self.step.seconds(rows), None if drafts is None else drafts.seconds(d)
            if step is None or draft is None or rows / (draft + step) >= plain:
                return False
        return True

    def _untimed(self, depth: int, lanes: int, rows: int) -> list[tuple]:
        """What a step drafting `depth` would run that was never timed: ('step', rows) and
        ('draft', lanes, depth)."""
        keys = [("step", rows)] + ([("draft", lanes, depth)] if depth > 0 else [])
        timings = {"step": self.step, "draft": self.drafts.get(lanes)}
        return [key for key in keys if timings[key[0]] is None or not timings[key[0]].count.get(key[-1], 0)]

    def _unmeasured(self, depth: int, lanes: int, rows: int) -> list[tuple]:
        """What a probe of `depth` has yet to time (_untimed), while it has taken fewer than
        PROBE_TRIES steps."""
        return [key for key in self._untimed(depth, lanes, rows) if self._probes.get(key, 0) < PROBE_TRIES]

    def describe(self) -> dict:
        """What the policy has measured (for reports): step seconds by rows, draft seconds by
        lanes and depth, pooled acceptance by live lane, and over all lanes the pooled
        acceptance and E(0..max_depth)."""
        return {"step_s": dict(sorted(self.step.mean.items())),
                "draft_s": {n: dict(sorted(t.mean.items())) for n, t in sorted(self.drafts.items())},
                "acceptance": {s: round(a.p, 4) for s, a in sorted(self._lanes.items())},
                "acceptance_all": round(self._all.p, 4), "switch_s": self.switch, "warmup_s": self.warmup,
                "expected_tokens_all": [round(e, 3) for e in self._all.expected_upto(self.max_depth)]}
