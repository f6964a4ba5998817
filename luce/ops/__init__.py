"""Backend API the models call; numpy reference backend and the CUDA backend."""
from __future__ import annotations

BACKENDS = ("numpy", "cuda", "auto")


def cuda_device_count() -> int:
    """Visible CUDA devices through cuda-python (0 without cuda-python, a driver or a GPU)."""
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
        return int(count) if int(err) == 0 else 0
    except Exception:
        return 0


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA backend cannot start here (None if it can): no kernel library, no GPU."""
    from luce.ops.native import LIB_DIR, LIB_NAMES, kernel_library_path

    if kernel_library_path("cuda") is None:
        return (f"the CUDA kernel library {LIB_DIR / LIB_NAMES['cuda']} is not built ($LUCE_KERNEL_LIB "
                "names another): install the CUDA toolkit (nvcc on PATH) and run "
                "'python setup.py build_ext --inplace'")
    if cuda_device_count() == 0:
        return ("no CUDA GPU is visible (or cuda-python is missing: pip install cuda-python); "
                "check nvidia-smi and CUDA_VISIBLE_DEVICES")
    return None


def get_backend(name: str = "numpy"):
    """The backend called `name`: 'numpy', 'cuda', or 'auto' (cuda when the kernel library is
    built and a GPU is visible, else numpy)."""
    if name == "auto":
        name = "cuda" if cuda_unavailable_reason() is None else "numpy"
    if name == "numpy":
        from luce.ops.numpy_backend import NumpyBackend

        return NumpyBackend()
    if name == "cuda":
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"cannot use the CUDA backend: {reason}; or use --backend numpy")
        from luce.ops.cuda_backend import CudaBackend

        return CudaBackend()
    raise ValueError(f"unknown backend {name!r}: available: {', '.join(map(repr, BACKENDS))}")
