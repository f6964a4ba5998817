"""Benchmark cases for rotary (cuda/rotary.cu) at Qwen3.6-27B shapes: 24 query heads x 256,
partial rotary on 64 dims, in place (the other 192 dims are not touched, so not counted).
BENCH_CASES entries return (launch_fn, bytes_moved, flops)."""
from __future__ import annotations

import functools

import numpy as np

HQ, HEAD_DIM, ROPE_DIM, THETA = 24, 256, 64, 1e7
SECTIONS = (11, 11, 10, 0)


def rotary_case(tokens: int, mrope: bool):
    from luce import _cuda_elementwise as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    q = random_device_buffer(tokens * HQ * HEAD_DIM, 1)
    n_pos = 4 if mrope else 1
    pos = DeviceBuffer.from_numpy(np.repeat(np.arange(30000, 30000 + tokens, dtype=np.int32), n_pos))
    sections = SECTIONS if mrope else ()

    def launch(stream: int = 0, _keep=(q, pos)):
        ke.rotary(q.ptr, q.ptr, pos.ptr, tokens, HQ, HEAD_DIM, ROPE_DIM, THETA, sections, n_pos,
                  stream=stream)
    return launch, tokens * HQ * ROPE_DIM * 8 + tokens * n_pos * 4, tokens * HQ * ROPE_DIM * 3


BENCH_CASES = []
for _t, _m in ((1, False), (64, False), (4096, False), (64, True)):
    _c = functools.partial(rotary_case, _t, _m)
    _c.__name__ = f"rotary_q_{_t}x24x256_rope64" + ("_mrope" if _m else "")
    BENCH_CASES.append(_c)
