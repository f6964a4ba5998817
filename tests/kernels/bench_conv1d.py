"""Benchmark cases for the causal conv1d (cuda/conv1d.cu) at Qwen3.6-27B GDN shapes: 10240
channels (q, k: 16 heads x 128 each; v: 48 x 128), 4 taps, per-slot state updated in place.
BENCH_CASES entries return (launch_fn, bytes_moved, flops); bytes count x, y, the weights and
each segment's state read and written once."""
from __future__ import annotations

import functools

import numpy as np

CHANNELS, TAPS = 10240, 4


def conv_buffers(n_segments: int, rows_per_segment: int) -> dict:
    """Loads the kernels; device buffers x, y [T, CHANNELS], w [CHANNELS, TAPS], state
    [n_segments, TAPS-1, CHANNELS] f32 and indptr [n_segments+1] int32 (equal segments)."""
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    T = n_segments * rows_per_segment
    return {"x": random_device_buffer(T * CHANNELS, 1),
            "w": random_device_buffer(CHANNELS * TAPS, 2, scale=0.3),
            "state": random_device_buffer(n_segments * (TAPS - 1) * CHANNELS, 3),
            "y": DeviceBuffer(T * CHANNELS * 4),
            "indptr": DeviceBuffer.from_numpy(np.arange(n_segments + 1, dtype=np.int32) * rows_per_segment)}


def conv1d_case(n_segments: int, tokens_per_segment: int):
    from luce import _cuda_conv1d as kc
    from luce.ops.cuda_memory import DeviceBuffer

    b = conv_buffers(n_segments, tokens_per_segment)
    T = n_segments * tokens_per_segment
    b["slots"] = DeviceBuffer.from_numpy(np.random.default_rng(0).permutation(n_segments).astype(np.int32))

    def launch(stream: int = 0, b=b):
        kc.conv1d(b["x"].ptr, b["w"].ptr, b["y"].ptr, b["state"].ptr, b["state"].ptr, b["indptr"].ptr,
                  b["slots"].ptr, b["slots"].ptr, n_segments, CHANNELS, TAPS, tokens_per_segment, True,
                  stream=stream)

    state_bytes = n_segments * (TAPS - 1) * CHANNELS * 4 * 2
    return launch, T * CHANNELS * 8 + CHANNELS * TAPS * 4 + state_bytes, T * CHANNELS * (2 * TAPS + 4)


BENCH_CASES = []
for _n, _t in ((1, 1), (64, 1), (1, 4096), (8, 512)):
    _c = functools.partial(conv1d_case, _n, _t)
    _c.__name__ = f"conv1d_{_n}seg_x{_t}tok_10240ch"
    BENCH_CASES.append(_c)
