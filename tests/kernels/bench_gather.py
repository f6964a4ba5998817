"""Benchmark cases for the row gather copy (cuda/gather.cu) at Qwen3.6-27B shapes: KV commit
(rows of 4 KV heads x 256 f32 = 4 KiB, K and V pools alike), GDN state snapshots (48 x 128 x
128 f32 = 3 MiB per slot and layer), and plain copies moving as many bytes as a one-row matmul of the
27B reads (the size's own copy rate: tools/bench.py's roof is a 1 GiB copy, whose launch and tail
cost nothing next to its bytes). BENCH_CASES entries return (launch_fn, bytes_moved, 0); bytes count
every row read and written once."""
from __future__ import annotations

import functools

import numpy as np

KV_ROW = 4 * 256 * 4
STATE_ROW = 48 * 128 * 128 * 4
COPY_ROW = 16 << 10


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


def copy_case(moved: int):
    """A contiguous copy of moved / 2 bytes (read once, written once: `moved` bytes), rows of 16 KiB;
    sources and destinations rotate over regions 4x the L2 in all, so each launch reads from DRAM."""
    from luce import _cuda_gather as kg
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_matmul import L2_BYTES

    load_kernels()
    rows = max(1, moved // 2 // COPY_ROW)
    span = rows * COPY_ROW
    copies = max(1, min(16, -(-4 * L2_BYTES // (2 * span))))
    src, dst = DeviceBuffer(copies * span), DeviceBuffer(copies * span)
    turn = [0]

    def launch(stream: int = 0, _keep=(src, dst)):
        at = (turn[0] % copies) * span
        turn[0] += 1
        kg.gather(src.ptr + at, dst.ptr + at, 0, 0, rows, COPY_ROW, COPY_ROW, COPY_ROW, stream)
    return launch, 2 * span, 0


BENCH_CASES = []
for _name, _args in (("gather_kv_commit_64x4KiB", (64, KV_ROW, 65536)),
                     ("gather_kv_commit_4096x4KiB", (4096, KV_ROW, 65536)),
                     ("gather_state_snapshot_8x3MiB", (8, STATE_ROW, 64)),
                     ("gather_state_snapshot_64x3MiB", (64, STATE_ROW, 128))):
    _c = functools.partial(gather_case, *_args)
    _c.__name__ = _name
    BENCH_CASES.append(_c)
# The bytes a 27B one-row matmul reads: Q4_K out 5120 x 6144 (17.7 MB), Q4_K q|k|v (29.5 MB), Q4_K gate
# (50.1 MB); and 1 GiB in the same 16 KiB rows (the roof copies 1 MiB rows), so only the size differs.
for _name, _moved in (("17.7MB", 17_694_720), ("29.5MB", 29_491_200), ("50.1MB", 50_135_040), ("1GiB", 1 << 30)):
    _c = functools.partial(copy_case, _moved)
    _c.__name__ = f"gather_copy_moving_{_name}"
    BENCH_CASES.append(_c)
