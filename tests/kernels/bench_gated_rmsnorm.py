"""Benchmark cases for gated RMSNorm (cuda/gated_rmsnorm.cu) at Qwen3.6-27B GDN shapes:
48 value heads x 128. BENCH_CASES entries return (launch_fn, bytes_moved, flops)."""
from __future__ import annotations

import functools

HV, DV = 48, 128


def gated_rmsnorm_case(tokens: int):
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    rows = tokens * HV
    x, z, w = random_device_buffer(rows * DV, 1), random_device_buffer(rows * DV, 2), random_device_buffer(DV, 3)
    out = DeviceBuffer(rows * DV * 4)

    def launch(stream: int = 0, _keep=(x, z, w, out)):
        ke.gated_rmsnorm(x.ptr, z.ptr, w.ptr, out.ptr, rows, DV, 1e-6, stream)
    return launch, rows * DV * 12 + DV * 4, rows * DV * 8


BENCH_CASES = []
for _t in (1, 64, 4096):
    _c = functools.partial(gated_rmsnorm_case, _t)
    _c.__name__ = f"gated_rmsnorm_{_t}x48x128"
    BENCH_CASES.append(_c)
