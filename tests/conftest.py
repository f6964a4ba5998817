"""Shared pytest setup: `gpu` tests skip without a usable CUDA device, `real` tests skip
without the fetched Qwen2.5-Coder files (make models)."""
from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        from luce.ops.native import kernel_library_path

        if kernel_library_path("cuda") is None:
            return False
        from luce.ops.gpu_runtime import get_runtime

        return get_runtime("cuda").device_count() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU with a built kernel library")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
