"""The statistics every benchmark number comes from (docs/BENCHMARKS.md states each one).

Percentiles interpolate linearly between order statistics (numpy's default, Hyndman-Fan
type 7): for sorted x[0..n-1] and q in [0, 100], h = (n - 1) q / 100 and
P_q = x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from luce.benchmark.records import RequestRecord


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (type 7, see the module docstring); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    if lo + 1 >= len(xs):
        return xs[-1]
    return xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


def summarize(values: Sequence[float]) -> dict:
    """{"n", "p50", "p90", "mean", "min", "max"} of `values` (None entries when empty)."""
    xs = [v for v in values if v is not None]
    return {"n": len(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "mean": sum(xs) / len(xs) if xs else None,
            "min": min(xs) if xs else None, "max": max(xs) if xs else None}


def ttft(record: RequestRecord) -> float | None:
    """Time to first token: first text chunk read minus request sent."""
    first = record.first_token_time
    return None if first is None else first - record.send_time


def tbt(record: RequestRecord) -> float | None:
    """A request's mean time between tokens: (last token - first token) / (n_tokens - 1)."""
    if record.first_token_time is None or record.n_tokens < 2:
        return None
    return (record.last_token_time - record.first_token_time) / (record.n_tokens - 1)


@dataclass(frozen=True)
class OutputWindow:
    """A wave's output window: from the first token the wave receives to the last one.

    `tokens` counts every output token of the wave except those of the chunk that opened the
    window (they arrived at `start`, not after it), so one request alone gives
    tokens / duration == 1 / its TBT."""
    start: float
    end: float
    tokens: int

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def tok_s(self) -> float | None:
        return self.tokens / self.duration if self.duration > 0 else None


def output_window(records: Sequence[RequestRecord]) -> OutputWindow | None:
    """The output window of one wave (records that produced no output are left out)."""
    live = [r for r in records if r.chunk_times]
    if not live:
        return None
    opener = min(live, key=lambda r: r.first_token_time)
    start = opener.first_token_time
    end = max(r.last_token_time for r in live)
    tokens = sum(r.n_tokens for r in live) - opener.tokens_per_chunk()[0]
    return OutputWindow(start=start, end=end, tokens=tokens)


def pooled_tok_s(windows: Iterable[OutputWindow | None]) -> float | None:
    """Several waves' output rate: their tokens summed over their durations summed."""
    ws = [w for w in windows if w is not None]
    duration = sum(w.duration for w in ws)
    return sum(w.tokens for w in ws) / duration if duration > 0 else None


def tokens_between(records: Iterable[RequestRecord], t0: float, t1: float) -> int:
    """Output tokens whose arrival time t satisfies t0 < t <= t1, over all records."""
    return sum(1 for r in records for t in r.token_times() if t0 < t <= t1)


def longest_gap(times: Sequence[float], t0: float, t1: float) -> float | None:
    """The longest interval between consecutive `times` (sorted) that overlaps (t0, t1):
    a stall inside the window, or one that spans it entirely. None when no interval does."""
    gaps = [b - a for a, b in zip(times, times[1:]) if b > t0 and a < t1]
    return max(gaps) if gaps else None

