"""The real engine behind the bridge: `luce.engine.Engine` as an EngineCore, and the loader.

    bridge = load_bridge(ServeOptions(model="model.gguf", max_slots=5, ctx=4096))
    bridge.start()          # the engine thread steps while there is work

`LuceEngineCore` maps the engine's requests one to one (the server's request id is the
engine's), forgets finished and cancelled requests at once (the bridge already has their
tokens), and reports the engine's gauges. Cancelling frees the slot and pages before the
next step (the bridge calls it between steps).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from luce.ops import BACKENDS
from luce.spec.config import DRAFT_KINDS as KINDS
from luce.spec.config import DRAFT_VOCAB, MODES
from luce.server.bridge import EngineBridge, EngineStats, ModelInfo, StepOutput
from luce.server.kv_budget import (DEFAULT_CACHE_MEMORY, DEFAULT_KV_MEMORY, free_memory_bytes, parse_cache_memory,
                                   parse_kv_memory, plan_context)

log = logging.getLogger("luce.server")

SPEC_MODES, DRAFT_KINDS = MODES, KINDS   # the one list of each: luce.spec.config


class LuceEngineCore:
    """EngineCore over a luce.engine.Engine (engine thread only)."""

    def __init__(self, engine):
        self.engine = engine

    def add_request(self, request_id: str, prompt_ids: Sequence[int], params) -> None:
        self.engine.add_request(list(prompt_ids), params, request_id=request_id)

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)                 # frees its slot and pages now
        self.engine.requests.pop(request_id, None)     # and forget it

    def has_work(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> list[StepOutput]:
        outputs = []
        for update in self.engine.step():
            request = self.engine.requests.get(update.request_id)
            cached = request.metrics.get("cached_tokens") if request is not None else None
            if update.finish_reason is not None:
                self.engine.requests.pop(update.request_id, None)
            stop = update.stop_reason if isinstance(update.stop_reason, str) else None
            outputs.append(StepOutput(update.request_id, tuple(update.token_ids), update.finish_reason,
                                      update.error, update.text, stop, tuple(update.logprobs), cached))
        return outputs

    def stats(self) -> EngineStats:
        g = self.engine.gauges()
        spec = self.engine.spec.stats if self.engine.spec is not None else None
        return EngineStats(slots_total=g["slots_total"], slots_busy=g["slots_busy"], queue_depth=g["queue_depth"],
                           kv_pages_total=g["kv_pages_total"], kv_pages_used=g["kv_pages_used"],
                           steps=self.engine.stats.steps, graphs=self.engine.graph_counters(),
                           prefix_cache=self.engine.prefix_cache_counters(),
                           slots=tuple(None if e is None else (e.request_id, e.kv_len)
                                       for e in self.engine.slots.table),
                           acceptance_length=spec.acceptance_length if spec and spec.verifies else None)


@dataclass
class ServeOptions:
    model: str | None = None          # GGUF path or cached model name; None: the default pair
    draft: str | None = None
    spec: str | None = None           # None: chain when a draft or drafter kind is given, else off
    draft_kind: str | None = None     # dflash | model | ngram (None: from the draft file)
    ddtree_budget: int = 22
    ddtree_tau: float = 6.0
    spec_top_k: int = 4
    draft_max: int = 8                # tokens a model or n-gram draft proposes per verify
    draft_min: int = 0                # adaptive depth down to this (0: plain decoding when it is faster)
    draft_vocab: int = DRAFT_VOCAB    # a draft model proposes ids below this (0: all)
    backend: str = "auto"
    threads: int | None = None        # cpu backend threads (None: the cores this process may use)
    max_slots: int = 5
    ctx: int | None = None            # None: the model's context, bounded by the KV budget
    kv_memory: str = DEFAULT_KV_MEMORY  # KV pool cap: a fraction of free memory or a size (luce.server.kv_budget)
    max_queue: int = 64
    token_budget: int | None = None   # None: the engine's default for the backend (default_token_budget)
    alias: str | None = None          # model id reported to clients
    seed: int = 0
    enforce_eager: bool = False       # no CUDA graph replay (debugging; vLLM's --enforce-eager)
    prefix_cache: bool = True         # share prompt KV and recurrent snapshots across requests
    cache_memory: str = DEFAULT_CACHE_MEMORY  # the prefix cache's byte budget (luce.server.kv_budget)

    def check(self) -> None:
        if self.spec is not None and self.spec not in SPEC_MODES:
            raise ValueError(f"--spec {self.spec!r}: choose one of {', '.join(SPEC_MODES)}")
        if self.draft_kind is not None and self.draft_kind not in DRAFT_KINDS:
            raise ValueError(f"--draft-kind {self.draft_kind!r}: choose one of {', '.join(DRAFT_KINDS)}")
        if self.draft_kind in ("dflash", "model") and self.draft is None and self.model is not None:
            raise ValueError(f"--draft-kind {self.draft_kind} needs a draft model: pass --draft PATH "
                             "(or use --draft-kind ngram, which needs none)")
        for name in ("ddtree_budget", "spec_top_k", "draft_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.draft_min < 0:
            raise ValueError(f"--draft-min must be >= 0, got {self.draft_min}")
        if self.draft_vocab < 0:
            raise ValueError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {self.draft_vocab}")
        if self.ddtree_tau < 0:
            raise ValueError(f"--ddtree-tau must be >= 0, got {self.ddtree_tau}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.max_slots < 1:
            raise ValueError(f"--max-slots must be >= 1, got {self.max_slots}")
        if self.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {self.max_queue}")
        if self.ctx is not None and self.ctx < 2:
            raise ValueError(f"--ctx must be >= 2, got {self.ctx}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"--token-budget must be >= 1, got {self.token_budget}")
        parse_kv_memory(self.kv_memory)
        parse_cache_memory(self.cache_memory)


def add_spec_arguments(p) -> None:
    """The speculation flags of luce-serve and luce-run (names as Luce DFlash and llama-server;
    defaults: ServeOptions')."""
    d = ServeOptions
    p.add_argument("--draft", help="draft model GGUF (a DFlash draft or a small model with the same tokenizer)")
    p.add_argument("--spec", choices=SPEC_MODES, default=None,
                   help="speculation mode (default: chain when a draft is given, else off)")
    p.add_argument("--draft-kind", choices=DRAFT_KINDS, default=None,
                   help="drafter (default: from the draft file; ngram needs no draft)")
    p.add_argument("--ddtree-budget", type=int, default=d.ddtree_budget,
                   help=f"DDTree drafted nodes per verify (default {d.ddtree_budget})")
    p.add_argument("--ddtree-tau", type=float, default=d.ddtree_tau,
                   help=f"DDTree prunes nodes this far (log-prob) below the best path (default {d.ddtree_tau:g})")
    p.add_argument("--spec-top-k", type=int, default=d.spec_top_k,
                   help=f"DDTree siblings per node (default {d.spec_top_k})")
    p.add_argument("--draft-max", type=int, default=d.draft_max,
                   help=f"tokens a model or n-gram draft proposes per verify (default {d.draft_max}; "
                        "DFlash: its block)")
    p.add_argument("--draft-min", type=int, default=d.draft_min,
                   help="each step drafts the depth in [draft-min, draft-max] that measurably gives the most "
                        "tokens per second, or none (plain decoding) where that is faster: a draft shorter "
                        f"than draft-min is never made, as llama-server's (default {d.draft_min})")
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab,
                   help=f"a draft model proposes only token ids below this: a smaller read per draft token, "
                        f"never a different output (default {d.draft_vocab}; 0: the whole vocabulary)")


def add_cache_arguments(p) -> None:
    """The prefix cache flags of luce-serve and luce-run."""
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt in full (default: reuse cached prompt prefixes across requests)")
    p.add_argument("--cache-memory", default=DEFAULT_CACHE_MEMORY,
                   help=f"bytes the prefix cache may hold, KV pages and recurrent snapshots (default "
                        f"{DEFAULT_CACHE_MEMORY}; least recently used evicted first)")


def cache_options(args) -> dict:
    """ServeOptions fields from parsed add_cache_arguments flags."""
    return dict(prefix_cache=not args.no_prefix_cache, cache_memory=args.cache_memory)


def spec_options(args) -> dict:
    """ServeOptions fields from parsed add_spec_arguments flags."""
    return dict(draft=args.draft, spec=args.spec, draft_kind=args.draft_kind, ddtree_budget=args.ddtree_budget,
                ddtree_tau=args.ddtree_tau, spec_top_k=args.spec_top_k, draft_max=args.draft_max,
                draft_min=args.draft_min, draft_vocab=args.draft_vocab)


def check_backend_available(name: str) -> None:
    """ValueError with one line when backend `name` cannot start here (before any model is
    fetched or loaded); 'auto' always can."""
    from luce.ops import backend_error

    error = backend_error(name)
    if error is not None:
        raise ValueError(f"--backend {name}: {error}")


def backend_line(name: str, threads: int | None = None):
    """(backend instance, the start-up line naming it and why: 'backend cuda: NVIDIA H200
    (sm_90), library built for sm_90'). 'auto' takes cuda, then hip, then cpu, then numpy
    (luce.ops.auto_backend_choice)."""
    from luce.ops import auto_backend_choice, cuda_backend_why, get_backend

    why = "as asked"
    if name == "auto":
        name, why = auto_backend_choice()
    try:
        backend = get_backend(name, threads=threads)
    except Exception as e:
        raise ValueError(f"--backend {name}: {e}") from None
    if name == "cuda" and why == "as asked":
        why = f"as asked; {cuda_backend_why()}"
    describe = getattr(backend, "describe", None)
    return backend, f"backend {describe() if describe else backend.name}: {why}"


def resolve_models(options: ServeOptions, progress: bool = True) -> tuple[Path, Path | None]:
    """(target path, draft path or None); with no model, fetch the default pair (with progress)."""
    from luce.llm import resolve_model_path

    if options.model is None:
        from luce.fetch import fetch_default_models

        target, draft = fetch_default_models(progress=progress)
        return target, Path(options.draft) if options.draft else draft
    target = resolve_model_path(options.model)
    draft = resolve_model_path(options.draft) if options.draft else None
    return target, draft


def serve_spec_config(options: ServeOptions, draft: str | Path | None):
    """The SpecConfig luce-serve runs for `options` and the resolved draft path (None: no
    draft). The one construction: load_engine, and the benchmarks that measure the server's
    default (luce.benchmark.seed_workload: the 'default' arm)."""
    from luce.spec.config import resolve_spec_config

    return resolve_spec_config(options.spec, draft, options.draft_kind, ddtree_budget=options.ddtree_budget,
                               ddtree_tau=options.ddtree_tau, spec_top_k=options.spec_top_k,
                               chain_depth=options.draft_max, draft_min=min(options.draft_min, options.draft_max),
                               draft_vocab=options.draft_vocab)


def load_engine(options: ServeOptions, *, progress: bool = True, say=print):
    """Load the model and tokenizer and build the engine: returns (engine, tokenizer, ModelInfo)."""
    from luce.engine import Engine, EngineConfig
    from luce.models.loader import load_model
    from luce.tokenizer import Tokenizer

    options.check()
    check_backend_available(options.backend)  # before fetching models it could not run
    target, draft = resolve_models(options, progress)
    backend, chosen = backend_line(options.backend, options.threads)
    backend_name = backend.name
    say(f"luce: {chosen}")
    say(f"luce: loading {target} on {backend_name} ...")
    t0 = time.monotonic()
    model = load_model(target, backend)
    tokenizer = Tokenizer.from_gguf(target)
    plan = plan_context(model.config, ctx=options.ctx, max_slots=options.max_slots, kv_memory=options.kv_memory,
                        free_bytes=free_memory_bytes(backend_name))
    ctx = plan.ctx
    budget = None if options.token_budget is None else max(options.token_budget, options.max_slots + 64)
    spec = serve_spec_config(options, draft)
    if spec.enabled:
        say(f"luce: speculation {spec.spec} with the {spec.draft_kind} drafter"
            + (f" ({draft})" if spec.draft else "") + " ...")
    engine = Engine(model, tokenizer, EngineConfig(max_slots=options.max_slots, ctx=ctx, token_budget=budget,
                                                   kv_pages=plan.kv_pages,
                                                   max_queue=options.max_slots + options.max_queue + 1,
                                                   seed=options.seed, spec=spec,
                                                   cuda_graphs=not options.enforce_eager,
                                                   prefix_cache=options.prefix_cache,
                                                   cache_memory=parse_cache_memory(options.cache_memory)))
    if engine.cache_off_reason and options.prefix_cache:
        say(f"luce: note: prefix cache {engine.cache_off_reason}")
    say(f"luce: loaded {model.config.arch} ({model.config.n_layer} layers, vocab {tokenizer.vocab_size}) "
        f"in {time.monotonic() - t0:.1f} s; ctx {ctx} (model {plan.model_ctx}), KV {plan.kv_tokens} tokens "
        f"({plan.kv_bytes / 2**20:.0f} MiB, --kv-memory {options.kv_memory}), {options.max_slots} slots")
    notes = spec.notes_for(model.config)
    for note in notes:
        say(f"luce: note: {note}")
    info = ModelInfo(model_id=options.alias or target.name, path=str(target), n_ctx=ctx, backend=backend_name,
                     max_slots=options.max_slots, arch=model.config.arch,
                     draft_path=spec.draft if spec.enabled else None, spec_mode=spec.spec,
                     draft_kind=spec.draft_kind if spec.enabled else None, spec_active=spec.enabled,
                     spec_note="; ".join(notes),
                     extra={"kv_tokens": plan.kv_tokens, "kv_memory": options.kv_memory, "model_n_ctx": plan.model_ctx})
    return engine, tokenizer, info


def load_bridge(options: ServeOptions, *, progress: bool = True, say=print) -> EngineBridge:
    """load_engine, wrapped in an EngineBridge (not started)."""
    engine, tokenizer, info = load_engine(options, progress=progress, say=say)
    return EngineBridge(LuceEngineCore(engine), tokenizer, info,
                        max_pending=options.max_slots + options.max_queue)
