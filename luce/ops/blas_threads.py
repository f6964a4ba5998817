"""Keep numpy's BLAS on one thread while the cpu backend's own threads run.

OpenBLAS threads busy-wait after a call; beside the cpu kernels' OpenMP threads on the same
cores they starve each other (a 2-core machine saw every small matmul wait a scheduler
quantum, ~4 ms). The cpu backend calls no BLAS inside a step, but numpy might elsewhere.
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")


def limit_blas_threads(n: int = 1) -> bool:
    """Set the OpenBLAS that numpy loaded to n threads; False if none was found."""
    libdir = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs")
    done = False
    for path in glob.glob(os.path.join(libdir, "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            if hasattr(lib, name):
                getattr(lib, name)(ctypes.c_int(n))
                done = True
                break
    return done
