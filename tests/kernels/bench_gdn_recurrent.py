"""Benchmark cases for the GDN recurrent step (cuda/gdn_recurrent.cu) at Qwen3.6-27B shapes:
48 value heads, Dk = Dv = 128, f32 state [slots, 48, 128, 128] (3 MiB per slot and layer).

BENCH_CASES: callables returning (launch_fn, bytes_moved, flops); launch_fn(stream: int = 0)
launches once (the state is updated in place, so replays keep evolving it; g < 0 keeps it
bounded). bytes_moved is the floor: each segment's state read and written once plus its
q, k, v, g, beta and out. Run with `python -m tests.kernels.bench_attention` (attention and GDN cases).
"""
from __future__ import annotations

import functools

import numpy as np

HV, DK, DV = 48, 128, 128


def gdn_buffers(n_segments: int, tokens_per_segment: int = 1) -> dict:
    """Device buffers for n_segments segments of tokens_per_segment rows, each segment its
    own slot (slots in shuffled order); also 'bytes': the floor of bytes moved."""
    from luce.ops.cuda_memory import DeviceBuffer
    from luce.ops.native import load_kernels
    from tests.kernels.bench_attention import random_device_buffer

    load_kernels()
    T = n_segments * tokens_per_segment
    rng = np.random.default_rng(0)
    qk = rng.standard_normal((2, T, HV, DK))
    qk /= np.linalg.norm(qk, axis=-1, keepdims=True)
    up = DeviceBuffer.from_numpy
    b = {"q": up((qk[0] / np.sqrt(DK)).astype(np.float32)), "k": up(qk[1].astype(np.float32)),
         "v": up(rng.standard_normal((T, HV, DV)).astype(np.float32)),
         "g": up((-np.abs(rng.standard_normal((T, HV))) * 0.3).astype(np.float32)),
         "beta": up(rng.uniform(0.05, 1, (T, HV)).astype(np.float32)),
         "state": random_device_buffer(n_segments * HV * DK * DV, 5, scale=0.1),
         "out": DeviceBuffer(T * HV * DV * 4),
         "qo": up(np.arange(n_segments + 1, dtype=np.int32) * tokens_per_segment),
         "slots": up(rng.permutation(n_segments).astype(np.int32))}
    b["bytes"] = n_segments * HV * DK * DV * 4 * 2 + T * HV * (2 * DK + 2 * DV + 2) * 4
    return b


def gdn_case(n_segments: int, tokens_per_segment: int = 1):
    """n_segments slots (AR rows when tokens_per_segment == 1), each its own state."""
    from luce import _cuda_gdn as kg

    b = gdn_buffers(n_segments, tokens_per_segment)

    def launch(stream: int = 0, b=b):
        kg.gdn_recurrent(b["q"].ptr, b["k"].ptr, b["v"].ptr, b["g"].ptr, b["beta"].ptr, b["state"].ptr,
                         b["out"].ptr, b["qo"].ptr, b["slots"].ptr, n_segments, n_segments, HV, DK, DV,
                         stream)

    flops = n_segments * tokens_per_segment * HV * DK * DV * 8  # ~4 multiply-adds per element
    return launch, b["bytes"], flops


BENCH_CASES = [functools.partial(gdn_case, n, t) for n, t in [(1, 1), (8, 1), (32, 1), (64, 1), (1, 64)]]
for _c in BENCH_CASES:
    _c.__name__ = "gdn_recurrent_" + "_".join(map(str, _c.args))
