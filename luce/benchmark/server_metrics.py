"""Acceptance length from a server's Prometheus `/metrics`, measured over one benchmark phase.

    probe = AcceptanceProbe(endpoint)      # scrapes /metrics once (before the phase)
    ...run the phase...
    value, source = probe.finish()         # scrapes again; (None, None) when not reported

Sources, first found wins:
1. `luce_tokens_per_step` histogram (luce-serve): tokens a request received per engine step;
   over the phase, (sum after - sum before) / (count after - count before).
2. `luce_acceptance_length` or `luce_spec_acceptance_length` gauge: its value after the phase
   (a server-wide mean, not limited to the phase; NaN means not reported).
3. vLLM counters: 1 + accepted / drafts over the phase, from
   `vllm:spec_decode_num_accepted_tokens_total` and `vllm:spec_decode_num_drafts_total`.
Anything else (no /metrics, none of these names): not reported, and the report omits it.
"""
from __future__ import annotations

import math
import re

from luce.benchmark.client import Endpoint, http_get

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

HISTOGRAM = "luce_tokens_per_step"
GAUGES = ("luce_acceptance_length", "luce_spec_acceptance_length")
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over its label sets (comments and bad lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        name = match.group(1)
        out[name] = out.get(name, 0.0) + value
    return out


def scrape(endpoint: Endpoint) -> dict[str, float] | None:
    """Parsed /metrics of the endpoint, or None when it has none."""
    status, body = http_get(endpoint.root + "/metrics", api_key=endpoint.api_key)
    return parse_prometheus(body) if status == 200 else None


def acceptance_between(before: dict[str, float] | None,
                       after: dict[str, float] | None) -> tuple[float | None, str | None]:
    """(acceptance length, source name) from two scrapes around a phase; (None, None) if absent."""
    if after is None:
        return None, None
    before = before or {}
    count, total = f"{HISTOGRAM}_count", f"{HISTOGRAM}_sum"
    if count in after and total in after:
        steps = after[count] - before.get(count, 0.0)
        if steps > 0:
            return (after[total] - before.get(total, 0.0)) / steps, HISTOGRAM
    for name in GAUGES:
        value = after.get(name)
        if value is not None and math.isfinite(value):
            return value, name
    if VLLM_ACCEPTED in after and VLLM_DRAFTS in after:
        drafts = after[VLLM_DRAFTS] - before.get(VLLM_DRAFTS, 0.0)
        if drafts > 0:
            accepted = after[VLLM_ACCEPTED] - before.get(VLLM_ACCEPTED, 0.0)
            return 1.0 + accepted / drafts, "vllm:spec_decode"
    return None, None


class AcceptanceProbe:
    """Scrape at construction and at finish(); see acceptance_between."""

    def __init__(self, endpoint: Endpoint, enabled: bool = True):
        self.endpoint = endpoint
        self.enabled = enabled
        self.before = scrape(endpoint) if enabled else None

    def finish(self) -> tuple[float | None, str | None]:
        if not self.enabled or self.before is None:
            return None, None
        return acceptance_between(self.before, scrape(self.endpoint))
