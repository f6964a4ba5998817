#!/usr/bin/env python3
"""Tree rules `make test` enforces (exit 1 with one line per violation):

1. Size caps: Python modules under luce/ and tools/ and kernel sources stay under MAX_LINES.
2. No literal warp width in cuda/ or hip/ outside common.cuh (tools/warp_width_lint.py).
3. Every cuda/<k>.cu that defines a __global__ kernel has luce/ref/<k>.py and
   tests/kernels/test_<k>.py.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450
def sized_files():
    for pattern in ("luce/**/*.py", "luce/**/*.pyx", "tools/*.py", "cuda/*", "hip/*"):
        yield from (p for p in ROOT.glob(pattern) if p.is_file())


def check_sizes(errors: list[str]) -> None:
    for path in sized_files():
        n = len(path.read_text(errors="replace").splitlines())
        if n > MAX_LINES:
            errors.append(f"{path.relative_to(ROOT)}: {n} lines > {MAX_LINES}: split it by concept")


def check_warp_literals(errors: list[str]) -> None:
    """Rule 2, shared with tools/build_check.py: tools/warp_width_lint.py."""
    sys.path.insert(0, str(ROOT / "tools"))
    import warp_width_lint

    errors.extend(warp_width_lint.lint())


def check_kernel_companions(errors: list[str]) -> None:
    for path in sorted((ROOT / "cuda").glob("*.cu")):
        if "__global__" not in path.read_text():
            continue
        k = path.stem
        for need in (ROOT / "luce" / "ref" / f"{k}.py", ROOT / "tests" / "kernels" / f"test_{k}.py"):
            if not need.exists():
                errors.append(f"cuda/{k}.cu: missing {need.relative_to(ROOT)}")


def main() -> int:
    errors: list[str] = []
    check_sizes(errors)
    check_warp_literals(errors)
    check_kernel_companions(errors)
    for e in errors:
        print(e)
    if not errors:
        print("check_tree: ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
