"""One benchmark run against one endpoint: warm-up, waves per concurrency, a staggered round.

    result = run_benchmark(Endpoint("http://127.0.0.1:8080"), BenchConfig(), label="A")

`result` is a JSON-able dict (the schema is in docs/BENCHMARKS.md): "levels" (one entry per
concurrency, waves.summarize_level), "staggered" (staggered.summarize_round), "outputs"
(digests.summarize_outputs over every measured request), "records" (per-request timings,
times relative to the run start, and output text) and what the server said about itself.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

from luce.benchmark.client import Endpoint, http_get, stream_request
from luce.benchmark.digests import summarize_outputs
from luce.benchmark.prompts import (CORPUS_PROMPTS, HUMANEVAL_SUBSET, Prompt, corpus_prompt, load_problems,
                                    subset_prompts)
from luce.benchmark.staggered import StaggerConfig, run_staggered
from luce.benchmark.waves import run_level


@dataclass
class BenchConfig:
    concurrencies: tuple[int, ...] = (1, 2, 3, 4, 5)
    waves: int = 3                        # N waves per concurrency
    max_tokens: int = 128                 # M forced output tokens per wave request
    stagger: StaggerConfig | None = field(default_factory=StaggerConfig)   # None: no staggered round
    medium_words: int = CORPUS_PROMPTS["medium"][1]
    long_words: int = CORPUS_PROMPTS["long"][1]
    warmup_tokens: int = 16               # one unmeasured request first; 0: none
    scrape_metrics: bool = True           # read /metrics for the acceptance length

    def __post_init__(self):
        self.concurrencies = tuple(int(c) for c in self.concurrencies)
        if any(c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be >= 1, got {self.concurrencies}")
        if self.waves < 1 or self.max_tokens < 2:
            raise ValueError("need waves >= 1 and max_tokens >= 2 (a TBT needs two tokens)")

    def to_json(self) -> dict:
        out = asdict(self)
        out["concurrencies"] = list(self.concurrencies)
        return out


@dataclass(frozen=True)
class PromptSet:
    subset: tuple[Prompt, ...]            # wave and established prompts
    arriving: tuple[Prompt, ...]          # staggered arrivals: medium, long

    def describe(self) -> dict:
        return {"subset": [p.id for p in self.subset],
                "arriving": [{"id": p.id, "corpus_words": p.corpus_words, "chars": len(p.text)}
                             for p in self.arriving]}


def build_prompts(config: BenchConfig, problems: dict | None = None) -> PromptSet:
    """The subset (HUMANEVAL_SUBSET) and the medium and long corpus prompts."""
    problems = load_problems() if problems is None else problems
    subset = tuple(subset_prompts(problems, HUMANEVAL_SUBSET))
    arriving = (corpus_prompt(problems, "medium", config.medium_words),
                corpus_prompt(problems, "long", config.long_words))
    return PromptSet(subset=subset, arriving=arriving)


def server_info(endpoint: Endpoint) -> dict:
    """What the server says about itself: the model list and /props (luce-serve, llama-server)."""
    info: dict = {}
    for path in ("/v1/models", "/props"):
        status, body = http_get(endpoint.root + path, api_key=endpoint.api_key)
        if status == 200 and len(body) < 20000:
            try:
                info[path] = json.loads(body)
            except json.JSONDecodeError:
                pass
    return info


async def _run(endpoint: Endpoint, config: BenchConfig, prompts: PromptSet, label: str) -> dict:
    origin = time.perf_counter()
    result: dict = {"label": label, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "endpoint": {"base_url": endpoint.base_url, "api": endpoint.api, "model": endpoint.model,
                                 "extra_body": endpoint.extra_body},
                    "config": config.to_json(), "prompts": prompts.describe(),
                    "server": await asyncio.to_thread(server_info, endpoint)}
    if config.warmup_tokens > 0:
        warm = await stream_request(endpoint, prompts.subset[0], config.warmup_tokens)
        result["warmup"] = {"ok": warm.ok, "error": warm.error}
        if not warm.ok:
            raise RuntimeError(f"{label}: the warm-up request to {endpoint.root}{endpoint.path} failed: "
                               f"{warm.error}")
    levels, wave_records = [], []
    for c in config.concurrencies:
        summary, records = await run_level(endpoint, prompts.subset, c, config.waves, config.max_tokens,
                                           origin, config.scrape_metrics)
        levels.append(summary)
        wave_records += [(c, r) for r in records]
    staggered, stagger_records = None, []
    if config.stagger is not None:
        staggered, stagger_records = await run_staggered(
            endpoint, prompts.subset, prompts.arriving, config.stagger, origin, config.scrape_metrics)
    everything = [r for _, r in wave_records] + stagger_records
    result["levels"] = levels
    result["staggered"] = staggered
    result["outputs"] = summarize_outputs(everything)
    result["records"] = {
        "waves": [dict(r.to_json(origin, with_text=True), concurrency=c) for c, r in wave_records],
        "staggered": [dict(r.to_json(origin, with_text=True),
                           role="established" if i < config.stagger.established else "arriving")
                      for i, r in enumerate(stagger_records)],
    }
    result["duration_s"] = time.perf_counter() - origin
    return result


def run_benchmark(endpoint: Endpoint, config: BenchConfig, label: str = "run",
                  prompts: PromptSet | None = None) -> dict:
    """Run the whole benchmark against one endpoint (blocking); see the module docstring."""
    prompts = build_prompts(config) if prompts is None else prompts
    return asyncio.run(_run(endpoint, config, prompts, label))
