"""What this machine has for AMD GPUs: the HIP kernel library (luce/lib/libluce_hip.so), the
ROCm runtime library (libamdhip64), hip-python, the AMD GPUs the kernel driver lists
(/sys/class/kfd) and, when hip-python is there, the devices it sees (hipGetDeviceCount, as
CUDA's device count: no GPU memory or stream is touched).

The GPU backend runs on HIP (luce/ops/hip_runtime.py) when the library is built, hip-python
is installed and a device is visible; otherwise `--backend hip` stops with one line saying
what was found and what is missing.
"""
from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import sys
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
    """hip-python's installed version (hip-python 10 is rocm-bindings-hip under the `hip`
    name), 'unknown' for a `hip` package without metadata, None without one."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("hip-python", "rocm-bindings-hip"):
        try:
            return version(dist)
        except PackageNotFoundError:
            pass
    module = sys.modules.get("hip")
    if module is not None:
        return str(getattr(module, "__version__", "unknown"))
    spec = importlib.util.find_spec("hip")
    return "unknown" if spec is not None and spec.origin else None   # not the namespace of luce's hip/ folder


@dataclass
class HipFindings:
    library: Path | None       # luce/lib/libluce_hip.so (or $LUCE_KERNEL_LIB)
    runtime: str | None        # libamdhip64
    hip_python: str | None     # its version
    gpus: list[str]            # gfx archs
    kfd: bool                  # /dev/kfd: the driver is loaded
    devices: int | None = None  # hipGetDeviceCount through hip-python (None: not asked)

    def line(self) -> str:
        from luce.ops.native import LIB_DIR, LIB_NAMES

        gpus = (f"AMD GPU {', '.join(self.gpus)}" if self.gpus else
                "no AMD GPU (" + ("/dev/kfd lists none" if self.kfd else "no /dev/kfd: no amdgpu driver") + ")")
        library = (f"HIP kernel library {self.library}" if self.library else
                   f"HIP kernel library not built ({LIB_DIR / LIB_NAMES['hip']})")
        runtime = f"ROCm runtime {self.runtime}" if self.runtime else "no ROCm runtime (libamdhip64)"
        python = f"hip-python {self.hip_python}" if self.hip_python else "no hip-python"
        if self.hip_python and self.devices is not None:
            python += f" ({self.devices} HIP device{'' if self.devices == 1 else 's'})"
        return f"found {gpus}, {library}, {runtime}, {python}"

    def missing(self) -> list[str]:
        """What to install or do before the HIP backend can start (empty: it can)."""
        if self.library and self.hip_python and self.devices:
            return []
        needs = []
        if not self.devices:
            if not self.gpus:
                needs.append("an AMD GPU with the amdgpu driver (/dev/kfd)")
            elif self.hip_python and self.runtime:
                needs.append("a device hip-python can see (check HIP_VISIBLE_DEVICES and access to /dev/kfd)")
        if not self.runtime:
            needs.append("ROCm >= 6.0 (libamdhip64, hipcc)")
        if not self.hip_python:
            needs.append("'pip install hip-python' (the version of your ROCm)")
        if not self.library:
            needs.append("the HIP kernel library: 'make build' with ROCm's hipcc (LUCE_HIP_ARCHS)")
        return needs


def find() -> HipFindings:
    """What is here; the HIP device count is asked only when hip-python is installed."""
    from luce.ops.gpu_runtime import get_runtime
    from luce.ops.native import kernel_library_path

    python = hip_python_version()
    return HipFindings(kernel_library_path("hip"), hip_runtime_library(), python, amd_gpus(),
                       os.path.exists("/dev/kfd"), get_runtime("hip").device_count() if python else None)


def hip_unavailable_reason() -> str | None:
    """Why the HIP backend cannot start here (what was found, what to install), or None."""
    findings = find()
    needs = findings.missing()
    if not needs:
        return None
    return f"{findings.line()}; needs {'; '.join(needs)}; or use --backend auto or cpu"
