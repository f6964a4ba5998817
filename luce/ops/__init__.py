"""Backend API the models call; numpy reference backend and GPU backends."""
from __future__ import annotations


def get_backend(name: str = "numpy"):
    """The backend called `name` ('numpy'; GPU backends register as they land)."""
    if name == "numpy":
        from luce.ops.numpy_backend import NumpyBackend

        return NumpyBackend()
    raise ValueError(f"unknown backend {name!r}: available: 'numpy'")
