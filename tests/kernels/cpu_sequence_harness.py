"""Shared pieces of the cpu sequence kernel tests (tests/kernels/test_cpu_sequence_*.py): the
backend, a thread-count switch, and bitwise helpers."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

THREADS = (1, 2, 4)


def cpu_backend():
    """A CpuBackend (skips the test when luce._cpu is not built)."""
    pytest.importorskip("luce._cpu")
    from luce.ops.cpu_backend import CpuBackend

    return CpuBackend(threads=2)


@contextlib.contextmanager
def threads(n: int):
    """Run the cpu kernels on n threads inside the block (the count is process-wide)."""
    from luce import _cpu

    before = _cpu.get_threads()
    _cpu.set_threads(n)
    try:
        yield
    finally:
        _cpu.set_threads(before)


def same_bits(a, b) -> bool:
    """Bitwise equality of two f32 arrays (NaN payloads included)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def under_threads(fn):
    """[fn() run on each of THREADS threads]."""
    out = []
    for n in THREADS:
        with threads(n):
            out.append(fn())
    return out
