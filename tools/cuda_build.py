#!/usr/bin/env python3
"""The CUDA toolchain: which nvcc builds luce/lib/libluce_cuda.so, for which archs, and where a
GPU machine without a CUDA toolkit gets one (the usual case: a driver, no toolkit).

nvcc, first found: $NVCC, nvcc on PATH, $CUDA_HOME/bin/nvcc (or $CUDA_PATH), /usr/local/cuda/bin,
then the nvidia-cuda-nvcc wheel in this Python's environment (nvidia/cu<major>/bin/nvcc).
Archs: each local GPU's compute capability (nvidia-smi), sm_90 when none is listed, plus
LUCE_CUDA_ARCHS ("80,89" or "sm_80;sm_89"). The build writes what it used to
luce/lib/libluce_cuda.json; the start-up line reads it (luce.ops.nvidia_probe).

`ensure` (make build, make serve): when nvidia-smi lists a GPU, installs into this environment
what the GPU backend needs and lacks: nvcc and its headers from the CUDA wheels of the driver's
major version, no newer than the driver's CUDA version (CUDA 13 on; the CUDA 12 wheel
nvidia-cuda-nvcc-cu12 holds ptxas only, so a CUDA 12 driver needs the toolkit), and cuda-python
of that major. Without nvidia-smi it installs nothing.

    python3 tools/cuda_build.py ensure [--dry-run]   # --dry-run: print the pip command only
    python3 tools/cuda_build.py show                 # the nvcc and archs a build would use
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_DIR = ROOT / "cuda"
_spec = importlib.util.spec_from_file_location("luce_nvidia_probe", ROOT / "luce" / "ops" / "nvidia_probe.py")
nvidia_probe = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(nvidia_probe)

COMMON_FLAGS = ["-std=c++17", "-I", str(CUDA_DIR)]
# the CUDA wheels that make a toolkit, nvcc first (all pinned to one minor version)
WHEELS = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl")
FIRST_WHEEL_MAJOR = 13
DEFAULT_CUDA_HOME = "/usr/local/cuda"


@dataclass(frozen=True)
class Nvcc:
    path: str
    source: str                       # where it was found, for the build line
    link_flags: tuple[str, ...] = ()  # the wheel's nvcc.profile names lib64/, the wheel has lib/


def wheel_nvccs(site_dirs: list[str] | None = None) -> list[Path]:
    """nvidia/cu<major>/bin/nvcc of the CUDA wheels installed in this environment."""
    dirs = site_dirs or sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return sorted(p for d in dirs for p in Path(d).glob("nvidia/cu*/bin/nvcc") if p.is_file())


def find_nvcc(env=None, site_dirs: list[str] | None = None) -> Nvcc | None:
    """The nvcc a build uses (module docstring for the order), None without one or under LUCE_NO_CUDA."""
    env = os.environ if env is None else env
    if env.get("LUCE_NO_CUDA"):
        return None
    cands = [(env.get("NVCC"), "$NVCC"), (shutil.which("nvcc", path=env.get("PATH")), "PATH")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            cands.append((os.path.join(env[var], "bin", "nvcc"), f"${var}"))
    cands.append((os.path.join(DEFAULT_CUDA_HOME, "bin", "nvcc"), DEFAULT_CUDA_HOME))
    for path, source in cands:
        if path and os.path.isfile(path):
            return Nvcc(path, f"{path} ({source})")
    for path in reversed(wheel_nvccs(site_dirs)):
        top = path.parent.parent
        return Nvcc(str(path), f"{path} (the {top.name} CUDA wheels)", ("-L", str(top / "lib")))
    return None


def build_archs(probe=None, env=None) -> list[str]:
    """Each local GPU's arch (sm_90 when nvidia-smi lists none), then LUCE_CUDA_ARCHS, deduplicated."""
    env = os.environ if env is None else env
    probe = nvidia_probe.probe() if probe is None else probe
    archs = [g.arch for g in probe.gpus] or ["90"]
    for item in env.get("LUCE_CUDA_ARCHS", "").replace(";", ",").split(","):
        archs.append(item.strip().lower().replace("sm_", "").replace("compute_", ""))
    return list(dict.fromkeys(a for a in archs if a))


def gencode_flags(archs: list[str]) -> list[str]:
    """sm_90 builds as sm_90a (the same GPUs, H100/H200): its arch-specific warpgroup MMAs serve the
    prompt-row GEMM (cuda/matmul_prefill_wgmma.cuh)."""
    return [f"-gencode=arch=compute_{a}a,code=sm_{a}a" if a == "90" else f"-gencode=arch=compute_{a},code=sm_{a}"
            for a in archs]


def wheel_requirements(driver_cuda: tuple[int, int] | None) -> tuple[list[str] | None, str]:
    """(pip requirements of a CUDA toolkit no newer than the driver, why) or (None, why not)."""
    if driver_cuda is None:
        return None, "nvidia-smi does not say which CUDA version the driver supports"
    major, minor = driver_cuda
    if major < FIRST_WHEEL_MAJOR:
        return None, (f"the driver supports CUDA {major}.{minor}; nvcc comes as a wheel from CUDA "
                      f"{FIRST_WHEEL_MAJOR} on (nvidia-cuda-nvcc-cu12 holds ptxas only): install the CUDA "
                      f"{major}.{minor} toolkit (nvcc on PATH or $CUDA_HOME) or a driver for CUDA "
                      f"{FIRST_WHEEL_MAJOR}, then run 'make build'")
    pin = f">={major}.0,<{major}.{minor + 1}"
    return [f"{w}{pin}" for w in WHEELS], f"the CUDA {major} wheels up to {major}.{minor} (the driver's CUDA version)"


def cuda_python_requirement(driver_cuda: tuple[int, int] | None) -> str:
    """cuda-python of the driver's major version (12.6 on for CUDA 12)."""
    major = driver_cuda[0] if driver_cuda else 12
    return f"cuda-python>={major}.{6 if major == 12 else 0},<{major + 1}"


def has_cuda_python() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ImportError:  # no `cuda` package at all
        return False


def ensure(dry_run: bool = False, probe=None, say=print) -> list[str]:
    """What `make build`/`make serve` install for a local NVIDIA GPU (module docstring); returns
    the pip command run (or, with dry_run, printed), [] when nothing is needed."""
    probe = nvidia_probe.probe() if probe is None else probe
    if not probe.gpus:
        return []
    reqs = []
    if find_nvcc() is None and not os.environ.get("LUCE_NO_CUDA"):
        wheels, why = wheel_requirements(probe.driver_cuda)
        if wheels is None:
            say(f"luce: {probe.describe()} is here but there is no nvcc to build its kernels: {why}")
        else:
            say(f"luce: {probe.describe()} is here and no nvcc: installing nvcc from {why} (~300 MB)")
            reqs += wheels
    if not has_cuda_python():
        reqs.append(cuda_python_requirement(probe.driver_cuda))
    if not reqs:
        return []
    cmd = [sys.executable, "-m", "pip", "install", "-q", *reqs]
    say("luce: " + shlex.join(cmd))
    if not dry_run and subprocess.run(cmd).returncode != 0:
        # the build goes on without them; the start-up line then names the GPU and what is missing
        say(f"luce: the install failed (offline?): {probe.describe()} will not be used until "
            "'make build' succeeds with nvcc (CUDA toolkit or these wheels) and cuda-python")
    return cmd


def host_compiler() -> str | None:
    """The C++ compiler nvcc will call: $NVCC_CCBIN, else g++ or c++ on PATH (None: none)."""
    return os.environ.get("NVCC_CCBIN") or shutil.which("g++") or shutil.which("c++")


def build_library(out_dir: str, say=print) -> None:
    """nvcc every cuda/*.cu into out_dir/libluce_cuda.so for build_archs(), and the build record
    beside it; skipped when the library is newer than every source and was built for these archs
    with this nvcc."""
    nvcc = find_nvcc()
    probe = nvidia_probe.probe()
    if nvcc is None:
        if probe.gpus:
            wheels, why = wheel_requirements(probe.driver_cuda)
            fix = "run 'make build' (it installs nvcc from the CUDA wheels)" if wheels else why
            say(f"luce: {probe.describe()} is here but nvcc is not: the CUDA kernel library is not built; {fix}")
        else:
            say(f"luce: nvcc not found ({probe.why_none()}); building the cpu backend only "
                "(set NVCC or CUDA_HOME to add CUDA)")
        return
    if host_compiler() is None:
        say("luce: nvcc needs a C++ host compiler and none was found (g++ or c++ on PATH, or NVCC_CCBIN): "
            "the CUDA kernel library is not built; install g++ (e.g. apt-get install g++) and run 'make build'")
        return
    archs = build_archs(probe)
    sources = sorted(CUDA_DIR.glob("*.cu"))
    target = Path(out_dir) / "libluce_cuda.so"
    record = nvidia_probe.build_info_path(target)
    built = {"archs": archs, "nvcc": nvcc.path}
    newest = max(p.stat().st_mtime for p in [*sources, *CUDA_DIR.glob("*.h"), *CUDA_DIR.glob("*.cuh"),
                                             Path(__file__), ROOT / "setup.py"])
    try:
        same = json.loads(record.read_text()) == built and target.stat().st_mtime >= newest
    except (OSError, ValueError):
        same = False
    if same:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc.path, "-O3", *COMMON_FLAGS, "-shared", "-Xcompiler", "-fPIC", "--threads", "0",
           *gencode_flags(archs), *nvcc.link_flags, "-o", str(target), *map(str, sources)]
    gpus = f" ({probe.describe()})" if probe.gpus else f" (no GPU listed: {probe.why_none()})"
    say(f"luce: building CUDA kernels for {nvidia_probe.sm_list(archs)}{gpus} with {nvcc.source}")
    record.unlink(missing_ok=True)
    subprocess.run(cmd, check=True)
    record.write_text(json.dumps(built) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="install nvcc and cuda-python for a local GPU").add_argument(
        "--dry-run", action="store_true", help="print the pip command, install nothing")
    sub.add_parser("show", help="the nvcc and archs a build would use")
    args = ap.parse_args(argv)
    if args.cmd == "ensure":
        ensure(args.dry_run)
        return 0
    nvcc = find_nvcc()
    print(f"nvcc: {nvcc.source if nvcc else 'none'}")
    print(f"archs: {nvidia_probe.sm_list(build_archs())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
