"""AR decode through the engine (luce.engine.Engine): what a server sees per step, engine
bookkeeping, graph replay, sampling and all (luce.benchmark.decode_bench times model.forward
alone). C requests with the same prompt length decode together with speculation off, greedy
(or, with settings.engine_sampled, seeded sampling at llama-server's defaults: temperature 0.8,
top-k 40, top-p 0.95, min-p 0.05); the timed steps are steady ones (every request decoding)
after `warmup` of them.

Beside the step's wall time, its host time: the wall time minus the time spent waiting for
the device (inside the runtime calls that block until queued work has run: stream, event
and device synchronisation, device-to-host copies; `RuntimeClock`). Without steps ahead
the host work of a decode step is serial with the device (the next step needs the sampled
token), so it adds to every step; with them (luce.engine.ahead) it overlaps the device's. `launch_ms` is the part of the host time inside graph launches (the
driver's, for a captured graph of hundreds of nodes). Medians over the timed steps."""
from __future__ import annotations

import statistics
import time

from luce.engine.request import DECODE

WAITS = ("synchronize", "event_synchronize", "device_synchronize", "copy_d2h_async")   # block until the device is done
LAUNCHES = ("graph_launch",)


class RuntimeClock:
    """Seconds spent inside a backend's GPU runtime calls while installed (`with clock:`):
    `wait` in those that wait for the device (WAITS), `launch` in graph launches. A backend
    without a runtime (numpy, cpu) never waits. The calls are wrapped on the runtime object
    and unwrapped on exit."""

    def __init__(self, backend):
        self.runtime = getattr(backend, "runtime", None)
        self.wait = self.launch = 0.0

    def __enter__(self) -> RuntimeClock:
        if self.runtime is not None:
            for name in WAITS + LAUNCHES:
                setattr(self.runtime, name, self._timed(getattr(self.runtime, name), name in WAITS))
        return self

    def __exit__(self, *exc) -> None:
        if self.runtime is not None:
            for name in WAITS + LAUNCHES:
                self.runtime.__dict__.pop(name, None)

    def _timed(self, call, waits: bool):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                if waits:
                    self.wait += time.perf_counter() - t0
                else:
                    self.launch += time.perf_counter() - t0
        return timed

    def reading(self) -> tuple[float, float]:
        return self.wait, self.launch


def bench_engine_ar(model, prompts, settings) -> list[dict]:
    """-> [{concurrency, tok_s, step_ms, host_ms, launch_ms, wait_ms, steps, graphs}] for C in
    settings.concurrency (ms: medians over the timed steps; host = step - wait)."""
    from luce.engine import Engine, EngineConfig
    from luce.engine.sampler import SamplingParams

    rows = []
    for C in settings.concurrency:
        n_tokens = settings.warmup + settings.steps + 2
        ctx = max(len(p) for p in prompts[:C]) + n_tokens + 1
        engine = Engine(model, None, EngineConfig(max_slots=C, ctx=ctx, cuda_graphs=settings.graphs,
                                                  token_budget=max(sum(len(p) for p in prompts[:C]), 64) + C))
        sampling = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05) if settings.engine_sampled else {}
        requests = [engine.get(engine.add_request(list(p), SamplingParams(max_tokens=n_tokens, ignore_eos=True,
                                                                          seed=i, **sampling)))
                    for i, p in enumerate(prompts[:C])]
        steps, steady = [], 0
        with RuntimeClock(model.backend) as clock:
            while engine.has_unfinished() and len(steps) < settings.steps:
                timed = all(r.phase == DECODE for r in requests)
                (wait0, launch0), t0 = clock.reading(), time.perf_counter()
                engine.step()
                dt, (wait1, launch1) = time.perf_counter() - t0, clock.reading()
                if timed:
                    steady += 1
                    if steady > settings.warmup:
                        steps.append((dt, dt - (wait1 - wait0), launch1 - launch0, wait1 - wait0))
        median = lambda i: 1e3 * statistics.median(s[i] for s in steps) if steps else float("nan")  # noqa: E731
        step = median(0) / 1e3
        rows.append({"concurrency": C, "tok_s": C / step if steps else float("nan"), "step_ms": median(0),
                     "host_ms": median(1), "launch_ms": median(2), "wait_ms": median(3), "steps": len(steps),
                     "graphs": engine.graph_counters()})
        del engine
    return rows
