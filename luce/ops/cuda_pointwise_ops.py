"""Elementwise ops of the CUDA backend (mixed into CudaBackend): add and mul with numpy
broadcasting (up to the kernel's MAX_DIMS) or a host scalar, the unary activations and the
row L2 norm, all on cuda/pointwise.cu."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from luce.ops.cuda_array import CudaArray


class PointwiseOps:
    """Mixin of CudaBackend (uses its empty / upload / _f32 / stream)."""

    def _binary(self, op: str, a, b) -> CudaArray:
        from luce import _cuda_pointwise as kp

        if not isinstance(a, CudaArray) and isinstance(b, CudaArray):
            a, b = b, a  # add and mul commute
        a = self._f32(a)
        scalar = None
        if not isinstance(b, CudaArray):
            host = np.asarray(b, dtype=np.float32)
            if host.size == 1 and host.ndim <= a.ndim:
                scalar = float(host.reshape(-1)[0])
                b_shape = host.shape
            else:
                b = self.upload(host)
        if scalar is None:
            b = self._f32(b)
            b_shape = b.shape
        full = np.broadcast_shapes(a.shape, b_shape)
        if len(full) > kp.MAX_DIMS:
            raise ValueError(f"{op}: broadcasting {a.shape} with {b_shape} needs {len(full)} dims; "
                             f"the CUDA pointwise kernel handles up to {kp.MAX_DIMS}")
        out = self.empty(full)
        pad = (1,) * (kp.MAX_DIMS - len(full)) + tuple(full)
        kp.binary(op, a.ptr, 0 if scalar is not None else b.ptr, out.ptr, pad, _strides(a.shape, pad),
                  [0] * kp.MAX_DIMS if scalar is not None else _strides(b_shape, pad),
                  0.0 if scalar is None else scalar, self.stream)
        return out

    def add(self, a, b) -> CudaArray:
        return self._binary("add", a, b)

    def mul(self, a, b) -> CudaArray:
        return self._binary("mul", a, b)

    def _unary(self, op: str, x) -> CudaArray:
        from luce import _cuda_pointwise as kp

        x = self._f32(x)
        out = self.empty(x.shape)
        kp.unary(op, x.ptr, out.ptr, x.size, self.stream)
        return out

    def silu(self, x) -> CudaArray:
        return self._unary("silu", x)

    def sigmoid(self, x) -> CudaArray:
        return self._unary("sigmoid", x)

    def softplus(self, x) -> CudaArray:
        return self._unary("softplus", x)

    def exp(self, x) -> CudaArray:
        return self._unary("exp", x)

    def l2norm(self, x, eps: float) -> CudaArray:
        from luce import _cuda_pointwise as kp

        x = self._f32(x)
        out = self.empty(x.shape)
        if x.size:
            kp.l2norm(x.ptr, out.ptr, x.size // x.shape[-1], x.shape[-1], eps, self.stream)
        return out


def _strides(shape: Sequence[int], full: Sequence[int]) -> list[int]:
    """Element strides of a C-contiguous `shape` read broadcast to `full` (0 on broadcast dims)."""
    shape = (1,) * (len(full) - len(shape)) + tuple(shape)
    out, step = [0] * len(full), 1
    for d in range(len(full) - 1, -1, -1):
        out[d] = 0 if shape[d] == 1 and full[d] != 1 else step
        step *= shape[d]
    return out
