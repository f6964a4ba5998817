"""Verify benchmark (a section of luce/benchmark/decode_bench.py; tools/profile_step.py's verify):
one slot, one draft tree of W rows (W = 1 is the root alone) packed by the one packer
(luce.models.packer, tree rows as luce.models.batch defines them); a DDTree (luce.spec.tree.ddtree)
over a synthetic top-k proposal of depth <= `depth` (`build` times the tree and the batch packing,
not the proposal). Each repetition verifies the same tree at the same position and commits nothing,
so nothing advances. Reported as ms and as a multiple of the median C=1 AR step.
"""
from __future__ import annotations

import time

import numpy as np

from luce.benchmark.decode_bench import BenchSettings, _error, _summary, _sync
from luce.models.kv_cache import pages_needed
from luce.models.packer import SegmentSpec, build_batch


def synthetic_proposal(depth: int, top_k: int, vocab: int, seed: int):
    """A DraftProposal of `depth` depths with min(top_k, vocab) distinct tokens each, log-probs
    falling with rank (what a drafter's top-k looks like to the tree builder)."""
    from luce.spec.proposal import DraftProposal

    k = min(top_k, vocab)
    base = np.random.default_rng(seed).integers(0, vocab, (max(depth, 1), 1))
    ids = (base + np.arange(k)) % vocab
    lps = -np.tile(np.arange(k, dtype=np.float32), (len(ids), 1)) - 0.01
    return DraftProposal(ids, lps)


def verify_prefix(model, prompt, widest: int):
    """One slot holding `prompt`, with room for `widest` tree rows after it: (state, pages, the
    root token: the prompt's greedy next token)."""
    per_slot = pages_needed(len(prompt) + widest)
    state = model.new_state(max_pages=per_slot, max_slots=1)
    pages = list(range(per_slot))
    out = model.forward(build_batch([SegmentSpec(0, list(prompt), 0, pages)]), state)
    return state, pages, int(model.backend.argmax(out.logits)[0])


def tree_batch(root: int, proposal, width: int, top_k: int, start: int, pages):
    """The DDTree of `width` rows (`root` and width - 1 drafted nodes of `proposal`) packed as one
    segment at `start`: (tree, batch)."""
    from luce.spec.tree import ddtree

    tree = ddtree(root, proposal, budget=width - 1, top_k=top_k, tau=None)
    batch = build_batch([SegmentSpec(0, tree.tokens.tolist(), start, pages, parents=tree.parents.tolist())],
                        pad_pages=True)
    return tree, batch


def bench_verify(model, prompt, settings: BenchSettings, ar_step_ms: float) -> list[dict]:
    from luce.models.graphed_forward import GraphedForward
    from luce.spec.config import GDN_TREE_MODE

    backend = model.backend
    if hasattr(model, "gdn_tree_mode"):
        model.gdn_tree_mode = GDN_TREE_MODE.get(settings.spec_mode, "factor")
    state, pages, root = verify_prefix(model, prompt, max(settings.tree_widths))
    rows = []
    for width in settings.tree_widths:
        depth = min(settings.depth, width - 1)
        proposal = synthetic_proposal(depth, settings.top_k, model.config.vocab, settings.seed + width)
        records, tree = [], None
        forward = GraphedForward(model, enabled=settings.graphs)
        try:
            for rep in range(settings.warmup + settings.steps):
                t0 = time.perf_counter()
                tree, batch = tree_batch(root, proposal, width, settings.top_k, len(prompt), pages)
                t1 = time.perf_counter()
                out = forward(batch, state)
                t2 = time.perf_counter()
                _sync(backend, out.logits)
                t3 = time.perf_counter()
                if rep >= settings.warmup:
                    records.append({"build": t1 - t0, "launch": t2 - t1, "wait": t3 - t2})
        except Exception as e:  # noqa: BLE001 - report the failure, keep benchmarking
            rows.append({"width": width, "error": _error(e)})
            continue
        row = {"width": width, "tree_depth": tree.max_depth, **_summary(records), "graphs": dict(forward.counters)}
        forward.invalidate()
        row["x_ar_step"] = row["step_ms"] / ar_step_ms if ar_step_ms else float("nan")
        rows.append(row)
    return rows
