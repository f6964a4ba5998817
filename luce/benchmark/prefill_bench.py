"""Prefill through the engine: time to the first token of one prompt of L random tokens
(luce.engine.Engine, greedy, one slot, chunks of at most `token_budget` rows a step), what a
user of `luce-serve` waits for before the first streamed token.

Per length L: `warmup` untimed requests (the first one captures the graphs of the chunk
buckets it meets), then `reps` timed ones, each a fresh prompt (distinct random tokens: the
prefix cache, off here anyway, could not serve them). TTFT is the wall time from
add_request to the end of the step that emitted the request's first token; tok/s = L / TTFT
(best of the reps, as llama-bench reports its mean of a warm run). Lengths past the model's
trained context are skipped with the reason. The engine's graph counters show whether the
prompt chunks replayed (luce.models.graphed_forward; issue 18 deliverable 4).
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Sequence

from luce.benchmark.decode_bench import random_prompts

PREFILL_LENGTHS = (512, 4096, 12000, 32000)


def time_to_first_token(engine, prompt: Sequence[int]) -> tuple[float, int]:
    """(seconds from add_request to the step that emits the first token, steps run)."""
    from luce.engine.sampler import SamplingParams

    t0 = time.perf_counter()
    request = engine.get(engine.add_request(list(prompt), SamplingParams(max_tokens=1, ignore_eos=True, seed=0)))
    steps = 0
    while not request.output_ids:
        if request.finished:
            raise RuntimeError(f"prefill of {len(prompt)} tokens ended without a token: {request.finish_reason}"
                               + (f" ({request.error})" if request.error else ""))
        engine.step()
        steps += 1
    seconds = time.perf_counter() - t0
    while engine.has_unfinished():      # the finishing bookkeeping frees the slot for the next prompt
        engine.step()
    return seconds, steps


def bench_prefill(model, lengths: Sequence[int] = PREFILL_LENGTHS, token_budget: int | None = None, reps: int = 3,
                  warmup: int = 1, graphs: bool = True, seed: int = 0) -> list[dict]:
    """-> [{prompt_tokens, tok_s, ttft_s, ttft_median_s, steps, reps, token_budget, graphs}] per length
    (or {prompt_tokens, skipped} / {prompt_tokens, error}). token_budget None: the engine's default
    for the model's backend (luce.engine.engine_config.default_token_budget)."""
    from luce.engine import Engine, EngineConfig

    if reps < 1 or warmup < 0 or (token_budget is not None and token_budget < 1):
        raise ValueError(f"prefill bench needs reps >= 1, warmup >= 0, token_budget >= 1; got {reps}, {warmup}, "
                         f"{token_budget}")
    cfg = model.config
    trained = int(getattr(cfg, "context_length", 0) or 0)
    rows = []
    for i, L in enumerate(lengths):
        if trained and L + 1 > trained:
            rows.append({"prompt_tokens": L, "skipped": f"past the model's trained context ({trained} tokens)"})
            continue
        try:
            engine = Engine(model, None, EngineConfig(max_slots=1, ctx=L + 1, token_budget=token_budget,
                                                      cuda_graphs=graphs))
            times, steps = [], 0
            for rep in range(warmup + reps):
                seconds, steps = time_to_first_token(engine, random_prompts(1, L, cfg.vocab, seed + 1000 * i + rep)[0])
                if rep >= warmup:
                    times.append(seconds)
            rows.append({"prompt_tokens": L, "tok_s": L / min(times), "ttft_s": min(times),
                         "ttft_median_s": statistics.median(times), "steps": steps, "reps": reps,
                         "token_budget": engine.config.token_budget, "graphs": engine.graph_counters()})
            del engine
        except Exception as e:  # noqa: BLE001 - report the failure, keep benchmarking
            rows.append({"prompt_tokens": L, "error": f"{type(e).__name__}: {e}"})
        gc.collect()
    return rows
