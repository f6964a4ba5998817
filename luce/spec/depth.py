"""How deep to draft, from what speculation measurably costs and gains (speculation pays or
steps aside).

A chain of depth d drafted with per-token acceptance p yields E(d) = (1 - p^(d+1)) / (1 - p)
tokens per verify (the accepted drafts plus the target's bonus token). It costs the draft
(d passes of a draft model, one DFlash block, nothing for n-grams) plus the verify step, whose
time grows with its rows once the target's matmuls turn compute-bound (a CPU at a few rows, a
GPU at tens). The policy keeps both measured: draft time per depth and step time per row
count (exponential averages of wall time, what the engine observed), and acceptance per
lane; each step it drafts, for all its speculating lanes together (they share the draft call
and the step), the depth in [min_depth, max_depth] with the most expected tokens per second,
where depth 0 is plain decoding (one row per lane, no draft). Row counts and depths not yet
measured are estimated from the nearest measured ones (linearly in rows; past the largest,
along the slope of the last two, or proportionally from one); it measures a short chain
(PROBE_DEPTH) and the floor first, and every EXPLORE_EVERY-th choice tries a neighbour of the best depth, so the estimates follow the
machine and the text. A draft is timed only when its lanes drafted in the previous step too
(luce.engine.speculation): a first draft, or one after plain steps, is a draft model catching
up on every token since, a switching cost and not the cost of its depth. Any depth gives the same output (speculation is
lossless): the policy only decides speed.
"""
from __future__ import annotations

EMA = 0.2                 # weight of a new timing
ACCEPT_DECAY = 0.97       # per verify: older acceptance counts fade
PRIOR_ACCEPTED, PRIOR_REJECTED = 3.0, 1.0   # a new lane starts at p = 0.75
EXPLORE_EVERY = 8
PROBE_DEPTH = 2           # the first depth measured: cheap when drafts are rarely right


def expected_tokens(depth: int, p: float) -> float:
    """Tokens a depth-`depth` chain verify commits at per-token acceptance p (bonus included)."""
    if p >= 1.0:
        return depth + 1.0
    return (1.0 - p ** (depth + 1)) / (1.0 - p)


class Timings:
    """seconds(key): exponential average per integer key, estimated between and past keys.
    Below the smallest measured key: proportional to the key when `through_zero` (a draft of
    fewer passes), else the smallest key's time (a step is never cheaper than one row)."""

    def __init__(self, through_zero: bool = False):
        self.through_zero = through_zero
        self.mean: dict[int, float] = {}
        self.count: dict[int, int] = {}

    def add(self, key: int, seconds: float) -> None:
        old = self.mean.get(key)
        self.mean[key] = seconds if old is None else (1 - EMA) * old + EMA * seconds
        self.count[key] = self.count.get(key, 0) + 1

    def seconds(self, key: int) -> float | None:
        if key in self.mean:
            return self.mean[key]
        if not self.mean:
            return None
        below = [k for k in self.mean if k < key]
        above = [k for k in self.mean if k > key]
        if below and above:
            a, b = max(below), min(above)
            return self.mean[a] + (self.mean[b] - self.mean[a]) * (key - a) / (b - a)
        if above:
            b = min(above)
            return self.mean[b] * key / b if self.through_zero else self.mean[b]
        a = max(below)                 # more rows than any measured: the slope of the last two
        if len(below) >= 2:            # (an optimistic guess is corrected once tried, a pessimistic one
            b = max(k for k in below if k != a)   # only by exploring)
            return self.mean[a] + max(0.0, self.mean[a] - self.mean[b]) / (a - b) * (key - a)
        return self.mean[a] * key / a if a > 0 else self.mean[a]


class DepthPolicy:
    def __init__(self, max_depth: int, min_depth: int = 0):
        if not 0 <= min_depth <= max_depth:
            raise ValueError(f"draft depth range [{min_depth}, {max_depth}] is empty")
        self.min_depth, self.max_depth = min_depth, max_depth
        self.draft = Timings(through_zero=True)   # depth -> seconds of the draft call
        self.step = Timings()           # rows of a decode step -> its seconds (built to sampled tokens)
        self._lanes: dict[int, list[float]] = {}   # slot -> [accepted, rejected] (decayed counts)
        self._choices = 0

    @property
    def adaptive(self) -> bool:
        return self.min_depth < self.max_depth

    # ---- what the engine observed ------------------------------------------------------------
    def record_draft(self, depth: int, seconds: float) -> None:
        self.draft.add(depth, seconds)

    def record_step(self, rows: int, seconds: float) -> None:
        """A step of `rows` rows, all of them AR or tree rows (no prompt chunk)."""
        self.step.add(rows, seconds)

    def record_verify(self, slot: int, drafted: int, accepted: int) -> None:
        """A chain of `drafted` tokens verified, `accepted` of them taken (a rejection ends it)."""
        counts = self._lanes.setdefault(slot, [PRIOR_ACCEPTED, PRIOR_REJECTED])
        counts[0] = counts[0] * ACCEPT_DECAY + accepted
        counts[1] = counts[1] * ACCEPT_DECAY + (1.0 if accepted < drafted else 0.0)

    def forget(self, slot: int) -> None:
        self._lanes.pop(slot, None)

    def acceptance(self, slot: int) -> float:
        accepted, rejected = self._lanes.get(slot, (PRIOR_ACCEPTED, PRIOR_REJECTED))
        return accepted / (accepted + rejected)

    # ---- the choice --------------------------------------------------------------------------
    def tokens_per_second(self, depth: int, ps: list[float]) -> float | None:
        """Expected tokens per second of a step in which every lane (acceptance ps) drafts `depth`."""
        step = self.step.seconds(len(ps) * (depth + 1))
        draft = 0.0 if depth == 0 else self.draft.seconds(depth)
        if step is None or draft is None:
            return None
        return sum(expected_tokens(depth, p) for p in ps) / (draft + step)

    def choose(self, slots: list[int], limit: int) -> int:
        """The depth the lanes `slots` draft this step, at most `limit` (their tokens or context left)."""
        hi = min(self.max_depth, limit)
        lo = min(self.min_depth, hi)
        if not self.adaptive or hi <= lo or not slots:
            return hi
        rows = lambda d: len(slots) * (d + 1)  # noqa: E731
        for d in (min(PROBE_DEPTH, hi), lo):   # measure a short chain and the floor first; from them,
            if self.step.count.get(rows(d), 0) == 0 or (d > 0 and self.draft.count.get(d, 0) == 0):
                return d                       # estimates, refined by exploring the neighbours
        ps = [self.acceptance(s) for s in slots]
        scores = {d: self.tokens_per_second(d, ps) for d in range(lo, hi + 1)}
        best = max(scores, key=lambda d: (scores[d], -d))
        self._choices += 1
        if self._choices % EXPLORE_EVERY == 0:
            near = [d for d in (best - 1, best + 1) if lo <= d <= hi]
            return min(near, key=lambda d: (self.step.count.get(rows(d), 0), d)) if near else best
        return best
