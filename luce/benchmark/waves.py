"""Fixed-concurrency waves: C requests sent together, the next wave only after all C ended.

Wave w at concurrency C sends subset prompts (w*C + i) mod 10 for i < C, so successive
waves rotate through the subset. Per C the report gives (docs/BENCHMARKS.md):
- output_tok_s: the waves' output tokens summed over their output windows summed
  (stats.output_window / stats.pooled_tok_s);
- ttft_s, tbt_s: p50/p90 over the C*N requests (stats.ttft, stats.tbt);
- acceptance_length over the C's waves when the server reports it (server_metrics).
"""
from __future__ import annotations

import asyncio
from typing import Sequence

from luce.benchmark import stats
from luce.benchmark.client import Endpoint, stream_request
from luce.benchmark.prompts import Prompt
from luce.benchmark.records import RequestRecord
from luce.benchmark.server_metrics import AcceptanceProbe


def wave_prompts(subset: Sequence[Prompt], concurrency: int, wave_index: int) -> list[Prompt]:
    return [subset[(wave_index * concurrency + i) % len(subset)] for i in range(concurrency)]


async def run_wave(endpoint: Endpoint, prompts: Sequence[Prompt], max_tokens: int) -> list[RequestRecord]:
    """All prompts at once, one connection each; returns when every stream has ended."""
    return list(await asyncio.gather(*(stream_request(endpoint, p, max_tokens) for p in prompts)))


def token_source(records: Sequence[RequestRecord]) -> str:
    sources = {r.token_source for r in records if r.ok}
    return sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")


def summarize_level(concurrency: int, waves: Sequence[Sequence[RequestRecord]], max_tokens: int,
                    origin: float, acceptance: tuple[float | None, str | None] = (None, None)) -> dict:
    """The report entry of one concurrency level from its waves' records."""
    records = [r for wave in waves for r in wave]
    ok = [r for r in records if r.ok]
    windows = [stats.output_window([r for r in wave if r.ok]) for wave in waves]
    return {
        "concurrency": concurrency,
        "waves": len(waves),
        "requests": len(records),
        "failed": len(records) - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "short": sum(1 for r in ok if r.n_tokens != max_tokens),
        "token_source": token_source(records),
        "output_tok_s": stats.pooled_tok_s(windows),
        "windows": [None if w is None else {"start_s": round(w.start - origin, 6),
                                            "duration_s": w.duration, "tokens": w.tokens,
                                            "tok_s": w.tok_s} for w in windows],
        "ttft_s": stats.summarize([stats.ttft(r) for r in ok]),
        "tbt_s": stats.summarize([stats.tbt(r) for r in ok]),
        "acceptance_length": acceptance[0],
        "acceptance_source": acceptance[1],
    }


async def run_level(endpoint: Endpoint, subset: Sequence[Prompt], concurrency: int, n_waves: int,
                    max_tokens: int, origin: float, scrape_metrics: bool = True,
                    ) -> tuple[dict, list[RequestRecord]]:
    """N waves at one concurrency: (summary, every record)."""
    if concurrency < 1 or n_waves < 1:
        raise ValueError(f"concurrency and waves must be >= 1, got {concurrency} and {n_waves}")
    probe = await asyncio.to_thread(AcceptanceProbe, endpoint, scrape_metrics)
    waves = []
    for w in range(n_waves):
        waves.append(await run_wave(endpoint, wave_prompts(subset, concurrency, w), max_tokens))
    acceptance = await asyncio.to_thread(probe.finish)
    summary = summarize_level(concurrency, waves, max_tokens, origin, acceptance)
    return summary, [r for wave in waves for r in wave]
