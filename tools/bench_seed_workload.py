#!/usr/bin/env python3
"""The seed workload of issue 15 (luce/benchmark/seed_workload.py): A/B/A of speculation
paused vs kept during prefill, then SpecLA vs per-node-state ddtree on the same workload.

    python tools/bench_seed_workload.py TARGET.gguf --draft DFLASH.gguf --backend cuda --json out.json
    python tools/bench_seed_workload.py T.gguf --draft D.gguf --backend cpu --established-tokens 40 \\
        --arriving 70,150 --arrive-after 0.2          # a small smoke run
    python tools/bench_seed_workload.py T.gguf --draft D.gguf --backend cuda --sections modes \
        --established-tokens 256 --arrive-after 0.5   # SpecLA vs ddtree, bounded
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.benchmark.seed_workload import SeedConfig, compare_modes, prepare, run_seed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    d = SeedConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--draft", type=Path, help="DFlash draft (or draft model) the oracle wraps: its cost is paid")
    p.add_argument("--backend", default="auto")
    p.add_argument("--established-tokens", type=int, default=d.established_tokens)
    p.add_argument("--arriving", default=",".join(map(str, d.arriving_lens)), help="prompt lengths, e.g. 1500,4500")
    p.add_argument("--arrive-after", type=float, default=d.arrive_after_s, help="seconds after the first step")
    p.add_argument("--acceptance-length", type=int, default=d.acceptance_length)
    p.add_argument("--arriving-tokens", type=int, default=d.arriving_tokens, help="tokens each arriving prompt generates")
    p.add_argument("--sections", default="aba,modes", help="subset of aba,modes")
    p.add_argument("--modes", default="specla,ddtree", help="spec modes the modes section compares")
    p.add_argument("--json", metavar="PATH", help="write the report (also after each section)")
    args = p.parse_args(argv)
    from luce.models.loader import load_model
    from luce.ops import get_backend

    cfg = dataclasses.replace(d, established_tokens=args.established_tokens, arrive_after_s=args.arrive_after,
                              arriving_lens=tuple(int(x) for x in args.arriving.split(",")),
                              arriving_tokens=args.arriving_tokens, acceptance_length=args.acceptance_length)
    backend = get_backend(args.backend)
    model = load_model(args.model, backend)
    draft = None
    if args.draft is not None:
        from luce.gguf.reader import read_config

        extra = {"target_model": model} if read_config(args.draft).arch == "dflash" else {}
        draft = load_model(args.draft, backend, **extra)
    report: dict = {"model": str(args.model), "draft": str(args.draft) if args.draft else None, "backend": backend.name}

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))

    requests, outputs = prepare(model, cfg)
    sections = set(args.sections.split(","))
    if "aba" in sections:
        report["aba"] = run_seed(model, draft, cfg, requests, outputs)
        save()
    if "modes" in sections:
        report["modes"] = compare_modes(model, draft, cfg, requests, outputs, modes=tuple(args.modes.split(",")))
        save()
    print(json.dumps({k: v["summary"] for k, v in report.items() if isinstance(v, dict) and "summary" in v},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
