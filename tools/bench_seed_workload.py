#!/usr/bin/env python3
"""The seed workload of issue 15 (luce/benchmark/seed_workload.py): A/B/A of speculation
paused vs kept during prefill, then SpecLA vs per-node-state ddtree on the same workload; and
the seed's C1-C5 waves (luce/benchmark/seed_waves.py, section `waves`): AR and speculation
with the oracle drafter, goodput per concurrency, output digests; `--compare A B A2` gives the
A/B/A of three such reports (previous commit, this one, previous again).

    python tools/bench_seed_workload.py TARGET.gguf --draft DFLASH.gguf --backend cuda --json out.json
    python tools/bench_seed_workload.py T.gguf --draft D.gguf --backend cpu --established-tokens 40 \\
        --arriving 70,150 --arrive-after 0.2          # a small smoke run
    python tools/bench_seed_workload.py T.gguf --draft D.gguf --backend cuda --sections modes \
        --established-tokens 256 --arrive-after 0.5   # SpecLA vs ddtree, bounded
    python tools/bench_seed_workload.py T.gguf --draft D.gguf --backend cuda --sections waves --json b.json
    python tools/bench_seed_workload.py --compare a.json b.json a2.json
    python tools/bench_seed_workload.py T.gguf --draft D.gguf --backend cuda --sections gate \
        --wave-prompt-len 128 --wave-tokens 128 --json gate.json   # issue 17's gate (seed_waves.run_gate)

Section `gate`: speculation pays or steps aside. For each --gate-al acceptance length, waves of
--arms (default ar, default, chain@8: plain decoding, luce-serve's own speculation config for
the draft with its depth chosen per step, and the fixed depth 8) at --concurrency (default
1,5): goodput, exactness, the depths the default config chose, PASS when it is >= plain
decoding everywhere.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.benchmark.seed_waves import (GATE_ARMS, WaveConfig, compare_waves, prepare_waves, run_gate,  # noqa: E402
                                      run_waves)
from luce.benchmark.seed_workload import SeedConfig, compare_modes, prepare, run_seed  # noqa: E402

SECTIONS = ("aba", "modes", "waves", "gate")
GATE_CONCURRENCY = (1, 5)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    d, w = SeedConfig(), WaveConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, nargs="?")
    p.add_argument("--draft", type=Path, help="DFlash draft (or draft model) the oracle wraps: its cost is paid")
    p.add_argument("--backend", default="auto")
    p.add_argument("--established-tokens", type=int, default=d.established_tokens)
    p.add_argument("--arriving", default=",".join(map(str, d.arriving_lens)), help="prompt lengths, e.g. 1500,4500")
    p.add_argument("--arrive-after", type=float, default=d.arrive_after_s, help="seconds after the first step")
    p.add_argument("--acceptance-length", type=int, default=d.acceptance_length)
    p.add_argument("--arriving-tokens", type=int, default=d.arriving_tokens, help="tokens each arriving prompt generates")
    p.add_argument("--sections", default="aba,modes", help=f"subset of {','.join(SECTIONS)}")
    p.add_argument("--modes", default="specla,ddtree", help="spec modes the modes section compares")
    p.add_argument("--concurrency", type=_ints, default=None,
                   help=f"waves, gate: concurrencies (default {','.join(map(str, w.concurrency))} and "
                        f"{','.join(map(str, GATE_CONCURRENCY))})")
    p.add_argument("--arms", default=None,
                   help="waves, gate: ar, ar2 (a second plain engine, the A/A control), default (luce-serve's "
                        "config), MODE or MODE@DEPTH, comma-separated "
                        f"(default ar,{w.spec} and {','.join(GATE_ARMS)})")
    p.add_argument("--gate-al", type=_ints, default=(6, 3), help="gate: oracle acceptance lengths (default 6,3)")
    p.add_argument("--waves", type=int, default=w.waves, help="waves: timed waves per concurrency")
    p.add_argument("--wave-prompt-len", type=int, default=w.prompt_len, help="waves: prompt tokens")
    p.add_argument("--wave-tokens", type=int, default=w.max_tokens, help="waves: output tokens per request")
    p.add_argument("--json", metavar="PATH", help="write the report (also after each section)")
    p.add_argument("--compare", nargs=3, type=Path, metavar=("A", "B", "A2"),
                   help="A/B/A of three reports of the waves section (no model is run)")
    args = p.parse_args(argv)
    if args.compare:
        reports = [json.loads(path.read_text()).get("waves", {}) for path in args.compare]
        print(json.dumps(compare_waves(reports), indent=1))
        return 0
    sections = set(args.sections.split(","))
    if args.model is None or sections - set(SECTIONS):
        p.error(f"give a model file and --sections from {','.join(SECTIONS)} (or --compare A B A2)")
    if args.waves < 1 or args.wave_prompt_len < 1 or args.wave_tokens < 1:
        p.error("need --waves, --wave-prompt-len and --wave-tokens >= 1")
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

    if sections & {"aba", "modes"}:
        requests, outputs = prepare(model, cfg)
    if "aba" in sections:
        report["aba"] = run_seed(model, draft, cfg, requests, outputs)
        save()
    if "modes" in sections:
        report["modes"] = compare_modes(model, draft, cfg, requests, outputs, modes=tuple(args.modes.split(",")))
        save()
    arms = tuple(args.arms.split(",")) if args.arms else None
    for section in ("waves", "gate"):
        if section not in sections:
            continue
        default_c = w.concurrency if section == "waves" else GATE_CONCURRENCY
        wcfg = dataclasses.replace(w, concurrency=args.concurrency or default_c, waves=args.waves,
                                   prompt_len=args.wave_prompt_len, max_tokens=args.wave_tokens,
                                   acceptance_length=args.acceptance_length)
        prompts, truth = prepare_waves(model, wcfg)
        if section == "waves":
            report["waves"] = run_waves(model, draft, wcfg, prompts, truth, arms=arms or ("ar", w.spec))
        else:
            report["gate"] = run_gate(model, draft, wcfg, prompts, truth, args.gate_al, arms=arms or GATE_ARMS)
        save()
    print(json.dumps({k: v["summary"] for k, v in report.items() if isinstance(v, dict) and "summary" in v},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
