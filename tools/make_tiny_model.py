#!/usr/bin/env python3
"""Write a deterministic tiny GGUF model (see luce/testing/tiny_models.py for the sizes).

    python tools/make_tiny_model.py qwen35 /tmp/tiny35.gguf --quant-mix q4_k_m
    python tools/make_tiny_model.py dflash /tmp/draft.gguf --target /tmp/tiny35.gguf
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.gguf.writer import QUANT_MIXES  # noqa: E402
from luce.testing.tiny_models import (make_dense, make_dflash_draft, make_qwen35,  # noqa: E402
                                      sizes_for_mix, tiny_qwen35_config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arch", choices=("qwen35", "dflash", "qwen3", "qwen2"))
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quant-mix", default="f32", choices=QUANT_MIXES)
    parser.add_argument("--target", type=Path,
                        help="dflash only: the target .gguf (default: the tiny qwen35 config "
                             "make_qwen35 uses for this quant mix)")
    args = parser.parse_args(argv)
    if args.target and args.arch != "dflash":
        parser.error("--target applies to dflash only")
    if args.arch == "qwen35":
        config = make_qwen35(args.out, seed=args.seed, quant_mix=args.quant_mix)
    elif args.arch == "dflash":
        if args.target:
            from luce.gguf.reader import read_config
            target = read_config(args.target)
        else:
            target = tiny_qwen35_config(**sizes_for_mix("qwen35", args.quant_mix, {}))
        config = make_dflash_draft(args.out, target, seed=args.seed, quant_mix=args.quant_mix)
    else:
        config = make_dense(args.out, arch=args.arch, seed=args.seed, quant_mix=args.quant_mix)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size:,} bytes): {config.arch}, {config.n_layer} layers, "
          f"hidden {config.hidden}, vocab {config.vocab}, quant mix {args.quant_mix}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
