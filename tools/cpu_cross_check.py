#!/usr/bin/env python3
"""The cpu backend's C kernels compile for aarch64 (the portable path; the instruction-set files
build empty there), checked on any machine with clang and the aarch64 C headers:

    clang-22 --target=aarch64-linux-gnu -isystem /usr/aarch64-linux-gnu/include -O3 -std=c11
        -ffp-contract=off -c luce/cpu/<f>.c

Debian's `libc6-dev-arm64-cross` has the headers (`make cross-headers` installs it). On the
x86-64 machine itself, the portable path is what the tests compare every SIMD path against
(tests/kernels/test_cpu_matmul.py, test_cpu_sequence_isa.py), so an aarch64 build computes
bitwise what those tests pin down.

    python3 tools/cpu_cross_check.py [--clang clang-22]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_DIR = ROOT / "luce" / "cpu"
HEADERS = Path("/usr/aarch64-linux-gnu/include")
FLAGS = ["--target=aarch64-linux-gnu", "-isystem", str(HEADERS), "-O3", "-std=c11", "-pthread",
         "-ffp-contract=off", "-fno-fast-math", "-Werror=implicit-function-declaration", "-I", str(CPU_DIR)]


def check(clang: str) -> list[str]:
    if shutil.which(clang) is None:
        return [f"cpu_cross_check: {clang} not found (make hip-toolchain installs clang-22)"]
    if not (HEADERS / "stdlib.h").exists():
        return [f"cpu_cross_check: no aarch64 C headers in {HEADERS}: apt-get install libc6-dev-arm64-cross "
                "(make cross-headers)"]
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = sorted(CPU_DIR.glob("*.c"))
        for src in sources:
            r = subprocess.run([clang, *FLAGS, "-c", str(src), "-o", str(Path(tmp) / (src.stem + ".o"))],
                               capture_output=True, text=True)
            if r.returncode != 0:
                errors.append(f"cpu_cross_check: {src.relative_to(ROOT)} does not compile for aarch64:\n{r.stderr[-1500:]}")
    if not errors:
        print(f"cpu_cross_check: {len(sources)} luce/cpu sources compile for aarch64-linux-gnu")
    return errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clang", default="clang-22")
    errors = check(ap.parse_args(argv).clang)
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
