"""The cpu backend's sequence ops (attention, norms, rotary, pointwise, Gated DeltaNet) on the
C kernels of luce/cpu/ (wrappers in luce/_cpu_sequence.pxi): a mixin of CpuBackend."""
from __future__ import annotations


class CpuSequenceOps:
    """Mixin of luce.ops.cpu_backend.CpuBackend (self._k is luce._cpu)."""
