"""Locate and load the compiled kernel library behind luce._cuda: libluce_cuda.so or, with the
same C ABI, libluce_hip.so (the GPU runtime's `name` picks; luce.ops.gpu_runtime).

The library is optional: without nvcc (or hipcc) at build time there is none, and luce runs
on the cpu or numpy backend. Nothing here touches a GPU until `load_kernels()` is called.
"""
from __future__ import annotations

import os
from pathlib import Path

LIB_DIR = Path(__file__).resolve().parent.parent / "lib"
LIB_NAMES = {"cuda": "libluce_cuda.so", "hip": "libluce_hip.so"}


def kernel_library_path(kind: str = "cuda") -> Path | None:
    """Path of the built kernel library for `kind` ('cuda' or 'hip'), or None if not built.

    `$LUCE_KERNEL_LIB` overrides the search (for a library built elsewhere)."""
    override = os.environ.get("LUCE_KERNEL_LIB")
    if override:
        return Path(override) if Path(override).exists() else None
    path = LIB_DIR / LIB_NAMES[kind]
    return path if path.exists() else None


def family_modules() -> list[str]:
    """Names of the per-family launch modules (luce/_cuda_<family>.pyx), built or not."""
    src = Path(__file__).resolve().parent.parent
    return sorted(p.stem for p in src.glob("_cuda_*.pyx"))


def load_kernels(kind: str = "cuda"):
    """Load the kernel library into luce._cuda and every luce._cuda_<family> module; return
    luce._cuda (the family modules are imported as `luce._cuda_<family>`)."""
    import importlib

    from luce import _cuda

    path = kernel_library_path(kind)
    if path is None:
        toolkit = "ROCm >= 6.0 (hipcc)" if kind == "hip" else "the CUDA toolkit (nvcc on PATH)"
        raise RuntimeError(
            f"luce was built without {kind.upper()} kernels ({LIB_DIR / LIB_NAMES[kind]} is missing): "
            f"install {toolkit} and run 'python setup.py build_ext --inplace', or use --backend numpy")
    if _cuda.loaded_path() != str(path):
        _cuda.load(str(path))
        for name in family_modules():
            importlib.import_module(f"luce.{name}").load(str(path))
    return _cuda
