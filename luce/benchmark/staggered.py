"""Staggered arrivals: long prompts arrive while K established requests are decoding.

At t0 the K established requests (subset prompts 0..K-1, L tokens each) are sent. At exactly
t0 + S the arriving requests (the medium and long corpus prompts, 64 tokens each) are sent
together. The prefill window runs from their send time t_a to the last arriving request's
first token t_p. Reported (docs/BENCHMARKS.md):
- established_goodput_tok_s: established output tokens arriving in (t_a, t_p], over t_p - t_a;
  established_goodput_before_tok_s the same over (t_s, t_a], t_s the last established first
  token (steady decoding before the arrivals);
- established_tbt_effective_s: K (t_p - t_a) / those tokens (K t / tokens: the time per
  token each decoder saw), and the same before the arrivals; established_max_gap_s: the
  longest wait between two chunks of one established request that overlaps the window;
- arriving_ttft_s (p50 among them), prompt_tok_s: the arriving requests' prompt tokens (server
  usage) over t_p - t_a; round_time_s: t0 to the last token of any request.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Sequence

from luce.benchmark import stats
from luce.benchmark.client import Endpoint, stream_request
from luce.benchmark.prompts import Prompt
from luce.benchmark.records import RequestRecord
from luce.benchmark.server_metrics import AcceptanceProbe


@dataclass(frozen=True)
class StaggerConfig:
    established: int = 3                  # K
    established_tokens: int = 512         # L
    arrive_after_s: float = 2.0           # S, from sending the established requests
    arrival_tokens: int = 64

    def __post_init__(self):
        if self.established < 1 or self.established_tokens < 2 or self.arrival_tokens < 1:
            raise ValueError("staggered run needs >= 1 established request of >= 2 tokens and "
                             ">= 1 arrival token")
        if self.arrive_after_s < 0:
            raise ValueError(f"arrive_after_s must be >= 0, got {self.arrive_after_s}")


def _rate(tokens: int, duration: float) -> float | None:
    return tokens / duration if duration > 0 else None


def _per_decoder_tbt(decoders: int, duration: float, tokens: int) -> float | None:
    return decoders * duration / tokens if tokens > 0 and duration > 0 else None


def summarize_round(established: Sequence[RequestRecord], arriving: Sequence[RequestRecord],
                    t0: float, origin: float, arrive_after_s: float) -> dict:
    """The staggered report from the round's records (times are perf_counter seconds)."""
    warnings: list[str] = []
    est_ok = [r for r in established if r.ok]
    arr_ok = [r for r in arriving if r.ok]
    errors = sorted({r.error for r in list(established) + list(arriving) if r.error})[:5]
    t_a = min(r.send_time for r in arriving)
    out = {
        "established": len(established), "arriving": len(arriving), "errors": errors,
        "arrive_after_s": arrive_after_s, "arrived_at_s": t_a - t0,
        "prefill_window": None, "established_goodput_tok_s": None,
        "established_goodput_before_tok_s": None, "established_tbt_effective_s": None,
        "established_tbt_before_s": None, "established_max_gap_s": None,
        "arriving_ttft_s": stats.summarize([stats.ttft(r) for r in arr_ok]),
        "arriving_prompt_tokens": None, "prompt_tok_s": None, "round_time_s": None,
        "warnings": warnings,
    }
    everything = est_ok + arr_ok
    if everything:
        out["round_time_s"] = max(r.last_token_time for r in everything) - t0
    if len(est_ok) < len(established) or len(arr_ok) < len(arriving):
        warnings.append("some requests failed; the window metrics are not computed")
        return out
    t_p = max(r.first_token_time for r in arriving)
    t_s = max(r.first_token_time for r in established)
    window = t_p - t_a
    out["prefill_window"] = {"start_s": t_a - origin, "end_s": t_p - origin, "duration_s": window}
    k = len(established)
    during = stats.tokens_between(established, t_a, t_p)
    out["established_tokens_in_window"] = during
    out["established_goodput_tok_s"] = _rate(during, window)
    out["established_tbt_effective_s"] = _per_decoder_tbt(k, window, during)
    gaps = [stats.longest_gap(r.chunk_times, t_a, t_p) for r in established]
    out["established_max_gap_s"] = max((g for g in gaps if g is not None), default=None)
    if t_s < t_a:
        before = stats.tokens_between(established, t_s, t_a)
        out["established_goodput_before_tok_s"] = _rate(before, t_a - t_s)
        out["established_tbt_before_s"] = _per_decoder_tbt(k, t_a - t_s, before)
    else:
        warnings.append(f"not every established request had its first token before the arrivals "
                        f"(S = {arrive_after_s:g} s is too short): no steady-state comparison")
    if min(r.last_token_time for r in established) < t_p:
        warnings.append("an established request finished inside the prefill window (L too small): "
                        "its goodput there is understated")
    if all(r.prompt_tokens is not None for r in arriving):
        n_prompt = sum(r.prompt_tokens for r in arriving)
        out["arriving_prompt_tokens"] = n_prompt
        out["prompt_tok_s"] = _rate(n_prompt, window)
    else:
        warnings.append("the server sent no prompt token counts (usage): no prompt throughput")
    return out


async def run_staggered(endpoint: Endpoint, established_prompts: Sequence[Prompt],
                        arriving_prompts: Sequence[Prompt], config: StaggerConfig, origin: float,
                        scrape_metrics: bool = True) -> tuple[dict, list[RequestRecord]]:
    """One staggered round: (summary, established records + arriving records)."""
    if len(established_prompts) < config.established:
        raise ValueError(f"{config.established} established requests need as many prompts, "
                         f"got {len(established_prompts)}")
    if not arriving_prompts:
        raise ValueError("a staggered round needs at least one arriving prompt")
    probe = await asyncio.to_thread(AcceptanceProbe, endpoint, scrape_metrics)
    t0 = time.perf_counter()
    established = [asyncio.ensure_future(stream_request(endpoint, p, config.established_tokens))
                   for p in established_prompts[:config.established]]
    await asyncio.sleep(max(0.0, t0 + config.arrive_after_s - time.perf_counter()))
    arriving = await asyncio.gather(*(stream_request(endpoint, p, config.arrival_tokens)
                                      for p in arriving_prompts))
    established_records = list(await asyncio.gather(*established))
    acceptance = await asyncio.to_thread(probe.finish)
    summary = summarize_round(established_records, list(arriving), t0, origin, config.arrive_after_s)
    summary["round_start_s"] = t0 - origin
    summary["acceptance_length"], summary["acceptance_source"] = acceptance
    summary["config"] = {"established": config.established, "established_tokens": config.established_tokens,
                         "arrive_after_s": config.arrive_after_s, "arrival_tokens": config.arrival_tokens,
                         "arriving_prompts": [p.id for p in arriving_prompts]}
    return summary, established_records + list(arriving)
