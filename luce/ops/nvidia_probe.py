"""What this machine has for NVIDIA GPUs: the GPUs `nvidia-smi` lists (name, compute capability),
the CUDA version the driver supports, and the architectures the CUDA kernel library was built
for (the `<library>.json` the build writes beside luce/lib/libluce_cuda.so).

Standard library only and no luce imports: setup.py and tools/cuda_build.py load this file by
path at build time (the build targets the local GPU), and the backend choice reads it at start-up
(luce.ops.cuda_unavailable_reason) so that a GPU without a usable library is named, not skipped.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NvidiaGpu:
    name: str       # "NVIDIA GeForce RTX 3090"
    arch: str       # compute capability as an arch number: "86" (sm_86), "120" (sm_120)

    def describe(self) -> str:
        return f"{self.name} (sm_{self.arch})"


@dataclass(frozen=True)
class NvidiaProbe:
    smi: str | None                       # nvidia-smi's path, None when absent
    gpus: tuple[NvidiaGpu, ...]           # what it lists (empty when absent or failing)
    driver_cuda: tuple[int, int] | None   # the newest CUDA version the driver supports
    error: str | None = None              # why nvidia-smi gave nothing, when it was there

    def why_none(self) -> str:
        """Why no GPU is listed ('nvidia-smi absent', its error), for the start-up line."""
        if self.smi is None:
            return "nvidia-smi absent"
        return f"nvidia-smi lists none: {self.error}" if self.error else "nvidia-smi lists none"

    def describe(self) -> str:
        """'NVIDIA H200 (sm_90)'; several GPUs are joined with ', '."""
        return ", ".join(g.describe() for g in self.gpus)


def _run(cmd: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, a one-line error)."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{Path(cmd[0]).name} failed: {e}"
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()
        return None, f"{Path(cmd[0]).name} exit {result.returncode}" + (f": {tail[-1]}" if tail else "")
    return result.stdout, None


def parse_gpus(csv_text: str) -> list[NvidiaGpu]:
    """`nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader` lines ("NVIDIA H200, 9.0")."""
    out = []
    for line in csv_text.splitlines():
        name, _, cap = line.rpartition(",")
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", cap)
        if name.strip() and m:
            out.append(NvidiaGpu(name.strip(), f"{int(m[1])}{int(m[2])}"))
    return out


def parse_driver_cuda(smi_text: str) -> tuple[int, int] | None:
    """The 'CUDA Version: 13.0' of nvidia-smi's banner as (13, 0)."""
    m = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", smi_text)
    return (int(m[1]), int(m[2])) if m else None


def probe(smi: str | None = None) -> NvidiaProbe:
    """Ask nvidia-smi (on PATH unless `smi` names it) for the GPUs and the driver's CUDA version."""
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        return NvidiaProbe(None, (), None)
    listed, error = _run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    if listed is None:
        return NvidiaProbe(smi, (), None, error)
    gpus = tuple(parse_gpus(listed))
    banner, _ = _run([smi])
    return NvidiaProbe(smi, gpus, parse_driver_cuda(banner or ""), None if gpus else "no GPU lines")


def runs_on(lib_arch: str, gpu_arch: str) -> bool:
    """Whether machine code for sm_<lib_arch> runs on an sm_<gpu_arch> GPU: same major version
    and a minor no newer than the GPU's; an arch-specific target ("90a") only on its own arch."""
    if not lib_arch.isdigit():
        return lib_arch.rstrip("af") == gpu_arch
    return lib_arch[:-1] == gpu_arch[:-1] and int(lib_arch[-1]) <= int(gpu_arch[-1])


def build_info_path(library: Path) -> Path:
    """luce/lib/libluce_cuda.so -> luce/lib/libluce_cuda.json (written by tools/cuda_build.py)."""
    return library.with_suffix(".json")


def library_archs(library: Path) -> list[str] | None:
    """The archs the library was built for, from its build record (None without one)."""
    try:
        return list(json.loads(build_info_path(library).read_text())["archs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sm_list(archs: list[str]) -> str:
    return ", ".join(f"sm_{a}" for a in archs)


def library_mismatch(library: Path, gpus: tuple[NvidiaGpu, ...]) -> str | None:
    """Why the library cannot run on a listed GPU (built for other archs), or None."""
    archs = library_archs(library)
    if archs is None:
        return None
    unserved = [g for g in gpus if not any(runs_on(a, g.arch) for a in archs)]
    if not unserved:
        return None
    return (f"the CUDA kernel library {library} is built for {sm_list(archs)}, which cannot run on "
            f"{', '.join(g.describe() for g in unserved)}: run 'make build' (it builds for the local GPU)")
