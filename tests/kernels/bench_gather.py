"""Benchmark cases for the row gather copy (cuda/gather.cu) at Qwen3.6-27B shapes: KV commit
(rows of 4 KV heads x 256 f32 = 4 KiB, K and V pools alike), GDN state snapshots (48 x 128 x
128 f32 = 3 MiB per slot and layer). BENCH_CASES entries return (launch_fn, bytes_moved, 0);
bytes count every row read and written once."""
from __future__ import annotations

import functools

import numpy as np

KV_ROW = 4 * 256 * 4
STATE_ROW = 48 * 128 * 128 * 4


def gather_case(n: int, row_bytes: int, pool_rows: int):
    from luce import _cuda_gather as kg
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    rng = np.random.default_rng(0)
    src = random_device_buffer(pool_rows * row_bytes // 4, 1)
    dst = DeviceBuffer(pool_rows * row_bytes)
    src_rows = DeviceBuffer.from_numpy(rng.choice(pool_rows, n, replace=False).astype(np.int64))
    dst_rows = DeviceBuffer.from_numpy(rng.choice(pool_rows, n, replace=False).astype(np.int64))

    def launch(stream: int = 0, _keep=(src, dst, src_rows, dst_rows)):
        kg.gather(src.ptr, dst.ptr, src_rows.ptr, dst_rows.ptr, n, row_bytes, row_bytes, row_bytes, stream)
    return launch, 2 * n * row_bytes, 0


BENCH_CASES = []
for _name, _args in (("gather_kv_commit_64x4KiB", (64, KV_ROW, 65536)),
                     ("gather_kv_commit_4096x4KiB", (4096, KV_ROW, 65536)),
                     ("gather_state_snapshot_8x3MiB", (8, STATE_ROW, 64)),
                     ("gather_state_snapshot_64x3MiB", (64, STATE_ROW, 128))):
    _c = functools.partial(gather_case, *_args)
    _c.__name__ = _name
    BENCH_CASES.append(_c)
