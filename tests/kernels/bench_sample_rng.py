"""Benchmark cases for seeded sampling (cuda/sample_rng.cu) over the Qwen3.6-27B vocab
(248320), top-k 40 with top-p 0.95 (the server's defaults). BENCH_CASES entries return
(launch_fn, bytes_moved, flops); bytes count the logits read once."""
from __future__ import annotations

import functools

import numpy as np

VOCAB = 248320


def sample_case(rows: int):
    from luce import _cuda_sample_rng as kr
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    logits = random_device_buffer(rows * VOCAB, 1, scale=4.0)
    args = [DeviceBuffer.from_numpy(a) for a in (
        np.full(rows, 0.8), np.full(rows, 40, np.int32), np.full(rows, 0.95), np.zeros(rows),
        np.arange(rows, dtype=np.uint64), np.arange(rows, dtype=np.int64))]
    ids = DeviceBuffer(rows * 8)
    work = DeviceBuffer(kr.workspace_bytes(rows, VOCAB))

    def launch(stream: int = 0, _keep=(logits, ids, work, *args)):
        kr.sample_rng(logits.ptr, *(a.ptr for a in args), ids.ptr, work.ptr, work.nbytes, rows, VOCAB,
                      stream=stream)
    return launch, rows * VOCAB * 4, rows * VOCAB


BENCH_CASES = []
for _r in (1, 64):
    _c = functools.partial(sample_case, _r)
    _c.__name__ = f"sample_top40_{_r}x248320"
    BENCH_CASES.append(_c)
