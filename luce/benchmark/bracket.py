"""A/B/A brackets: baseline A, candidate B, baseline again A2, and what may be concluded.

For every metric m (values a, b, a2):
    drift  = |a2 - a|                  how far the baseline moved against itself
    mean   = (a + a2) / 2              the bracket mean
    change = b - mean                  (change_rel = change / mean)
    significant  iff  change != 0 and |change| >= 2 * drift
A gain smaller than twice the A-to-A2 drift is not significant. Whether a significant change
is "better" or "worse" depends on the metric's direction (tok/s up, latency down).

Correctness comes first: the candidate's output-set digest must equal the baseline's (A). If
it does not, the candidate is a correctness failure: its timings are quarantined (kept
aside under "quarantined", never compared). If A and A2 differ the baseline itself is not
reproducible and the bracket is flagged invalid.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from luce.benchmark.digests import differing_keys

# (metric key in a level or staggered summary, report name suffix, higher is better)
LEVEL_METRICS = (
    ("output_tok_s", "output_tok_s", True),
    (("ttft_s", "p50"), "ttft_p50_s", False),
    (("ttft_s", "p90"), "ttft_p90_s", False),
    (("tbt_s", "p50"), "tbt_p50_s", False),
    (("tbt_s", "p90"), "tbt_p90_s", False),
    ("acceptance_length", "acceptance_length", True),
)
STAGGER_METRICS = (
    ("established_goodput_tok_s", "established_goodput_tok_s", True),
    ("established_tbt_effective_s", "established_tbt_effective_s", False),
    ("established_max_gap_s", "established_max_gap_s", False),
    (("arriving_ttft_s", "p50"), "arriving_ttft_p50_s", False),
    ("prompt_tok_s", "prompt_tok_s", True),
    ("round_time_s", "round_time_s", False),
)


def _lookup(summary: dict, key):
    if isinstance(key, tuple):
        inner = summary.get(key[0]) or {}
        return inner.get(key[1])
    return summary.get(key)


def run_metrics(result: dict) -> dict[str, tuple[float | None, bool]]:
    """A run result flattened to {"c3.output_tok_s": (value, higher_is_better), ...}."""
    out: dict[str, tuple[float | None, bool]] = {}
    for level in result.get("levels") or ():
        for key, name, higher in LEVEL_METRICS:
            out[f"c{level['concurrency']}.{name}"] = (_lookup(level, key), higher)
    staggered = result.get("staggered")
    if staggered:
        for key, name, higher in STAGGER_METRICS:
            out[f"staggered.{name}"] = (_lookup(staggered, key), higher)
    return out


@dataclass(frozen=True)
class MetricChange:
    name: str
    higher_is_better: bool
    a: float | None
    b: float | None
    a2: float | None
    drift: float | None = None
    mean: float | None = None
    change: float | None = None
    change_rel: float | None = None
    drift_rel: float | None = None
    significant: bool = False
    verdict: str = "missing"          # "better" | "worse" | "not significant" | "no change" | "missing"


def compare_metric(name: str, a: float | None, b: float | None, a2: float | None,
                   higher_is_better: bool = True) -> MetricChange:
    """The bracket arithmetic of the module docstring for one metric."""
    if a is None or b is None or a2 is None:
        return MetricChange(name, higher_is_better, a, b, a2)
    drift = abs(a2 - a)
    mean = (a + a2) / 2.0
    change = b - mean
    significant = change != 0 and abs(change) >= 2.0 * drift
    if change == 0:
        verdict = "no change"
    elif not significant:
        verdict = "not significant"
    else:
        verdict = "better" if (change > 0) == higher_is_better else "worse"
    return MetricChange(name, higher_is_better, a, b, a2, drift=drift, mean=mean, change=change,
                        change_rel=change / mean if mean else None,
                        drift_rel=drift / mean if mean else None,
                        significant=significant, verdict=verdict)


def bracket(a: dict, b: dict, a2: dict) -> dict:
    """Compare three run results (run.run_benchmark) as an A/B/A bracket."""
    outputs_a, outputs_b, outputs_a2 = (r["outputs"]["outputs"] for r in (a, b, a2))
    candidate_differs = differing_keys(outputs_a, outputs_b)
    baseline_differs = differing_keys(outputs_a, outputs_a2)
    correctness_ok = a["outputs"]["set_digest"] == b["outputs"]["set_digest"]
    baseline_ok = a["outputs"]["set_digest"] == a2["outputs"]["set_digest"]
    ma, mb, ma2 = run_metrics(a), run_metrics(b), run_metrics(a2)
    out = {
        "digests": {"A": a["outputs"]["set_digest"], "B": b["outputs"]["set_digest"],
                    "A2": a2["outputs"]["set_digest"]},
        "correctness_ok": correctness_ok,
        "candidate_differing_keys": candidate_differs,
        "baseline_reproducible": baseline_ok,
        "baseline_differing_keys": baseline_differs,
        "valid": correctness_ok and baseline_ok,
        "changes": [],
        "quarantined": None,
        "baseline_drift": [],
    }
    if not correctness_ok:
        out["quarantined"] = {name: value for name, (value, _) in mb.items()}
        for name, (value, _) in ma.items():
            value2 = ma2.get(name, (None,))[0]
            drift = None if value is None or value2 is None else abs(value2 - value)
            out["baseline_drift"].append({"name": name, "a": value, "a2": value2, "drift": drift})
        return out
    out["changes"] = [asdict(compare_metric(name, value, mb.get(name, (None,))[0], ma2.get(name, (None,))[0],
                                            higher))
                      for name, (value, higher) in ma.items()]
    return out
