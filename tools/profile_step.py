#!/usr/bin/env python3
"""Where a GPU step's time goes: a CUPTI timeline (torch.profiler, a test-only oracle on the
device) of replayed decode steps or draft passes, kernel by kernel.

    python3 tools/profile_step.py MODEL.gguf ar --concurrency 1 --steps 20
    python3 tools/profile_step.py TARGET.gguf draft --draft DRAFT.gguf --concurrency 5
    python3 tools/profile_step.py MODEL.gguf prefill --prompt-len 12000 --steps 2
    python3 tools/profile_step.py MODEL.gguf verify --width 23 --prompt-len 1024

A verify step is one replayed verify of a DDTree of `--width` rows (bench_decode's verify section:
a synthetic proposal over a `--prompt-len` prompt). A prefill "step" is one whole prompt through the engine (chunks of its token budget) to its first
token, each time a fresh random prompt. Warm up with 2 or more: a graph key's first call runs
eagerly and its second captures, so a profile after one warm-up prompt times the captures.

Prints, per step: the span (first kernel start to last kernel end), the busy time (sum of
kernel durations), the gaps between kernels, the launches, then each kernel name's total
time, calls and mean (names shortened), biggest first. Kernels of a PDL launch may start
before the kernel ahead ends, so their durations overlap: busy can exceed the span.
Run on the GPU machine only (needs torch with CUDA); not part of `make test`.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402


def short_name(name: str) -> str:
    """'void mm::gemv_kernel<mm::GemvQ4K, 1, 4>(mm::GemvArgs)' -> 'gemv_kernel<GemvQ4K,1,4>'."""
    name = re.sub(r"\([^()]*\)$", "", name.replace("void ", ""))
    name = re.sub(r"\b[\w]+::", "", name).replace(" ", "")
    name = re.sub(r"\(anonymousnamespace\)", "", name)
    return name[:70]


def kernel_events(prof) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of every GPU kernel, memset and copy, in start order."""
    out = []
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is None or "CUDA" not in str(dev):
            continue
        start = e.time_range.start
        out.append((float(start), float(e.time_range.end - start), e.name))
    return sorted(out)


def summarize(events, steps: int, top: int) -> str:
    if not events:
        return "no GPU events recorded (is CUPTI available?)"
    span = events[-1][0] + events[-1][1] - events[0][0]
    busy = sum(d for _, d, _ in events)
    gaps, end = 0.0, events[0][0]
    for s, d, _ in events:
        gaps += max(0.0, s - end)
        end = max(end, s + d)
    per = defaultdict(lambda: [0.0, 0])
    for _, d, n in events:
        per[short_name(n)][0] += d
        per[short_name(n)][1] += 1
    lines = [f"per step: span {span / steps:,.1f} us, busy {busy / steps:,.1f} us, gaps {gaps / steps:,.1f} us, "
             f"launches {len(events) / steps:.1f}",
             f"{'kernel':70s} {'us/step':>9s} {'calls/step':>10s} {'us/call':>8s}"]
    for name, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{name:70s} {t / steps:9.1f} {c / steps:10.1f} {t / c:8.2f}")
    return "\n".join(lines)


def ar_runner(model, concurrency: int, prompt_len: int):
    """A closure that runs one replayed greedy AR step of `concurrency` slots."""
    from luce.benchmark.decode_bench import random_prompts
    from luce.models.graphed_forward import GraphedForward
    from luce.models.kv_cache import pages_needed
    from luce.models.packer import SegmentSpec, build_batch

    prompts = random_prompts(concurrency, prompt_len, model.config.vocab, 0)
    forward = GraphedForward(model, enabled=True)
    per_slot = pages_needed(prompt_len + 4096)
    state = model.new_state(max_pages=concurrency * per_slot, max_slots=concurrency)
    pages = [list(range(s * per_slot, (s + 1) * per_slot)) for s in range(concurrency)]
    out = forward(build_batch([SegmentSpec(s, list(p), 0, pages[s]) for s, p in enumerate(prompts)]), state)
    last = [int(t) for t in model.backend.argmax(out.logits)]
    pos = [prompt_len]

    def step():
        batch = build_batch([SegmentSpec(s, [last[s]], pos[0], pages[s]) for s in range(concurrency)], pad_pages=True)
        ids = model.backend.ids_to_host(forward(batch, state, greedy_ids=True).greedy_ids)
        last[:] = [int(t) for t in ids]
        pos[0] += 1
    return step


def draft_runner(model, draft_path: str, concurrency: int, prompt_len: int, depth: int):
    """A closure that runs one draft pass (propose) of `concurrency` lanes at a fixed root."""
    from luce.benchmark.decode_bench import load_draft, make_drafter, random_prompts
    from luce.spec.drafters.base import DraftLane

    draft = load_draft(draft_path, model)
    drafter = make_drafter(draft, model, concurrency, prompt_len + 256, depth)
    prompts = random_prompts(concurrency, prompt_len, model.config.vocab, 0)
    lanes = [DraftLane(s, list(prompts[s]) + [1], depth, 1) for s in range(concurrency)]
    width = getattr(draft, "feature_width", 0)
    if width:
        feats = np.random.default_rng(0).standard_normal((concurrency * prompt_len, width)).astype(np.float32)
        drafter.add_context([(s, 0, prompt_len) for s in range(concurrency)], drafter.backend.asarray(feats))
    drafter.propose(lanes)
    return lambda: drafter.propose(lanes)


def verify_runner(model, width: int, prompt_len: int, depth: int):
    """A closure that runs one replayed verify of a width-`width` tree over a `prompt_len` prompt
    (bench_decode's verify section: a synthetic proposal, 4 candidates a depth)."""
    from luce.benchmark.decode_bench import random_prompts
    from luce.benchmark.verify_bench import synthetic_proposal, tree_batch, verify_prefix
    from luce.models.graphed_forward import GraphedForward

    prompt = random_prompts(1, prompt_len, model.config.vocab, 0)[0]
    state, pages, root = verify_prefix(model, prompt, width)
    proposal = synthetic_proposal(min(depth, width - 1), 4, model.config.vocab, width)
    _, batch = tree_batch(root, proposal, width, 4, prompt_len, pages)
    forward = GraphedForward(model, enabled=True)

    def step():
        model.backend.argmax(forward(batch, state).logits)  # -> host ids: waits for the step
    return step


def prefill_runner(model, prompt_len: int):
    """A closure that prefills one fresh prompt of `prompt_len` random tokens to its first token."""
    from luce.benchmark.decode_bench import random_prompts
    from luce.benchmark.prefill_bench import time_to_first_token
    from luce.engine import Engine, EngineConfig

    engine = Engine(model, None, EngineConfig(max_slots=1, ctx=prompt_len + 1))
    seed = [0]

    def step():
        seed[0] += 1
        time_to_first_token(engine, random_prompts(1, prompt_len, model.config.vocab, seed[0])[0])
    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("what", choices=("ar", "draft", "verify", "prefill"))
    p.add_argument("--draft", type=Path)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--depth", type=int, default=15)
    p.add_argument("--width", type=int, default=23, help="verify: the tree's rows")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)

    import torch  # the device's torch: CUPTI through its profiler (test-only oracle, never at run time)
    from torch.profiler import ProfilerActivity, profile

    from luce.benchmark.decode_bench import open_backend
    from luce.models.loader import load_model

    torch.zeros(1, device="cuda")  # torch and luce share the device's primary context
    be = open_backend("cuda")
    model = load_model(str(args.model), be)
    if args.what == "ar":
        step = ar_runner(model, args.concurrency, args.prompt_len)
    elif args.what == "draft":
        step = draft_runner(model, str(args.draft), args.concurrency, args.prompt_len, args.depth)
    elif args.what == "verify":
        step = verify_runner(model, args.width, args.prompt_len, args.depth)
    else:
        step = prefill_runner(model, args.prompt_len)
    for _ in range(args.warmup):
        step()
    be.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        be.synchronize()
    shape = f"width {args.width}" if args.what == "verify" else f"C{args.concurrency}"
    print(f"{args.model.name} {args.what} {shape}, {args.steps} steps")
    print(summarize(kernel_events(prof), args.steps, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
