"""Benchmark cases for the conv1d tree kernels (cuda/tree_conv.cu) at Qwen3.6-27B GDN shapes:
10240 channels, 4 taps. BENCH_CASES entries return (launch_fn, bytes_moved, flops); bytes
count x and y once, the weights and each tree's resident state read once (commit: the path
rows read, the state read and written). Run: `python -m tests.kernels.bench_tree_conv`."""
from __future__ import annotations

import functools
import sys

import numpy as np

from tests.kernels.bench_conv1d import CHANNELS, TAPS, conv_buffers


def conv_tree_case(width: int, n_trees: int = 1):
    from luce import _cuda_tree_conv as kc
    from luce.ops.cuda_memory import DeviceBuffer
    from tests.kernels.bench_gdn_tree import ddtree_parents

    b = conv_buffers(n_trees, width)
    T = n_trees * width
    b["slots"] = DeviceBuffer.from_numpy(np.arange(n_trees, dtype=np.int32))
    local = ddtree_parents(width)
    b["tp"] = DeviceBuffer.from_numpy(np.concatenate([np.where(local >= 0, local + s * width, -1)
                                                      for s in range(n_trees)]).astype(np.int32))

    def launch(stream: int = 0, b=b):
        kc.conv_tree(b["x"].ptr, b["w"].ptr, b["y"].ptr, b["state"].ptr, b["indptr"].ptr, b["slots"].ptr,
                     b["tp"].ptr, n_trees, CHANNELS, TAPS, width, True, stream=stream)

    nbytes = T * CHANNELS * 8 + CHANNELS * TAPS * 4 + n_trees * (TAPS - 1) * CHANNELS * 4
    return launch, nbytes, T * CHANNELS * (2 * TAPS + 4)


def conv_tree_commit_case(path_len: int, n_slots: int):
    from luce import _cuda_tree_conv as kc
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    x = random_device_buffer(n_slots * path_len * CHANNELS, 1)
    state = random_device_buffer(n_slots * (TAPS - 1) * CHANNELS, 3)
    indptr = DeviceBuffer.from_numpy(np.arange(n_slots + 1, dtype=np.int32) * path_len)
    rows = DeviceBuffer.from_numpy(np.arange(n_slots * path_len, dtype=np.int32))
    slots = DeviceBuffer.from_numpy(np.arange(n_slots, dtype=np.int32))
    keep = (x, state, indptr, rows, slots)

    def launch(stream: int = 0, _keep=keep):
        kc.conv_tree_commit(x.ptr, state.ptr, state.ptr, indptr.ptr, rows.ptr, slots.ptr, slots.ptr, n_slots,
                            CHANNELS, TAPS, stream=stream)

    moved_rows = n_slots * min(path_len, TAPS - 1)
    return launch, moved_rows * CHANNELS * 4 + n_slots * (TAPS - 1) * CHANNELS * 8, 0


BENCH_CASES = ([functools.partial(conv_tree_case, w, n) for w, n in [(8, 1), (64, 1), (64, 8)]]
               + [functools.partial(conv_tree_commit_case, 8, n) for n in (1, 8)])
for _c in BENCH_CASES:
    _c.__name__ = _c.func.__name__.replace("_case", "") + "_" + "_".join(map(str, _c.args))


if __name__ == "__main__":
    from tests.kernels.bench_attention import run_cases

    run_cases(BENCH_CASES, sys.argv[1] if len(sys.argv) > 1 else None)
