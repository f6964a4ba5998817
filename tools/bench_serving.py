#!/usr/bin/env python3
"""Serving benchmark against any OpenAI-compatible server (luce-serve, llama-server, vLLM).

    tools/bench_serving.py --url http://127.0.0.1:8080
    tools/bench_serving.py --baseline-cmd "luce-serve m.gguf --port {port}" \\
                           --candidate-cmd "luce-serve m.gguf --spec dflash --port {port}"

`--help` lists every option; docs/BENCHMARKS.md defines every number it prints.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from luce.benchmark.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
