#!/usr/bin/env python3
"""Tree rules `make test` enforces (exit 1 with one line per violation):

1. Size caps: Python modules under luce/ and tools/ and kernel sources stay under MAX_LINES.
2. No literal warp width in cuda/ outside common.cuh (WARP_SIZE and the warp helpers there).
3. Every cuda/<k>.cu that defines a __global__ kernel has luce/ref/<k>.py and
   tests/kernels/test_<k>.py.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450
WARP_PATTERNS = [
    (re.compile(r"\bwarpSize\b"), "warpSize (use WARP_SIZE from common.cuh)"),
    (re.compile(r"__shfl\w*\s*\("), "raw shuffle (use the warp helpers in common.cuh)"),
    (re.compile(r"threadIdx\.[xyz]\s*(?:%|/)\s*(?:32|64)\b"), "lane/warp index from a literal 32/64"),
    (re.compile(r"threadIdx\.[xyz]\s*&\s*(?:31|63)\b"), "lane mask from a literal 31/63"),
    (re.compile(r"\b0xffffffff(?:u|U)?\b"), "full-warp mask literal"),
]


def sized_files():
    for pattern in ("luce/**/*.py", "luce/**/*.pyx", "tools/*.py", "cuda/*", "hip/*"):
        yield from (p for p in ROOT.glob(pattern) if p.is_file())


def check_sizes(errors: list[str]) -> None:
    for path in sized_files():
        n = len(path.read_text(errors="replace").splitlines())
        if n > MAX_LINES:
            errors.append(f"{path.relative_to(ROOT)}: {n} lines > {MAX_LINES}: split it by concept")


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def check_warp_literals(errors: list[str]) -> None:
    for path in sorted((ROOT / "cuda").glob("*")):
        if path.name == "common.cuh" or not path.is_file():
            continue
        for lineno, line in enumerate(strip_comments(path.read_text()).splitlines(), 1):
            for pattern, what in WARP_PATTERNS:
                if pattern.search(line):
                    errors.append(f"cuda/{path.name}:{lineno}: {what}")


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
