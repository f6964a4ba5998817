"""AR decode through the engine (luce.engine.Engine): what a server sees per step, engine
bookkeeping, graph replay, sampling and all (luce.benchmark.decode_bench times model.forward
alone). C requests with the same prompt length decode together with speculation off; the
timed steps are steady ones (every request decoding) after `warmup` of them."""
from __future__ import annotations

import time

from luce.engine.request import DECODE


def bench_engine_ar(model, prompts, settings) -> list[dict]:
    """-> [{concurrency, tok_s, step_ms, steps, graphs}] for C in settings.concurrency."""
    from luce.engine import Engine, EngineConfig
    from luce.engine.sampler import SamplingParams

    rows = []
    for C in settings.concurrency:
        n_tokens = settings.warmup + settings.steps + 2
        ctx = max(len(p) for p in prompts[:C]) + n_tokens + 1
        engine = Engine(model, None, EngineConfig(max_slots=C, ctx=ctx, cuda_graphs=settings.graphs,
                                                  token_budget=max(sum(len(p) for p in prompts[:C]), 64) + C))
        requests = [engine.get(engine.add_request(list(p), SamplingParams(max_tokens=n_tokens, ignore_eos=True)))
                    for p in prompts[:C]]
        times, steady = [], 0
        while engine.has_unfinished() and len(times) < settings.steps:
            timed = all(r.phase == DECODE for r in requests)
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            if timed:
                steady += 1
                if steady > settings.warmup:
                    times.append(dt)
        times.sort()
        step = times[len(times) // 2] if times else float("nan")
        rows.append({"concurrency": C, "tok_s": C / step if times else float("nan"), "step_ms": step * 1e3,
                     "steps": len(times), "graphs": engine.graph_counters()})
        del engine
    return rows
