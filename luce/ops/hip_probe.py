"""What this machine has for AMD GPUs, found without touching a GPU: the HIP kernel library
(luce/lib/libluce_hip.so), the ROCm runtime library (libamdhip64), hip-python, and the AMD GPUs
the kernel driver lists (/sys/class/kfd). `--backend hip` reports it in one line.

The HIP runtime behind the GPU backend (over hip-python) is not written yet: until it is,
`--backend hip` always stops with that line, and `--backend auto` never picks HIP.
"""
from __future__ import annotations

import ctypes.util
import glob
import os
from dataclasses import dataclass
from pathlib import Path

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def gfx_name(target_version: int) -> str:
    """KFD's gfx_target_version to an arch name: 110000 -> gfx1100, 90010 -> gfx90a."""
    major, minor, step = target_version // 10000, target_version // 100 % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def amd_gpus(nodes_dir: str = KFD_NODES) -> list[str]:
    """Arch of each GPU node the amdgpu kernel driver lists (CPU nodes have version 0)."""
    out = []
    for props in sorted(glob.glob(os.path.join(nodes_dir, "*", "properties"))):
        try:
            text = Path(props).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "gfx_target_version" and value.strip().isdigit() and int(value) > 0:
                out.append(gfx_name(int(value)))
    return out


def hip_runtime_library() -> str | None:
    """The ROCm runtime library the dynamic loader would find (libamdhip64), or None."""
    found = ctypes.util.find_library("amdhip64")
    if found:
        return found
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if root and glob.glob(os.path.join(root, "lib", "libamdhip64.so*")):
            return os.path.join(root, "lib", "libamdhip64.so")
    return None


def hip_python_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("hip-python")
    except PackageNotFoundError:
        return None


@dataclass
class HipFindings:
    library: Path | None       # luce/lib/libluce_hip.so (or $LUCE_KERNEL_LIB)
    runtime: str | None        # libamdhip64
    hip_python: str | None     # its version
    gpus: list[str]            # gfx archs
    kfd: bool                  # /dev/kfd: the driver is loaded

    def line(self) -> str:
        from luce.ops.native import LIB_DIR, LIB_NAMES

        gpus = (f"AMD GPU {', '.join(self.gpus)}" if self.gpus else
                "no AMD GPU (" + ("/dev/kfd lists none" if self.kfd else "no /dev/kfd: no amdgpu driver") + ")")
        library = (f"HIP kernel library {self.library}" if self.library else
                   f"HIP kernel library not built ({LIB_DIR / LIB_NAMES['hip']})")
        runtime = f"ROCm runtime {self.runtime}" if self.runtime else "no ROCm runtime (libamdhip64)"
        python = f"hip-python {self.hip_python}" if self.hip_python else "no hip-python"
        return f"found {gpus}, {library}, {runtime}, {python}"


def find() -> HipFindings:
    from luce.ops.native import kernel_library_path

    return HipFindings(kernel_library_path("hip"), hip_runtime_library(), hip_python_version(),
                       amd_gpus(), os.path.exists("/dev/kfd"))


def hip_unavailable_reason() -> str:
    """Why the HIP backend cannot start here, with what was found and what to install."""
    return (f"{find().line()}. Running on AMD needs ROCm >= 6.0 (hipcc, libamdhip64), "
            "'pip install hip-python', 'make build' (LUCE_HIP_ARCHS) and luce's HIP runtime, "
            "which is not written yet: use --backend auto or cpu")
