"""Decode benchmark of one model file on one backend (tools/bench_decode.py is its CLI).

Sections (each returns plain dicts; `run_decode_bench` gathers them into one report):
- AR decode at concurrency C: C slots prefilled together, then steps of C AR rows driven
  through `model.forward` with ForwardBatch/ModelState directly (no engine); the greedy
  next token is fed back. Per step: `build` (Python packing the batch), `launch` (inside
  model.forward until it returns), `wait` (with graphs: the step and the argmax captured in
  its graph, the ids brought to the host, as the engine serves greedy rows; eager:
  backend.synchronize(), or to_numpy of the logits when the backend has none), `sample`
  (eager: the argmax to the host). tok/s = C / median step. As the engine does where the
  backend launches asynchronously (luce.engine.ahead), each step is launched fed from the
  last step's ids on the device, and `wait` is for the last step's ids while this one runs
  (`ahead=False`: every step waits for its own).
  Forwards go through luce.models.graphed_forward (graph replay; `graphs=False` for eager).
- Engine AR (luce/benchmark/engine_bench.py): the same decode through luce.engine.Engine.
- Verify (luce/benchmark/verify_bench.py): one slot, one draft tree of W rows, as ms and as
  a multiple of the median C=1 AR step.
- Draft pass (with a draft file): the drafter's `propose` for C lanes at a fixed root,
  after the lanes' context is in (DFlash: random target features; draft model: the prompt).
- Speculation through luce.engine.Engine with an oracle drafter (proposes the true
  greedy continuation: upper bound) and an always-wrong drafter (lower bound), both
  wrapping the real drafter when a draft is given (its cost paid, its proposals dropped).
  Only steady steps are timed (every request decoding, none near its end), after `warmup`
  of them; tok/s = tokens committed / time over the timed steps. The outputs are compared
  with plain greedy AR.
- Prefill (luce/benchmark/prefill_bench.py): time to the first token of one prompt of each
  length through the engine, prompt tok/s.
Medians are over `steps` timed repetitions after `warmup` untimed ones.
"""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from luce.benchmark.peak_memory import peak_memory
from luce.models.packer import SegmentSpec, build_batch
from luce.models.kv_cache import pages_needed

PHASES = ("build", "launch", "wait", "sample")


@dataclass(frozen=True)
class BenchSettings:
    prompt_len: int = 128
    concurrency: tuple[int, ...] = (1, 2, 3, 4, 5)
    warmup: int = 3
    steps: int = 16
    tree_widths: tuple[int, ...] = (1, 8, 16, 23, 32, 64)
    depth: int = 15                 # deepest drafted token (DFlash block 16: 15)
    top_k: int = 4                  # candidates per depth
    spec_mode: str = "specla"       # chain | ddtree | specla (luce.spec.config.MODES)
    budget: int = 22                # DDTree drafted nodes
    spec_tokens: int = 0            # tokens per request in the spec runs (0: enough for `steps` steps)
    spec_concurrency: tuple[int, ...] = (1,)
    seed: int = 0
    graphs: bool = True             # replay captured graphs (luce.models.graphed_forward) where the backend can
    ahead: bool = True              # AR steps launched before the last step's ids reach the host (luce.engine.ahead)
    engine_sampled: bool = False    # engine section: seeded sampling at llama-server's defaults, not greedy
    prefill_lengths: tuple[int, ...] = (512, 4096, 12000, 32000)   # prompt tokens of the prefill section
    prefill_budget: int | None = None  # the engine's token budget there (None: its default for the backend)
    prefill_reps: int = 3           # timed prompts per length (best reported)


def open_backend(name: str):
    """luce.ops.get_backend(name); 'auto' = cuda when it can be opened, else numpy."""
    from luce.ops import get_backend

    if name != "auto":
        return get_backend(name)
    try:
        return get_backend("cuda")
    except Exception:   # no GPU, no kernel library, or no CUDA backend registered
        return get_backend("numpy")


def sync_method(backend) -> str:
    return "synchronize" if callable(getattr(backend, "synchronize", None)) else "to_numpy"


def _sync(backend, logits) -> None:
    if callable(getattr(backend, "synchronize", None)):
        backend.synchronize()
    else:
        backend.to_numpy(logits)


def _median_ms(values: Sequence[float]) -> float:
    return 1e3 * statistics.median(values) if values else float("nan")


def _summary(records: list[dict]) -> dict:
    """Median ms of every phase and of the whole step over timed step records."""
    out = {f"{p}_ms": _median_ms([r[p] for r in records]) for p in PHASES if records and p in records[0]}
    out["step_ms"] = _median_ms([sum(v for k, v in r.items() if k in PHASES) for r in records])
    out["steps"] = len(records)
    return out


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n distinct prompts of `length` random token ids."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, length)] for _ in range(n)]


# ---- AR decode ---------------------------------------------------------------------------------

def run_ar(model, prompts: Sequence[Sequence[int]], n_steps: int, warmup: int = 0, graphs: bool = True,
           ahead: bool = True):
    """Greedy decode of len(prompts) slots together: one prefill step, then n_steps steps of
    one AR row per slot (through GraphedForward: the first step of a key eager, the second
    captured, then replays). ahead (as the engine serves greedy rows on a backend that launches
    asynchronously, luce.engine.ahead): each step is launched fed from the previous step's ids
    on the device before those ids are read on the host; else each step waits for the last's.
    -> (tokens per slot [C][n_steps + 1], timed records of the steps after `warmup`, graph
    counters; with graphs, 'nodes': the launches of one replayed step,
    luce.ops.launch_count.NodeCounts.as_dict)."""
    from luce.models.graphed_forward import GraphedForward

    forward = GraphedForward(model, enabled=graphs)
    backend, C = model.backend, len(prompts)
    ahead = ahead and hasattr(backend, "put_ids")
    if ahead:
        forward.keep_ids_for(C)
    per_slot = pages_needed(max(len(p) for p in prompts) + n_steps + 1)
    state = model.new_state(max_pages=C * per_slot, max_slots=C)
    pages = [list(range(s * per_slot, (s + 1) * per_slot)) for s in range(C)]
    batch = build_batch([SegmentSpec(s, list(p), 0, pages[s]) for s, p in enumerate(prompts)])
    last = backend.argmax(forward(batch, state).logits)
    tokens = [[int(t)] for t in last]
    records, pending = [], None
    for step in range(n_steps):
        fed = ahead and step > 0
        t0 = time.perf_counter()
        batch = build_batch([SegmentSpec(s, [0 if fed else tokens[s][-1]], len(prompts[s]) + step, pages[s])
                             for s in range(C)], pad_pages=True)
        t1 = time.perf_counter()
        out = forward(batch, state, greedy_ids=True, fed=fed)
        if ahead:
            started = backend.ids_start(out.greedy_ids)
        t2 = time.perf_counter()
        if ahead:      # the previous step's ids, while this one runs
            last, pending = (backend.ids_wait(pending) if pending is not None else None), started
            t3 = t4 = time.perf_counter()
        elif out.greedy_ids is not None:   # the argmax in the step's graph, the step waited for
            last = backend.ids_to_host(out.greedy_ids)
            t3 = t4 = time.perf_counter()
        else:
            _sync(backend, out.logits)
            t3 = time.perf_counter()
            last = backend.argmax(out.logits)
            t4 = time.perf_counter()
        if last is not None:
            for s in range(C):
                tokens[s].append(int(last[s]))
        if step >= warmup:
            records.append({"build": t1 - t0, "launch": t2 - t1, "wait": t3 - t2, "sample": t4 - t3})
    if pending is not None:
        for s, t in enumerate(backend.ids_wait(pending)):
            tokens[s].append(int(t))
    counters = dict(forward.counters)
    if forward.cache.last_nodes is not None:
        counters["nodes"] = forward.cache.last_nodes.as_dict()
    forward.invalidate()   # free the graphs' pools before the next run
    return tokens, records, counters


def bench_ar(model, prompts, settings: BenchSettings) -> list[dict]:
    rows = []
    for C in settings.concurrency:
        try:
            _, records, graphs = run_ar(model, prompts[:C], settings.warmup + settings.steps, settings.warmup,
                                        settings.graphs, settings.ahead)
        except Exception as e:  # noqa: BLE001 - report the failure, keep benchmarking
            rows.append({"concurrency": C, "error": _error(e)})
            continue
        row = {"concurrency": C, **_summary(records), "graphs": graphs}
        row["tok_s"] = C / (row["step_ms"] / 1e3)
        nodes = graphs.get("nodes")
        if nodes:
            row["launches"] = nodes["launches"]
            row["launches_per_layer"] = nodes["launches"] / model.config.n_layer
        rows.append(row)
        gc.collect()
    return rows


# ---- drafts ------------------------------------------------------------------------------------

def load_draft(draft_path: str, target):
    """The draft model of a file, on the target's backend (DFlash drafts borrow its head)."""
    from luce.gguf.reader import read_config
    from luce.models.loader import load_model

    if read_config(draft_path).arch == "dflash":
        return load_model(draft_path, target.backend, target_model=target)
    return load_model(draft_path, target.backend)


def make_drafter(draft, target, max_slots: int, ctx: int, depth: int):
    """A fresh drafter (its own state) over a loaded draft: DFlash or a plain draft model."""
    from luce.spec.drafters import DFlashDrafter, DraftModelDrafter

    if draft.config.arch == "dflash":
        return DFlashDrafter(draft, max_slots, ctx)
    return DraftModelDrafter(draft, max_slots, ctx, max_depth=depth, target_vocab=target.config.vocab)


def bench_draft(drafter, prompts, settings: BenchSettings, feature_width: int) -> list[dict]:
    """Median `propose` time for C lanes at a fixed root (context already in)."""
    from luce.spec.drafters.base import DraftLane

    rng = np.random.default_rng(settings.seed)
    rows = []
    for C in settings.concurrency:
        for slot in range(C):
            drafter.release(slot)
        lanes = [DraftLane(s, list(prompts[s]) + [1], settings.depth, settings.top_k) for s in range(C)]
        if feature_width:   # the context a commit hands over (random target features)
            feats = [rng.standard_normal((len(prompts[s]), feature_width)).astype(np.float32) for s in range(C)]
            drafter.add_context([(s, 0, len(feats[s])) for s in range(C)],
                                drafter.backend.asarray(np.concatenate(feats)))
        drafter.propose(lanes)
        times = []
        for rep in range(settings.warmup + settings.steps):
            t0 = time.perf_counter()
            drafter.propose(lanes)
            if rep >= settings.warmup:
                times.append(time.perf_counter() - t0)
        rows.append({"concurrency": C, "pass_ms": _median_ms(times), "steps": len(times)})
    return rows


# ---- speculation -------------------------------------------------------------------------------

def spec_depth_cap(settings: BenchSettings, draft=None) -> int:
    """Deepest chain a verify can commit: the drafter's depth (DFlash: block - 1), cut at
    the tree budget in the DDTree modes."""
    cap = settings.depth
    if draft is not None and draft.config.arch == "dflash":
        cap = min(cap, int(draft.block_size) - 1)
    return min(cap, settings.budget) if settings.spec_mode in ("ddtree", "specla") else cap


def spec_tokens(settings: BenchSettings, cap: int) -> int:
    """Tokens per request of a spec run: settings.spec_tokens, or (0) enough for `warmup +
    steps` steady oracle steps of cap + 1 tokens each, plus the prefill token and a margin."""
    return settings.spec_tokens or 2 + (settings.warmup + settings.steps + 1) * (cap + 1) + settings.depth


def bench_spec(model, prompts, sequences, drafter, settings: BenchSettings) -> dict:
    """Greedy speculative decoding of `prompts` through luce.engine.Engine with `drafter`,
    until `steps` steady steps are timed or every request is done. A step is steady when
    every request is decoding with more tokens to go than the deepest draft (so no lane's
    tree is cut by its end); the first `warmup` steady steps are not timed."""
    from luce.engine import Engine, EngineConfig
    from luce.engine.request import DECODE
    from luce.engine.sampler import SamplingParams
    from luce.spec.config import SpecConfig

    C, G = len(prompts), len(sequences[0]) - len(prompts[0])
    spec = SpecConfig(spec=settings.spec_mode, draft_kind="ngram", chain_depth=settings.depth,
                      ddtree_budget=settings.budget, spec_top_k=settings.top_k)
    nodes = 1 + max(settings.budget, settings.depth)
    ctx = max(len(p) for p in prompts) + G + nodes + 1
    engine = Engine(model, None, EngineConfig(max_slots=C, ctx=ctx, spec=spec, cuda_graphs=settings.graphs,
                                              token_budget=max(sum(len(p) for p in prompts) + C, C * nodes) + 64),
                    drafter=drafter)
    rids = [engine.add_request(p, SamplingParams(max_tokens=G, ignore_eos=True, seed=0)) for p in prompts]
    requests = [engine.get(r) for r in rids]
    max_depth = engine.spec.speculator.max_depth
    times, tokens, steady_steps = [], 0, 0
    while engine.has_unfinished() and len(times) < settings.steps:
        steady = all(r.phase == DECODE and r.params.max_tokens - len(r.output_ids) > max_depth for r in requests)
        before = sum(len(r.output_ids) for r in requests)
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        if steady:
            steady_steps += 1
            if steady_steps > settings.warmup:
                times.append(dt)
                tokens += sum(len(r.output_ids) for r in requests) - before
        if engine.stats.steps > 10 * (G + 2):
            raise RuntimeError("speculative run did not finish: a step commits at least one token per lane")
    stats = engine.spec.stats
    matches = all(r.output_ids == list(s[len(p):len(p) + len(r.output_ids)])
                  for r, s, p in zip(requests, sequences, prompts))
    return {
        "drafter": drafter.kind, "mode": settings.spec_mode, "concurrency": C, "max_depth": max_depth,
        "steps": len(times), "warmup": settings.warmup, "step_ms": _median_ms(times),
        "tok_s": tokens / sum(times) if times else float("nan"),
        "tokens_per_step": tokens / len(times) if times else float("nan"),
        "acceptance_length": stats.acceptance_length, "acceptance_rate": stats.acceptance_rate,
        "verifies": stats.verifies, "rows_per_verify": stats.verify_rows / max(stats.verifies, 1),
        "matches_ar": matches, "misses": drafter.misses, "proposal_depths": list(drafter.depths),
        "emitted": stats.emitted, "accepted": stats.accepted, "graphs": engine.graph_counters(),
    }


def run_decode_bench(model_path: str, backend="numpy", draft_path: str | None = None,
                     settings: BenchSettings = BenchSettings(), sections=("ar", "engine", "verify", "draft", "spec", "prefill"),
                     log=None) -> dict:
    """Load the model (and draft) and run the sections; returns the report dict.
    log(message, report) is called after loading and after each section (progress, and a
    chance to save the partial report)."""
    import os

    from luce.models.loader import load_model
    from luce.spec.drafters.bench_drafters import AlwaysWrongDrafter, OracleDrafter

    log = log or (lambda msg, report: None)
    be = open_backend(backend) if isinstance(backend, str) else backend
    t0 = time.perf_counter()
    model = load_model(model_path, be)
    cfg = model.config
    report = {"model": str(model_path), "arch": cfg.arch, "n_layer": cfg.n_layer, "vocab": cfg.vocab,
              "file_bytes": os.path.getsize(model_path), "backend": be.name, "sync": sync_method(be),
              "load_s": time.perf_counter() - t0, "draft": draft_path, "settings": asdict(settings)}
    n_prompts = max(settings.concurrency + settings.spec_concurrency)
    prompts = random_prompts(n_prompts, settings.prompt_len, cfg.vocab, settings.seed)
    log(f"loaded {cfg.arch} ({cfg.n_layer} layers) on {be.name} in {report['load_s']:.1f} s", report)
    if "ar" in sections or "verify" in sections:
        report["ar"] = bench_ar(model, prompts, settings)
        log("AR done", report)
    if "engine" in sections:
        from luce.benchmark.engine_bench import bench_engine_ar

        report["engine_ar"] = bench_engine_ar(model, prompts, settings)
        log("engine AR done", report)
    if "prefill" in sections:
        from luce.benchmark.prefill_bench import bench_prefill

        report["prefill"] = bench_prefill(model, settings.prefill_lengths, settings.prefill_budget,
                                          settings.prefill_reps, graphs=settings.graphs, seed=settings.seed)
        log("prefill done", report)
    if "verify" in sections:
        ar1 = next((r["step_ms"] for r in report["ar"] if r["concurrency"] == 1 and "error" not in r), None)
        if ar1 is None:
            try:
                ar1 = _summary(run_ar(model, prompts[:1], settings.warmup + settings.steps, settings.warmup,
                                      settings.graphs)[1])["step_ms"]
            except Exception:  # noqa: BLE001 - AR already reported its failure; ratios become NaN
                ar1 = float("nan")
        report["verify_ar_step_ms"] = ar1       # the C=1 AR step the verify ratios divide by
        from luce.benchmark.verify_bench import bench_verify

        report["verify"] = bench_verify(model, prompts[0], settings, ar1)
        log("verify done", report)
    draft = load_draft(draft_path, model) if draft_path and ("draft" in sections or "spec" in sections) else None
    n_spec = spec_tokens(settings, spec_depth_cap(settings, draft))
    ctx = settings.prompt_len + n_spec + 2 * (settings.budget + settings.depth) + 2
    new_inner = (lambda slots: make_drafter(draft, model, slots, ctx, settings.depth)) if draft else None
    if draft is not None and "draft" in sections:
        try:
            report["draft_pass"] = bench_draft(new_inner(max(settings.concurrency)), prompts, settings,
                                               getattr(draft, "feature_width", 0))
        except Exception as e:  # noqa: BLE001 - report the failure, keep benchmarking
            report["draft_pass"] = [{"concurrency": 0, "error": _error(e)}]
        gc.collect()
        log("draft done", report)
    if "spec" in sections:
        report["spec"] = []
        for C in settings.spec_concurrency:
            spec_prompts = prompts[:C]
            seqs = run_ar(model, spec_prompts, n_spec - 1, graphs=settings.graphs)[0]
            sequences = [list(p) + s for p, s in zip(spec_prompts, seqs)]
            for cls in (OracleDrafter, AlwaysWrongDrafter):
                drafter = cls(sequences, cfg.vocab, inner=new_inner(C) if new_inner else None)
                try:
                    report["spec"].append(bench_spec(model, spec_prompts, sequences, drafter, settings))
                except Exception as e:  # noqa: BLE001 - report the failure, keep benchmarking
                    report["spec"].append({"drafter": drafter.kind, "concurrency": C, "error": _error(e)})
                del drafter
                gc.collect()
        log("spec done", report)
    report["memory"] = peak_memory(be)
    return report
