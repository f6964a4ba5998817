#!/usr/bin/env python3
"""Decode benchmark of a model file: AR tok/s at concurrency 1..5, verify cost against tree
width, draft-pass time, speculation bounds (oracle and always-wrong drafters), and prefill
(time to the first token and prompt tok/s at 512 .. 32,000 tokens).

    python tools/bench_decode.py MODEL.gguf --backend cuda --draft DRAFT.gguf
    python tools/bench_decode.py MODEL.gguf --backend numpy --prompt-len 16 --steps 4 --json out.json

See luce/benchmark/decode_bench.py for what each figure measures.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.benchmark.decode_bench import BenchSettings, run_decode_bench  # noqa: E402
from luce.benchmark.decode_report import format_report  # noqa: E402
from luce.spec.config import MODES  # noqa: E402

SECTIONS = ("ar", "engine", "verify", "draft", "spec", "prefill")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    d = BenchSettings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--backend", default="auto", choices=("numpy", "cuda", "auto"))
    p.add_argument("--draft", type=Path, help="DFlash draft or draft model .gguf")
    p.add_argument("--prompt-len", type=int, default=d.prompt_len)
    p.add_argument("--concurrency", type=_ints, default=d.concurrency, help="e.g. 1,2,3,4,5")
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps per figure (medians)")
    p.add_argument("--widths", type=_ints, default=d.tree_widths, help="verify tree widths, e.g. 1,8,16,23,32,64")
    p.add_argument("--depth", type=int, default=d.depth, help="deepest drafted token")
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--spec-mode", default=d.spec_mode, choices=[m for m in MODES if m != "off"])
    p.add_argument("--budget", type=int, default=d.budget, help="DDTree drafted nodes")
    p.add_argument("--spec-tokens", type=int, default=d.spec_tokens,
                   help="tokens per request in spec runs (default: enough for --steps oracle steps)")
    p.add_argument("--spec-concurrency", type=_ints, default=d.spec_concurrency,
                   help="requests decoded together in the spec runs, e.g. 1,5")
    p.add_argument("--prefill-lengths", type=_ints, default=d.prefill_lengths,
                   help="prompt tokens of the prefill section, e.g. 512,4096,12000,32000")
    p.add_argument("--prefill-budget", type=int, default=d.prefill_budget, help="token budget of a prefill step (default: the engine's for the backend)")
    p.add_argument("--prefill-reps", type=int, default=d.prefill_reps, help="timed prompts per length")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-graphs", action="store_true", help="run every forward eagerly (no graph replay)")
    p.add_argument("--engine-sampled", action="store_true",
                   help="engine section: seeded sampling at llama-server's defaults instead of greedy")
    p.add_argument("--no-ahead", action="store_true",
                   help="AR section: every step waits for its own ids (not launched ahead, fed on the device)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {','.join(SECTIONS)}")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-' = stdout only)")
    args = p.parse_args(argv)
    sections = tuple(s for s in args.sections.split(",") if s)
    if set(sections) - set(SECTIONS):
        p.error(f"--sections takes {','.join(SECTIONS)}")
    if args.steps < 1 or args.warmup < 0 or args.prompt_len < 1 or args.spec_tokens < 0:
        p.error("need --steps >= 1, --warmup >= 0, --prompt-len >= 1, --spec-tokens >= 0")
    if (args.prefill_budget is not None and args.prefill_budget < 1) or args.prefill_reps < 1:
        p.error("need --prefill-budget >= 1 and --prefill-reps >= 1")
    settings = BenchSettings(prompt_len=args.prompt_len, concurrency=args.concurrency, warmup=args.warmup,
                             steps=args.steps, tree_widths=args.widths, depth=args.depth, top_k=args.top_k,
                             spec_mode=args.spec_mode, budget=args.budget, spec_tokens=args.spec_tokens,
                             spec_concurrency=args.spec_concurrency, seed=args.seed, graphs=not args.no_graphs,
                             ahead=not args.no_ahead, engine_sampled=args.engine_sampled,
                             prefill_lengths=args.prefill_lengths, prefill_budget=args.prefill_budget,
                             prefill_reps=args.prefill_reps)

    def log(message: str, partial: dict) -> None:
        print(message, file=sys.stderr, flush=True)
        if args.json and args.json != "-":      # keep what is measured if a later section fails or times out
            Path(args.json).write_text(json.dumps(partial, indent=1) + "\n")

    report = run_decode_bench(str(args.model), args.backend, str(args.draft) if args.draft else None,
                              settings, sections, log=log)
    if args.json == "-":
        print(json.dumps(report, indent=1))
        return 0
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
