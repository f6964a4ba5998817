"""Benchmark cases for SwiGLU (cuda/swiglu.cu) at Qwen3.6-27B shapes: FFN 17408, reading a
fused gate|up projection [T, 2 x 17408]. BENCH_CASES entries return
(launch_fn, bytes_moved, flops)."""
from __future__ import annotations

import functools

FFN = 17408


def swiglu_case(tokens: int):
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    fused = random_device_buffer(tokens * 2 * FFN, 1)
    out = DeviceBuffer(tokens * FFN * 4)

    def launch(stream: int = 0, _keep=(fused, out)):
        ke.swiglu(fused.ptr, fused.ptr + 4 * FFN, out.ptr, tokens, FFN, 2 * FFN, 2 * FFN, FFN, stream)
    return launch, tokens * FFN * 12, tokens * FFN * 4


BENCH_CASES = []
for _t in (1, 64, 4096):
    _c = functools.partial(swiglu_case, _t)
    _c.__name__ = f"swiglu_{_t}x17408"
    BENCH_CASES.append(_c)
