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

import re
import shutil
import subprocess
from pathlib import Path

EMU = Path(__file__).resolve().parent
CUDA = EMU.parent.parent.parent / "cuda"
# No `;` inside a launch: a comment naming one (pdl.cuh) does not run on into code.
LAUNCH = re.compile(r"([\w:]+(?:<[^;{}]*?>)?)\s*<<<([^;]*?)>>>\s*\(([^;]*?)\);", re.S)
DYNAMIC_SMEM = re.compile(r"extern\s+__shared__\s+([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")


def host_source(text: str) -> str:
    text = DYNAMIC_SMEM.sub(lambda m: f"{m[1]} *{m[2]} = reinterpret_cast<{m[1]} *>(emu::block_smem());", text)
    return LAUNCH.sub(lambda m: f"emu_launch({m[1]}, {m[2]}, {m[3]});", text)


def build(names: list[str], out_dir: Path, defines: tuple[str, ...] = ()) -> Path | None:
    """cuda/<name> for each name -> out_dir/libemu.so (None: no g++ here); `defines`: extra
    preprocessor definitions ("NAME" or "NAME=value"), e.g. a kernel's other code path."""
    cxx = shutil.which("g++")
    if cxx is None:
        return None
    sources = [EMU / "fibers.cpp"]
    for header in CUDA.glob("*.cuh"):
        (out_dir / header.name).write_text(host_source(header.read_text()))
    for name in names:
        src = out_dir / (Path(name).stem + ".cpp")
        src.write_text(host_source((CUDA / name).read_text()))
        sources.append(src)
    flags = ["-std=c++20", "-O2", "-ffp-contract=off", "-fPIC", "-I", str(EMU), "-I", str(CUDA),
             *(f"-D{d}" for d in defines)]
    objects = [out_dir / (src.stem + ".o") for src in sources]
    jobs = [subprocess.Popen([cxx, *flags, "-c", str(src), "-o", str(obj)]) for src, obj in zip(sources, objects)]
    failed = [src.name for src, job in zip(sources, jobs) if job.wait() != 0]
    if failed:
        raise RuntimeError(f"g++ failed on {', '.join(failed)}")
    lib = out_dir / "libemu.so"
    subprocess.run([cxx, "-shared", *map(str, objects), "-o", str(lib)], check=True)
    return lib


def load(names: list[str], out_dir: Path, what: str, defines: tuple[str, ...] = ()):
    """ctypes.CDLL of build(names, out_dir, defines), or pytest.skip naming why this host cannot
    emulate `what`."""
    import ctypes

    import pytest

    try:
        path = build(names, out_dir, defines)
    except Exception as exc:  # noqa: BLE001 - a host without C++20 cannot emulate
        pytest.skip(f"no host build of {what}: {exc}")
    if path is None:
        pytest.skip("no g++")
    return ctypes.CDLL(str(path))
