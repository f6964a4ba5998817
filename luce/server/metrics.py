"""Prometheus metrics in the text exposition format (version 0.0.4), without dependencies.

`ServerMetrics` holds what the server records (requests by endpoint and status, tokens,
latency histograms) and renders it together with the engine's gauges (slots, KV pages, queue,
acceptance length) read from the bridge's latest stats snapshot at scrape time.
"""
from __future__ import annotations

import math
import threading
from typing import Iterable

from luce.server.bridge import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
TOKENS_PER_STEP_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Iterable[str] = ()):
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    """A monotonically increasing count; `name` should end in `_total`."""
    kind = "counter"

    def __init__(self, name, help, labelnames=()):
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels) -> float:
        return self._values.get(self._key(labels), 0.0)

    def mirror(self, total: float, **labels) -> None:
        """Set the count from a total kept elsewhere (e.g. the engine's step counter)."""
        with self._lock:
            self._values[self._key(labels)] = float(total)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.labelnames:
            items = [((), 0.0)]
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name, help, labelnames=()):
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: float, **labels) -> None:
        with self._lock:
            self._values[self._key(labels)] = float(value)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name, help, buckets: Iterable[float], labelnames=()):
        super().__init__(name, help, labelnames)
        self.buckets = tuple(sorted(float(b) for b in buckets))
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, **labels) -> None:
        key = self._key(labels)
        with self._lock:
            counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
            self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, **labels) -> int:
        return sum(self._counts.get(self._key(labels), ()))

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(c), self._sums[k]) for k, c in self._counts.items())
        if not items and not self.labelnames:
            items = [((), [0] * (len(self.buckets) + 1), 0.0)]
        lines = self.header()
        for key, counts, total in items:
            running = 0
            for bound, c in zip(self.buckets + (math.inf,), counts):
                running += c
                le = 'le="' + _number(bound) + '"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {running}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {running}")
        return lines


GRAPH_COUNTERS = {   # luce.models.graph_cache.GraphCache.counters: target forward, commit and draft model together
    "replays": "Forward passes and tree commits replayed from a captured CUDA graph (target and draft model).",
    "captures": "CUDA graphs captured (one per graph key).",
    "rebuilds": "CUDA graphs captured again for a key whose graph was dropped (state or slot topology changed).",
    "eager_steps": "Forward passes and commits run eagerly on a graph-capable backend (a key's first step, or why in "
                   "luce_graph_eager_total).",
    "failures": "Graph keys that could not be captured and stay eager.",
}


class ServerMetrics:
    """Every metric the server exports; `render(stats)` adds the engine gauges."""

    def __init__(self, prefix: str = "luce"):
        p = prefix
        self.requests = Counter(f"{p}_http_requests_total", "HTTP requests answered, by endpoint and status code.",
                                ("endpoint", "status"))
        self.finished = Counter(f"{p}_request_finished_total",
                                "Generation requests ended, by finish reason (stop, length, error, cancelled).",
                                ("reason",))
        self.prompt_tokens = Counter(f"{p}_prompt_tokens_total", "Prompt tokens of admitted generation requests.")
        self.generation_tokens = Counter(f"{p}_generation_tokens_total", "Tokens generated for clients.")
        self.rejected = Counter(f"{p}_requests_rejected_total", "Generation requests refused, by reason.",
                                ("reason",))
        self.ttft = Histogram(f"{p}_time_to_first_token_seconds",
                              "Time from request arrival to its first generated token.", LATENCY_BUCKETS)
        self.itl = Histogram(f"{p}_inter_token_latency_seconds",
                             "Time between consecutive generated tokens of a request (per token).", LATENCY_BUCKETS)
        self.e2e = Histogram(f"{p}_request_duration_seconds", "Generation request time, arrival to last token.",
                             REQUEST_BUCKETS)
        self.tokens_per_event = Histogram(f"{p}_tokens_per_step", "Tokens a request received from one engine step "
                                          "(more than 1 only with speculation).", TOKENS_PER_STEP_BUCKETS)
        self.requests_running = Gauge(f"{p}_requests_in_flight", "Generation requests admitted and not finished.")
        self.slots_busy = Gauge(f"{p}_slots_busy", "Engine slots holding a request.")
        self.slots_total = Gauge(f"{p}_slots_total", "Engine slots (luce-serve --max-slots).")
        self.queue_depth = Gauge(f"{p}_queue_depth", "Requests admitted but waiting for a slot.")
        self.kv_used = Gauge(f"{p}_kv_pages_used", "KV cache pages (16 tokens each) in use.")
        self.kv_free = Gauge(f"{p}_kv_pages_free", "KV cache pages (16 tokens each) free.")
        self.acceptance = Gauge(f"{p}_spec_acceptance_length",
                                "Mean tokens committed per request per engine step (1 without speculation).")
        self.steps = Counter(f"{p}_engine_steps_total", "Engine steps run.")
        self.graphs = {name: Counter(f"{p}_graph_{name}_total", help_text) for name, help_text in GRAPH_COUNTERS.items()}
        self.eager = Counter(f"{p}_graph_eager_total", "Eager forward passes and commits on a graph-capable backend, "
                             "by why ('first call of a key' is warm-up; anything else a step that cannot replay).",
                             ("reason",))
        self.cache_tokens = Counter(f"{p}_prefix_cache_prompt_tokens_total",
                                    "Prompt tokens served from the prefix cache (not prefilled).")
        self.cache_snapshots = Counter(f"{p}_prefix_cache_snapshot_lookups_total", "Prefix cache lookups of hybrid "
                                       "models, by whether a recurrent snapshot was found (hit, miss).", ("result",))
        self.cache_evictions = Counter(f"{p}_prefix_cache_evictions_total",
                                       "Prefix cache evictions, by kind (page, snapshot).", ("kind",))
        self.cache_bytes = Gauge(f"{p}_prefix_cache_bytes", "Bytes the prefix cache holds (KV pages it references "
                                 "and recurrent snapshots).")
        self._own = [self.requests, self.finished, self.rejected, self.prompt_tokens, self.generation_tokens,
                     self.ttft, self.itl, self.e2e, self.tokens_per_event]

    def render(self, stats: EngineStats | None, in_flight: int) -> str:
        self.requests_running.set(in_flight)
        engine = [self.requests_running]
        if stats is not None:
            self.slots_busy.set(stats.slots_busy)
            self.slots_total.set(stats.slots_total)
            self.queue_depth.set(stats.queue_depth)
            self.kv_used.set(stats.kv_pages_used)
            self.kv_free.set(stats.kv_pages_free)
            self.acceptance.set(math.nan if stats.acceptance_length is None else stats.acceptance_length)
            self.steps.mirror(stats.steps)
            for name, counter in self.graphs.items():
                counter.mirror(stats.graphs.get(name, 0))
            for reason, n in stats.graphs.get("eager_reasons", {}).items():
                self.eager.mirror(n, reason=reason)
            engine += [self.slots_busy, self.slots_total, self.queue_depth, self.kv_used, self.kv_free,
                       self.acceptance, self.steps, *self.graphs.values(), self.eager]
            engine += self._prefix_cache(stats.prefix_cache)
        lines: list[str] = []
        for metric in self._own + engine:
            lines += metric.render()
        return "\n".join(lines) + "\n"

    def _prefix_cache(self, counters: dict) -> list:
        if not counters:
            return []
        self.cache_tokens.mirror(counters["prompt_tokens"])
        self.cache_snapshots.mirror(counters["snapshot_hits"], result="hit")
        self.cache_snapshots.mirror(counters["snapshot_misses"], result="miss")
        self.cache_evictions.mirror(counters["evicted_pages"], kind="page")
        self.cache_evictions.mirror(counters["evicted_snapshots"], kind="snapshot")
        self.cache_bytes.set(counters["bytes"])
        return [self.cache_tokens, self.cache_snapshots, self.cache_evictions, self.cache_bytes]
