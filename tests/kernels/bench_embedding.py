"""Benchmark cases for embedding rows (cuda/embedding.cu) at Qwen3.6-27B shapes: a Q4_K
table of 248,320 x 5,120 (the token embedding; only looked-up rows are read), 1 and 4,096
tokens. BENCH_CASES entries return (launch_fn, bytes_moved, 0): row bytes read + f32 written."""
from __future__ import annotations

import functools

import numpy as np

VOCAB, HIDDEN = 248320, 5120
Q4_K, Q4_K_ROW = 12, 5120 // 256 * 144


def embedding_case(tokens: int):
    from luce import _cuda_embedding as ke
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels

    load_kernels()
    table = DeviceBuffer(VOCAB * Q4_K_ROW)   # contents do not matter for timing (f16 scales may be NaN)
    ids = DeviceBuffer.from_numpy(np.random.default_rng(0).integers(0, VOCAB, tokens).astype(np.int32))
    out = DeviceBuffer(tokens * HIDDEN * 4)

    def launch(stream: int = 0, _keep=(table, ids, out)):
        ke.embedding(table.ptr, ids.ptr, out.ptr, VOCAB, HIDDEN, Q4_K_ROW, tokens, Q4_K, stream=stream)
    return launch, tokens * (Q4_K_ROW + HIDDEN * 4), 0


BENCH_CASES = []
for _t in (1, 4096):
    _c = functools.partial(embedding_case, _t)
    _c.__name__ = f"embedding_q4k_{_t}x5120"
    BENCH_CASES.append(_c)
