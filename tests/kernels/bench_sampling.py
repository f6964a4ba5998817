"""Benchmark cases for argmax and top-k log-probs (cuda/sampling.cu) over the Qwen3.6-27B
vocab (248320). BENCH_CASES entries return (launch_fn, bytes_moved, flops); bytes count the
logits read once."""
from __future__ import annotations

import functools

VOCAB = 248320


def sampling_case(rows: int, k: int):
    from luce import _cuda_sampling as ks
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    logits = random_device_buffer(rows * VOCAB, 1, scale=4.0)
    ids, lps = DeviceBuffer(rows * max(k, 1) * 8), DeviceBuffer(rows * max(k, 1) * 4)

    if k == 0:
        def launch(stream: int = 0, _keep=(logits, ids)):
            ks.argmax(logits.ptr, ids.ptr, rows, VOCAB, stream=stream)
        return launch, rows * VOCAB * 4, rows * VOCAB

    work = DeviceBuffer(ks.workspace_bytes(rows, VOCAB, k))

    def launch(stream: int = 0, _keep=(logits, ids, lps, work)):
        ks.top_k_logprobs(logits.ptr, ids.ptr, lps.ptr, work.ptr, work.nbytes, rows, VOCAB, k, stream=stream)
    return launch, rows * VOCAB * 4, rows * VOCAB * 4


BENCH_CASES = []
for _r, _k in ((1, 0), (64, 0), (1, 4), (16, 4), (80, 4), (1, 20), (64, 20)):
    _c = functools.partial(sampling_case, _r, _k)
    _c.__name__ = f"argmax_{_r}x248320" if _k == 0 else f"top{_k}_logprobs_{_r}x248320"
    BENCH_CASES.append(_c)
