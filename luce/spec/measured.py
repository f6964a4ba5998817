"""What speculation measured, as the depth policy (luce.spec.depth) reads it: step and draft
times by integer key (`Timings`: exponential averages, estimated between and past the measured
keys) and a lane's acceptance per drafted position (`LaneAcceptance`)."""
from __future__ import annotations

import bisect

EMA = 0.2                 # weight of a new timing
ACCEPT_DECAY = 0.97       # per verify: older acceptance counts fade
PRIOR_ACCEPTED, PRIOR_REJECTED = 3.0, 1.0   # a new lane starts at p = 0.75
POSITION_PRIOR = 1.0      # weight of the lane's pooled rate in each position's acceptance


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
        self._keys: list[int] = []     # the measured keys, sorted

    def add(self, key: int, seconds: float) -> None:
        old = self.mean.get(key)
        if old is None:
            bisect.insort(self._keys, key)
        self.mean[key] = seconds if old is None else (1 - EMA) * old + EMA * seconds
        self.count[key] = self.count.get(key, 0) + 1

    def seconds(self, key: int) -> float | None:
        mean = self.mean.get(key)
        if mean is not None or not self._keys:
            return mean
        keys, m = self._keys, self.mean
        i = bisect.bisect_left(keys, key)      # keys[:i] below, keys[i:] above
        if 0 < i < len(keys):
            a, b = keys[i - 1], keys[i]
            return m[a] + (m[b] - m[a]) * (key - a) / (b - a)
        if i == 0:
            b = keys[0]
            return m[b] * key / b if self.through_zero else m[b]
        a = keys[-1]                   # more rows than any measured: the slope of the last two
        if len(keys) >= 2:             # (an optimistic guess is corrected once tried, a pessimistic one
            b = keys[-2]               # only by exploring)
            return m[a] + max(0.0, m[a] - m[b]) / (a - b) * (key - a)
        return m[a] * key / a if a > 0 else m[a]


class LaneAcceptance:
    """One lane's measured acceptance, decayed per verify: pooled (accepted and rejected drafted
    tokens, from the prior p = 0.75) and per drafted position k >= 1 (`tried[k - 1]`: verifies
    that drafted k tokens and accepted the first k - 1, so position k was tested; `passed[k - 1]`:
    those that accepted it too)."""

    def __init__(self):
        self.accepted, self.rejected = PRIOR_ACCEPTED, PRIOR_REJECTED
        self.tried: list[float] = []
        self.passed: list[float] = []

    def record(self, drafted: int, accepted: int) -> None:
        """A chain of `drafted` tokens verified, its first `accepted` taken (a rejection ends it)."""
        self.accepted = self.accepted * ACCEPT_DECAY + accepted
        self.rejected = self.rejected * ACCEPT_DECAY + (1.0 if accepted < drafted else 0.0)
        grow = drafted - len(self.tried)
        if grow > 0:
            self.tried += [0.0] * grow
            self.passed += [0.0] * grow
        for k in range(len(self.tried)):
            self.tried[k] *= ACCEPT_DECAY
            self.passed[k] *= ACCEPT_DECAY
        for k in range(min(accepted + 1, drafted)):
            self.tried[k] += 1.0
            self.passed[k] += 1.0 if k < accepted else 0.0

    def prior(self, verifies: float) -> LaneAcceptance:
        """A new lane's start: these counts scaled to weigh at most `verifies` verifies."""
        lane = LaneAcceptance()
        if self.tried and self.tried[0] > 0:
            scale = min(1.0, verifies / self.tried[0])
            lane.accepted, lane.rejected = self.accepted * scale, self.rejected * scale
            lane.tried, lane.passed = [t * scale for t in self.tried], [t * scale for t in self.passed]
        return lane

    @property
    def p(self) -> float:
        """Pooled per-token acceptance: accepted / (accepted + rejected)."""
        return self.accepted / (self.accepted + self.rejected)

    def expected_tokens(self, depth: int) -> float:
        """E(depth) = 1 + sum over k <= depth of S(k), S(k) the product of each position's
        acceptance q_j = (passed_j + POSITION_PRIOR p) / (tried_j + POSITION_PRIOR), j <= k."""
        return self.expected_upto(depth)[depth]

    def expected_upto(self, depth: int) -> list[float]:
        """[E(0), ..., E(depth)] (expected_tokens), in one pass."""
        p, total, survive, out = self.p, 1.0, 1.0, [1.0]
        prior, n = POSITION_PRIOR * p, len(self.tried)
        for k in range(depth):
            survive *= (self.passed[k] + prior) / (self.tried[k] + POSITION_PRIOR) if k < n else p
            total += survive
            out.append(total)
        return out
