"""Backend API the models call: the numpy reference backend, the cpu backend (C kernels) and
the GPU backend over a GPU runtime ('cuda': cuda-python and libluce_cuda.so; 'hip': hip-python
and libluce_hip.so; luce.ops.gpu_runtime). BACKENDS is the one list of backend names (the CLIs
offer it). A backend that cannot start here says what this machine has and what is missing."""
from __future__ import annotations

BACKENDS = ("auto", "cuda", "hip", "cpu", "numpy")


def cuda_device_count() -> int:
    """Visible CUDA devices through cuda-python (0 without cuda-python, a driver or a GPU)."""
    from luce.ops.gpu_runtime import get_runtime

    return get_runtime("cuda").device_count()


def cuda_unavailable_reason(nvidia=None) -> str | None:
    """Why the CUDA backend cannot start here (None if it can), naming a GPU that nvidia-smi
    lists (luce.ops.nvidia_probe; `nvidia`: a probe already taken): no kernel library, one built
    for other archs, no cuda-python, no visible device."""
    from luce.ops import nvidia_probe
    from luce.ops.native import LIB_DIR, LIB_NAMES, kernel_library_path

    nvidia = nvidia or nvidia_probe.probe()
    library = kernel_library_path("cuda")
    if library is None:
        missing = (f"the CUDA kernel library {LIB_DIR / LIB_NAMES['cuda']} is not built "
                   "($LUCE_KERNEL_LIB names another)")
        if not nvidia.gpus:
            return f"no NVIDIA GPU found ({nvidia.why_none()}) and {missing}"
        return (f"an NVIDIA GPU is here ({nvidia.describe()}) but {missing}: run 'make build' (it builds "
                "for this GPU, with nvcc from the CUDA wheels when no toolkit is installed)")
    mismatch = nvidia_probe.library_mismatch(library, nvidia.gpus)
    if mismatch:
        return mismatch
    if cuda_device_count() == 0:
        if not nvidia.gpus:
            return (f"no NVIDIA GPU found ({nvidia.why_none()}) and no CUDA device is visible (or cuda-python is "
                    "missing: pip install cuda-python); check CUDA_VISIBLE_DEVICES")
        import importlib.util

        try:
            bindings = importlib.util.find_spec("cuda.bindings") is not None
        except ImportError:
            bindings = False
        if not bindings:
            return (f"an NVIDIA GPU is here ({nvidia.describe()}) but cuda-python is missing: run 'make build' "
                    "(it installs the version of the driver) or pip install cuda-python")
        return (f"nvidia-smi lists {nvidia.describe()} but CUDA sees no device: check CUDA_VISIBLE_DEVICES "
                "and that the driver matches cuda-python's CUDA version")
    return None


def cuda_backend_why(nvidia=None) -> str:
    """What the CUDA backend runs on: 'NVIDIA H200 (sm_90), library built for sm_90'."""
    from luce.ops import nvidia_probe
    from luce.ops.native import kernel_library_path

    nvidia = nvidia or nvidia_probe.probe()
    archs = nvidia_probe.library_archs(kernel_library_path("cuda"))
    built = f"library built for {nvidia_probe.sm_list(archs)}" if archs else "library archs not recorded"
    return f"{nvidia.describe() or 'a CUDA device (nvidia-smi absent)'}, {built}"


def cpu_unavailable_reason() -> str | None:
    """Why the cpu backend cannot start here (None if it can): its C extension is not built."""
    try:
        from luce import _cpu  # noqa: F401
    except ImportError as e:
        return (f"the cpu kernels (luce._cpu) are not built ({e}): run 'make build' "
                "(needs a C compiler)")
    return None


def hip_unavailable_reason() -> str | None:
    """Why the HIP backend cannot start here (None if it can): what was found, what to install
    (luce.ops.hip_probe)."""
    from luce.ops.hip_probe import hip_unavailable_reason as reason

    return reason()


def backend_error(name: str) -> str | None:
    """The one line get_backend(name) would fail with here, or None if it can start (without
    starting it: no GPU is touched beyond counting devices). 'auto' and 'numpy' always can."""
    if name == "hip":
        reason = hip_unavailable_reason()
        return None if reason is None else f"cannot use the HIP backend: {reason}"
    probes = {"cuda": ("CUDA", cuda_unavailable_reason), "cpu": ("cpu", cpu_unavailable_reason)}
    if name in probes:
        label, probe = probes[name]
        reason = probe()
        return None if reason is None else f"cannot use the {label} backend: {reason}; or use --backend numpy"
    if name not in BACKENDS:
        return f"unknown backend {name!r}: available: {', '.join(map(repr, BACKENDS))}"
    return None


def auto_backend_choice() -> tuple[str, str]:
    """(backend name, why) that --backend auto picks: cuda, then hip (when the kernel driver
    lists an AMD GPU), then cpu, then numpy."""
    from luce.ops import nvidia_probe

    nvidia = nvidia_probe.probe()   # nvidia-smi runs once for the choice and its line
    cuda_reason = cuda_unavailable_reason(nvidia)
    if cuda_reason is None:
        return "cuda", cuda_backend_why(nvidia)
    from luce.ops.hip_probe import amd_gpus

    amd = amd_gpus()
    if amd:
        hip_reason = hip_unavailable_reason()
        if hip_reason is None:
            return "hip", f"no CUDA; an AMD GPU ({', '.join(amd)}), hip-python and the HIP kernel library are present"
        cuda_reason += f"; the AMD GPU here ({', '.join(amd)}) cannot be used: {hip_reason}"
    cpu_reason = cpu_unavailable_reason()
    if cpu_reason is None:
        return "cpu", cuda_reason
    return "numpy", f"{cuda_reason}; no cpu kernels ({cpu_reason})"


def get_backend(name="numpy", threads: int | None = None):
    """The backend called `name` (BACKENDS; a backend instance is returned as it is): 'auto'
    picks cuda when the kernel library is built and a GPU is visible, else hip likewise, else
    cpu when its C kernels are built, else numpy (auto_backend_choice says why). `threads` sets the cpu
    backend's thread count (default: the cores this process may use)."""
    if not isinstance(name, str):
        return name
    if name == "auto":
        name = auto_backend_choice()[0]
    if name == "numpy":
        from luce.ops.numpy_backend import NumpyBackend

        return NumpyBackend()
    if name not in BACKENDS:
        raise ValueError(backend_error(name))
    error = backend_error(name)
    if error is not None:
        raise RuntimeError(error)
    if name == "cpu":
        from luce.ops.cpu_backend import CpuBackend

        return CpuBackend(threads=threads)
    from luce.ops.cuda_backend import CudaBackend
    from luce.ops.gpu_runtime import get_runtime

    return CudaBackend(get_runtime(name))   # 'cuda' or 'hip': one GPU backend, two runtimes
