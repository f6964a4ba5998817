#!/usr/bin/env python3
"""Host time of one replayed decode step through luce.engine.Engine, on a machine without a GPU.

    python tools/profile_host_step.py                       # both shapes, C1 and C5
    python tools/profile_host_step.py --shape 27b -c 5 --profile 25
    python tools/profile_host_step.py --shape 1.5b -c 1 --spec-depth 5   # with a 0.5B draft model

The CUDA backend's host code runs over the recording double of cuda-python and the kernel
library (tests/ops/fake_cuda.py, tests/ops/fake_hip.py: no kernel computes, device memory is
host memory). The model is synthetic (luce.testing.synthetic_model) with a real model's layer
count, layer kinds and vocabulary and tiny widths: what the host does per step depends on
those, not on the widths. C requests decode together (greedy, speculation off, graphs on);
a first pass of the same requests captures every graph, and in a second pass, after `--warmup`
steady steps, `--steps` engine.step() calls are timed: every forward replays a graph.

Times are this thread's CPU time (time.thread_time: time it spends descheduled does not
count, though a busy machine still slows it, hence host_min); per step it reports
- `wall_us`: engine.step() (CPU time, the double included);
- `fake_us`: time inside the double (runtime calls and eager kernel launches; what cuda-python
  and the driver cost instead on a GPU host, a few us a call);
- `host_us` = wall - fake, the median (`host_p10` its 10th percentile, `host_min` its least:
  steadier on a busy machine): luce's own Python per step, what issue 17 (deliverable 4)
  bounds at 100 us on the H200's host; this CPU is a proxy;
- `calls`: Python and C function calls luce makes per step (deterministic, unlike times);
- `rt_calls` / `kernels`: runtime calls and kernels launched outside a graph per step;
- `replays`: graph replays per step (1: every forward replayed), `eager`: eager forwards.
`--spec-depth D`: speculation with a draft model of the Coder-0.5B's layers and vocabulary
(`luce-serve`'s chain mode at a fixed depth D): the double's argmax and top-k choose TOKEN,
so every draft is accepted and each step verifies D + 1 tree rows, after D draft passes
(`draft_us`: the host time inside the drafter's propose, the double's excluded).
`--phases` adds each part of the step (scheduler, builder, preflight, checkpoint, forward,
decide, commit, outputs): mean host us (the wrappers' own cost included) and calls;
`--profile N` runs N more steps under cProfile and prints the top functions. Per-step work
that grows with the context (page lists) shows with a longer `--prompt`.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {   # name -> (synthetic preset, layers, vocab): the H200 models' layer counts and vocabularies
    "27b": ("qwen36-27b", 64, 248320),
    "1.5b": ("qwen2.5-coder-1.5b", 28, 151936),
}
DRAFT_SHAPE = ("qwen2.5-coder-0.5b", 24, 151936)


TOKEN = 7   # what the double's argmax picks
CLOCK = time.thread_time   # CPU time of this thread: other processes on the machine do not count


class FakeClock:
    """Time and calls inside the double: every cuda-python call and kernel launch is wrapped."""

    def __init__(self):
        self.seconds, self.calls, self.kernels = 0.0, 0, 0

    def wrap(self, fn, kind: str):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = CLOCK()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += CLOCK() - t0
                if kind == "kernel":
                    self.kernels += 1
                else:
                    self.calls += 1
        return timed

    def snapshot(self) -> tuple[float, int, int]:
        return self.seconds, self.calls, self.kernels


def install(monkeypatch, tmp: Path) -> FakeClock:
    """The fake CUDA runtime and kernel library, every entry point timed by a FakeClock."""
    import importlib

    from luce.ops.native import family_modules
    from tests.ops.test_hip_runtime import install_fakes

    hip = install_fakes(monkeypatch, tmp, "cuda")
    hip.calls = _Discard()                     # the double's call log would grow by every call
    copy = hip.hipMemcpyAsync

    def device_copy_moves_nothing(dst, src, size, kind, stream):
        """No kernel computes here, so device-to-device bytes are never read: the double skips
        moving them (the recurrent-state checkpoint copies megabytes a step, and the copy would
        evict luce's own working set from the caches)."""
        if kind == hip.hipMemcpyKind.hipMemcpyDeviceToDevice:
            hip._device(int(dst), size), hip._device(int(src), size)
            hip._enqueue(stream, lambda: None)
            return (0,)
        return copy(dst, src, size, kind, stream)

    hip.hipMemcpyAsync = device_copy_moves_nothing

    instantiate = hip.hipGraphInstantiateWithFlags

    def keep_computing_nodes(graph, flags):
        err, graph_exec = instantiate(graph, flags)
        if graph_exec is not None:
            graph_exec.computing = [node for node in graph_exec.nodes if getattr(node, "computes", False)]
        return err, graph_exec

    def graph_launch_runs_computing_nodes(graph_exec, stream):
        """A replay's nodes are kernels that compute nothing here and memsets of memory no host
        code reads, but for the argmax (_argmax): the double runs only that (hundreds of Python
        calls a step otherwise, which would also evict luce's own working set)."""
        hip._stream(stream)
        hip.graph_launches += 1
        for node in graph_exec.computing:
            node()
        return (0,)

    hip.hipGraphInstantiateWithFlags = keep_computing_nodes
    hip.hipGraphLaunch = graph_launch_runs_computing_nodes
    clock = FakeClock()
    cudart = sys.modules["cuda.bindings"].runtime
    for name in dir(type(cudart)):
        if name.startswith("cuda") and callable(getattr(cudart, name)):
            setattr(cudart, name, clock.wrap(getattr(cudart, name), "call"))
    for name in ["_cuda"] + family_modules():
        module = importlib.import_module(f"luce.{name}")
        for attr in dir(module):
            fn = getattr(module, attr)
            if getattr(fn, "__module__", "") == "tests.ops.fake_hip" and getattr(fn, "__name__", "") == "launch":
                monkeypatch.setattr(module, attr, clock.wrap(fn, "kernel"))
    monkeypatch.setattr(importlib.import_module("luce._cuda_sampling"), "argmax",
                        clock.wrap(functools.partial(_argmax, hip), "kernel"))
    monkeypatch.setattr(importlib.import_module("luce._cuda_sampling"), "top_k_logprobs",
                        clock.wrap(functools.partial(_top_k_logprobs, hip), "kernel"))
    return clock


def _argmax(hip, logits, ids_out, rows, vocab, logits_stride=None, stream=0):
    """The argmax kernel of the double, choosing token TOKEN for every row (the recorder
    leaves the output as the memory held, which is no token id)."""
    hip.launch("_cuda_sampling.argmax", stream, [int(logits), int(ids_out)])

    def write_ids():
        hip._device(int(ids_out), 8 * rows).view("<i8").fill(TOKEN)
    write_ids.computes = True
    hip._enqueue(stream, write_ids)


def _top_k_logprobs(hip, logits, ids_out, logprobs_out, workspace, workspace_bytes, rows, vocab, k, logits_stride=None,
                    stream=0):
    """The top-k kernel of the double: TOKEN, TOKEN + 1, ... with log-probs 0, -1, ... (a
    draft that the argmax of the double always accepts)."""
    hip.launch("_cuda_sampling.top_k_logprobs", stream, [int(logits), int(ids_out), int(logprobs_out), int(workspace)])

    def write():
        hip._device(int(ids_out), 8 * rows * k).view("<i8").reshape(rows, k)[:] = TOKEN + np.arange(k)
        hip._device(int(logprobs_out), 4 * rows * k).view("<f4").reshape(rows, k)[:] = -np.arange(k)
    write.computes = True
    hip._enqueue(stream, write)


class _Discard(list):
    def append(self, item) -> None:
        pass


PHASES = (   # (label, module, owner, attribute): the engine step's parts, timed by wrapping them
    ("schedule", "luce.engine.scheduler", "Scheduler", "schedule"),
    ("build", "luce.engine.step", "StepBuilder", "build"),
    ("preflight", "luce.engine.txn", "Transaction", "preflight"),
    ("checkpoint", "luce.models.kv_cache", "ModelState", "checkpoint"),
    ("forward", "luce.models.graphed_forward", "GraphedForward", "__call__"),
    ("decide", "luce.engine.engine", None, "decide"),
    ("commit", "luce.engine.txn", "Transaction", "commit"),
    ("record+apply", "luce.engine.engine", "Engine", "_record"),
    ("record+apply", "luce.engine.engine", "Engine", "_apply"),
)


class PhaseClock:
    """Host time (minus the double's) inside each phase of PHASES."""

    def __init__(self, fake: FakeClock):
        self.fake = fake
        self.seconds: dict[str, float] = {}

    def install(self, monkeypatch) -> None:
        import importlib

        for label, module, owner, attr in PHASES:
            target = importlib.import_module(module)
            target = getattr(target, owner) if owner else target
            monkeypatch.setattr(target, attr, self._wrap(label, getattr(target, attr)))

    def _wrap(self, label, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            f0, t0 = self.fake.seconds, CLOCK()
            try:
                return fn(*args, **kwargs)
            finally:
                host = CLOCK() - t0 - (self.fake.seconds - f0)
                self.seconds[label] = self.seconds.get(label, 0.0) + host
        return timed


def _measuring(code) -> str | None:
    """'double' for code of the double (tests/ops/fake_*, this tool's wrappers of it: nothing
    they call is luce's), 'wrapper' for PhaseClock's (it calls luce, its own calls are not),
    else None."""
    if "/tests/ops/fake_" in code.co_filename:
        return "double"
    if code.co_filename != __file__:
        return None
    return "wrapper" if code.co_qualname.startswith("PhaseClock.") else "double"


def count_calls(step, n: int) -> tuple[int, dict[str, int]]:
    """Python and C function calls that luce makes in n calls of step() (neither the double's
    nor those of this tool's clocks, or of what they call), in all and inside each phase of
    PHASES: a deterministic proxy of host work, where times are noisy."""
    import importlib

    labels = {}
    for label, module, owner, attr in PHASES:
        target = importlib.import_module(module)
        fn = getattr(getattr(target, owner) if owner else target, attr)
        labels[getattr(fn, "__wrapped__", fn).__code__] = label
    count, by_phase, inside = 0, {}, []       # inside: (frame, label) of the phases entered
    double = []                               # the double's frame being run, if any

    def profile(frame, event, arg):
        nonlocal count
        if double:
            if event == "return" and double[-1] is frame:
                double.pop()
            return
        if event == "return" and inside and inside[-1][0] is frame:
            inside.pop()
        if event not in ("call", "c_call"):
            return
        kind = _measuring(frame.f_code)
        if kind == "double" and event == "call":
            double.append(frame)
        if kind is not None:
            return
        count += 1
        if inside:
            by_phase[inside[-1][1]] = by_phase.get(inside[-1][1], 0) + 1
        if event == "call" and frame.f_code in labels:
            inside.append((frame, labels[frame.f_code]))

    sys.setprofile(profile)
    try:
        for _ in range(n):
            step()
    finally:
        sys.setprofile(None)
    return count, by_phase


def make_model(shape, tmp: Path, backend):
    """shape: a name of SHAPES, or a (preset, layers, vocab) of its own."""
    from luce.models import load_model
    from luce.testing.synthetic_model import plan_synthetic, preset_config, write_synthetic

    preset, layers, vocab = SHAPES[shape] if isinstance(shape, str) else shape
    shape = shape if isinstance(shape, str) else preset
    config = dataclasses.replace(preset_config(preset, tiny=True, n_layer=layers), vocab=vocab)
    path = tmp / f"{shape}.gguf"
    write_synthetic(path, plan_synthetic(config, "q8_0", name=shape), seed=0, workers=1)
    return load_model(path, backend)


def run(shape: str, concurrency: int, args) -> dict:
    import pytest

    from luce.engine import Engine, EngineConfig
    from luce.engine.request import DECODE
    from luce.engine.sampler import SamplingParams
    from luce.ops import get_backend

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        clock = install(mp, Path(tmp))
        model = make_model(shape, Path(tmp), get_backend("cuda"))
        depth = getattr(args, "spec_depth", 0)
        n_tokens = (args.warmup + args.steps + args.profile + 28) * (depth + 1)
        config = EngineConfig(max_slots=concurrency, ctx=args.prompt + n_tokens + 16,
                              token_budget=max(args.prompt * concurrency, 64) + concurrency * (depth + 1))
        draft = None
        if depth:
            from luce.spec.config import SpecConfig

            draft = make_model(DRAFT_SHAPE, Path(tmp), model.backend)
            spec = SpecConfig(spec="chain", draft_kind="model", draft=str(Path(tmp) / f"{DRAFT_SHAPE[0]}.gguf"),
                              chain_depth=depth, spec_top_k=1)   # the draft is passed loaded; its path names it
            config = dataclasses.replace(config, spec=spec)
        engine = Engine(model, None, config, draft_model=draft)

        def add_requests():
            return [engine.get(engine.add_request([1 + (i + j) % 300 for j in range(args.prompt)],
                                                  SamplingParams(max_tokens=n_tokens, ignore_eos=True)))
                    for i in range(concurrency)]

        add_requests()
        engine.run()             # a first pass meets every replay key (KV buckets crossed) of the second
        requests = add_requests()
        while not all(r.phase == DECODE for r in requests):
            engine.step()
        for _ in range(args.warmup):
            engine.step()
        phases = PhaseClock(clock)
        if args.phases:
            phases.install(mp)
        drafting = PhaseClock(clock)
        if depth:
            drafter = engine.spec.speculator.drafter
            drafter.propose = drafting._wrap("draft", drafter.propose)
        before = engine.graph_counters()
        walls, fakes, calls, kernels = [], [], [], []
        for _ in range(args.steps):
            f0, c0, k0 = clock.snapshot()
            t0 = CLOCK()
            engine.step()
            walls.append(CLOCK() - t0)
            f1, c1, k1 = clock.snapshot()
            fakes.append(f1 - f0)
            calls.append(c1 - c0)
            kernels.append(k1 - k0)
        after = engine.graph_counters()
        replays = after["replays"] - before["replays"]
        host = sorted(w - f for w, f in zip(walls, fakes))
        row = dict(shape=shape, concurrency=concurrency, host_us=1e6 * statistics.median(host),
                   host_p10=1e6 * host[len(host) // 10], host_min=1e6 * host[0],
                   wall_us=1e6 * statistics.median(walls), fake_us=1e6 * statistics.median(fakes),
                   rt_calls=statistics.median(calls),
                   kernels=statistics.median(kernels), replays=replays / args.steps,
                   eager=after["eager_steps"] - before["eager_steps"],
                   draft_us=1e6 * drafting.seconds.get("draft", 0.0) / args.steps)
        calls, by_phase = count_calls(engine.step, 20)
        row["calls"] = calls / 20
        if args.phases:
            row["phases"] = {k: (1e6 * v / args.steps, by_phase.get(k, 0) / 20) for k, v in phases.seconds.items()}
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.profile):
                engine.step()
            profiler.disable()
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats(args.sort).print_stats(args.top)
            row["profile"] = out.getvalue()
        del engine, requests, model
        return row


COLUMNS = (("host_us", "8.1f"), ("draft_us", "8.1f"), ("host_p10", "8.1f"), ("host_min", "8.1f"), ("wall_us", "8.1f"), ("fake_us", "8.1f"),
           ("calls", "6.0f"), ("rt_calls", "8.0f"), ("kernels", "7.0f"), ("replays", "7.2f"), ("eager", "5d"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=tuple(SHAPES), action="append", help="model shape (repeatable; "
                        "default both)")
    parser.add_argument("-c", "--concurrency", type=int, action="append", help="requests decoding (default 1 and 5)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--spec-depth", type=int, default=0, help="speculate with a 0.5B-shaped draft model, "
                        "this deep (chain mode, every draft accepted)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--profile", type=int, default=0, help="steps to run under cProfile after the timed ones")
    parser.add_argument("--phases", action="store_true", help="also the mean host us and calls of each part of the "
                        "step (scheduler, builder, preflight, checkpoint, forward, decide, commit, outputs)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    print(f"{'shape':>5} {'C':>2} " + " ".join(f"{name:>{int(fmt.split('.')[0].rstrip('d'))}}" for name, fmt in COLUMNS))
    for shape in args.shape or list(SHAPES):
        for c in args.concurrency or [1, 5]:
            r = run(shape, c, args)
            print(f"{shape:>5} {c:>2} " + " ".join(format(r[name], fmt) for name, fmt in COLUMNS), flush=True)
            if "phases" in r:
                print("       " + "  ".join(f"{k} {us:.1f} us/{n:.0f} calls" for k, (us, n) in r["phases"].items()))
            if "profile" in r:
                print(r["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
