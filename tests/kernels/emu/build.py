"""Compile CUDA kernel sources for the host against tests/kernels/emu/cuda_runtime.h.

Two textual edits make a .cu file plain C++: each dynamic shared-memory declaration
(`extern __shared__ T name[];`) becomes a pointer to the stand-in's buffer and each
`kernel<<<grid, block, smem, stream>>>(args)` launch becomes
`emu_launch(kernel, grid, block, smem, stream, args)`. The headers of cuda/ get the same edits
(copies beside the sources, which their quoted includes find first). The result is a shared
library with the sources' extern "C" entry points (ctypes), its threads run as fibers
(fibers.cpp). Needs g++ with C++20.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

EMU = Path(__file__).resolve().parent
CUDA = EMU.parent.parent.parent / "cuda"
CACHE = EMU.parent.parent.parent / "build" / "emu_cache"   # git-ignored
# -O1: a clean clone's emulated tests compile every kernel once; on a 2-core machine -O1 took them
# from 224 to 169 s (compiling is most of it). No fused multiply-adds or fast math at any level,
# so the bits are the same.
FLAGS = ("-std=c++20", "-O1", "-ffp-contract=off", "-fPIC")
# No `;` inside a launch: a comment naming one (pdl.cuh) does not run on into code.
LAUNCH = re.compile(r"([\w:]+(?:<[^;{}]*?>)?)\s*<<<([^;]*?)>>>\s*\(([^;]*?)\);", re.S)
DYNAMIC_SMEM = re.compile(r"extern\s+__shared__\s+([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")


def host_source(text: str) -> str:
    text = DYNAMIC_SMEM.sub(lambda m: f"{m[1]} *{m[2]} = reinterpret_cast<{m[1]} *>(emu::block_smem());", text)
    return LAUNCH.sub(lambda m: f"emu_launch({m[1]}, {m[2]}, {m[3]});", text)


def _cache_key(cxx: str, names: list[str], defines: tuple[str, ...]) -> str:
    """Digest of everything a build reads: the compiler (path and version), the sources, every
    cuda/ header, the stand-ins and the defines."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout  # an upgrade in place
    h = hashlib.sha256(f"{cxx}|{version}|{FLAGS}|{sorted(names)}|{sorted(defines)}".encode())
    inputs = sorted(CUDA.glob("*.cuh")) + sorted(CUDA.glob("*.h")) + [CUDA / n for n in sorted(names)]
    for path in inputs + sorted(EMU.glob("*.[hc]*")) + [Path(__file__)]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:24]


class NoHostCompiler(RuntimeError):
    """This host's g++ cannot build the emulator at all (no C++20): the emulated tests skip."""


def cxx20(cxx: str) -> bool:
    """Whether `cxx` compiles a C++20 translation unit with FLAGS (a host that cannot is no place
    for the emulator; a kernel source it fails on is a failure of that source)."""
    probe = subprocess.run([cxx, *FLAGS, "-x", "c++", "-fsyntax-only", "-"], input="#include <span>\nint main() {}\n",
                           capture_output=True, text=True)
    return probe.returncode == 0


def build(names: list[str], out_dir: Path, defines: tuple[str, ...] = ()) -> Path | None:
    """cuda/<name> for each name -> out_dir/libemu.so (None: no g++ here); `defines`: extra
    preprocessor definitions ("NAME" or "NAME=value"), e.g. a kernel's other code path.
    A library built before from the same inputs (CACHE, keyed by their digest) is copied
    instead: test modules build the same sources several times in one run. The copy is a file
    of its own, so each caller's library keeps its own statics (a launch's one-time choices)."""
    cxx = shutil.which("g++")
    if cxx is None:
        return None
    cached = CACHE / _cache_key(cxx, names, defines) / "libemu.so"
    lib = out_dir / "libemu.so"
    if cached.exists():
        shutil.copyfile(cached, lib)
        return lib
    sources = [EMU / "fibers.cpp"]
    for header in CUDA.glob("*.cuh"):
        (out_dir / header.name).write_text(host_source(header.read_text()))
    for name in names:
        src = out_dir / (Path(name).stem + ".cpp")
        src.write_text(host_source((CUDA / name).read_text()))
        sources.append(src)
    flags = [*FLAGS, "-I", str(EMU), "-I", str(CUDA), *(f"-D{d}" for d in defines)]
    objects = [out_dir / (src.stem + ".o") for src in sources]
    jobs = [subprocess.Popen([cxx, *flags, "-c", str(src), "-o", str(obj)], stderr=subprocess.PIPE, text=True)
            for src, obj in zip(sources, objects)]
    errors = {src.name: job.communicate()[1] for src, job in zip(sources, jobs)}
    failed = [src.name for src, job in zip(sources, jobs) if job.returncode != 0]
    if failed:
        if not cxx20(cxx):
            raise NoHostCompiler(f"{cxx} does not compile C++20")
        first = errors[failed[0]].strip().splitlines()
        raise RuntimeError(f"g++ failed on {', '.join(failed)}: " + "\n".join(first[:20]))
    subprocess.run([cxx, "-shared", *map(str, objects), "-o", str(lib)], check=True)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.part")  # whole or absent: parallel runs may race
    shutil.copyfile(lib, partial)
    os.replace(partial, cached)
    return lib


def load(names: list[str], out_dir: Path, what: str, defines: tuple[str, ...] = ()):
    """ctypes.CDLL of build(names, out_dir, defines), or pytest.skip naming why this host cannot
    emulate `what` (no g++, or one without C++20). A source g++ fails on raises: the tests of
    `what` fail, naming the compiler's first errors."""
    import ctypes

    import pytest

    try:
        path = build(names, out_dir, defines)
    except NoHostCompiler as exc:
        pytest.skip(f"no host build of {what}: {exc}")
    if path is None:
        pytest.skip("no g++")
    return ctypes.CDLL(str(path))
