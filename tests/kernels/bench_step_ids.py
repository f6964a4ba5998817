"""Benchmark cases for the ids carried between decode steps (cuda/step_ids.cu): keep then feed
over a step of C AR rows among 64 slots (what a step ahead adds to a decode graph: two tiny
launches). BENCH_CASES entries return (launch_fn, bytes_moved, flops)."""
from __future__ import annotations

import functools

import numpy as np


def step_ids_case(rows: int):
    from luce import _cuda_step_ids as k
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    qo = DeviceBuffer.from_numpy(np.arange(rows + 1, dtype=np.int32))
    ar = DeviceBuffer.from_numpy(np.arange(rows, dtype=np.int32))
    logits = DeviceBuffer.from_numpy(np.arange(rows, dtype=np.int64))
    ids = DeviceBuffer.from_numpy(np.arange(rows, dtype=np.int64))
    last, tokens = DeviceBuffer(64 * 4), DeviceBuffer(rows * 4)

    def launch(stream: int = 0, _keep=(qo, ar, logits, ids, last, tokens)):
        k.keep_ids(ids.ptr, logits.ptr, qo.ptr, ar.ptr, last.ptr, rows, rows, stream=stream)
        k.feed_ids(tokens.ptr, qo.ptr, ar.ptr, last.ptr, rows, 1 << 20, stream=stream)
    return launch, rows * 40, 0


BENCH_CASES = []
for _r in (1, 5, 64):
    _c = functools.partial(step_ids_case, _r)
    _c.__name__ = f"keep_feed_ids_{_r}rows"
    BENCH_CASES.append(_c)
