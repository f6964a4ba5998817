#!/usr/bin/env python3
"""Write a GGUF with random weights at a real model's shapes and quant mix (benchmarks only).

    python tools/make_synthetic_model.py qwen36-27b /tmp/q36-iq4_xs.gguf --mix iq4_xs --workers 16
    python tools/make_synthetic_model.py dflash-27b /tmp/dflash-27b.gguf --target /tmp/q36-iq4_xs.gguf
    python tools/make_synthetic_model.py qwen2.5-coder-1.5b /tmp/c15.gguf --tiny --layers 2
    python tools/make_synthetic_model.py qwen36-27b --plan --mix q4_k_m      # sizes only, no file

Presets: qwen36-27b (qwen35 hybrid), dflash-27b (its DFlash draft), qwen2.5-coder-1.5b,
qwen2.5-coder-0.5b (qwen2). See luce/testing/synthetic_model.py for what the file holds.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.gguf.writer import QUANT_MIXES  # noqa: E402
from luce.testing.synthetic_model import (PRESETS, default_mix, plan_synthetic,  # noqa: E402
                                          predicted_file_size, preset_config, write_synthetic)


def _progress():
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= 2.0 or done == total:
            last[0] = now
            print(f"  {done / 1e9:7.2f} / {total / 1e9:.2f} GB", file=sys.stderr, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", choices=tuple(PRESETS))
    parser.add_argument("out", type=Path, nargs="?", help="the .gguf file to write (not with --plan)")
    parser.add_argument("--mix", choices=QUANT_MIXES, help="quant mix (default: the preset's)")
    parser.add_argument("--tiny", action="store_true", help="scaled-down sizes (tests)")
    parser.add_argument("--layers", type=int, help="override the layer count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="writer processes (default: every CPU)")
    parser.add_argument("--plan", action="store_true", help="print the plan and the file size; write nothing")
    draft = parser.add_argument_group("dflash-27b only")
    draft.add_argument("--target", type=Path, help="the target .gguf whose sizes the draft takes "
                                                   "(default: the qwen36-27b preset at the same scale)")
    draft.add_argument("--block-size", type=int, help="draft block size (default 16)")
    draft.add_argument("--target-layers", help="comma-separated captured target layers, 0-based "
                                               "(default: z-lab's spread, 1,16,31,46,61 on 64 layers)")
    args = parser.parse_args(argv)
    if not args.plan and args.out is None:
        parser.error("give the output path (or --plan)")
    overrides = {}
    if args.block_size:
        overrides["block_size"] = args.block_size
    if args.target_layers:
        overrides["target_layers"] = tuple(int(x) for x in args.target_layers.split(","))
    target = None
    if args.target:
        from luce.gguf.reader import read_config
        target = read_config(args.target)
    if (target or overrides) and args.preset != "dflash-27b":
        parser.error("--target, --block-size and --target-layers apply to dflash-27b only")
    mix = args.mix or default_mix(args.preset)
    config = preset_config(args.preset, tiny=args.tiny, n_layer=args.layers, target=target, **overrides)
    plan = plan_synthetic(config, mix, args.preset)
    print(f"{args.preset}{' (tiny)' if args.tiny else ''}: {config.arch}, {config.n_layer} layers, "
          f"hidden {config.hidden}, vocab {config.vocab}, mix {mix}")
    for name, (count, nbytes) in sorted(plan.type_counts().items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:7s} {count:4d} tensors {nbytes / 1e9:9.3f} GB")
    if args.plan:
        size = predicted_file_size(plan)
        print(f"file size: {size:,} bytes ({size / 1e9:.3f} GB, {size / 2**30:.3f} GiB)")
        return 0
    stats = write_synthetic(args.out, plan, seed=args.seed, workers=args.workers, progress=_progress())
    print(f"wrote {args.out}: {stats.file_bytes:,} bytes in {stats.seconds:.1f} s "
          f"({stats.mb_per_s:.0f} MB/s, {stats.workers} workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
