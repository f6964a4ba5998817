#!/usr/bin/env python3
"""Compile checks `make test` runs: every kernel builds for AMD (HIP) and NVIDIA (sm_90).

HIP: each `cuda/<k>.cu` (or its AMD override `hip/<k>.hip`, DESIGN 5) is compiled with clang-22
for gfx1100, gfx1151 and gfx1201 down to ISA assembly:
    clang++-22 -O3 -x hip --offload-arch=<gfx> --offload-device-only -nogpulib -nogpuinc -S
No ROCm is needed: `-I hip/check` supplies stand-in HIP headers (hip/README.md). The device
library is not linked (-nogpulib), so the check stops at assembly: it proves the source
parses, type-checks and lowers to each target's instructions.

NVIDIA: the normal build (`setup.py build_ext`, run by `make build`) compiles cuda/*.cu into
luce/lib/libluce_cuda.so for sm_90 when nvcc exists. This script then checks that the
library is newer than every kernel source and exports every entry point `cuda/luce_ops.h`
declares. Without nvcc the sm_90 check is skipped with a note (CI machines without CUDA),
unless --require-nvcc.

Results are cached under build/compile_check/ by a hash of the compiler, the flags, the
source and the headers it includes, so an unchanged kernel costs nothing. Exit status 1 on any failure, each failure with the compiler's message.

    python3 tools/build_check.py [--hip-only | --nvcc-only] [--clang clang++-22] [-j N] [--opt -O3]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_DIR, HIP_DIR = ROOT / "cuda", ROOT / "hip"
CACHE_DIR = ROOT / "build" / "compile_check"
HIP_ARCHS = ("gfx1100", "gfx1151", "gfx1201")
HIP_FLAGS = ("-std=c++17", "-x", "hip", "--offload-device-only", "-nogpulib", "-nogpuinc",
             "-Wno-unused-command-line-argument", "-Wno-pass-failed")
CUDA_LIB = ROOT / "luce" / "lib" / "libluce_cuda.so"


def kernel_sources() -> list[Path]:
    """cuda/*.cu with hip/<k>.hip substituted where an AMD override exists."""
    out = []
    for cu in sorted(CUDA_DIR.glob("*.cu")):
        override = HIP_DIR / f"{cu.stem}.hip"
        out.append(override if override.exists() else cu)
    return out


INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def quoted_includes(src: Path) -> set[Path]:
    """Every file `src` reaches through #include "..." (resolved beside the includer or in
    cuda/), transitively."""
    seen: set[Path] = set()
    todo = [src]
    while todo:
        path = todo.pop()
        for name in INCLUDE.findall(path.read_text(errors="replace")):
            for base in (path.parent, CUDA_DIR):
                cand = (base / name).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen.add(cand)
                        todo.append(cand)
                    break
    return seen


def source_digest(src: Path) -> str:
    """Hash of a source, the headers it includes and every HIP header (hip/, hip/check/)."""
    h = hashlib.sha256()
    for path in sorted({src.resolve(), *quoted_includes(src), *HIP_DIR.rglob("*.h")}):
        h.update(str(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def compiler_identity(clang: str) -> str:
    result = subprocess.run([clang, "--version"], capture_output=True, text=True)
    return result.stdout.splitlines()[0] if result.returncode == 0 and result.stdout else clang


def hip_command(clang: str, src: Path, arch: str, out: Path, opt: str) -> list[str]:
    return [clang, *HIP_FLAGS, opt, f"--offload-arch={arch}", "-I", str(HIP_DIR / "check"),
            "-I", str(CUDA_DIR), "-S", str(src), "-o", str(out)]


def compile_hip(clang: str, opt: str, src: Path, arch: str, key: str) -> tuple[str, str | None, bool]:
    """Compile one (source, arch); returns (label, error text or None, was_cached)."""
    label = f"{src.relative_to(ROOT)} [{arch}]"
    out_dir = CACHE_DIR / arch
    out = out_dir / f"{src.stem}.{key[:20]}.s"
    if out.exists():
        return label, None, True
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    result = subprocess.run(hip_command(clang, src, arch, tmp, opt), capture_output=True, text=True)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        return label, (result.stderr or result.stdout).strip(), False
    for stale in out_dir.glob(f"{src.stem}.*.s"):
        stale.unlink()
    tmp.rename(out)
    if result.stderr.strip():
        print(f"{label}: warnings\n{result.stderr.strip()}")
    return label, None, False


def check_hip(clang: str, jobs: int, opt: str = "-O3") -> list[str]:
    if shutil.which(clang) is None:
        return [f"{clang} not found: install it (as root: apt-get install clang-22 lld-22) "
                "or run 'make test', which installs it"]
    common = compiler_identity(clang) + "\0" + " ".join(HIP_FLAGS) + " " + opt + "\0"
    tasks = []
    # largest sources first: the slowest compiles start early on a 2-core machine
    for src in sorted(kernel_sources(), key=lambda p: -p.stat().st_size):
        key = hashlib.sha256((common + source_digest(src)).encode()).hexdigest()
        for arch in HIP_ARCHS:
            tasks.append((src, arch, key))
    errors, built = [], 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for label, err, cached in pool.map(lambda t: compile_hip(clang, opt, *t), tasks):
            if err:
                errors.append(f"{label}: HIP compile failed\n{err}")
            built += not cached
    print(f"build_check: HIP {len(tasks) - len(errors)}/{len(tasks)} compiles ok "
          f"({len(kernel_sources())} sources x {', '.join(HIP_ARCHS)}; {built} rebuilt)")
    return errors


def declared_entry_points() -> list[str]:
    """Function names `cuda/luce_ops.h` and the headers it includes (cuda/luce_ops_*.h)
    declare (luce_<name>(...);)."""
    headers = [CUDA_DIR / "luce_ops.h", *sorted(CUDA_DIR.glob("luce_ops_*.h"))]
    text = re.sub(r"/\*.*?\*/", "", "\n".join(h.read_text() for h in headers), flags=re.S)
    return sorted(set(re.findall(r"^\s*(?:int|const\s+char\s*\*|void)\s*\**\s*(luce_\w+)\s*\(",
                                 text, flags=re.M)))


def exported_symbols(lib: Path) -> set[str]:
    result = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nm failed on {lib}: {result.stderr.strip()}")
    return {line.split()[-1] for line in result.stdout.splitlines() if line.strip()}


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def check_nvcc(require: bool) -> list[str]:
    if os.environ.get("LUCE_NO_CUDA") or find_nvcc() is None:
        msg = "nvcc not found: the sm_90 compile check is skipped (set NVCC or install CUDA)"
        if require:
            return [msg]
        print(f"build_check: {msg}")
        return []
    if not CUDA_LIB.exists():
        return [f"{CUDA_LIB.relative_to(ROOT)} missing although nvcc exists: run "
                "'python3 setup.py build_ext --inplace' (make build) and read its errors"]
    sources = [*CUDA_DIR.glob("*.cu"), *CUDA_DIR.glob("*.h"), *CUDA_DIR.glob("*.cuh")]
    stale = [p.name for p in sources if p.stat().st_mtime > CUDA_LIB.stat().st_mtime]
    if stale:
        return [f"{CUDA_LIB.relative_to(ROOT)} is older than {', '.join(sorted(stale))}: "
                "rebuild with 'python3 setup.py build_ext --inplace' (make build)"]
    missing = [n for n in declared_entry_points() if n not in exported_symbols(CUDA_LIB)]
    if missing:
        return [f"{CUDA_LIB.relative_to(ROOT)} lacks entry points declared in cuda/luce_ops.h: "
                f"{', '.join(missing)} (define them in a cuda/*.cu with extern \"C\")"]
    print(f"build_check: sm_90 library ok ({len(declared_entry_points())} entry points exported)")
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--hip-only", action="store_true", help="only the clang-22 gfx compiles")
    which.add_argument("--nvcc-only", action="store_true", help="only the sm_90 library check")
    ap.add_argument("--clang", default=os.environ.get("LUCE_HIP_CLANG", "clang++-22"))
    ap.add_argument("--require-nvcc", action="store_true", help="fail when nvcc is absent")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--opt", default="-O3", help="HIP optimisation level (-O3 as a real build; "
                    "-O0 compiles matmul.cu ~5x faster for a quick syntax check)")
    args = ap.parse_args(argv)
    errors: list[str] = []
    if not args.nvcc_only:
        errors += check_hip(args.clang, max(1, args.jobs), args.opt)
    if not args.hip_only:
        errors += check_nvcc(args.require_nvcc)
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
